"""TransientStorePool: shared-memory write buffers, one per commit-log file being written.

Mirrors `TransientStorePool` (docs/format.md §7.5) across processes: `transientStorePoolSize`
segments of `mappedFileSizeCommitLog` bytes, created and mlocked by the supervisor. Producers
append into the buffer serving the current file; the committer copies committed bytes to the
file and returns the buffer once its file is wholly committed. Which file a buffer serves is in
the pointer table (`layout.pool_file_offset`: borrowed under the put lock, returned without it,
which that function's docstring shows safe). Buffers are shared
memory, so they outlive a crashed supervisor, which commits what they hold before recovering.

The supervisor's mlock makes a buffer's pages resident, but each producer maps the buffers itself
and its mapping starts without page-table entries: every first write to a 4 KiB page was a
minor fault (about 0.9 us here, one per 14 sends of the realistic bench row). `prefault` fills a
producer's entries ahead of the write position, PREFAULT_BYTES at a time, with one
MADV_POPULATE_WRITE (about 0.3 us a page).
"""

from __future__ import annotations

import mmap

from shm import layout
from shm.pointer_table import PointerTable
from shm.segment import MADV_POPULATE_WRITE, SharedSegment

FREE = -1
PREFAULT_BYTES = 512 << 10
"""How far past the write position a producer keeps its mapping of the pool buffer populated;
it populates again once the write position is within half of this of the populated end (about
64 pages a call, every ~900 sends of 290 B: 20 us, off the put lock)."""
_PAGE = mmap.PAGESIZE


def prefault(buffer: mmap.mmap, position: int, populated_until: int) -> tuple[int, int]:
    """Populate this process's page-table entries of ``buffer`` from the page of ``position``
    (a byte position in the buffer: the write position in its file) to PREFAULT_BYTES past it,
    skipping ``[.., populated_until)``, done before. Returns (populated_until, the position at
    which to call again). Nothing in the buffer changes: the pages are the supervisor's,
    already resident. A kernel without MADV_POPULATE_WRITE (before 5.14) raises OSError."""
    size = len(buffer)
    page = min(max(position, 0), size) // _PAGE * _PAGE
    stop = min(size, page + PREFAULT_BYTES)
    start = max(populated_until, page)
    if start < stop:
        buffer.madvise(MADV_POPULATE_WRITE, start, stop - start)
    populated_until = max(populated_until, stop)
    due = size + 1 if populated_until >= size else populated_until - PREFAULT_BYTES // 2
    return populated_until, due


class TransientPool:
    def __init__(self, table: PointerTable, buffers: list[SharedSegment]) -> None:
        self.table = table
        self.buffers = buffers

    def file_offset(self, index: int) -> int:
        return self.table.get(layout.pool_file_offset(index))

    def buffer_for(self, file_offset: int) -> int:
        """Index of the buffer serving ``file_offset``'s file, or -1."""
        for i in range(len(self.buffers)):
            if self.file_offset(i) == file_offset:
                return i
        return -1

    def borrow(self, file_offset: int) -> int:
        """Assign a free buffer to a file (put lock held). -1 when none is free."""
        for i in range(len(self.buffers)):
            if self.file_offset(i) == FREE:
                self.table.set(layout.pool_file_offset(i), file_offset)
                return i
        return -1

    def give_back(self, index: int) -> None:
        """Return a buffer whose file is wholly committed (the committer, without the put lock:
        `layout.pool_file_offset` says why none is needed)."""
        self.table.set(layout.pool_file_offset(index), FREE)

    def in_use(self) -> int:
        return len(self.buffers) - self.available()

    def available(self) -> int:
        return sum(1 for i in range(len(self.buffers)) if self.file_offset(i) == FREE)
