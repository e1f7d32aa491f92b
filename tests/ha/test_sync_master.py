"""SYNC_MASTER: a put that waits for the store is answered once a slave acknowledged it, through
the replica-request ring (no polling); SLAVE_NOT_AVAILABLE and FLUSH_SLAVE_TIMEOUT as RocketMQ;
after kill -9 of the master's whole process tree every PUT_OK message is on the slave.

Every case runs on both put paths (``path``): the compiled core (rmq_mp/put/_core.c `replica_*`),
checked to have served every waiting send itself (its own count, and no reference send counted
after each queue's first), and the Python reference (rmq_mp/put/replica_wait.py).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rmq_mp.format import ha_frame
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import commit_log, start_master, start_slave, wait_caught_up
from tests.integration.test_native_send import _reference_sends
from tests.integration.test_native_send import (
    test_every_documented_send_shape_is_sent_by_the_core as every_shape_is_sent_by_the_core,
)
from tests.service import RunningService, wait_until

SYNC = {"brokerRole": "SYNC_MASTER", "haSendHeartbeatInterval": "1000"}


@pytest.fixture(params=["core", "reference"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The put path of the producers the test attaches: the compiled core or the reference."""
    if request.param == "reference":
        monkeypatch.setattr(native, "core", None)  # what `Producer._bind` looks at
    elif native.core is None:
        pytest.skip(f"no compiled core: {native.why_reference}")
    return str(request.param)


@contextlib.contextmanager
def sending(master: RunningService, path: str) -> Iterator[Producer]:
    """A producer on ``path``. On the core, each queue of topic T gets its first send (the
    reference's, by design) before the test's sends, and none of those may go to the reference."""
    with Producer.attach(master.names.base) as producer:
        core = producer._native
        assert (core is not None) == (path == "core")
        if core is None:
            yield producer
            return
        for queue_id in range(producer.config.default_topic_queue_nums):
            assert producer.send("T", b"w", queue_id=queue_id, properties={"WAIT": "false"}).ok
        before, sent = _reference_sends(producer), core.sent
        yield producer
        assert core.sent > sent
        assert _reference_sends(producer) == before, "a SYNC_MASTER send went to the reference"


def test_no_slave_is_slave_not_available(tmp_path: Path, path: str) -> None:
    master = start_master(tmp_path, **SYNC)
    with sending(master, path) as producer:
        result = producer.send("T", b"x" * 100)
        assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        assert "no slave" in result.reason
        assert producer.send("T", b"y", properties={"WAIT": "false"}).status is PutMessageStatus.PUT_OK
    assert master.read(layout.HA_SLAVE_NOT_AVAILABLE) == 1


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_put_ok_once_the_slave_acknowledged(tmp_path: Path, flush: str, path: str) -> None:
    master = start_master(tmp_path, flushDiskType=flush, **SYNC)
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), haSendHeartbeatInterval="1000")
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    with sending(master, path) as producer:
        for i in range(200):
            result = producer.send("T", i.to_bytes(8, "big") * 20)
            assert result.status is PutMessageStatus.PUT_OK, result
            assert master.read(layout.HA_ACKED_OFFSET) >= result.commit_log_offset + 1
        results = producer.send_batch([{"topic": "T", "body": b"b" * 50} for _ in range(10)])
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    end = master.read(layout.WROTE_POSITION)
    assert master.read(layout.HA_ACKED_OFFSET) == end
    wait_caught_up(slave, end)


def test_a_slave_that_never_acknowledges_is_flush_slave_timeout(tmp_path: Path, path: str) -> None:
    master = start_master(tmp_path, slaveTimeout="300", **SYNC)
    with socket.create_connection(("127.0.0.1", master.read(layout.HA_LISTEN_PORT)), timeout=10) as silent:
        silent.sendall(ha_frame.encode_report(0))  # connected, then never acknowledges
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the connection")
        with sending(master, path) as producer:
            result = producer.send("T", b"z" * 100)
            batch = producer.send_batch([{"topic": "T", "body": b"b"}, {"topic": "T", "body": b"c"}])
    assert result.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert "slaveTimeout" in result.reason
    assert result.commit_log_offset >= 0  # stored either way
    assert [r.status for r in batch] == [PutMessageStatus.FLUSH_SLAVE_TIMEOUT] * 2
    assert all(r.commit_log_offset >= 0 for r in batch)
    # a count per put (lock hold): the core puts a batch's items one hold each, the reference in one
    assert master.read(layout.HA_FLUSH_SLAVE_TIMEOUT) == (3 if path == "core" else 2)


def test_a_slave_too_far_behind_is_slave_not_available(tmp_path: Path, path: str) -> None:
    """haSlaveFallbehindMax: the best acknowledged offset this many bytes or more below a put's
    end is no slave at all (RocketMQ's isSlaveOK), answered at once, not after slaveTimeout."""
    master = start_master(tmp_path, slaveTimeout="60000", haSlaveFallbehindMax="1", **SYNC)
    with socket.create_connection(("127.0.0.1", master.read(layout.HA_LISTEN_PORT)), timeout=10) as silent:
        silent.sendall(ha_frame.encode_report(0))
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the connection")
        with sending(master, path) as producer:
            result = producer.send("T", b"z" * 100)
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert result.commit_log_offset >= 0
    assert master.read(layout.HA_SLAVE_NOT_AVAILABLE) == 1
    assert master.read(layout.HA_FLUSH_SLAVE_TIMEOUT) == 0


def test_every_send_shape_of_a_sync_master_is_sent_by_the_core(tmp_path: Path) -> None:
    """`test_native_send`'s shape test on a SYNC_MASTER with its slave: every documented shape,
    waiting for the slave's acknowledgement, is served by the compiled core, not the reference."""
    if native.core is None:
        pytest.skip(f"no compiled core: {native.why_reference}")
    master = start_master(tmp_path, **SYNC)
    start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), haSendHeartbeatInterval="1000")
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    with Producer.attach(master.names.base) as producer:
        assert producer.send("Warm", b"w", queue_id=0).ok  # maps the file, as that test's fixture
        every_shape_is_sent_by_the_core((master, producer))
        assert producer.send("Shape", b"acked", queue_id=0).ok
    assert master.read(layout.HA_SLAVE_NOT_AVAILABLE) == master.read(layout.HA_FLUSH_SLAVE_TIMEOUT) == 0


@pytest.mark.parametrize("seed", [11, 12])
def test_every_put_ok_is_on_the_slave_after_the_master_tree_is_killed(
    tmp_path: Path, seed: int, path: str
) -> None:
    rng = random.Random(seed)
    master = start_master(tmp_path, **SYNC)
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), haSendHeartbeatInterval="1000")
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    ok: list[bytes] = []
    by_reference: list[bytes] = []
    stop = threading.Event()
    kill_after = rng.randrange(100, 600)
    producer = Producer.attach(master.names.base)
    core = producer._native
    assert (core is not None) == (path == "core")
    for queue_id in range(producer.config.default_topic_queue_nums):  # each queue's first send
        assert producer.send("T", b"w", queue_id=queue_id).ok

    def produce() -> None:
        i = 0
        while not stop.is_set():
            body = b"sync-%08d-" % i + bytes(rng.randrange(0, 400))
            sent = core.sent if core is not None else 0
            try:
                result = producer.send("T", body)
            except Exception:
                return  # the store died under it
            if result.status is PutMessageStatus.PUT_OK:
                ok.append(body)
                if core is not None and core.sent != sent + 1:
                    by_reference.append(body)
            i += 1

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    wait_until(lambda: len(ok) >= kill_after, 60, f"{kill_after} PUT_OK answers")
    tree = psutil.Process(master.process.pid)
    for proc in [*tree.children(recursive=True), tree]:
        proc.kill()
    master.process.wait(10)
    stop.set()
    thread.join(30)
    producer.close()
    answered = list(ok)
    assert not by_reference, f"{len(by_reference)} PUT_OK sends served by the reference, not the core"
    wait_until(
        lambda: slave.read(layout.WROTE_POSITION) >= slave.read(layout.HA_SLAVE_RECEIVED_END),
        20,
        "whole records",
    )
    wait_caught_up(slave, slave.read(layout.WROTE_POSITION))
    assert slave.stop() == 0
    log = b"".join(commit_log(slave).values())
    missing = [body[:13] for body in answered if body not in log]
    assert not missing, f"{len(missing)} of {len(answered)} PUT_OK messages not on the slave: {missing[:5]}"
    assert len(answered) >= kill_after
    print(f"seed {seed} ({path}): {len(answered)} PUT_OK answers before kill -9, all on the slave")
