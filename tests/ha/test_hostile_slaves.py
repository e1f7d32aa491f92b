"""A real master's HA port against scripted hostile peers on loopback: a flood of peers that
never read, a peer that hangs up while frames wait for it, and report streams no slave sends.
Each bad peer is closed (or refused) with one log line, the good slave keeps following, SYNC_MASTER
puts keep their PUT_OK, and the ha worker is never restarted."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import assert_same_log, put, start_master, start_slave, wait_caught_up
from tests.service import RunningService, wait_until
from workers import ha_listen

SYNC = {"brokerRole": "SYNC_MASTER", "haSendHeartbeatInterval": "1000"}
SMALL_RCVBUF_BYTES = 4096


def _ha_lines(service: RunningService, text: str) -> list[str]:
    return [line for line in (service.root / "logs" / "ha.log").read_text().splitlines() if text in line]


def _deaf_peer(port: int, report: int) -> socket.socket:
    """A peer that sends one report and never reads (a tiny receive buffer: the master's frames
    back up at once)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF_BYTES)
    sock.connect(("127.0.0.1", port))
    sock.sendall(struct.pack(">q", report))
    return sock


def _sync_puts_ok(master: RunningService, count: int) -> None:
    with Producer.attach(master.names.base) as producer:
        for i in range(count):
            result = producer.send("HaTopic", b"sync-%d" % i)
            assert result.status is PutMessageStatus.PUT_OK, result


def _ha_worker_untouched(service: RunningService, pid: int) -> None:
    assert service.worker_pid("ha") == pid
    assert service.read(layout.worker_field("ha", "restarts")) == 0
    assert not _ha_lines(service, "work failed")


def test_a_flood_of_peers_that_never_read_is_refused_past_the_bound(tmp_path: Path) -> None:
    """Unbounded, such a flood wedged the ha worker for good (1,011 peers: select's ValueError
    on descriptor 1024 every pass, its slave cut off); now peers past `MAX_PEERS` are refused at
    accept with one line each, and the good slave and the SYNC_MASTER puts carry on."""
    master = start_master(tmp_path, **SYNC)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port)
    pid = master.worker_pid("ha")
    end = put(master, 400, body_bytes=2000)
    wait_caught_up(slave, end)
    flood = ha_listen.MAX_PEERS + 8
    peers = [_deaf_peer(port, report) for report in [0, 1] * (flood // 2)]
    try:
        refused = flood - (ha_listen.MAX_PEERS - 1)  # the good slave holds one
        wait_until(
            lambda: master.read(layout.HA_REFUSED_PEERS) == refused, 20, "the peers past the bound refused"
        )
        # Published at the end of the pass that accepted them, after the refusals' count.
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == ha_listen.MAX_PEERS, 20, "the bound served")
        assert len(_ha_lines(master, "connections, the most one listener takes")) == refused
        _sync_puts_ok(master, 20)  # the good slave still acknowledges
        end = put(master, 200, body_bytes=2000)
        wait_caught_up(slave, end)
        _ha_worker_untouched(master, pid)
    finally:
        for sock in peers:
            sock.close()
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the flood's connections closed")
    assert slave.stop() == 0
    assert master.stop() == 0
    assert_same_log(master, slave, end)


def test_a_peer_that_hangs_up_while_frames_wait_is_closed_once(tmp_path: Path) -> None:
    """A peer that asks for megabytes, reads none, then half-closes: the master reads its end of
    stream with frames still waiting to go. It used to send them on the socket it had just
    closed: a second line ("closed: [Errno 9] Bad file descriptor") and a drop counted."""
    master = start_master(tmp_path)
    port = master.read(layout.HA_LISTEN_PORT)
    pid = master.worker_pid("ha")
    put(master, 2000, body_bytes=2000)  # 4 MB: far more than the socket buffers hold
    sock = _deaf_peer(port, 1)
    try:
        wait_until(lambda: bool(_ha_lines(master, "asks from 1")), 20, "the master to start sending")
        wait_until(lambda: len(sock.recv(1, socket.MSG_PEEK)) == 1, 20, "the master's first frame")
        sock.shutdown(socket.SHUT_WR)
        name = f"127.0.0.1:{sock.getsockname()[1]}"
        wait_until(lambda: bool(_ha_lines(master, f"slave {name} closed")), 20, "the master to close it")
    finally:
        sock.close()
    put(master, 1)  # one more pass of every connection: nothing left of the closed one
    assert len(_ha_lines(master, f"slave {name} closed")) == 1
    assert master.read(layout.HA_DROPPED) == 0  # it hung up: no drop
    _ha_worker_untouched(master, pid)
    assert master.stop() == 0


HOSTILE_STREAMS = {
    "negative first": struct.pack(">q", -1),
    "negative later": struct.pack(">qq", 0, -(1 << 40)),
    "beyond the end later": struct.pack(">qq", 0, 1 << 62),
    "the largest long later": struct.pack(">qq", 0, (1 << 63) - 1),
    "garbage": b"\xde\xad\xbe\xef" * 4,
    "text": b"GET / HTTP/1.0\r\n\r\n",
}


def test_hostile_report_streams_are_closed_with_one_line_each(tmp_path: Path) -> None:
    """Reports no slave sends, whole or a byte at a time: each peer closed with one line saying
    why, nothing acknowledged, and the good slave and SYNC_MASTER puts unaffected."""
    master = start_master(tmp_path, **SYNC)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port)
    pid = master.worker_pid("ha")
    end = put(master, 100)
    wait_caught_up(slave, end)
    # The slave's report of its end comes after its log reaches it (and a loaded machine can
    # time a SYNC put out before it): the master's ack settles at the end, then must not move.
    wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 30, "the master to see the ack")
    acked = end
    closed = 0
    for _name, stream in HOSTILE_STREAMS.items():
        for chunk_bytes in (len(stream), 1):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                for at in range(0, len(stream), chunk_bytes):
                    sock.sendall(stream[at : at + chunk_bytes])
                name = f"127.0.0.1:{sock.getsockname()[1]}"
                closed += 1
                wait_until(lambda: master.read(layout.HA_DROPPED) == closed, 20, "the peer dropped")  # noqa: B023
                assert len(_ha_lines(master, f"slave {name} closed: ")) == 1
            assert master.read(layout.HA_ACKED_OFFSET) == acked
    _sync_puts_ok(master, 5)
    end = put(master, 50)
    wait_caught_up(slave, end)
    _ha_worker_untouched(master, pid)
    assert slave.stop() == 0
    assert master.stop() == 0
    assert_same_log(master, slave, end)


def test_the_metadata_listener_refuses_peers_past_the_bound(tmp_path: Path) -> None:
    """The metadata channel shares the ha worker's process and descriptors (workers/ha_meta.py):
    its peers are bounded by the same `MAX_PEERS`, one line each past it."""
    master = start_master(tmp_path, haMetaListenPort="0")
    wait_until(lambda: master.read(layout.HA_META_LISTEN_PORT) > 0, 20, "the metadata listener")
    address = ("127.0.0.1", master.read(layout.HA_META_LISTEN_PORT))
    pid = master.worker_pid("ha")
    peers = [socket.create_connection(address, timeout=10) for _ in range(ha_listen.MAX_PEERS + 3)]
    try:
        wait_until(lambda: master.read(layout.HA_META_REFUSED) == 3, 20, "the peers past the bound refused")
        wait_until(
            lambda: master.read(layout.HA_META_CONNECTIONS) == ha_listen.MAX_PEERS, 20, "the bound served"
        )
        assert len(_ha_lines(master, "ha-meta: refused")) == 3
    finally:
        for sock in peers:
            sock.close()
    wait_until(lambda: master.read(layout.HA_META_CONNECTIONS) == 0, 20, "the connections closed")
    _ha_worker_untouched(master, pid)
    assert master.stop() == 0
