"""RocketMQ 4.9.8's HA wire format (`store/ha`; docs/replication.md): bytes only.

slave -> master: a bare stream of 8-byte big-endian signed offsets, each the slave's commit-log
end (`encode_report`; `ReportReader` keeps the last whole one, as HAConnection's reader does).
master -> slave: frames of a 12-byte header (8-byte big-endian physical offset of the first data
byte, 4-byte big-endian length) and that many commit-log bytes; length 0 is a heartbeat
(`encode_header`; `FrameReader` takes them apart from chunks that mean nothing on their own).
No handshake, version or checksum. Chunk boundaries carry no meaning in either direction.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from rmq_mp.errors import HaProtocolError

HEADER_BYTES = 12
REPORT_BYTES = 8
JAVA_LONG_MAX = (1 << 63) - 1
MAX_FRAME_BYTES = 4 * 1024 * 1024 - HEADER_BYTES
"""The largest frame a Java slave can take in (its 4 MiB read buffer holds header and data)."""

_HEADER = struct.Struct(">qi")
_REPORT = struct.Struct(">q")


def encode_header(phy_offset: int, length: int) -> bytes:
    """The header of a frame of ``length`` commit-log bytes from ``phy_offset`` (0: heartbeat)."""
    if not 0 <= phy_offset <= JAVA_LONG_MAX or not 0 <= length <= MAX_FRAME_BYTES:
        raise HaProtocolError(f"no HA frame has offset {phy_offset} and length {length}")
    return _HEADER.pack(phy_offset, length)


def decode_header(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(phy_offset, length) of a 12-byte header; `HaProtocolError` for one no master sends."""
    phy_offset, length = _HEADER.unpack(data)
    if phy_offset < 0 or not 0 <= length <= MAX_FRAME_BYTES:
        raise HaProtocolError(f"HA frame header with offset {phy_offset} and length {length}")
    return phy_offset, length


def encode_report(phy_offset: int) -> bytes:
    """A slave's report of its commit-log end."""
    if not 0 <= phy_offset <= JAVA_LONG_MAX:
        raise HaProtocolError(f"no HA report carries offset {phy_offset}")
    return _REPORT.pack(phy_offset)


class ReportReader:
    """The master's side of the reports: bytes in, whole 8-byte values out. A partial value waits
    for its rest (RocketMQ keeps only whole values too)."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[int]:
        """The whole reports ``data`` completes, in order; a negative one is `HaProtocolError`."""
        self._pending += data
        whole = len(self._pending) - len(self._pending) % REPORT_BYTES
        values = [v for (v,) in _REPORT.iter_unpack(self._pending[:whole])]
        del self._pending[:whole]
        if any(v < 0 for v in values):
            raise HaProtocolError(f"HA report of a negative offset: {min(values)}")
        return values

    def feed_latest(self, data: bytes | bytearray | memoryview, first: bool) -> list[int]:
        """What a master needs of the whole reports ``data`` completes: with ``first`` (none came
        before on the connection) that one, then the highest of the rest if any; a negative one
        is `HaProtocolError`. `feed`'s checks without a Python int per report: a peer streaming
        reports made the master's loop walk 8,192 of them a read (bench/ha_report_flood.py)."""
        self._pending += data
        count = len(self._pending) // REPORT_BYTES
        if not count:
            return []
        values = np.frombuffer(self._pending, dtype=">i8", count=count)
        lowest = int(values.min())
        latest = [int(values[0])] if first else []
        rest = values[1:] if first else values
        if len(rest):
            latest.append(int(rest.max()))
        del values, rest  # views of the bytearray: resizing it needs them gone
        del self._pending[: count * REPORT_BYTES]
        if lowest < 0:
            raise HaProtocolError(f"HA report of a negative offset: {lowest}")
        return latest


class Frame(NamedTuple):
    """A tuple (the slave makes one per 32 KiB of log and unpacks it in one step; 0.23 us to
    make against a frozen dataclass's 0.31, timeit)."""

    phy_offset: int
    data: bytes | memoryview
    """Empty for a heartbeat; a view of `FrameBuffer`'s buffer from that reader."""


class FrameReader:
    """The slave's side: chunks in, frames out. Holds at most one header and one frame's data,
    so a reader bounds its memory by `MAX_FRAME_BYTES` and the batch size it accepts."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._pending = bytearray()

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def needed(self) -> int:
        """Bytes the next whole frame still lacks (the header's at least)."""
        if len(self._pending) < HEADER_BYTES:
            return HEADER_BYTES - len(self._pending)
        _offset, length = decode_header(self._pending[:HEADER_BYTES])
        return max(0, HEADER_BYTES + length - len(self._pending))

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """The whole frames ``data`` completes, in order."""
        self._pending += data
        frames: list[Frame] = []
        start = 0
        view = self._pending
        while len(view) - start >= HEADER_BYTES:
            phy_offset, length = decode_header(view[start : start + HEADER_BYTES])
            if length > self.max_frame_bytes:
                raise HaProtocolError(
                    f"HA frame of {length} bytes at {phy_offset}, over the {self.max_frame_bytes} accepted"
                )
            end = start + HEADER_BYTES + length
            if end > len(view):
                break
            frames.append(Frame(phy_offset, bytes(view[start + HEADER_BYTES : end])))
            start = end
        del self._pending[:start]
        return frames


class FrameBuffer:
    """`FrameReader` without its copies, for the slave's receive path: a socket reads straight
    into one preallocated buffer (`space`, then `filled`), and whole frames come out as views of
    it, valid until the next `space`. The buffer holds a largest frame and one read, so memory
    stays bounded as with `FrameReader` (back-pressure: nothing is read beyond that)."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, read_bytes: int = 1 << 18) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.read_bytes = read_bytes
        self._buf = bytearray(HEADER_BYTES + max_frame_bytes + read_bytes)
        self._view = memoryview(self._buf)
        self._start = 0
        """The first byte not yet handed out as part of a frame."""
        self._end = 0
        """The end of the bytes read."""

    @property
    def pending_bytes(self) -> int:
        return self._end - self._start

    def space(self) -> memoryview:
        """Where the next read goes, ``read_bytes`` long. A partial frame left at the buffer's
        end is moved to its start first (what is left is under one whole frame, so the space is
        always there); the views `filled` handed out before are invalid from here."""
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < self.read_bytes:
            rest = bytes(self._view[self._start : self._end])
            self._buf[: len(rest)] = rest
            self._start, self._end = 0, len(rest)
        return self._view[self._end : self._end + self.read_bytes]

    def filled(self, nbytes: int) -> list[Frame]:
        """The whole frames the ``nbytes`` just read into `space` complete, in order."""
        self._end += nbytes
        frames: list[Frame] = []
        view, at, end = self._view, self._start, self._end
        unpack, most = _HEADER.unpack_from, self.max_frame_bytes
        while end - at >= HEADER_BYTES:
            phy_offset, length = unpack(view, at)
            if phy_offset < 0 or not 0 <= length <= most:
                decode_header(view[at : at + HEADER_BYTES])  # its error, for one no master sends
                raise HaProtocolError(
                    f"HA frame of {length} bytes at {phy_offset}, over the {self.max_frame_bytes} accepted"
                )
            stop = at + HEADER_BYTES + length
            if stop > end:
                break
            frames.append(Frame(phy_offset, view[at + HEADER_BYTES : stop]))
            at = stop
        self._start = at
        return frames
