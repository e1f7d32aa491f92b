"""The HA wire format (rmq_mp/format/ha_frame.py) against the recorded RocketMQ 4.9.8 exchange."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_mp.errors import HaProtocolError
from rmq_mp.format import ha_frame
from tests.ha.transcript import MASTER_TO_SLAVE, SLAVE_TO_MASTER, chunks, stream


def test_reports_of_the_recorded_slave(ha_fixture: Path) -> None:
    reader = ha_frame.ReportReader()
    values = [v for c in chunks(ha_fixture) if c.direction == SLAVE_TO_MASTER for v in reader.feed(c.data)]
    assert values[0] == 0
    assert values[-1] == 94933
    assert len(values) == 17
    assert values == sorted(values)
    assert b"".join(ha_frame.encode_report(v) for v in values) == stream(ha_fixture, SLAVE_TO_MASTER)


def test_frames_of_the_recorded_master(ha_fixture: Path) -> None:
    reader = ha_frame.FrameReader()
    frames = [f for c in chunks(ha_fixture) if c.direction == MASTER_TO_SLAVE for f in reader.feed(c.data)]
    assert reader.pending_bytes == 0
    assert len(frames) == 18
    assert sum(1 for f in frames if not f.data) == 5
    log = (ha_fixture / "master-store/commitlog/00000000000000000000").read_bytes()
    expected = 0
    for f in frames:
        assert f.phy_offset == expected
        assert len(f.data) <= 32768
        assert f.data == log[f.phy_offset : f.phy_offset + len(f.data)]
        expected += len(f.data)
    assert expected == 94933
    rebuilt = b"".join(ha_frame.encode_header(f.phy_offset, len(f.data)) + f.data for f in frames)
    assert rebuilt == stream(ha_fixture, MASTER_TO_SLAVE)


def test_frames_byte_by_byte(ha_fixture: Path) -> None:
    """Chunk boundaries mean nothing: one byte at a time gives the same frames."""
    data = stream(ha_fixture, MASTER_TO_SLAVE)
    whole = ha_frame.FrameReader().feed(data)
    reader = ha_frame.FrameReader()
    one_by_one = [f for i in range(len(data)) for f in reader.feed(data[i : i + 1])]
    assert one_by_one == whole


def test_partial_report_waits_for_its_rest() -> None:
    reader = ha_frame.ReportReader()
    raw = ha_frame.encode_report(94933) + ha_frame.encode_report(1 << 40)
    assert reader.feed(raw[:5]) == []
    assert reader.feed(raw[5:13]) == [94933]
    assert reader.feed(raw[13:]) == [1 << 40]


@pytest.mark.parametrize(
    "header",
    [
        struct.pack(">qi", -1, 0),
        struct.pack(">qi", 0, -5),
        struct.pack(">qi", 0, ha_frame.MAX_FRAME_BYTES + 1),
    ],
)
def test_hostile_headers_are_refused(header: bytes) -> None:
    with pytest.raises(HaProtocolError):
        ha_frame.FrameReader().feed(header)


def test_frame_over_the_accepted_batch_is_refused() -> None:
    with pytest.raises(HaProtocolError, match="over the 32768 accepted"):
        ha_frame.FrameReader(32768).feed(ha_frame.encode_header(0, 32769))


def test_negative_report_is_refused() -> None:
    with pytest.raises(HaProtocolError):
        ha_frame.ReportReader().feed(struct.pack(">q", -8))
    with pytest.raises(HaProtocolError):
        ha_frame.encode_report(-1)


def _through_buffer(buffer: ha_frame.FrameBuffer, data: bytes, sizes: list[int]) -> list[tuple[int, bytes]]:
    """``data`` read into ``buffer`` in reads of ``sizes`` (cycled, each at most its space), as a
    socket's `recv_into` would; each frame copied out before the next read invalidates it."""
    out: list[tuple[int, bytes]] = []
    at, i = 0, 0
    while at < len(data):
        space = buffer.space()
        n = min(len(space), sizes[i % len(sizes)], len(data) - at)
        space[:n] = data[at : at + n]
        out += [(f.phy_offset, bytes(f.data)) for f in buffer.filled(n)]
        at, i = at + n, i + 1
    return out


@pytest.mark.parametrize("sizes", [[1], [7, 12, 13], [4096], [1 << 18], [5, 40000, 3, 70000]])
def test_frame_buffer_gives_the_readers_frames(ha_fixture: Path, sizes: list[int]) -> None:
    """The slave's copy-free reader (`FrameBuffer`): any read sizes give `FrameReader`'s frames,
    with data longer than one read and a partial frame moved to the buffer's start."""
    data = stream(ha_fixture, MASTER_TO_SLAVE)
    data += ha_frame.encode_header(94933, 40000) + bytes(range(256)) * 156 + bytes(64)
    data += ha_frame.encode_header(134933, 100)
    whole = [(f.phy_offset, bytes(f.data)) for f in ha_frame.FrameReader().feed(data)]
    buffer = ha_frame.FrameBuffer(40000, read_bytes=1 << 16)
    assert _through_buffer(buffer, data, sizes) == whole
    assert buffer.pending_bytes == 12  # the last header, waiting for its frame


def test_frame_buffer_refuses_a_frame_over_its_size() -> None:
    buffer = ha_frame.FrameBuffer(32768, read_bytes=64)
    space = buffer.space()
    assert len(space) == 64
    space[:12] = ha_frame.encode_header(0, 32769)
    with pytest.raises(HaProtocolError, match="over the 32768 accepted"):
        buffer.filled(12)


@settings(max_examples=200, deadline=None)
@given(
    reports=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=40),
    cuts=st.lists(st.integers(0, 8 * 40), max_size=6),
)
def test_the_latest_reports_are_the_readers(reports: list[int], cuts: list[int]) -> None:
    """`feed_latest` (the master's: the first report, then the highest of each read's rest)
    against `feed`, over any cut of the stream: the same values kept, the same refusal."""
    raw = b"".join(struct.pack(">q", v) for v in reports)
    bounds = sorted({0, len(raw), *(c for c in cuts if c <= len(raw))})
    whole, latest = ha_frame.ReportReader(), ha_frame.ReportReader()
    first = True
    for start, stop in itertools.pairwise(bounds):
        chunk = raw[start:stop]
        try:
            expected = whole.feed(chunk)
        except HaProtocolError:
            with pytest.raises(HaProtocolError):
                latest.feed_latest(chunk, first)
            return
        got = latest.feed_latest(chunk, first)
        if first and expected:
            assert got[0] == expected.pop(0)
            got, first = got[1:], False
        assert got == ([max(expected)] if expected else [])
