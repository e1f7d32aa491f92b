"""MappedFileQueue.flush with a page threshold (RocketMQ's `isAbleToFlush`), on real files."""

from __future__ import annotations

from pathlib import Path

from rmq_mp.store.mapped_file import OS_PAGE_SIZE
from rmq_mp.store.mapped_file_queue import MappedFileQueue
from rmq_mp.store.reporter import Reporter


def test_flush_waits_for_least_pages_unless_the_file_is_full(tmp_path: Path) -> None:
    size = 4 * OS_PAGE_SIZE
    mfq = MappedFileQueue(tmp_path, size, writable=True, reporter=Reporter())
    first = mfq.ensure_file(0)
    first.fill(0, b"x" * 100)
    first.wrote_position = first.committed_position = 100
    assert not mfq.flush(least_pages=2), "under 2 dirty pages: not yet"
    assert mfq.flushed_where == 0
    first.fill(100, b"y" * (2 * OS_PAGE_SIZE))
    first.wrote_position = first.committed_position = 100 + 2 * OS_PAGE_SIZE
    assert mfq.flush(least_pages=2)
    assert mfq.flushed_where == 100 + 2 * OS_PAGE_SIZE
    first.wrote_position = first.committed_position = size  # full: flushed whatever is dirty
    second = mfq.ensure_file(size)
    second.fill(0, b"z" * 10)
    second.wrote_position = second.committed_position = 10
    assert mfq.flush(least_pages=2)
    assert mfq.flushed_where == size, "the full file flushed, the new one's 10 bytes not yet"
    assert mfq.flush(least_pages=0)
    assert mfq.flushed_where == size + 10
    for mf in mfq.files:
        mf.close()


def test_ensure_file_below_the_first_mapped_segment_maps_that_segment(tmp_path: Path) -> None:
    """A view mapped from a later file (a slave's ha worker maps its log's tail) asked for an
    older file maps it in front, and keeps what it had mapped: it once returned the last
    segment, so a returning old master compared the wrong file's bytes with its new master's."""
    size = OS_PAGE_SIZE
    writer = MappedFileQueue(tmp_path, size, writable=True, reporter=Reporter())
    for i in range(4):
        writer.ensure_file(i * size).fill(0, bytes([i + 1]) * size)
    view = MappedFileQueue(tmp_path, size, writable=False, reporter=Reporter())
    view.ensure_range(3 * size, 3 * size)
    tail = view.files[-1]
    got = view.ensure_file(size)
    assert got.file_from_offset == size
    assert bytes(got.buf[:4]) == b"\x02" * 4
    assert [mf.file_from_offset for mf in view.files] == [size, 2 * size, 3 * size]
    assert view.files[-1] is tail
    assert view.find_mapped_file_by_offset(2 * size + 5) is view.files[1]
    for mf in [*writer.files, *view.files]:
        mf.close()
