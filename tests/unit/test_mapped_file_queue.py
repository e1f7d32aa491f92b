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
