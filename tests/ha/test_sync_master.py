"""SYNC_MASTER: a put that waits for the store is answered once a slave acknowledged it, through
the replica-request ring (no polling); SLAVE_NOT_AVAILABLE and FLUSH_SLAVE_TIMEOUT as RocketMQ;
after kill -9 of the master's whole process tree every PUT_OK message is on the slave."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

import psutil
import pytest

from rmq_mp.format import ha_frame
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import commit_log, start_master, start_slave, wait_caught_up
from tests.service import wait_until

SYNC = {"brokerRole": "SYNC_MASTER", "haSendHeartbeatInterval": "1000"}


def test_no_slave_is_slave_not_available(tmp_path: Path) -> None:
    master = start_master(tmp_path, **SYNC)
    with Producer.attach(master.names.base) as producer:
        result = producer.send("T", b"x" * 100)
        assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        assert "no slave" in result.reason
        assert producer.send("T", b"y", properties={"WAIT": "false"}).status is PutMessageStatus.PUT_OK
    assert master.read(layout.HA_SLAVE_NOT_AVAILABLE) == 1


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_put_ok_once_the_slave_acknowledged(tmp_path: Path, flush: str) -> None:
    master = start_master(tmp_path, flushDiskType=flush, **SYNC)
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), haSendHeartbeatInterval="1000")
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    with Producer.attach(master.names.base) as producer:
        for i in range(200):
            result = producer.send("T", i.to_bytes(8, "big") * 20)
            assert result.status is PutMessageStatus.PUT_OK, result
            assert master.read(layout.HA_ACKED_OFFSET) >= result.commit_log_offset + 1
        results = producer.send_batch([{"topic": "T", "body": b"b" * 50} for _ in range(10)])
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    end = master.read(layout.WROTE_POSITION)
    assert master.read(layout.HA_ACKED_OFFSET) == end
    wait_caught_up(slave, end)


def test_a_slave_that_never_acknowledges_is_flush_slave_timeout(tmp_path: Path) -> None:
    master = start_master(tmp_path, slaveTimeout="300", **SYNC)
    with socket.create_connection(("127.0.0.1", master.read(layout.HA_LISTEN_PORT)), timeout=10) as silent:
        silent.sendall(ha_frame.encode_report(0))  # connected, then never acknowledges
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the connection")
        with Producer.attach(master.names.base) as producer:
            result = producer.send("T", b"z" * 100)
    assert result.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert result.commit_log_offset >= 0  # stored either way
    assert master.read(layout.HA_FLUSH_SLAVE_TIMEOUT) == 1


@pytest.mark.parametrize("seed", [11, 12])
def test_every_put_ok_is_on_the_slave_after_the_master_tree_is_killed(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    master = start_master(tmp_path, **SYNC)
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), haSendHeartbeatInterval="1000")
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    ok: list[bytes] = []
    stop = threading.Event()
    kill_after = rng.randrange(100, 600)

    def produce() -> None:
        with Producer.attach(master.names.base) as producer:
            i = 0
            while not stop.is_set():
                body = b"sync-%08d-" % i + bytes(rng.randrange(0, 400))
                try:
                    result = producer.send("T", body)
                except Exception:
                    return  # the store died under it
                if result.status is PutMessageStatus.PUT_OK:
                    ok.append(body)
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
    answered = list(ok)
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
    print(f"seed {seed}: {len(answered)} PUT_OK answers before kill -9, all {len(answered)} on the slave")
