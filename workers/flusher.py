"""Flusher: forces CommitLog bytes to disk and completes SYNC_FLUSH requests.

Mirrors GroupCommitService + FlushDiskWatcher (SYNC_FLUSH) and FlushRealTimeService (ASYNC_FLUSH)
(docs/format.md §7.4). FLUSHED is its field alone, and it never advances on a failed fsync
(RocketMQ 4.9.8 does: issue #2706); the failure is counted and waiting producers time out.

- SYNC_FLUSH: woken by producers (else every 10 ms while requests wait, 200 ms when idle): wait
  for the producers the last flush woke to put again (`GroupGather.wait`, while the oldest send waiting
  began less than 1.25 passes ago),
  flush ``[flushed, wrote)``, then complete every open request (the tickets after the last one
  answered) at or below the flushed offset and time out those past their deadline (the
  watcher's job); wake reput, since under SYNC_FLUSH consumers see only flushed records.
- ASYNC_FLUSH: every `flushIntervalCommitLog` ms, flush when `flushCommitLogLeastPages` pages are
  dirty or `flushCommitLogThoroughInterval` ms passed; `flushCommitLogTimed` makes the interval a
  sleep that wakeups do not shorten (a stop does).
Writes PHYSIC_MSG_TIMESTAMP after each flush; with `enableRunningFlagsInFlush` a failed fsync
sets NOT_WRITEABLE, so puts are refused with the reason until restart; a failed fsync is retried on
the interval, never in a loop. Final pass: flush everything (10 tries).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from rmq_mp.config.store_config import FlushDiskType
from rmq_mp.outcomes import RunningFlags
from rmq_mp.store.mapped_file import OS_PAGE_SIZE
from shm import layout
from shm.pointer_table import now_ms
from shm.semaphores import spin_until
from shm.store_shm import StoreShm
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.flusher")
FLUSH_SLOW_MS = 500
"""A flush slower than this is logged, as RocketMQ's FlushRealTimeService does."""
GATHER_AGE_PASSES = 1.25
"""A gather ends once the oldest send waiting began this many SYNC passes ago (`GroupGather.wait`)."""
GATHER_SPIN_S = 100e-6
"""A gather watches for its group this long, yielding the CPU between looks, before it sleeps:
the woken producers are back in 35-65 us on 2 cores (bench/NOTES.md, syncwake), and a sleeping
flusher costs the last of them a semaphore post and itself a wake on a CPU gone idle."""


class GroupGather:
    """SYNC_FLUSH's gather: what the last pass woke, and the wait for those producers to put again
    before the next flush (`wait`). Its own object, on the store's shared memory alone, so that
    it is read and tested apart from the worker around it."""

    def __init__(self, shm: StoreShm, gather_max_s: float, group_max: int) -> None:
        self.table, self.ring, self.wakeup = shm.table, shm.ring, shm.wakeup("flusher")
        self.gather_max_s = gather_max_s
        """`syncFlushGatherMaxUs`: the longest a gather waits after the pass that woke its group."""
        self.group_max = group_max
        """The most producers a gather waits for: two a CPU (`wait`)."""
        self.woken = 0
        """Waiters the last pass completed: producers that usually put again at once."""
        self.woken_after_ticket = 0
        """FLUSH_REQUEST_SEQ when the last pass completed them."""
        self.woken_at_ns = 0
        """time.monotonic_ns() when the last pass completed them."""
        self.left_open = 0
        """Requests the last pass left waiting (they came during its fsync)."""
        self.pass_s = 0.0
        """A moving average of a SYNC pass, its flush and its completions: the age bound."""

    def woke(self, count: int, last_ticket: int, left_open: int) -> None:
        """A pass completed ``count`` requests, the tickets through ``last_ticket`` seen, and left
        ``left_open`` waiting."""
        self.woken, self.woken_after_ticket, self.left_open = count, last_ticket, left_open
        self.woken_at_ns = time.monotonic_ns()

    def passed(self, pass_s: float) -> None:
        """A pass that flushed took ``pass_s``: into the moving average (1/8 a pass)."""
        self.pass_s += (pass_s - self.pass_s) / 8 if self.pass_s else pass_s

    def wait(self, answered_through: int) -> None:
        """SYNC: before a flush, wait for the waiters the last pass woke to put again, while the
        oldest send waiting began less than 1.25 passes ago (a pass: a flush and its
        completions, a moving average) and for at most `syncFlushGatherMaxUs` after that pass.
        Each producer waits for its own put's flush before it sends again, so flushing as soon
        as one request is there splits the producers into two groups that alternate, each
        waiting through the other's fsync (2.25 requests per fsync with 4 producers,
        bench/NOTES.md); they return within tens of microseconds, and a flush that waits for
        them serves all of them in one fsync. A send's age counts from its start, which its
        request carries (`FlushRequestRing.oldest_started_ns`): flushing at once, a send that
        came just after a flush began waits about a pass before its own flush starts, so a
        gather that holds none longer keeps about its latency (counted from when the flusher
        first saw a request, or the middle of the fsync that left it open, a producer slow to
        the lock waited that much more). One flush instead of 1.25 passes flushed a put that
        came during a slow fsync at once, without the producers it woke, and the groups split
        again (tests/crash/test_sync_group.py: 1.75 puts per fsync; bench/NOTES.md, syncstart).
        With no request waiting yet, the woken producers' sends began after the pass that woke
        them. Only one wake a gather: its flag stays set, so the puts post
        nothing, but the one with the last ticket awaited (FLUSH_GATHER_TICKET) posts the
        semaphore (rmq_mp/put/_core.c, `Producer._wake_workers`), or the age bound's timeout
        ends the sleep; a post that came late only ends a later sleep early. Before that sleep
        it watches for the group for up to GATHER_SPIN_S, the ticket not yet armed, so a group
        back within it posts nothing and the flusher does not sleep. Only while the
        group is at most two producers a CPU: each one woken needs a CPU turn (~25-30 us of CPU
        a put) before it puts again, and with 8 producers on 2 cores the last ones came back
        about a flush later, so waiting for them cost 0.85x the throughput (bench/NOTES.md),
        while flushing at once already served about half of them."""
        expected = self.woken
        self.woken = 0
        if expected <= 0 or self.gather_max_s <= 0 or expected + self.left_open > self.group_max:
            return
        age_ns = int(self.pass_s * GATHER_AGE_PASSES * 1e9)
        cap_ns = self.woken_at_ns + int(self.gather_max_s * 1e9)
        since = self.woken_after_ticket
        seq = self.table.get
        ring = self.ring

        def gathered() -> bool:
            return seq(layout.FLUSH_REQUEST_SEQ) - since >= expected

        def left_ns() -> int:
            oldest_ns = ring.oldest_started_ns(answered_through, seq(layout.FLUSH_REQUEST_SEQ))
            return min(cap_ns, (oldest_ns or self.woken_at_ns) + age_ns) - time.monotonic_ns()

        if gathered() or (left := left_ns()) <= 0 or spin_until(gathered, min(GATHER_SPIN_S, left / 1e9)):
            return  # back within the watch: no ticket armed, no post, no sleep
        try:
            while not gathered() and (left := left_ns()) > 0:
                self.table.set(layout.FLUSH_GATHER_TICKET, since + expected)
                if gathered():  # after the store: a put that published it before read 0
                    return
                self.wakeup.sleep(left / 1e9)  # woken by the last request, or the age bound
        finally:
            self.table.set(layout.FLUSH_GATHER_TICKET, 0)


class FlusherService(ServiceLoop):
    role = "flusher"

    def on_start(self) -> None:
        self.sync = self.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.last_thorough = time.monotonic()
        self.failing = False
        """The last fsync failed: retry on the interval, never in a loop."""
        self.answered_through = self.table.get(layout.FLUSH_REQUEST_SEQ)
        """Every ticket up to this one is answered. A producer's ticket is FLUSH_REQUEST_SEQ after
        its increment, so the open ones are (answered_through, FLUSH_REQUEST_SEQ]."""
        self.seen_through = self.answered_through
        """The last ticket a pass has seen: a newer one is work; an older open one (its bytes not
        yet flushable, or its fsync failed) is retried on the 10 ms interval, not in a busy loop."""
        self.gathering = GroupGather(
            self.store.shm, self.store.config.sync_flush_gather_max_us / 1e6, 2 * (os.cpu_count() or 1)
        )

    def interval_s(self) -> float:
        cfg = self.store.config
        if self.sync:
            return 0.01 if self.answered_through < self.table.get(layout.FLUSH_REQUEST_SEQ) else 0.2
        if cfg.flush_commit_log_timed:  # a stop ends it (it did not: 0.4 s of every stop)
            self.wakeup.sleep(cfg.flush_interval_commit_log / 1000)
            return 0
        return cfg.flush_interval_commit_log / 1000

    def least_pages(self) -> int:
        """ASYNC: flushCommitLogLeastPages, or 0 once the thorough interval passed."""
        cfg = self.store.config
        thorough = (time.monotonic() - self.last_thorough) * 1000 >= cfg.flush_commit_log_thorough_interval
        return 0 if thorough else cfg.flush_commit_log_least_pages

    def has_work(self) -> bool:
        """SYNC: a request came since the last pass began; ASYNC: enough dirty pages (the timed
        flusher sleeps its interval and never asks)."""
        if self.sync:
            return self.seen_through < self.table.get(layout.FLUSH_REQUEST_SEQ)
        if self.failing:  # retried on the interval
            return False
        flushed = self.table.get(layout.FLUSHED_POSITION)
        return self.target() // OS_PAGE_SIZE - flushed // OS_PAGE_SIZE >= max(self.least_pages(), 1)

    def target(self) -> int:
        """What a flush forces up to: `PointerTable.written_end` (its FLUSHED is then the
        readable end under SYNC_FLUSH)."""
        return self.table.written_end()

    def flush(self, least_pages: int) -> bool:
        """Force ``[flushed, target)``; True if FLUSHED advanced."""
        t = self.table
        flushed = t.get(layout.FLUSHED_POSITION)
        target = self.target()
        store_ts = t.get(layout.LAST_STORE_TIMESTAMP)
        self.store.commit_log.release_before(flushed)
        if target <= flushed:
            return False
        if least_pages > 0 and target // OS_PAGE_SIZE - flushed // OS_PAGE_SIZE < least_pages:
            return False
        log_view = self.store.commit_log
        log_view.sync_positions(min_offset=t.get(layout.MIN_OFFSET), readable_end=target)
        size = self.store.config.mapped_file_size_commit_log
        started = time.monotonic()
        try:
            offset = max(flushed, t.get(layout.MIN_OFFSET))  # a SLAVE's log may begin above 0
            while offset < target:
                mf = log_view.file_at(offset)
                mf.flushed_position = offset - mf.file_from_offset
                mf.flush()
                offset = mf.file_from_offset + size
        except OSError as exc:
            self.failing = True
            t.add(layout.FLUSH_FAILURES, 1)
            log.error(
                "flush of [%d, %d) failed, flushed offset stays at %d: %s", flushed, target, flushed, exc
            )
            if self.store.config.enable_running_flags_in_flush:
                self.mark_not_writeable()
            return False
        self.failing = False
        t.set(layout.FLUSHED_POSITION, target)
        t.add(layout.FLUSH_COUNT, 1)
        cost_ms = int((time.monotonic() - started) * 1000)
        if cost_ms > FLUSH_SLOW_MS:  # RocketMQ: "Flush data to disk costs {} ms"
            log.warning(
                "flush data to disk costs %d ms ([%d, %d), %d bytes)",
                cost_ms,
                flushed,
                target,
                target - flushed,
            )
        if store_ts:
            t.set(layout.PHYSIC_MSG_TIMESTAMP, store_ts)
        return True

    def mark_not_writeable(self) -> None:
        """RunningFlags.makeNotWriteable, under the flags lock (several workers write the flags)."""
        self.store.shm.update_running_flags(set_bits=RunningFlags.NOT_WRITEABLE)

    def complete_requests(self) -> None:
        """Complete flushed requests, time out overdue ones (FlushDiskWatcher), free abandoned
        ones (`FlushRequestRing.answer`, over the tickets after the last one answered), and wake
        each completed request's waiter."""
        flushed = self.table.get(layout.FLUSHED_POSITION)
        last_ticket = self.table.get(layout.FLUSH_REQUEST_SEQ)
        self.answered_through, completed = self.store.shm.ring.answer(
            self.answered_through, last_ticket, flushed, now_ms()
        )
        for slot in completed:
            self.store.shm.flush_done(slot).release()
        if completed:
            self.gathering.woke(len(completed), last_ticket, left_open=last_ticket - self.answered_through)

    def do_work(self) -> None:
        if self.sync:
            self.gathering.wait(self.answered_through)
            self.seen_through = self.table.get(layout.FLUSH_REQUEST_SEQ)
            started = time.monotonic()
            advanced = self.flush(0)
            self.complete_requests()
            if advanced:
                self.gathering.passed(time.monotonic() - started)
                self.store.shm.wake("reput")
            return
        least_pages = self.least_pages()
        if least_pages == 0:
            self.last_thorough = time.monotonic()
        self.flush(least_pages)

    def final_pass(self) -> None:
        for _ in range(10):
            if not self.flush(0):
                break
        if self.sync:
            self.complete_requests()


if __name__ == "__main__":
    sys.exit(main(FlusherService))
