"""Committer: copies appended bytes from TransientStorePool buffers into the CommitLog files.

Mirrors CommitRealTimeService (docs/format.md §7.4, §7.5). Runs only with the pool
(ASYNC_FLUSH + transientStorePoolEnable). Every `commitIntervalCommitLog` ms or when woken: if at
least `commitCommitLogLeastPages` pages are waiting, or `commitCommitLogThoroughInterval` ms
passed since the last commit, copy ``[committed, wrote)`` file by file, advance COMMITTED (its
single writer), return a buffer once its file is wholly committed, and wake flusher and reput.
Final pass: commit everything. Runs under SCHED_BATCH (`ServiceLoop.batch_scheduled`): a put's
wake-up never preempts the producer that posted it, so on a busy machine the committer runs
when that producer's time slice ends and commits more pages a pass.
"""

from __future__ import annotations

import sys
import time

from rmq_mp.store.mapped_file import OS_PAGE_SIZE
from shm import layout
from workers.service import ServiceLoop, main


class CommitterService(ServiceLoop):
    role = "committer"
    writable_log = True
    batch_scheduled = True  # a bulk copy behind the producers (ServiceLoop.batch_scheduled)

    def on_start(self) -> None:
        self.last_commit = time.monotonic()

    def interval_s(self) -> float:
        return self.store.config.commit_interval_commit_log / 1000

    def least_pages(self) -> int:
        """Pages a commit waits for: commitCommitLogLeastPages, or 0 once the thorough interval passed."""
        cfg = self.store.config
        thorough = (time.monotonic() - self.last_commit) * 1000 >= cfg.commit_commit_log_thorough_interval
        return 0 if thorough else cfg.commit_commit_log_least_pages

    def has_work(self) -> bool:
        wrote = self.table.get(layout.WROTE_POSITION)
        committed = self.table.get(layout.COMMITTED_POSITION)
        return wrote > committed and wrote // OS_PAGE_SIZE - committed // OS_PAGE_SIZE >= self.least_pages()

    def do_work(self) -> None:
        self.commit(self.least_pages())

    def commit(self, least_pages: int) -> bool:
        """`MappedFileQueue.commit(leastPages)`; True if bytes moved."""
        t = self.table
        wrote = t.get(layout.WROTE_POSITION)
        committed = t.get(layout.COMMITTED_POSITION)
        self.store.commit_log.release_before(committed)
        if wrote <= committed:
            return False
        if least_pages > 0 and wrote // OS_PAGE_SIZE - committed // OS_PAGE_SIZE < least_pages:
            return False
        size = self.store.config.mapped_file_size_commit_log
        pool = self.store.shm.pool
        while committed < wrote:
            file_offset = committed - committed % size
            index = pool.buffer_for(file_offset)
            assert index >= 0, f"no pool buffer holds the uncommitted file at {file_offset}"
            mf = self.store.commit_log.file_at(file_offset)
            mf.write_buffer = pool.buffers[index].mm
            mf.committed_position = committed - file_offset
            mf.commit(min(wrote - file_offset, size))
            committed = file_offset + mf.committed_position
            t.set(layout.COMMITTED_POSITION, committed)
            if mf.committed_position == size:
                mf.write_buffer = None
                pool.give_back(index)
        t.add(layout.COMMIT_COUNT, 1)
        self.last_commit = time.monotonic()
        self.store.shm.wake("flusher")
        self.store.shm.wake("reput")
        return True

    def final_pass(self) -> None:
        for _ in range(10):
            if not self.commit(0):
                break


if __name__ == "__main__":
    sys.exit(main(CommitterService))
