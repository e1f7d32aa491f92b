"""TransientStorePool: shared-memory write buffers, one per commit-log file being written.

Mirrors `TransientStorePool` (docs/format.md §7.5) across processes: `transientStorePoolSize`
segments of `mappedFileSizeCommitLog` bytes, created and mlocked by the supervisor. Producers
append into the buffer serving the current file; the committer copies committed bytes to the
file and returns the buffer once its file is wholly committed. Which file a buffer serves is in
the pointer table (`layout.pool_file_offset`: borrowed under the put lock, returned without it,
which that function's docstring shows safe). Buffers are shared
memory, so they outlive a crashed supervisor, which commits what they hold before recovering.
"""

from __future__ import annotations

from shm import layout
from shm.pointer_table import PointerTable
from shm.segment import SharedSegment

FREE = -1


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
