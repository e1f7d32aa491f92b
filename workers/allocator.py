"""Allocator: keeps the next CommitLog files created before a put needs them.

Mirrors AllocateMappedFileService (rocketmq-format.md §7.6): RocketMQ prepares the next and the
next-next file; so does this worker, with the disk blocks reserved (posix_fallocate) so the put
path never pays for file creation. With `warmMapedFileEnable` it also warms each file it creates
(`MappedFile.warm`: pages faulted in, forced every `flushLeastPagesWhenWarmMapedFile` pages under
SYNC_FLUSH, mlocked) and keeps it locked until the write position has moved past it, as RocketMQ
munlocks a file once it is full. Writes ALLOCATED_UNTIL. Woken by producers, else every 100 ms.
Final pass: nothing (files it created but nobody used are removed by the next recovery).
"""

from __future__ import annotations

import logging
import sys

from rmq_mp.mapped_file import MappedFile, offset_to_file_name
from shm import layout
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.allocator")
FILES_AHEAD = 2


class AllocatorService(ServiceLoop):
    role = "allocator"

    def on_start(self) -> None:
        self.warmed: list[MappedFile] = []
        """Files warmed and mlocked by this worker, oldest first, until writes move past them."""

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
        cfg = self.store.config
        size = cfg.mapped_file_size_commit_log
        target = self.target()
        current = target - (FILES_AHEAD + 1) * size
        while self.warmed and self.warmed[0].file_from_offset < current:
            self.warmed.pop(0).close()  # unmapping unlocks it
        until = self.table.get(layout.ALLOCATED_UNTIL)
        if until >= target:
            return
        directory = self.store.paths.commit_log
        directory.mkdir(parents=True, exist_ok=True)
        for offset in range(max(current, until), target, size):
            path = directory / offset_to_file_name(offset)
            if MappedFile.prepare(path, size, preallocate=True) and cfg.warm_maped_file_enable:
                self.warm(MappedFile(path, size, writable=True))
        self.table.set(layout.ALLOCATED_UNTIL, target)

    def warm(self, mf: MappedFile) -> None:
        cfg = self.store.config
        reason = mf.warm(cfg.flush_least_pages_when_warm_maped_file if self.store.sync_flush else 0)
        if reason:
            log.warning("mlock of %s failed: %s (warmed, not locked)", mf.path.name, reason)
        self.warmed.append(mf)

    def on_exit(self) -> None:
        for mf in self.warmed:
            mf.close()


if __name__ == "__main__":
    sys.exit(main(AllocatorService))
