"""`ha_frame.FrameBuffer.run` (`_scan.frame_run`), the slave's steady-state take of a read's frames
(workers/ha.py `_take`), against the reference it replaces: `FrameBuffer.filled` and
`ha_frame.append_file` a frame at a time (`_apply`). The same byte streams (random frame sizes,
heartbeats, frames at another offset, frames crossing a file, bad headers, file boundaries, any
split into reads) go to both; the log written, the end, the bytes left in the buffer and the
error (type and text) must be the same, and a run's pieces lie in one file."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_mp.errors import HaProtocolError
from rmq_mp.format import ha_frame, native

pytestmark = pytest.mark.skipif(
    native.scan.active is None, reason=f"the compiled scan is not used: {native.scan.why_reference}"
)

MAX_FRAME = 300
READ_BYTES = 512


class Slave:
    """A slave's log as `_apply` and `_write_pending` leave it: the bytes from ``base`` on."""

    def __init__(self, end: int, file_size: int) -> None:
        self.base = self.end = end
        self.file_size = file_size
        self.log = bytearray()
        self.frames = ha_frame.FrameBuffer(MAX_FRAME, READ_BYTES)

    def write(self, pieces: list[bytes | memoryview], at: int) -> None:
        """Pieces that continue the end, in one file (each write of the slave's is one pwritev)."""
        assert at == self.end
        data = b"".join(pieces)
        assert at // self.file_size == (at + len(data) - 1) // self.file_size, "a write spans two files"
        self.log += data
        self.end += len(data)

    def apply(self, frames: list[ha_frame.Frame]) -> None:
        """The reference: `_apply` a frame at a time, pending pieces written per file, also
        when a frame is refused (`_receive`'s finally)."""
        pending: list[bytes | memoryview] = []
        pending_file = pending_end = 0
        try:
            for start, data in frames:
                file_start = ha_frame.append_file(
                    pending_end if pending else self.end, start, len(data), self.file_size
                )
                if file_start is None:
                    continue
                if pending and file_start != pending_file:
                    self.write(pending, pending_end - sum(len(p) for p in pending))
                    pending = []
                if not pending:
                    pending_file = file_start
                assert isinstance(data, memoryview)
                pending.append(data)
                pending_end = start + len(data)
        finally:
            if pending:
                self.write(pending, pending_end - sum(len(p) for p in pending))

    def read_reference(self, chunk: bytes) -> None:
        self.frames.space()[: len(chunk)] = chunk
        self.apply(self.frames.filled(len(chunk)))

    def read_run(self, chunk: bytes) -> None:
        """As `HaSlave._take` with the compiled scan, for a slave with a non-empty log."""
        self.frames.space()[: len(chunk)] = chunk
        nbytes, why = len(chunk), ha_frame.RUN_FILE
        while why == ha_frame.RUN_FILE:
            pieces, end, why = self.frames.run(nbytes, self.end, self.file_size)
            nbytes = 0
            if pieces:
                self.write(pieces, self.end)
                assert self.end == end
            else:
                assert end == self.end
        if why == ha_frame.RUN_REFER:
            self.apply(self.frames.filled(0))


def outcome(stream: bytes, cuts: list[int], end: int, file_size: int, run: bool) -> tuple[object, ...]:
    slave = Slave(end, file_size)
    error = None
    at = 0
    try:
        for cut in [*cuts, len(stream)]:
            chunk = stream[at:cut]
            at = cut
            if chunk:
                (slave.read_run if run else slave.read_reference)(chunk)
    except HaProtocolError as exc:
        error = str(exc)
    return bytes(slave.log), slave.end, slave.frames.pending_bytes, error


def body(offset: int, length: int) -> bytes:
    return bytes((offset + i) % 251 for i in range(length))


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """(stream, the slave's end, file size): a master's frames from that end, with faults."""
    file_size = draw(st.sampled_from([64, 100, 257, 1000]))
    end = at = draw(st.integers(1, 3 * file_size))
    out = bytearray()
    for _ in range(draw(st.integers(0, 24))):
        kind = draw(st.sampled_from(["data"] * 8 + ["heartbeat"] * 2 + ["other", "cross", "bad", "tail"]))
        room = file_size - at % file_size
        if kind == "heartbeat":
            out += ha_frame.encode_header(at, 0)
        elif kind == "data" or kind == "tail":
            length = room if kind == "tail" else draw(st.integers(1, min(room, MAX_FRAME)))
            if length > MAX_FRAME:
                length = MAX_FRAME
            out += ha_frame.encode_header(at, length) + body(at, length)
            at += length
        elif kind == "other":
            offset = draw(st.integers(0, 4 * file_size - 1))
            offset += offset >= at  # any offset but the end
            length = draw(st.integers(0, 40))
            out += ha_frame.encode_header(offset, length) + body(offset, length)
        elif kind == "cross":
            length = draw(st.integers(room + 1, room + 40))
            if length <= MAX_FRAME:
                out += ha_frame.encode_header(at, length) + body(at, length)
        else:
            offset, length = draw(
                st.sampled_from([(-1, 4), (at, -1), (at, MAX_FRAME + 1), (-(1 << 62), 0), (at, 1 << 30)])
            )
            out += struct.pack(">qi", offset, length) + bytes(max(0, min(length, 40)))
    return bytes(out), end, file_size


@settings(max_examples=400, deadline=None)
@given(streams(), st.data())
def test_runs_give_the_reference_outcome(case: tuple[bytes, int, int], data: st.DataObject) -> None:
    stream, end, file_size = case
    sizes = data.draw(st.lists(st.integers(1, READ_BYTES), max_size=40))
    cuts, at = [], 0
    for size in sizes:
        at += size
        if at >= len(stream):
            break
        cuts.append(at)
    while len(stream) - (cuts[-1] if cuts else 0) > READ_BYTES:  # no read over READ_BYTES
        cuts.append((cuts[-1] if cuts else 0) + READ_BYTES)
    assert outcome(stream, cuts, end, file_size, run=True) == outcome(stream, cuts, end, file_size, run=False)


@settings(max_examples=60, deadline=None)
@given(streams())
def test_a_split_at_every_position(case: tuple[bytes, int, int]) -> None:
    """Two reads, the stream cut at each byte (a header or a body cut anywhere)."""
    stream, end, file_size = case
    if len(stream) > READ_BYTES:
        stream = stream[:READ_BYTES]
    for cut in range(len(stream) + 1):
        assert outcome(stream, [cut], end, file_size, run=True) == outcome(
            stream, [cut], end, file_size, run=False
        )


def frames(*spec: tuple[int, int]) -> bytes:
    return b"".join(ha_frame.encode_header(o, n) + body(o, n) for o, n in spec)


def run_of(stream: bytes, end: int, file_size: int) -> tuple[list[bytes], int, int, int]:
    buf = ha_frame.FrameBuffer(MAX_FRAME, READ_BYTES)
    buf.space()[: len(stream)] = stream
    pieces, after, why = buf.run(len(stream), end, file_size)
    return [bytes(p) for p in pieces], after, why, buf.pending_bytes


def test_a_run_passes_heartbeats_and_stops_at_a_file_end() -> None:
    stream = frames((90, 10), (100, 0), (100, 5))
    assert run_of(stream, 90, 100) == ([body(90, 10)], 100, ha_frame.RUN_FILE, len(stream) - 34)
    assert run_of(frames((95, 5), (100, 0)), 95, 100) == ([body(95, 5)], 100, ha_frame.RUN_PARTIAL, 0)


def test_a_run_stops_before_a_frame_it_does_not_take() -> None:
    other = frames((10, 5), (16, 5))
    assert run_of(other, 10, 100) == ([body(10, 5)], 15, ha_frame.RUN_REFER, 17)
    crossing = frames((10, 5), (15, 86))
    assert run_of(crossing, 10, 100) == ([body(10, 5)], 15, ha_frame.RUN_REFER, 98)
    partial = frames((10, 5), (15, 20))[:-1]
    assert run_of(partial, 10, 100) == ([body(10, 5)], 15, ha_frame.RUN_PARTIAL, len(partial) - 17)


def test_a_bad_header_anywhere_leaves_the_whole_read_to_the_reference() -> None:
    """`filled` refuses such a read before any of its frames is applied; the run writes none."""
    stream = frames((10, 5)) + struct.pack(">qi", 15, MAX_FRAME + 1)
    assert run_of(stream, 10, 100) == ([], 10, ha_frame.RUN_REFER, len(stream))
    slave = Slave(10, 100)
    with pytest.raises(HaProtocolError, match="over the 300 accepted"):
        slave.read_run(stream)
    assert slave.end == 10


def test_misuse_is_refused() -> None:
    buf = ha_frame.FrameBuffer(MAX_FRAME, READ_BYTES)
    with pytest.raises(ValueError, match="out of range"):
        buf.run(0, 0, 100)  # an empty slave's first frame is the reference's
    assert native.scan.active is not None
    with pytest.raises(ValueError, match="out of range"):
        native.scan.active.frame_run(memoryview(bytearray(8)), 0, 9, 1, 100, MAX_FRAME)
