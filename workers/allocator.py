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
warmed files are written whole, and published as reserved before the warming starts (warming
three 1 GiB files takes seconds; a put meanwhile would reserve for itself, a MiB at a time). It
keeps each locked until the write position has moved past it, as RocketMQ munlocks a file once
it is full. Without warming, and when producers write the file's mapping themselves (no pool),
it keeps the page cache filled POPULATE_AHEAD_BYTES ahead of the write position instead
(`MappedFile.populate`: clean pages, nothing written, locked or flushed), so a producer's first
store to a page finds it there rather than allocating and zeroing it in its own page fault.
Runs at nice ALLOCATOR_NICE: work ahead of need yields the CPU to the put path and dispatch.
Passes every 100 ms. Final pass: nothing (files it created but nobody used are removed by the
next recovery).
"""

from __future__ import annotations

import errno
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
POPULATE_AHEAD_BYTES = 256 << 20
"""Without warming: how far ahead of the write position the page cache is kept filled, topped
up once half of it is used: 128 MiB is about three 100 ms passes of log at 435 MB/s (a producer
sending 128 B messages with a tag and a key, 290 B records, at 1.5M msgs/s). With 64 MiB that
producer outran the window in some passes of a loaded 2-core machine (2 of 8 windows of 200,000
sends, 0 of 8 with 256 MiB). A producer that outruns it faults its pages in itself, as before.
The producer's page faults that allocated and zeroed those pages were 0.5-0.87 us of system
time a 290 B record, 0-0.12 us with the window (issue 33's comparison row; bench/NOTES.md
2026-11-27, cmpshape). Clean page cache, so the kernel may take it back under memory pressure."""


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
        cfg = self.store.config
        self.populating = not cfg.warm_maped_file_enable and not self.store.pool_enabled
        """Whether to fill the page cache ahead (`populate_ahead`): not when files are warmed
        whole, nor when producers write pool buffers (the committer writes the file)."""
        self.populated_until = 0
        """Commit-log offset up to which this worker has filled the page cache."""
        self.populate_maps: dict[int, MappedFile] = {}
        """Read-only mappings of the files being populated, by first offset."""

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
            or (
                self.populating
                and self.populated_until < self.populate_target(wrote, POPULATE_AHEAD_BYTES // 2)
            )
        )

    def populate_target(self, wrote: int, ahead: int) -> int:
        """Page-aligned end of the page cache to have filled: ``ahead`` past the write position,
        within the files that exist."""
        end = min(wrote + ahead, self.created_until)
        return end - end % OS_PAGE_SIZE

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
            self.reserve()  # before the warming, which takes long
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
            if self.populating:
                self.populate_ahead(wrote)
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

    def populate_ahead(self, wrote: int) -> None:
        """The page cache filled from the write position to POPULATE_AHEAD_BYTES past it, file by
        file (`MappedFile.populate`); mappings of files behind the write position closed. A kernel
        without MADV_POPULATE_READ (before 5.14) turns this off, logged once."""
        size = self.store.config.mapped_file_size_commit_log
        current = wrote - wrote % size
        for offset in [o for o in self.populate_maps if o < current]:
            self.populate_maps.pop(offset).close()
        start = max(self.populated_until, wrote - wrote % OS_PAGE_SIZE)
        target = self.populate_target(wrote, POPULATE_AHEAD_BYTES)
        while start < target:
            file_offset = start - start % size
            stop = min(target, file_offset + size)
            mf = self.populate_maps.get(file_offset)
            if mf is None:
                path = self.store.paths.commit_log / offset_to_file_name(file_offset)
                mf = self.populate_maps[file_offset] = MappedFile(path, size, writable=False)
            try:
                mf.populate(start - file_offset, stop - file_offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.info("page cache not filled ahead of the write position: %s (a kernel before 5.14)", exc)
                self.populating = False
                self.close_populated()
                return
            self.populated_until = start = stop

    def close_populated(self) -> None:
        while self.populate_maps:
            self.populate_maps.popitem()[1].close()

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
        self.close_populated()


if __name__ == "__main__":
    sys.exit(main(AllocatorService))
