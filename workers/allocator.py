"""Allocator: keeps the next CommitLog files created before a put needs them.

Mirrors AllocateMappedFileService (rocketmq-format.md §7.6): RocketMQ prepares the next and the
next-next file; so does this worker, with the disk blocks reserved (posix_fallocate) so the put
path never pays for file creation. Writes ALLOCATED_UNTIL. Woken by producers, else every 100 ms.
Final pass: nothing (files it created but nobody used are removed by the next recovery).
"""

from __future__ import annotations

import sys

from rmq_mp.mapped_file import MappedFile, offset_to_file_name
from shm import layout
from workers.service import ServiceLoop, main

FILES_AHEAD = 2


class AllocatorService(ServiceLoop):
    role = "allocator"

    def interval_s(self) -> float:
        return 0.1

    def target(self) -> int:
        """End of the last file to have ready: the current one and FILES_AHEAD more."""
        size = self.store.config.mapped_file_size_commit_log
        wrote = self.table.get(layout.WROTE_POSITION)
        return wrote - wrote % size + (FILES_AHEAD + 1) * size

    def has_work(self) -> bool:
        return self.table.get(layout.ALLOCATED_UNTIL) < self.target()

    def do_work(self) -> None:
        size = self.store.config.mapped_file_size_commit_log
        target = self.target()
        current = target - (FILES_AHEAD + 1) * size
        until = self.table.get(layout.ALLOCATED_UNTIL)
        if until >= target:
            return
        directory = self.store.paths.commit_log
        directory.mkdir(parents=True, exist_ok=True)
        for offset in range(max(current, until), target, size):
            MappedFile.prepare(directory / offset_to_file_name(offset), size, preallocate=True)
        self.table.set(layout.ALLOCATED_UNTIL, target)


if __name__ == "__main__":
    sys.exit(main(AllocatorService))
