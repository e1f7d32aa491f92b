"""Allocator: keeps the next CommitLog files created, and disk blocks reserved, before a put
needs them.

Mirrors AllocateMappedFileService (docs/format.md §7.6): RocketMQ prepares the next and the
next-next file; so does this worker, sparse, so the put path never creates a file. Disk blocks
(posix_fallocate) are reserved a bounded distance ahead, one file size past the write position
(topped up once less than half of that is left), and published as ALLOCATED_UNTIL: the put path
writes below it without a system call and reserves for itself only if it ever gets past it
(`Appender.reserve`). So an idle store holds about one file of blocks, not three, and a full
disk is an OSError here (retried every RESERVE_RETRY_S) or a refused put, never a SIGBUS.

With `warmMapedFileEnable` it also warms each file it creates (`MappedFile.warm`: the file's
blocks reserved, pages faulted in, forced every `flushLeastPagesWhenWarmMapedFile` pages under
SYNC_FLUSH, mlocked): then the current file and the files ahead are reserved whole, as RocketMQ's
warmed files are written whole. It keeps each locked until the write position has moved past it,
as RocketMQ munlocks a file once it is full. Runs at nice ALLOCATOR_NICE: work ahead of need
yields the CPU to the put path and dispatch. Woken by producers, else every 100 ms.
Final pass: nothing (files it created but nobody used are removed by the next recovery).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from rmq_mp import file_modes
from rmq_mp.config.store_config import BrokerRole
from rmq_mp.store.mapped_file import OS_PAGE_SIZE, MappedFile, offset_to_file_name, reserve_blocks
from shm import layout
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.allocator")
FILES_AHEAD = 2
"""Files created (sparse) beyond the current one."""
RESERVE_RETRY_S = 1.0
"""After a failed creation or reservation (a full disk), the next try waits this long."""
ALLOCATOR_NICE = 19
"""Creating and warming files ahead is background work. Warming a 64 MiB file is the kernel
zeroing every page (MADV_POPULATE_WRITE): at 400 MB/s of log that was a third of a 2-core
machine, taken from reput and the producers; at nice 19 the `send_batch` row went from
1.52-1.71x to 1.79-1.89x raw append (alternating, bench/NOTES.md 2026-11-26). A put that
reaches a file before it is warmed writes it all the same (RocketMQ's put path does too)."""


class AllocatorService(ServiceLoop):
    role = "allocator"

    def on_start(self) -> None:
        self.warmed: list[MappedFile] = []
        """Files warmed and mlocked by this worker, oldest first, until writes move past them."""
        self.to_warm: list[int] = []
        """Offsets of files this worker created and has not warmed yet."""
        self.created_until = 0
        """End of the files this worker knows exist."""
        self.retry_at = 0.0
        self.failure = ""
        """Why the last pass failed ('' when it did not): logged once, not every retry."""

    def interval_s(self) -> float:
        return 0.1

    def nice(self) -> int:
        """ALLOCATOR_NICE: its work is ahead of need, so it takes what CPU the put path and
        dispatch leave (below)."""
        return ALLOCATOR_NICE

    def files_target(self, wrote: int) -> int:
        """End of the last file to have created: the current one and FILES_AHEAD more."""
        size = self.store.config.mapped_file_size_commit_log
        return wrote - wrote % size + (FILES_AHEAD + 1) * size

    def reserve_target(self, wrote: int) -> int:
        """End of the blocks to have reserved: one file size past the write position, page
        aligned (every file made when files are warmed: warming writes them whole)."""
        if self.store.config.warm_maped_file_enable:
            return self.files_target(wrote)
        end = wrote + self.store.config.mapped_file_size_commit_log
        return end - end % OS_PAGE_SIZE

    def has_work(self) -> bool:
        if time.monotonic() < self.retry_at or self.slave_start_unknown():
            return False
        wrote = self.table.get(layout.WROTE_POSITION)
        slack = (
            0
            if self.store.config.warm_maped_file_enable
            else self.store.config.mapped_file_size_commit_log // 2
        )
        return (
            self.created_until < self.files_target(wrote)
            or self.table.get(layout.ALLOCATED_UNTIL) < self.reserve_target(wrote) - slack
        )

    def slave_start_unknown(self) -> bool:
        """An empty SLAVE's log begins where its master's first frame says (workers/ha_start.py):
        no file is made ahead of that, so none is left below it."""
        t = self.table
        return (
            self.store.config.broker_role is BrokerRole.SLAVE
            and not t.get(layout.WROTE_POSITION)
            and not t.get(layout.HA_SLAVE_RECEIVED_END)
        )

    def do_work(self) -> None:
        size = self.store.config.mapped_file_size_commit_log
        wrote = self.table.get(layout.WROTE_POSITION)
        current = wrote - wrote % size
        while self.warmed and self.warmed[0].file_from_offset < current:
            self.warmed.pop(0).close()  # unmapping unlocks it
        if not self.has_work():
            return
        try:
            self.create_files(current, self.files_target(wrote))
            while self.to_warm:
                if self.left_behind(self.to_warm[0]):  # written whole before we got to it
                    self.to_warm.pop(0)
                    continue
                self.warm(
                    MappedFile(
                        self.store.paths.commit_log / offset_to_file_name(self.to_warm[0]),
                        size,
                        writable=True,
                    )
                )
                self.to_warm.pop(0)
            self.reserve()
        except OSError as exc:
            self.retry_at = time.monotonic() + RESERVE_RETRY_S
            if str(exc) != self.failure:
                log.error(
                    "commit-log files ahead of %d: %s (retrying every %.0f s)", wrote, exc, RESERVE_RETRY_S
                )
            self.failure = str(exc)
            return
        if self.failure:
            log.info("commit-log files ahead of %d reserved again", wrote)
            self.failure = ""

    def create_files(self, current: int, target: int) -> None:
        """Every file of ``[current, target)`` exists, sparse at full length."""
        size = self.store.config.mapped_file_size_commit_log
        directory = self.store.paths.commit_log
        directory.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        for offset in range(max(current, self.created_until), target, size):
            made = MappedFile.prepare(directory / offset_to_file_name(offset), size)
            if made and self.store.config.warm_maped_file_enable:
                self.to_warm.append(offset)
            self.created_until = offset + size

    def left_behind(self, file_offset: int) -> bool:
        """The write position has left the file at ``file_offset``: it is full, and this worker
        must not touch it (see `reserve`)."""
        return (
            self.table.get(layout.WROTE_POSITION)
            >= file_offset + self.store.config.mapped_file_size_commit_log
        )

    def reserve(self) -> None:
        """Blocks from the write position to `reserve_target` reserved, file by file,
        ALLOCATED_UNTIL published after each (a put below it never waits for this).

        The write position is read again right before each file's fallocate, which starts no
        lower than its page and skips a file it has left: the kernel counts every fallocate as a
        modification, even where all the blocks are there (ext4 sets the file's mtime), and a
        full file's mtime is its age to the cleaner (fileReservedTime). A pass that reserved
        from the position it read at its start reserved into files the producers had filled
        since whenever it was held up (nice 19 under load: seconds), resetting their age. What
        is left is the moment between that read and the call."""
        size = self.store.config.mapped_file_size_commit_log
        target = self.reserve_target(self.table.get(layout.WROTE_POSITION))
        start = self.table.get(layout.ALLOCATED_UNTIL)
        while True:
            wrote = self.table.get(layout.WROTE_POSITION)
            start = max(start, wrote - wrote % OS_PAGE_SIZE)
            if start >= target:
                return
            file_offset = start - start % size
            stop = min(target, file_offset + size)
            fd = os.open(self.store.paths.commit_log / offset_to_file_name(file_offset), os.O_RDWR)
            try:
                wrote = self.table.get(layout.WROTE_POSITION)  # the open may have waited
                start = max(start, wrote - wrote % OS_PAGE_SIZE)
                if start < stop:
                    reserve_blocks(fd, start - file_offset, stop - file_offset)
            finally:
                os.close(fd)
            self.table.set(layout.ALLOCATED_UNTIL, stop)
            start = stop

    def warm(self, mf: MappedFile) -> None:
        cfg = self.store.config
        try:
            reason = mf.warm(cfg.flush_least_pages_when_warm_maped_file if self.store.sync_flush else 0)
        except BaseException:
            mf.close()
            raise
        if reason:
            log.warning("mlock of %s failed: %s (warmed, not locked)", mf.path.name, reason)
        self.warmed.append(mf)

    def on_exit(self) -> None:
        for mf in self.warmed:
            mf.close()


if __name__ == "__main__":
    sys.exit(main(AllocatorService))
