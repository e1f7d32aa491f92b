"""The recorded RocketMQ 4.9.8 exchange replayed against rmq-mp in both roles.

Slave: a socket plays the recorded master (its chunks, as recorded, answered to our slave's
reports); our slave must end with the recorded slave's commit log and consume queues, byte for
byte. Master: a socket plays the recorded slave's reports to our master serving a copy of the
recorded master's store; our frames must carry exactly the master's bytes under 4.9.8's rules."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from rmq_mp.format import ha_frame
from shm import layout
from tests.ha.pair import start_master, start_slave
from tests.ha.transcript import MASTER_TO_SLAVE, SLAVE_TO_MASTER, chunks
from tests.service import wait_until

END = 94933


def _recv_reports(sock: socket.socket, reader: ha_frame.ReportReader, until: int) -> list[int]:
    """Reports until one reaches ``until`` (socket timeout: a clear failure)."""
    seen: list[int] = []
    while not seen or seen[-1] < until:
        data = sock.recv(4096)
        assert data, f"the slave closed after reporting {seen}"
        seen += reader.feed(data)
    return seen


def test_our_slave_fed_the_recorded_frames_ends_with_the_recorded_slave(
    ha_fixture: Path, tmp_path: Path
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    slave = start_slave(tmp_path, listener.getsockname()[1], haSendHeartbeatInterval="1000")
    conn, _ = listener.accept()
    conn.settimeout(30)
    reader = ha_frame.ReportReader()
    reports = _recv_reports(conn, reader, 0)
    assert reports[0] == 0, "an empty slave's first report is 0"
    for chunk in chunks(ha_fixture):
        if chunk.direction == MASTER_TO_SLAVE:
            conn.sendall(chunk.data)
    reports += _recv_reports(conn, reader, END)
    recorded = ha_frame.ReportReader().feed(
        b"".join(c.data for c in chunks(ha_fixture) if c.direction == SLAVE_TO_MASTER)
    )
    assert set(reports) <= set(recorded), "a report of an end the recorded slave never had"
    wait_until(lambda: slave.read(layout.REPUT_FROM_OFFSET) >= END, 30, "the slave to dispatch")
    assert slave.stop() == 0
    conn.close()
    listener.close()
    ours, theirs = slave.root, ha_fixture / "slave-store"
    name = "commitlog/00000000000000000000"
    assert (ours / name).read_bytes() == (theirs / name).read_bytes()
    queue_files = sorted(p.relative_to(theirs) for p in (theirs / "consumequeue").rglob("*") if p.is_file())
    assert len(queue_files) == 4
    for rel in queue_files:
        assert (ours / rel).read_bytes() == (theirs / rel).read_bytes(), rel


def _copy_store(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_our_master_answers_the_recorded_reports_with_the_recorded_bytes(
    ha_fixture: Path, tmp_path: Path
) -> None:
    _copy_store(ha_fixture / "master-store", tmp_path / "master")
    master = start_master(tmp_path, haSendHeartbeatInterval="1000")
    assert master.read(layout.WROTE_POSITION) == END
    port = master.read(layout.HA_LISTEN_PORT)
    log = (ha_fixture / "master-store" / "commitlog" / "00000000000000000000").read_bytes()
    recorded = ha_frame.ReportReader().feed(
        b"".join(c.data for c in chunks(ha_fixture) if c.direction == SLAVE_TO_MASTER)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(ha_frame.encode_report(recorded[0]))
        frames = ha_frame.FrameReader()
        received: list[ha_frame.Frame] = []
        data_end = 0
        while data_end < END:
            data = sock.recv(1 << 16)
            assert data, "the master closed the connection"
            for frame in frames.feed(data):
                assert frame.phy_offset == data_end, "frames are contiguous from the requested offset"
                assert len(frame.data) <= 32768
                received.append(frame)
                data_end += len(frame.data)
        assert b"".join(f.data for f in received) == log[:END]
        for value in recorded[1:]:
            sock.sendall(ha_frame.encode_report(value))
        wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == END, 30, "the master to take the acks")
        assert master.read(layout.ha_connection_field(0, "acked")) == END
        # Idle: heartbeats at the end, as the recorded master's (94933, 0).
        idle: list[ha_frame.Frame] = []
        while not idle:
            data = sock.recv(4096)
            assert data, "the master closed the connection"
            idle = frames.feed(data)
        assert (idle[0].phy_offset, idle[0].data) == (END, b"")
        # A later report beyond the end closes the connection (RocketMQ #3015).
        sock.sendall(ha_frame.encode_report(END + 1))
        while sock.recv(4096):
            pass
    wait_until(lambda: master.read(layout.HA_DROPPED) == 1, 10, "the drop to be counted")
    assert master.read(layout.HA_CONNECTIONS) == 0
