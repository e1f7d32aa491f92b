"""Two real stores over loopback: catch-up, file rolls, big messages, two slaves, refusals, and
the slave's kill -9 at seeded points; the slave's commit log is the master's byte for byte."""

from __future__ import annotations

import os
import random
import signal
import socket
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.format import ha_frame
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import assert_same_log, put, start_master, start_slave, wait_caught_up
from tests.service import wait_until

HB = {"haSendHeartbeatInterval": "1000"}


def _queue_files(root: Path) -> dict[str, bytes]:
    base = root / "consumequeue"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def test_catch_up_from_empty_then_follow_across_file_rolls(tmp_path: Path) -> None:
    master = start_master(tmp_path, **HB)
    end = put(master, 300)
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), **HB)
    wait_caught_up(slave, end)
    end = put(master, 5000, body_bytes=300)  # about 1.6 MiB: two file rolls of 1 MiB
    assert end > 2 << 20
    wait_caught_up(slave, end)
    wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 30, "the master to see the ack")
    assert_same_log(master, slave, end)
    with Consumer.attach(slave.names.base, "ha_reader") as consumer:  # the slave serves what it replicated
        got = consumer.pull("HaTopic", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND
        assert got.messages[0].body[:8] == (0).to_bytes(8, "big")
    assert slave.stop() == 0
    assert master.stop() == 0
    assert _queue_files(slave.root) == _queue_files(master.root)


def test_big_messages_and_a_slave_from_behind(tmp_path: Path) -> None:
    settings = {**HB, "mappedFileSizeCommitLog": str(16 << 20)}
    master = start_master(tmp_path, **settings)
    end = put(master, 50)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **settings)
    wait_caught_up(slave, end)
    assert slave.stop() == 0
    with Producer.attach(master.names.base) as producer:  # 4 MiB bodies: many frames each
        for i in range(5):
            assert producer.send("Big", bytes([i]) * (4 << 20)).status.name == "PUT_OK"
    end = master.read(layout.WROTE_POSITION)
    slave = start_slave(tmp_path, port, **settings)  # restarted: resumes from its own end
    assert slave.read(layout.HA_SLAVE_RECEIVED_END) >= 0
    wait_caught_up(slave, end, 120)
    assert_same_log(master, slave, end)


def test_two_slaves_at_once(tmp_path: Path) -> None:
    master = start_master(tmp_path, **HB)
    port = master.read(layout.HA_LISTEN_PORT)
    one = start_slave(tmp_path, port, "one", **HB)
    two = start_slave(tmp_path, port, "two", **HB)
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 2, 30, "two slave connections")
    end = put(master, 2000)
    for slave in (one, two):
        wait_caught_up(slave, end)
        assert_same_log(master, slave, end)
    acked = {master.read(layout.ha_connection_field(s, "acked")) for s in range(2)}
    wait_until(
        lambda: {master.read(layout.ha_connection_field(s, "acked")) for s in range(2)} == {end},
        30,
        "both connections to acknowledge the end",
    )
    assert acked <= {end, *range(end)}


def test_a_peer_outside_allowed_slaves_gets_nothing(tmp_path: Path) -> None:
    master = start_master(tmp_path, haAllowedSlaves="10.0.0.0/8, 192.168.1.7", **HB)
    put(master, 10)
    with socket.create_connection(("127.0.0.1", master.read(layout.HA_LISTEN_PORT)), timeout=10) as sock:
        sock.sendall(ha_frame.encode_report(0))
        try:
            received = sock.recv(4096)
        except ConnectionResetError:  # closed with our report unread
            received = b""
        assert received == b""  # closed, not a byte sent
    assert master.read(layout.HA_REFUSED_PEERS) == 1
    assert "not in haAllowedSlaves" in (master.root / "logs" / "ha.log").read_text()


def test_a_first_report_beyond_the_end_is_no_acknowledgement(tmp_path: Path) -> None:
    master = start_master(tmp_path, **HB)
    end = put(master, 10)
    stranger = end + (1 << 30)
    with socket.create_connection(("127.0.0.1", master.read(layout.HA_LISTEN_PORT)), timeout=10) as sock:
        sock.sendall(ha_frame.encode_report(stranger))
        data = b""
        while len(data) < ha_frame.HEADER_BYTES:  # a heartbeat at the claimed offset
            data += sock.recv(ha_frame.HEADER_BYTES - len(data))
        assert ha_frame.decode_header(data) == (stranger, 0)
        assert master.read(layout.HA_ACKED_OFFSET) == 0, "4.9.8 would count it"
        sock.sendall(ha_frame.encode_report(stranger))  # again: closed
        while sock.recv(4096):
            pass
    assert master.read(layout.HA_ACKED_OFFSET) == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_slave_worker_killed_at_seeded_points_resumes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    master = start_master(tmp_path, **HB)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **HB)
    end = 0
    for _ in range(3):
        end = put(master, rng.randrange(200, 2000), body_bytes=rng.randrange(50, 2000))
        target = rng.randrange(end // 2, end)

        def got_to(target: int = target) -> bool:
            return slave.read(layout.HA_SLAVE_RECEIVED_END) >= target

        wait_until(got_to, 60, "the slave to get going")
        pid = slave.worker_pid("ha")
        os.kill(pid, signal.SIGKILL)

        def restarted(pid: int = pid) -> bool:
            return slave.worker_pid("ha") not in (0, pid)

        wait_until(restarted, 30, "the ha worker to be restarted")
    wait_caught_up(slave, end)
    assert_same_log(master, slave, end)
    assert slave.read(layout.worker_field("ha", "restarts")) == 3


@pytest.mark.parametrize("seed", [3])
def test_slave_tree_killed_then_restarted_resumes_from_its_own_end(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    master = start_master(tmp_path, **HB)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **HB)
    end = put(master, 3000, body_bytes=500)
    target = rng.randrange(end // 3, end)
    wait_until(lambda: slave.read(layout.HA_SLAVE_RECEIVED_END) >= target, 60, "the slave to get going")
    import psutil

    tree = psutil.Process(slave.process.pid)
    for proc in [tree, *tree.children(recursive=True)]:
        proc.kill()
    slave.process.wait(10)
    slave = start_slave(tmp_path, port, **HB)
    wait_caught_up(slave, end)
    assert_same_log(master, slave, end)


def test_a_dead_masters_ha_worker_stops_serving(tmp_path: Path) -> None:
    """kill -9 of the master's supervisor: its ha worker exits (as every worker does), so a dead
    or fenced master neither serves nor acknowledges; the slave keeps what it has and retries."""
    import psutil

    master = start_master(tmp_path, **HB)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **HB)
    end = put(master, 500)
    wait_caught_up(slave, end)
    ha = psutil.Process(master.worker_pid("ha"))
    os.kill(master.process.pid, signal.SIGKILL)
    master.process.wait(10)
    ha.wait(10)  # psutil.TimeoutExpired: a clear failure if it goes on serving
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    wait_until(lambda: slave.read(layout.HA_SLAVE_STATE) != layout.SLAVE_CONNECTED, 20, "the slave to notice")
    assert slave.read(layout.WROTE_POSITION) == end
