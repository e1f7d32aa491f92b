"""Reput: dispatches CommitLog records into ConsumeQueues and index files, and wakes consumers.

Mirrors ReputMessageService and FlushConsumeQueueService (docs/format.md §7.7, §7.8). The only
writer of ConsumeQueue and index files while the store runs, through the library's `Dispatcher`
(the code recovery uses): a small pass's records as Python lists (`Dispatcher.dispatch_rows`),
a backlog in batches (`Dispatcher.dispatch_batch`). Reads up to what consumers may see, `PointerTable.readable_end`:
FLUSHED under SYNC_FLUSH, COMMITTED with the pool, WROTE otherwise. Writes REPUT_FROM_OFFSET, the per-queue dispatched
offset and last store time in the queue-offset table, and the logics/index checkpoint
timestamps; every `flushIntervalConsumeQueue` ms flushes the queues with
`flushConsumeQueueLeastPages` dirty pages, and every `flushConsumeQueueThoroughInterval` ms all
queues, the index and then the checkpoint. An index file is otherwise flushed when it is full (as
RocketMQ: an msync of the whole mapping stalled dispatch 3-4 ms every second). Woken by
producers, committer or flusher, else every 100 ms (RocketMQ polls every 1 ms; waking on events
keeps an idle store idle); under plain ASYNC_FLUSH it watches for the next record a little after
a pass before sleeping (`spin_s`); under SYNC_FLUSH or with the pool its passes start at most
every `reputBatchIntervalMs`. Under SYNC_FLUSH it runs at nice `reputSyncFlushNice` and SCHED_IDLE
(`reputSyncFlushSchedIdle`): off the acknowledgement path, it gives way to any woken producer,
while it keeps up (`follow_backlog`).
When the cleaner deleted ConsumeQueue and index files below the CommitLog minimum, drops its
mappings of them (a mapping keeps a deleted file's disk space) and takes the queues' new minimum
offsets. Final pass: dispatch to the end, flush queues, index and checkpoint.

A queue that cannot be written (its directory is a file, ENOSPC, EIO, any fault of that queue)
is quarantined, not a stop for every queue: reported once (Reporter kind
``queue-dispatch-failed`` and one log line), shown by status (its ``dispatch_error``,
DISPATCH_FAILED_QUEUES) while every other queue and the index go on. Every `retry` (0.1 s, doubling
to 2 s) it re-dispatches, to that queue alone, the records from the first one it lacks
(dispatch is idempotent per queue), so once the cause is gone it catches up to REPUT_FROM with no
restart and its consumers read every message once, in order; then it rejoins the passes ("caught
up" is logged). Meanwhile the cleaner keeps the commit log from QUEUE_REDISPATCH_FROM on, the
checkpoint's logics time stays before it, and a queue still quarantined at stop makes reput exit
1, so the supervisor keeps `abort` and recovery re-dispatches the range. The index likewise
(``index-dispatch-failed``: its path is a file, ENOSPC, maxIndexNum=1): indexing pauses, queues
go on, and the retry re-keys from the first record it lacks once it can; a pause still in place
at stop leaves those keys out after a restart (the index is best effort, as RocketMQ's) unless
messageIndexSafe makes recovery replay from the index checkpoint time. Each fault is logged once,
again only when its reason changes, and when it clears. A record that cannot be decoded at all
still stops dispatch at the valid end.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from rmq_mp.config.deleted_topics import PENDING, DeletedTopics
from rmq_mp.errors import ConfigError, StoreError
from rmq_mp.format import native, topic_marker
from rmq_mp.format.message import SCHEDULE_TOPIC, is_dispatchable
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.commit_log import SCAN_ROWS_CAP
from rmq_mp.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from rmq_mp.store.dispatch import INDEX_KEY, Dispatcher, DispatchFault
from rmq_mp.store.index_service import IndexService
from rmq_mp.store.mapping_pool import process_pool
from rmq_mp.store.reporter import Reporter
from rmq_mp.store.topic_deletion import remove_old_queues
from shm import layout
from shm import queue_offsets as qo
from shm import waiters as wt
from workers.service import ServiceLoop, can_leave_sched_idle, main
from workers.topic_delete import crash_point

log = logging.getLogger("rmq_mp.reput")
MAX_RECORDS_PER_PASS = 20_000
IDLE_BACKLOG_BYTES = 64 << 10
"""Under `reputSyncFlushSchedIdle`, a pass that starts this far behind the readable end runs
SCHED_OTHER (at its nice value) until one starts closer: a prompt reput is 1-2 ms of puts
behind (~8 KiB a ms at 30k SYNC puts/s), one kept off the CPU by other work much further."""
SPIN_S = 0.0002
SMALL_PASS_RECORDS = 32
"""Records a pass dispatches one by one before it turns to batches with the numpy decoder
(measured crossover ~30: `python -m bench.dispatch` and a per-pass timing, 2026-11-25)."""
SMALL_PASS_RECORDS_COMPILED = 4
"""The same with the compiled scan (rmq_mp/format/_scan.c): a batch of one record costs ~0.12 ms
instead of ~0.6, one record alone ~35 us, so the crossover is ~4 records (bench/NOTES.md,
2026-11-26, "The small pass")."""
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0
"""A quarantined queue or paused index is retried after RETRY_FIRST_S, doubling up to this."""


def fault_code(exc: Exception) -> int:
    """What the shared fields say about a fault: its errno, else a FAULT_* code."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return layout.FAULT_CONFIG if isinstance(exc, ConfigError) else layout.FAULT_OTHER


@dataclass(slots=True)
class Quarantine:
    """A queue (or the index, INDEX_KEY) reput cannot write to, and how far its catch-up got."""

    key: tuple[str, int]
    path: str
    resume_offset: int
    """The first record it has not taken."""
    held_timestamp: int
    """A store time at or before that record's: the checkpoint's time must not pass it."""
    code: int
    reason: str
    retry_at: float
    backoff_s: float = RETRY_FIRST_S

    @property
    def is_index(self) -> bool:
        return self.key == INDEX_KEY

    @property
    def what(self) -> str:
        return "index" if self.is_index else f"queue {self.key[0]}/{self.key[1]}"


class ReputService(ServiceLoop):
    role = "reput"
    _can_leave_idle: bool | None = None
    """`can_leave_sched_idle`, asked once."""

    def on_start(self) -> None:
        cfg = self.store.config
        self.sched_idle_now: bool | None = (
            os.sched_getscheduler(0) == os.SCHED_IDLE if self.idle_scheduled() else None
        )
        """Whether reput runs SCHED_IDLE now (`follow_backlog`); None when it never does."""
        paths = self.store.paths
        reporter = Reporter()
        self.cq_table = ConsumeQueueTable(
            paths.consume_queue,
            cfg.mapped_file_size_consume_queue,
            writable=True,
            reporter=reporter,
            pool=process_pool(cfg.max_open_consume_queue_files),
        )
        self.cq_table.load()
        for cq in self.cq_table.all():
            cq.recover()
            cq.min_logic_offset = self._table_min_offset(cq)
        self.index = (
            IndexService(
                paths.index,
                cfg.max_hash_slot_num,
                cfg.max_index_num,
                writable=True,
                reporter=reporter,
                max_msgs_num_batch=cfg.max_msgs_num_batch,
            )
            if cfg.message_index_enable
            else None
        )
        if self.index is not None:
            self.index.load()
        self.checkpoint = StoreCheckpoint(paths.checkpoint, writable=True)
        self.reporter = reporter
        self.dispatcher = Dispatcher(self.cq_table.find, self.index, self.checkpoint, isolate=True)
        self.dispatcher.on_marker = self.apply_marker
        self.quarantine: dict[tuple[str, int], Quarantine] = {}
        """Queues (and INDEX_KEY) that refused records, by key; the dispatcher skips them."""
        self.flush_failed: set[str] = set()
        """Queues (and the index) whose last flush failed (reported once); the checkpoint waits."""
        self.last_cq_flush = self.last_thorough = time.monotonic()
        self.cleaned_to = self.table.get(layout.CLEAN_CQ_MIN_PHY_OFFSET)
        self.stuck_at = -1
        self.deletes_applied = -1
        """TOPIC_DELETE_GENERATION last applied (-1: none yet; the first pass applies the file)."""
        """REPUT_FROM where the last pass met an unreadable record (-1: none)."""
        self.readable_in_bursts = self.store.sync_flush or self.store.pool_enabled
        """Records become readable at each flush (SYNC_FLUSH) or commit (the pool), not at each
        put: fixed for the process's life, asked before every sleep."""
        self.schedule_slots: set[int] = set()
        """Queue-table slots of SCHEDULE_TOPIC_XXXX queues: a dispatch to one wakes the scheduler."""
        self.schedule_slots_seen = -1
        """The queue table's fill when `schedule_slots` was last looked up."""
        self.last_pass_records = 0
        """Records the last pass dispatched: only a pass that did work paces the next."""
        self.small_pass_records = SMALL_PASS_RECORDS_COMPILED if native.scan.active else SMALL_PASS_RECORDS
        """Passes expected to hold fewer records go one by one (the batch set-up's crossover)."""
        self.record_bytes = 1 << 30
        """Mean record size (with any BLANK) of the last pass: how many records a pass's bytes
        hold. Until a pass says, any pass counts as small."""

    def _table_min_offset(self, cq: ConsumeQueue) -> int:
        slot = self.store.shm.queues.find(cq.topic, cq.queue_id)
        return (
            self.store.shm.queues.get(slot, qo.MIN_OFFSET) * CQ_STORE_UNIT_SIZE
            if slot >= 0
            else cq.min_logic_offset
        )

    def interval_s(self) -> float:
        return 0.1

    def spin_s(self) -> float:
        """Consumers' latency runs through reput: with plain ASYNC_FLUSH, where each put makes a
        record readable, it looks for the next one for SPIN_S before sleeping (a cross-process
        wake per message saved under steady load). Under SYNC_FLUSH or with the pool records
        become readable only at the next flush or commit, which wakes it: spinning would only
        take CPU from the producers and the flusher."""
        return 0.0 if self.readable_in_bursts else SPIN_S

    def nice(self) -> int:
        """`reputSyncFlushNice` under SYNC_FLUSH: a SYNC put's p99 is the flusher's cycle plus its
        producer's turn on a CPU, and reput's passes took both (its records are readable only
        at each flush anyway). Elsewhere consumers' latency runs through reput: 0."""
        return self.store.config.reput_sync_flush_nice if self.store.sync_flush else 0

    def idle_scheduled(self) -> bool:
        """`reputSyncFlushSchedIdle` under SYNC_FLUSH: at nice 19 a reput pass (~0.4 ms of CPU at
        4 SYNC producers on 2 cores) still held its CPU until it ended, and a producer woken by
        its flush waited it out (4 producers, put p99 0.64-2.1 ms; 0.44-0.58 under SCHED_IDLE,
        bench/NOTES.md).
        Its records become readable only at each flush anyway. Only where it can leave
        SCHED_IDLE again (`follow_backlog`; an unprivileged process cannot: `can_leave_sched_idle`),
        or CPU-bound neighbours could keep it off the CPU for good."""
        if not (self.store.sync_flush and self.store.config.reput_sync_flush_sched_idle):
            return False
        if self._can_leave_idle is None:
            self._can_leave_idle = can_leave_sched_idle(self.nice())
            if not self._can_leave_idle:
                log.info(
                    "reputSyncFlushSchedIdle: not used, this process could not leave SCHED_IDLE when "
                    "behind (no CAP_SYS_NICE, RLIMIT_NICE %d): nice %d alone",
                    resource.getrlimit(resource.RLIMIT_NICE)[0],
                    self.nice(),
                )
        return self._can_leave_idle

    def min_pass_interval_s(self) -> float:
        """`reputBatchIntervalMs` where records become readable in bursts (SYNC_FLUSH: at each
        flush; the pool: at each commit): a pass costs ~0.1 ms before its first record, so one
        per flush took half a core from SYNC producers and slowed the flusher's fsync. Plain
        ASYNC_FLUSH dispatches at once: consumers' latency runs through reput."""
        if not self.readable_in_bursts or not self.last_pass_records:
            return 0.0  # a record after a quiet spell (an idle pass) is dispatched at once
        return self.store.config.reput_batch_interval_ms / 1000

    def has_work(self) -> bool:
        """Records past REPUT_FROM are readable (and the last pass did not stop short of them on
        an unreadable record: that one waits for the interval, not a busy loop)."""
        reput_from = self.table.get(layout.REPUT_FROM_OFFSET)
        return self.store.readable_end() > reput_from and reput_from != self.stuck_at

    def dispatch(self, limit: int = MAX_RECORDS_PER_PASS) -> int:
        """Dispatch up to ``limit`` records from REPUT_FROM; returns how many.

        A batch (`CommitLog.iter_batches`, `Dispatcher.dispatch_batch`) costs about 0.6 ms of
        set-up (0.12 ms with the compiled scan) and then 0.2-2 us a record, one record
        (`Dispatcher.dispatch`) about 25-35 us. With the compiled scan, a pass expected to hold
        fewer than `SCAN_ROWS_CAP` records (its bytes over the last passes' mean record size)
        goes as Python lists (`_dispatch_rows`: a pass of 12 SYNC sends 75-90 us of CPU instead of
        230-270 as a batch, `python -m bench.dispatch --pass-records 12`), up to the first record
        the compiled scan hands back; otherwise one expected to hold fewer than
        `small_pass_records` goes one by one, up to that many; the rest (or a bigger pass whole)
        in batches. Light load,
        where consumers wait on reput, is a record or two a pass; a backlog, or a paced pass
        under SYNC_FLUSH, many. Both write the same bytes. A
        queue's DISPATCHED and LAST_STORE_TS are published after its entries are written. A
        record that fails its length check is skipped ("[BUG]"), as RocketMQ's reput does; an
        unreadable one stops the pass there."""
        t = self.table
        end = self.store.sync_log()
        if t.get(layout.TOPIC_DELETE_GENERATION) != self.deletes_applied:  # after `end`: a record
            self.apply_deletes()  # below it put after a delete is seen with the delete
        start = offset = max(t.get(layout.REPUT_FROM_OFFSET), t.get(layout.MIN_OFFSET))
        self.store.commit_log.release_before(offset)
        touched: set[int] = set()
        dispatched, stopped = 0, False
        small = self.small_pass_records
        if native.scan.active and end - offset < SCAN_ROWS_CAP * self.record_bytes:
            offset, dispatched = self._dispatch_rows(offset, end, limit, touched)
        if not dispatched and end - offset < small * self.record_bytes:
            offset, dispatched, stopped = self._dispatch_records(offset, end, min(limit, small), touched)
        if not stopped and offset < end and dispatched < limit:
            offset, batched = self._dispatch_batches(offset, end, limit - dispatched, touched)
            dispatched += batched
        if dispatched:
            self.record_bytes = (offset - start) // dispatched
        if self.dispatcher.faults:  # published before REPUT_FROM passes them (the cleaner reads both)
            self._quarantine(self.dispatcher.take_faults())
        if offset != t.get(layout.REPUT_FROM_OFFSET):
            t.set(layout.REPUT_FROM_OFFSET, offset)
            t.add(layout.DISPATCH_COUNT, dispatched)
            t.set(layout.LOGICS_MSG_TIMESTAMP, self.checkpoint.logics_msg_timestamp)
            if self.index is not None and self.index.files:
                t.set(layout.INDEX_MSG_TIMESTAMP, self.index.files[-1].end_timestamp)
        if touched:
            self._wake_waiters(touched)
            self._wake_scheduler(touched)
        return dispatched

    def apply_deletes(self) -> None:
        """rmq-admin deleteTopic (workers/topic_delete.py): from the tombstones, a deleted topic's
        records below its offset are dispatched to no queue, and its old queues are removed, their
        dispatched and minimum offsets 0, so the topic's next record starts a new queue at 0.
        Idempotent: a restarted reput runs it again at its first pass."""
        t = self.table
        generation = t.get(layout.TOPIC_DELETE_GENERATION)
        tombstones = DeletedTopics(self.store.paths.deleted_topics)
        tombstones.load()
        bounds = tombstones.bounds()
        self.dispatcher.dropped = bounds
        if bounds:
            # QUEUE_RESETS odd meanwhile (also when a reput killed here left it odd): the cleaner
            # publishes no queue minimum it planned before (workers/cleaner.py)
            with self.store.shm.flags_lock("deleteTopic queues"):
                resets = t.get(layout.QUEUE_RESETS)
                t.set(layout.QUEUE_RESETS, resets + 1 + resets % 2)
            self._reset_deleted_queues(bounds)
            with self.store.shm.flags_lock("deleteTopic queues"):
                t.add(layout.QUEUE_RESETS, 1)
        self.deletes_applied = generation
        t.set(layout.TOPIC_DELETES_APPLIED, generation)

    def _reset_deleted_queues(self, bounds: dict[str, int]) -> None:
        """`apply_deletes`' removal and reset, while QUEUE_RESETS is odd."""
        queues = self.store.shm.queues
        if remove_old_queues(self.cq_table, bounds):
            crash_point("reput")
        for topic in bounds:
            kept = self.cq_table.queues.get(topic, {})
            for queue_id, slot in queues.queues_of(topic):
                if queue_id in kept:  # the new topic's queue, dispatched by this reput
                    continue
                key = (topic, queue_id)
                self.quarantine.pop(key, None)
                self.dispatcher.quarantined.discard(key)
                if queues.get(slot, qo.DISPATCHED) or queues.get(slot, qo.MIN_OFFSET):
                    queues.set(slot, qo.DISPATCHED, 0)  # first: a reader sees [min, 0), nothing
                    queues.set(slot, qo.MIN_OFFSET, 0)
                    queues.set(slot, qo.LAST_STORE_TS, 0)
                    queues.set(slot, qo.DISPATCH_ERROR, 0)

    def apply_marker(self, phy_offset: int) -> list[str]:
        """A deleteTopic marker (rmq_mp/format/topic_marker.py) met at ``phy_offset``, before it or
        anything after it is dispatched: each topic it names without a tombstone at or past it (a
        SLAVE replicating its master's delete; a master whose supervisor died between the marker
        and the tombstone) gets one there, ``pending``, written atomically under the flags lock as
        the master's supervisor writes it; then `apply_deletes`, as for a delete on this store.
        Idempotent: met again (a restart, recovery re-dispatching from before it) it finds its
        tombstone. TOPIC_DELETE_MARKERS_APPLIED moves while a named topic's tombstone is pending,
        so the supervisor drops its group offsets and topics.json entry (workers/topic_delete.py)."""
        try:
            topics = topic_marker.decode(self.store.commit_log.look_message_by_offset(phy_offset).body)
        except StoreError as exc:
            log.error("deleteTopic marker at %d not applied: %s", phy_offset, exc)
            return []
        pending = False
        with self.store.shm.flags_lock("deleteTopic marker"):
            tombstones = DeletedTopics(self.store.paths.deleted_topics)
            tombstones.load()
            wrote = False
            for topic in topics:
                stone = tombstones.table.get(topic)
                if stone is None or stone.phy_offset < phy_offset:
                    tombstones.set(topic, phy_offset, PENDING)
                    wrote = True
                    log.info(
                        "deleteTopic %s: met its marker at %d in the log, deleting it", topic, phy_offset
                    )
                pending |= tombstones.table[topic].state == PENDING
            if wrote:
                tombstones.persist()
        crash_point("reput-marker")
        self.apply_deletes()
        if pending:
            self.table.add(layout.TOPIC_DELETE_MARKERS_APPLIED, 1)
        return topics

    # ------------------------------------------------------------------ faults

    def _quarantine(self, faults: list[DispatchFault]) -> None:
        """New faults: reported once each, shown in shared memory, retried on a backoff."""
        for fault in faults:
            if fault.key == INDEX_KEY:
                path = str(self.store.paths.index)
            else:
                path = str(self.cq_table.root / fault.key[0] / str(fault.key[1]))
            q = Quarantine(
                fault.key,
                path,
                fault.phy_offset,
                fault.store_timestamp - 1,
                fault_code(fault.error),
                _reason(fault.error),
                time.monotonic() + RETRY_FIRST_S,
            )
            self.quarantine[fault.key] = q
            self._report(q, fault.end_offset, fault.error)
        self._publish_faults()

    def _report(self, q: Quarantine, end_offset: int, error: Exception) -> None:
        """One line per distinct fault: Reporter's (its log line included)."""
        self.reporter.report(
            "index-dispatch-failed" if q.is_index else "queue-dispatch-failed",
            q.path,
            q.resume_offset,
            end_offset,
            f"{q.reason}; {'indexing paused' if q.is_index else 'queue quarantined'}, "
            f"retried from commit-log offset {q.resume_offset}",
        )
        if q.code == layout.FAULT_OTHER:
            log.error("%s: unexpected dispatch error", q.what, exc_info=error)

    def _publish_faults(self) -> None:
        """The quarantines into shared memory: each queue's dispatch_error, the counts, the index
        fields, and where the cleaner must keep the commit log from (set before the count)."""
        t, queues = self.table, self.store.shm.queues
        failed = [q for q in self.quarantine.values() if not q.is_index]
        if failed:
            t.set(layout.QUEUE_REDISPATCH_FROM, min(q.resume_offset for q in failed))
        t.set(layout.DISPATCH_FAILED_QUEUES, len(failed))
        for q in failed:
            slot = queues.find(*q.key)
            if slot >= 0 and queues.get(slot, qo.DISPATCH_ERROR) != q.code:
                queues.set(slot, qo.DISPATCH_ERROR, q.code)
        index = self.quarantine.get(INDEX_KEY)
        t.set(layout.INDEX_RESUME_OFFSET, index.resume_offset if index is not None else 0)
        t.set(layout.INDEX_DISPATCH_ERROR, index.code if index is not None else 0)

    def retry(self, *, final: bool = False) -> None:
        """Catch up each quarantined queue (or the index) whose retry is due; ``final``: all, to
        the end or their fault."""
        now_s = time.monotonic()
        for q in list(self.quarantine.values()):
            if final or q.retry_at <= now_s:
                while self._catch_up(q) and final:
                    pass

    def _catch_up(self, q: Quarantine) -> bool:
        """Re-dispatch up to MAX_RECORDS_PER_PASS of the records ``q`` lacks, to it alone.
        Released once at REPUT_FROM; on a fault, retried after its backoff. True when it made
        progress and has more to do."""
        reput_from = self.table.get(layout.REPUT_FROM_OFFSET)
        log_view = self.store.commit_log
        self.store.sync_log()
        min_offset = self.table.get(layout.MIN_OFFSET)
        if q.resume_offset < min_offset:
            self.reporter.report(
                "index-keys-lost" if q.is_index else "queue-entries-lost",
                q.path,
                q.resume_offset,
                min_offset,
                "commit-log files deleted before it caught up",
            )
            q.resume_offset = min_offset
        start = offset = q.resume_offset
        touched: set[int] = set()
        try:
            for step in log_view.iter_batches(
                offset, check_crc=False, end_offset=reput_from, max_records=MAX_RECORDS_PER_PASS
            ):
                if len(step.batch):
                    if q.is_index:
                        assert self.index is not None
                        self.index.build_index_batch(step.batch)
                    else:
                        done = self.dispatcher.dispatch_queue(step.batch, *q.key)
                        if done is not None:
                            self._publish(
                                done.topic, done.queue_id, done.queue_offset, done.store_timestamp, touched
                            )
                    q.held_timestamp = int(step.batch.store_timestamp[-1])
                offset = step.next_offset
                tail = step.tail
                if tail is not None and not tail.success and tail.size > 0:
                    offset = step.stop + tail.size  # skipped by the pass too ("[BUG]", logged there)
                q.resume_offset = offset
        except Exception as exc:
            q.backoff_s = min(q.backoff_s * 2, RETRY_MAX_S)
            q.retry_at = time.monotonic() + q.backoff_s
            code, reason = fault_code(exc), _reason(exc)
            if (code, reason) != (q.code, q.reason):
                q.code, q.reason = code, reason
                self._report(q, reput_from, exc)
            return False
        finally:
            if touched:
                self._wake_waiters(touched)
            self._publish_faults()
        if offset >= reput_from:
            # Logged before the release is published: whoever sees the fault cleared finds the line.
            log.info(
                "%s caught up to commit-log offset %d: dispatch to it resumed (%s)", q.what, offset, q.path
            )
            del self.quarantine[q.key]
            self.dispatcher.quarantined.discard(q.key)
            if not q.is_index:
                slot = self.store.shm.queues.find(*q.key)
                if slot >= 0:
                    self.store.shm.queues.set(slot, qo.DISPATCH_ERROR, 0)
            self._publish_faults()
            return False
        progressed = offset > start
        q.backoff_s = RETRY_FIRST_S if progressed else min(q.backoff_s * 2, RETRY_MAX_S)
        q.retry_at = time.monotonic() + (0.0 if progressed else q.backoff_s)
        return progressed

    def _publish(
        self, topic: str, queue_id: int, queue_offset: int, store_timestamp: int, touched: set[int]
    ) -> None:
        """A queue's entries up to ``queue_offset`` are written: consumers may read them."""
        queues = self.store.shm.queues
        slot = queues.find(topic, queue_id)
        if slot >= 0:
            queues.set(slot, qo.DISPATCHED, queue_offset + 1)
            queues.set(slot, qo.LAST_STORE_TS, store_timestamp)
            touched.add(slot)

    def _dispatch_rows(self, offset: int, end: int, limit: int, touched: set[int]) -> tuple[int, int]:
        """Up to ``limit`` records (and `SCAN_ROWS_CAP`) as Python lists (`CommitLog.scan_rows`,
        `Dispatcher.dispatch_rows`): a pass's fixed cost without the batch's arrays. (next
        offset, records); none taken where those decline (anything unusual in the span: the
        caller's other paths decide on it)."""
        rows = self.store.commit_log.scan_rows(offset, end, limit)
        if rows is None:
            return offset, 0
        progress = self.dispatcher.dispatch_rows(rows)
        if progress is None:
            return offset, 0
        for queue in progress:
            self._publish(queue.topic, queue.queue_id, queue.queue_offset, queue.store_timestamp, touched)
        return rows.stop, len(rows)

    def _dispatch_records(
        self, offset: int, end: int, limit: int, touched: set[int]
    ) -> tuple[int, int, bool]:
        """Up to ``limit`` records one by one; (next offset, records, stopped at an unreadable one)."""
        dispatched = 0
        log_view = self.store.commit_log
        quarantined = self.dispatcher.quarantined
        for phy, req in log_view.iter_dispatch(offset, check_crc=False, end_offset=end):
            if req.success and req.size > 0:
                self.dispatcher.dispatch(req)
                if (
                    is_dispatchable(req.sys_flag)
                    and (not quarantined or (req.topic, req.queue_id) not in quarantined)
                    and not self.dispatcher.drops(req.topic, phy)
                ):
                    self._publish(req.topic, req.queue_id, req.queue_offset, req.store_timestamp, touched)
                offset = phy + req.size
                dispatched += 1
            elif req.success:
                offset = log_view.roll_next_file(phy)
            elif req.size > 0:
                log.error("[BUG] record at %d: %s; skipping %d bytes", phy, req.reason, req.size)
                offset = phy + req.size
            else:
                log.error("unreadable record at %d below the readable end %d: %s", phy, end, req.reason)
                self.stuck_at = offset
                return offset, dispatched, True
            if dispatched >= limit:
                break
        return offset, dispatched, False

    def _dispatch_batches(self, offset: int, end: int, limit: int, touched: set[int]) -> tuple[int, int]:
        """Up to ``limit`` records in batches; (next offset, records)."""
        dispatched = 0
        log_view = self.store.commit_log
        while dispatched < limit:
            resume = -1
            for step in log_view.iter_batches(
                offset, check_crc=False, end_offset=end, max_records=limit - dispatched
            ):
                if len(step.batch):
                    for queue in self.dispatcher.dispatch_batch(step.batch):
                        self._publish(
                            queue.topic, queue.queue_id, queue.queue_offset, queue.store_timestamp, touched
                        )
                    dispatched += len(step.batch)
                offset = step.next_offset
                tail = step.tail
                if tail is not None and not tail.success:
                    if tail.size > 0:
                        log.error(
                            "[BUG] record at %d: %s; skipping %d bytes", step.stop, tail.reason, tail.size
                        )
                        resume = step.stop + tail.size
                    else:
                        log.error(
                            "unreadable record at %d below the readable end %d: %s",
                            step.stop,
                            end,
                            tail.reason,
                        )
                        self.stuck_at = offset
            if resume < 0:
                break
            offset = resume
        return offset, dispatched

    def _wake_scheduler(self, touched: set[int]) -> None:
        """A delayed message was dispatched: the scheduler may be asleep until a later due time
        (one semaphore post only when it sleeps, `Wakeup`)."""
        queues = self.store.shm.queues
        if queues.used != self.schedule_slots_seen:  # a queue was added: maybe a level's
            self.schedule_slots_seen = queues.used
            self.schedule_slots = {slot for _q, slot in queues.queues_of(SCHEDULE_TOPIC)}
        if not self.schedule_slots.isdisjoint(touched):
            self.store.shm.wake("scheduler")

    def _wake_waiters(self, touched: set[int]) -> None:
        """`arriving`: wake each long-polling consumer whose queue got past its offset."""
        waiters = self.store.shm.waiters
        queues = self.store.shm.queues
        for slot in waiters.waiting_slots():
            queue_slot = waiters.get(slot, wt.QUEUE_SLOT)
            if queue_slot < 0 or (
                queue_slot in touched and queues.get(queue_slot, qo.DISPATCHED) > waiters.get(slot, wt.OFFSET)
            ):
                waiters.set(slot, wt.WAITING, 0)
                self.store.shm.waiter(slot).release()

    def flush_queues(self, thorough: bool) -> None:
        """FlushConsumeQueueService: queues with `flushConsumeQueueLeastPages` dirty pages; when
        ``thorough`` all queues and the index, then the checkpoint, whose timestamps say what a
        crash need not replay (so they are written only once what they cover is on disk)."""
        least_pages = 0 if thorough else self.store.config.flush_consume_queue_least_pages
        flushed_all = True
        for cq in self.cq_table.all():
            flushed_all &= self._flush_one(
                str(cq.mfq.store_dir), partial(cq.flush, least_pages), cq.mfq.flushed_where
            )
        if thorough:
            if self.index is not None:
                flushed_all &= self._flush_one(str(self.store.paths.index), self.index.flush, 0)
            if not flushed_all:
                return  # the checkpoint must not claim what is not on disk
            cp = self.checkpoint
            cp.physic_msg_timestamp = self.table.get(layout.PHYSIC_MSG_TIMESTAMP)
            if self.index is not None and self.index.files:
                cp.index_msg_timestamp = self.index.files[-1].end_timestamp
            for q in self.quarantine.values():  # recovery must replay what a quarantine lacks
                if q.is_index:
                    cp.index_msg_timestamp = min(cp.index_msg_timestamp, q.held_timestamp)
                else:
                    cp.logics_msg_timestamp = min(cp.logics_msg_timestamp, q.held_timestamp)
            cp.flush()

    def _flush_one(self, path: str, flush: Callable[[], object], flushed_where: int) -> bool:
        """Flush one queue (or the index); a failure (EIO) is reported once, keeps the checkpoint
        from being written, and does not stop the other flushes. False when it failed."""
        try:
            flush()
        except OSError as exc:
            if path not in self.flush_failed:
                self.flush_failed.add(path)
                self.reporter.report("flush-failed", path, flushed_where, flushed_where, str(exc))
            return False
        if path in self.flush_failed:
            self.flush_failed.discard(path)
            log.info("%s flushed again", path)
        return True

    def drop_deleted_files(self) -> None:
        """Follow the cleaner: unmap the queue and index files it deleted."""
        cleaned_to = self.table.get(layout.CLEAN_CQ_MIN_PHY_OFFSET)
        if cleaned_to == self.cleaned_to:
            return
        self.cleaned_to = cleaned_to
        for cq in self.cq_table.all():
            cq.mfq.drop_deleted_files()
            cq.min_logic_offset = max(cq.min_logic_offset, self._table_min_offset(cq))
        if self.index is not None:
            self.index.drop_deleted_files()

    def follow_backlog(self) -> None:
        """`reputSyncFlushSchedIdle`: SCHED_IDLE only while reput keeps up. Beside CPU-bound
        processes a SCHED_IDLE reput got so little CPU that 3,000 SYNC sends were dispatched up
        to 2.5 s after the last (0.18 s at nice 19, bench/NOTES.md); a pass that starts
        `IDLE_BACKLOG_BYTES` behind runs at its nice value under SCHED_OTHER instead."""
        behind = self.store.readable_end() - self.table.get(layout.REPUT_FROM_OFFSET)
        idle = behind < IDLE_BACKLOG_BYTES
        if not idle:
            self.table.add(layout.REPUT_BEHIND_PASSES, 1)
        if idle != self.sched_idle_now:
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
            except OSError:  # refused (a sandbox): the nice value alone, as at start
                return
            self.sched_idle_now = idle

    def do_work(self) -> None:
        if self.sched_idle_now is not None:
            self.follow_backlog()
        self.drop_deleted_files()
        self.last_pass_records = self.dispatch()
        while self.last_pass_records >= MAX_RECORDS_PER_PASS:
            self.heartbeat()
            self.last_pass_records = self.dispatch()
        if self.quarantine:
            self.retry()
        cfg = self.store.config
        now_s = time.monotonic()
        if (now_s - self.last_cq_flush) * 1000 >= cfg.flush_interval_consume_queue:
            thorough = (now_s - self.last_thorough) * 1000 >= cfg.flush_consume_queue_thorough_interval
            self.flush_queues(thorough)
            self.last_cq_flush = now_s
            if thorough:
                self.last_thorough = now_s

    def final_pass(self) -> None:
        while self.dispatch():
            pass
        if self.quarantine:
            self.retry(final=True)
        self.flush_queues(thorough=True)
        queues = [q for q in self.quarantine.values() if not q.is_index]
        if queues:
            log.error(
                "%d queue(s) still quarantined at stop, the first lacking commit-log offset %d on: "
                "exiting 1, so the supervisor keeps abort and recovery re-dispatches them",
                len(queues),
                min(q.resume_offset for q in queues),
            )

    def run(self) -> int:
        """1 when a queue is still quarantined after the final pass (abort is kept)."""
        code = super().run()
        return (
            1 if code == 0 and any(not q.is_index for q in getattr(self, "quarantine", {}).values()) else code
        )

    def on_exit(self) -> None:
        if hasattr(self, "cq_table"):
            self.cq_table.close()
            if self.index is not None:
                self.index.close()


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, OSError | ConfigError) and str(exc) else f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main(ReputService))
