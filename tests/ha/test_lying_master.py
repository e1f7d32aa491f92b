"""A real slave against a scripted master on loopback that lies: frames at the wrong offset,
over the size a slave takes, bytes that are no record, records cut by a hang-up. The slave
never makes readable (WROTE_POSITION) a byte that is not the true log's, keeps no refused byte
in its files, says why it refuses, and then follows an honest master to the same bytes, without
a restart or a fork set aside."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rmq_mp.format import ha_frame, record
from shm import layout
from tests.ha.pair import commit_log, put, start_master, start_slave
from tests.service import RunningService, wait_until

FILE_BYTES = 1 << 20
BATCH_BYTES = 32 << 10


@pytest.fixture(scope="module")
def true_log(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real master's commit log: 60 records, about 13 KB."""
    tmp = tmp_path_factory.mktemp("source")
    source = start_master(tmp, "source")
    end = put(source, 60)
    assert source.stop() == 0
    return commit_log(source)["00000000000000000000"][:end]


def record_starts(log: bytes) -> list[int]:
    starts, at = [], 0
    while at < len(log):
        starts.append(at)
        at += record.peek_total_size(log, at)
    return starts


def frame(offset: int, data: bytes) -> bytes:
    return ha_frame.encode_header(offset, len(data)) + data


class Master:
    """The scripted master: one listener, one session at a time."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(30)
        self.port = self.listener.getsockname()[1]

    def session(self) -> tuple[socket.socket, int]:
        """The slave's next connection and its first report."""
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        report = b""
        while len(report) < 8:
            report += conn.recv(8 - len(report))
        return conn, struct.unpack(">q", report)[0]


@pytest.fixture
def liar(tmp_path: Path) -> Iterator[tuple[Master, RunningService]]:
    master = Master()
    slave = start_slave(tmp_path, master.port)
    try:
        yield master, slave
    finally:
        master.listener.close()
        assert slave.stop() == 0


def refused(conn: socket.socket) -> None:
    """Wait for the slave to close the connection (a refusal)."""
    with conn:
        try:
            while conn.recv(65536):
                pass
        except ConnectionResetError:
            pass


def ha_lines(slave: RunningService, text: str) -> list[str]:
    return [line for line in (slave.root / "logs" / "ha.log").read_text().splitlines() if text in line]


def slave_file(slave: RunningService) -> bytes:
    """The slave's first commit-log file (none before its first write: empty)."""
    if not (slave.root / "commitlog").is_dir():
        return b""
    return commit_log(slave).get("00000000000000000000", b"")


def assert_true_so_far(slave: RunningService, log: bytes) -> None:
    """What the slave holds is a prefix of the true log that ends at a record, nothing after it."""
    wrote, received = slave.read(layout.WROTE_POSITION), slave.read(layout.HA_SLAVE_RECEIVED_END)
    data = slave_file(slave)
    assert wrote in [*record_starts(log), len(log)]
    assert data[:wrote] == log[:wrote]
    assert received >= wrote
    assert data[wrote:received] == log[wrote:received]  # a record's head the master really sent
    assert not any(data[received : received + BATCH_BYTES + 1024])


def honest(master: Master, slave: RunningService, log: bytes) -> None:
    """Serve the true log from wherever the slave asks, until it has it all."""
    conn, first = master.session()
    with conn:
        at = 0 if first == 0 else first
        while at < len(log):
            data = log[at : at + BATCH_BYTES]
            conn.sendall(frame(at, data))
            at += len(data)
        wait_until(
            lambda: slave.read(layout.WROTE_POSITION) == len(log), 30, "the slave to take the true log"
        )
    assert slave_file(slave)[: len(log)] == log
    assert not any(slave_file(slave)[len(log) : len(log) + BATCH_BYTES])


def _garbage_after_records(log: bytes, first: int, cut: int) -> bytes:
    return frame(first, log[first:cut] + b"\xab" * 300)


def _size_past_the_file(log: bytes, first: int, cut: int) -> bytes:
    head = struct.pack(">ii", FILE_BYTES, record.MESSAGE_MAGIC_CODE)
    return frame(first, log[first:cut] + head)


def _fields_that_do_not_parse(log: bytes, first: int, cut: int) -> bytes:
    bad = bytearray(log[cut : cut + record.peek_total_size(log, cut)])
    bad[-3:] = b"\xff\xfe\xfd"  # the last properties bytes: not UTF-8
    return frame(first, log[first:cut] + bytes(bad))


def _fields_that_do_not_parse_then_records(log: bytes, first: int, cut: int) -> bytes:
    size = record.peek_total_size(log, cut)
    bad = bytearray(log[cut : cut + size])
    bad[-3:] = b"\xff\xfe\xfd"
    return frame(first, log[first:cut] + bytes(bad) + log[cut + size : cut + size + 2000])


def _offset_jumps_forward(log: bytes, first: int, cut: int) -> bytes:
    return frame(first, log[first:cut]) + frame(cut + 100, log[cut + 100 : cut + 200])


def _offset_goes_back(log: bytes, first: int, cut: int) -> bytes:
    return frame(first, log[first:cut]) + frame(first, log[first:cut])


def _frame_over_the_bound(log: bytes, first: int, cut: int) -> bytes:
    return frame(first, log[first:cut]) + struct.pack(">qi", cut, ha_frame.MAX_FRAME_BYTES + 1)


def _heartbeat_elsewhere(log: bytes, first: int, cut: int) -> bytes:
    return frame(first, log[first:cut]) + ha_frame.encode_header(cut + 8, 0)


LIES: dict[str, tuple[Callable[[bytes, int, int], bytes], str]] = {
    "garbage after whole records": (_garbage_after_records, "no record at {cut} of the master's bytes"),
    "a record size past its file": (_size_past_the_file, "no record at {cut} of the master's bytes"),
    "a record whose fields do not parse": (_fields_that_do_not_parse, "no whole record at {cut}"),
    "a record whose fields do not parse, then records": (
        _fields_that_do_not_parse_then_records,
        "no whole record at {cut}",
    ),
    "an offset that jumps forward": (
        _offset_jumps_forward,
        "frame at {cut_100}, but this slave's end is {cut}",
    ),
    "an offset that goes back": (_offset_goes_back, "but this slave's end is {cut}"),
    "a frame over the bound": (_frame_over_the_bound, "HA frame header with offset {cut} and length"),
    "a heartbeat elsewhere": (_heartbeat_elsewhere, "frame at {jump}, but this slave's end is {cut}"),
}


@pytest.mark.parametrize("lie", LIES)
def test_a_lying_master_is_refused_then_an_honest_one_followed(
    liar: tuple[Master, RunningService], true_log: bytes, lie: str
) -> None:
    """Two lies, one on an empty slave and one on a slave holding records (probed first): each
    refused with one line naming it, the slave's log a true prefix that ends at a record and
    nothing after it; then the honest master is followed to the same bytes."""
    master, slave = liar
    pid = slave.worker_pid("ha")
    starts = record_starts(true_log)
    lie_bytes, why = LIES[lie]
    for number, cut in enumerate((starts[7], starts[30]), start=1):
        conn, first = master.session()  # holding records, the slave asks from an earlier one
        conn.sendall(lie_bytes(true_log, first, cut))
        refused(conn)
        line = why.format(cut=cut, jump=cut + 8, cut_100=cut + 100)
        times = 1 if "{cut}" in why else number
        wait_until(lambda: len(ha_lines(slave, line)) == times, 20, f"the refusal: {line}")  # noqa: B023
        assert_true_so_far(slave, true_log)
        assert slave.read(layout.HA_SLAVE_RECEIVED_END) <= cut  # a read's frames before a bad
        # header may be dropped with it
    honest(master, slave, true_log)
    assert slave.worker_pid("ha") == pid
    assert slave.read(layout.worker_field("ha", "restarts")) == 0
    assert not (slave.root / "diverged").exists()


def test_a_record_cut_by_a_hang_up_is_never_readable_and_resumes(
    liar: tuple[Master, RunningService], true_log: bytes
) -> None:
    master, slave = liar
    starts = record_starts(true_log)
    middle = starts[12] + 50
    conn, first = master.session()
    with conn:
        conn.sendall(frame(first, true_log[:middle]))
        wait_until(lambda: slave.read(layout.HA_SLAVE_RECEIVED_END) == middle, 20, "the cut record's head")
    wait_until(lambda: slave.read(layout.WROTE_POSITION) == starts[12], 20, "the whole records readable")
    assert_true_so_far(slave, true_log)
    honest(master, slave, true_log)


def test_a_first_frame_ending_past_the_largest_offset_is_refused(
    liar: tuple[Master, RunningService], true_log: bytes
) -> None:
    """An empty slave takes a first frame at any file start (RocketMQ's slave does: its log then
    begins there), but not one whose end no report can carry (a Java long): it would hold a log
    it can never acknowledge, every report failing. Nothing is written; an honest master is then
    followed from 0."""
    master, slave = liar
    last_file = ha_frame.JAVA_LONG_MAX // FILE_BYTES * FILE_BYTES
    blank = struct.pack(">ii", FILE_BYTES - len(true_log), record.BLANK_MAGIC_CODE)
    data = true_log + blank + bytes(FILE_BYTES - len(true_log) - len(blank))
    conn, first = master.session()
    assert first == 0
    conn.sendall(frame(last_file, data))
    refused(conn)
    line = f"frame of {FILE_BYTES} bytes at {last_file} ends past the largest offset"
    wait_until(lambda: len(ha_lines(slave, line)) == 1, 20, f"the refusal: {line}")
    assert slave.read(layout.MIN_OFFSET) == 0
    assert slave.read(layout.HA_SLAVE_RECEIVED_END) == 0
    honest(master, slave, true_log)
    assert slave.read(layout.worker_field("ha", "restarts")) == 0


def test_records_sent_just_before_a_hang_up_are_readable(
    liar: tuple[Master, RunningService], true_log: bytes
) -> None:
    """The master's last frame and its close read in one receive (a master killed -9 right after
    it sent): the whole records of that frame are readable on the slave at once. They were
    walked but not published, the read of the close raising first, so WROTE_POSITION stayed
    below HA_SLAVE_RECEIVED_END until another master connected (test_sync_master's kill -9 of
    a SYNC_MASTER's tree timed out on them twice in 12 runs)."""
    master, slave = liar
    starts = record_starts(true_log)
    conn, first = master.session()
    conn.sendall(frame(first, true_log[: starts[20]]))
    conn.close()  # the close's FIN behind the frame: one receive reads both
    wait_until(lambda: slave.read(layout.HA_SLAVE_RECEIVED_END) == starts[20], 20, "the frame received")
    wait_until(lambda: slave.read(layout.WROTE_POSITION) == starts[20], 20, "its records readable")
    assert_true_so_far(slave, true_log)
    honest(master, slave, true_log)
