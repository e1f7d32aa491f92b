"""`rmq-admin promote` on real stores: refused while the master answers or the slave is behind
what it last heard; then a live promotion (no restart): a producer attached to the slave sends
at once, the group resumes where it committed on the master, the role survives a restart."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.format import ha_meta
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.tools import admin
from shm import layout
from shm import schedule_offsets as so
from tests.ha.pair import assert_same_log, put, start_master, start_slave, wait_caught_up
from tests.ha.test_meta import META, commit, committed, follow, start_pair
from tests.service import ROOT, RunningService, kill_tree, start_service, wait_until


def promote(service: RunningService, *extra: str) -> int:
    return admin.main(["promote", "--name", str(service.root), *extra])


def test_refused_while_the_master_answers_then_promoted_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    master, slave = start_pair(tmp_path)
    end = put(master, 300)
    commit(master, "g1", {("HaTopic", 0): 120})
    wait_caught_up(slave, end)
    wait_until(lambda: slave.read(layout.HA_META_MASTER_END) >= end, 20, "the master's end heard")
    # a snapshot built between the put and the commit says the same end: wait for the commit itself
    wait_until(lambda: committed(slave, "g1", "HaTopic", 0) == 120, 20, "the group's commit followed")
    assert promote(slave, "--broker-name", "someone-else") == 2
    assert "is not broker 'someone-else'" in capsys.readouterr().err
    assert promote(slave) == 2
    err = capsys.readouterr().err
    assert "still answers" in err
    assert err.count("\n") == 1
    supervisor_pid = slave.process.pid
    with Producer.attach(slave.names.base) as producer:
        refused = producer.send("HaTopic", b"x", queue_id=0)
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        kill_tree(master)
        assert promote(slave, "--role", "ASYNC_MASTER") == 0
        assert "promoted" in capsys.readouterr().out
        sent = producer.send("HaTopic", b"after", queue_id=0)  # the same producer, at once
        assert sent.status is PutMessageStatus.PUT_OK, sent
        assert sent.commit_log_offset == end
    with Consumer.attach(slave.names.base, "g1") as consumer:
        assert consumer.committed_offset("HaTopic", 0) == 120
        got = consumer.pull("HaTopic", 0, sent.queue_offset, 1, timeout_s=20)  # once reput dispatched it
        assert got.status is GetMessageStatus.FOUND
        assert got.messages[0].body == b"after"
    assert slave.process.pid == supervisor_pid
    assert slave.process.poll() is None
    assert promote(slave) == 2  # already a master
    assert "already runs as ASYNC_MASTER" in capsys.readouterr().err
    assert slave.stop() == 0
    again = start_service(tmp_path, "slave", **{k: v for k, v in _conf(slave).items()})
    with Producer.attach(again.names.base) as producer:
        assert producer.send("HaTopic", b"restarted").status is PutMessageStatus.PUT_OK
    assert again.stop() == 0


def _conf(service: RunningService) -> dict[str, str]:
    lines = service.conf.read_text().splitlines()
    skip = {"storePathRootDir"}
    return {k: v for k, _, v in (line.partition("=") for line in lines) if k and k not in skip}


def test_refused_when_behind_what_it_last_heard_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fake master's metadata says its end is far beyond what the slave holds."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    dead_ha = socket.create_server(("127.0.0.1", 0))
    ha_port = dead_ha.getsockname()[1]
    dead_ha.close()  # nobody answers there: the master is gone
    slave = start_slave(tmp_path, ha_port, haMasterMetaAddress=f"127.0.0.1:{listener.getsockname()[1]}")
    try:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(ha_meta.encode_snapshot(ha_meta.Snapshot(1, 5000, 0, {}, {}, {})))
            wait_until(lambda: slave.read(layout.HA_META_MASTER_END) == 5000, 10, "the master's end heard")
        assert promote(slave) == 2
        err = capsys.readouterr().err
        assert "holds the master's commit log to 0, the master last said 5000: 5000 bytes" in err
        assert promote(slave, "--force") == 0
        with Producer.attach(slave.names.base) as producer:
            assert producer.send("T", b"x").status is PutMessageStatus.PUT_OK
    finally:
        listener.close()
        assert slave.stop() == 0


def test_delays_the_old_master_delivered_are_not_delivered_again(tmp_path: Path) -> None:
    """A slave without the metadata channel holds no delay progress: the promotion finds the
    deliveries in the log it replicated and moves each level past them; the rest it delivers."""
    levels = {"messageDelayLevel": "1s 3s", "haSendHeartbeatInterval": "1000"}
    master = start_master(tmp_path, **levels)
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), **levels)
    with Producer.attach(master.names.base) as producer:
        for i in range(6):
            level = "1" if i < 4 else "2"  # four due at once, two later (before or after the kill)
            assert producer.send("Delayed", b"d%d" % i, properties={"DELAY": level}).ok
    wait_until(lambda: _schedule(master, 0) == 4, 30, "the master to deliver level 1")
    end = master.read(layout.WROTE_POSITION)
    wait_caught_up(slave, end)
    kill_tree(master)
    assert _schedule(slave, 0) == 0  # nothing followed: no metadata channel
    assert promote(slave, "--force") == 0
    assert _schedule(slave, 0) == 4
    wait_until(lambda: _schedule(slave, 1) == 2, 60, "the new master to deliver level 2")
    with Consumer.attach(slave.names.base, "checker") as reader:
        bodies = []
        for topic, queue_id, _slot in list(reader.queues.queues()):
            if topic == "Delayed":
                got = reader.pull(topic, queue_id, 0, 32)
                bodies += [m.body for m in got.messages] if got.status is GetMessageStatus.FOUND else []
    assert sorted(bodies) == [b"d%d" % i for i in range(6)]
    assert "were delivered by the old master" in (slave.root / "logs" / "supervisor.log").read_text()
    assert slave.stop() == 0


def _schedule(service: RunningService, queue_id: int) -> int:
    with Consumer.attach(service.names.base, "schedule_reader") as reader:
        return reader.store.shm.schedule.get(queue_id, so.OFFSET)


def test_promoted_to_sync_master_it_serves_a_new_slave(tmp_path: Path) -> None:
    """The default role for a slave with haListenPort: SYNC_MASTER. Its ha worker restarts as a
    master: with no slave a waiting put is SLAVE_NOT_AVAILABLE (stored); once a new slave of it
    follows, PUT_OK, and the new slave holds the log."""
    master = start_master(tmp_path, **META)
    wait_until(lambda: master.read(layout.HA_META_LISTEN_PORT) > 0, 20, "the metadata listener")
    slave = follow(tmp_path, master, haListenPort="0")
    end = put(master, 100)
    wait_caught_up(slave, end)
    kill_tree(master)
    wait_until(lambda: slave.read(layout.HA_SLAVE_STATE) != layout.SLAVE_CONNECTED, 20, "the slave to notice")
    assert promote(slave) == 0
    wait_until(lambda: slave.read(layout.HA_LISTEN_PORT) > 0, 20, "the promoted store's HA listener")
    with Producer.attach(slave.names.base) as producer:
        assert producer.send("HaTopic", b"alone").status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        third = start_slave(
            tmp_path, slave.read(layout.HA_LISTEN_PORT), "third", haSendHeartbeatInterval="1000"
        )
        wait_until(lambda: slave.read(layout.HA_CONNECTIONS) == 1, 20, "the new slave to connect")
        result = producer.send("HaTopic", b"replicated")
        assert result.status is PutMessageStatus.PUT_OK, result
    wait_caught_up(third, slave.read(layout.WROTE_POSITION))
    assert third.stop() == 0
    assert slave.stop() == 0


def test_a_promoted_store_rejoins_as_a_slave_after_demote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: B, promoted when its master A died, wrote as a master and stopped; A is back as
    the master at the address B's broker.conf (and its promotion record) name. B's start with
    that broker.conf unchanged is refused with one line naming `rmq-admin demote` (it would be a
    second master); `demote --store` retires the record (kept beside it); B then starts as the
    SLAVE its broker.conf says, sets aside what it wrote as a master, restarts itself to cut it
    and converges byte for byte: no file removed by hand."""
    hb = {"haSendHeartbeatInterval": "1000"}
    a = start_master(tmp_path, "a", **hb)
    port = a.read(layout.HA_LISTEN_PORT)
    b = start_slave(tmp_path, port, "b", **hb)
    shared = put(a, 300)
    wait_caught_up(b, shared)
    kill_tree(a)
    assert promote(b, "--role", "ASYNC_MASTER") == 0
    capsys.readouterr()
    put(b, 100, body_bytes=77, topic="OnlyB")
    assert b.stop() == 0
    a = start_service(tmp_path, "a", haListenPort=str(port), **hb)  # back at the address B names
    wait_until(lambda: a.read(layout.HA_LISTEN_PORT) == port, 20, "A's HA listener")
    a_end = put(a, 50)

    refused = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(b.conf)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused
    [line] = refused.stderr.strip().splitlines()
    assert f"rmq-admin demote --store {b.root}" in line, line
    assert "fork the log" in line
    assert b.names.leftovers() == [], "a refused start holds nothing"

    assert admin.main(["demote", "--name", a.names.base]) == 2  # a running store: never in place
    assert "needs a stopped store" in capsys.readouterr().err
    assert admin.main(["demote", "--store", str(b.root)]) == 0
    assert "retired" in capsys.readouterr().out
    config_dir = b.root / "config"
    assert not (config_dir / "promotion.json").exists()
    [kept] = config_dir.glob("promotion.json.demoted-*")
    assert json.loads(kept.read_text())["brokerRole"] == "ASYNC_MASTER"
    assert admin.main(["demote", "--store", str(b.root)]) == 0  # nothing left to retire: says so
    assert "not promoted" in capsys.readouterr().out

    b = start_slave(tmp_path, port, "b", **hb)  # the same broker.conf: SLAVE of A

    def restarts() -> int:
        try:
            return b.read(layout.FORK_RESTARTS)
        except ShmAttachError:
            return -1  # restarting itself

    wait_until(lambda: restarts() == 1, 60, "B to set aside what it wrote as a master and restart")
    wait_caught_up(b, a_end)
    assert_same_log(a, b, a_end)
    with Producer.attach(b.names.base) as producer:  # a slave again: producers refused
        assert producer.send("HaTopic", b"x").status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    end = put(a, 50)
    wait_caught_up(b, end)
    assert_same_log(a, b, end)
    assert b.stop() == 0
    assert a.stop() == 0
