"""Reput: dispatches CommitLog records into ConsumeQueues and index files, and wakes consumers.

Mirrors ReputMessageService and FlushConsumeQueueService (rocketmq-format.md §7.7, §7.8). The only
writer of ConsumeQueue and index files while the store runs, through the library's `Dispatcher`
(the code recovery uses): a pass's first records one by one, a backlog in batches
(`Dispatcher.dispatch_batch`). Reads up to what consumers may see: FLUSHED under SYNC_FLUSH,
COMMITTED with the pool, WROTE otherwise. Writes REPUT_FROM_OFFSET, the per-queue dispatched
offset and last store time in the queue-offset table, and the logics/index checkpoint
timestamps; every `flushIntervalConsumeQueue` ms flushes the queues with
`flushConsumeQueueLeastPages` dirty pages, and every `flushConsumeQueueThoroughInterval` ms all
queues, the index and then the checkpoint. An index file is otherwise flushed when it is full (as
RocketMQ: an msync of the whole mapping stalled dispatch 3-4 ms every second). Woken by
producers, committer or flusher, else every 100 ms (RocketMQ polls every 1 ms; waking on events
keeps an idle store idle); under plain ASYNC_FLUSH it watches for the next record a little after
a pass before sleeping (`spin_s`); under SYNC_FLUSH or with the pool its passes start at most
every `reputBatchIntervalMs`.
When the cleaner deleted ConsumeQueue and index files below the CommitLog minimum, drops its
mappings of them (a mapping keeps a deleted file's disk space) and takes the queues' new minimum
offsets. Final pass: dispatch to the end, flush queues, index and checkpoint.
"""

from __future__ import annotations

import logging
import sys
import time

from rmq_mp.checkpoint import StoreCheckpoint
from rmq_mp.consume_queue import ConsumeQueue, ConsumeQueueTable
from rmq_mp.dispatch import Dispatcher
from rmq_mp.index_service import IndexService
from rmq_mp.mapping_pool import process_pool
from rmq_mp.message import is_dispatchable
from rmq_mp.reporter import Reporter
from shm import layout
from shm import queue_offsets as qo
from shm import waiters as wt
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.reput")
MAX_RECORDS_PER_PASS = 20_000
SPIN_S = 0.0002
SMALL_PASS_RECORDS = 32
"""Records a pass dispatches one by one before it turns to batches (measured crossover ~30:
`python -m bench.dispatch` and a per-pass timing, 2026-11-25)."""


class ReputService(ServiceLoop):
    role = "reput"

    def on_start(self) -> None:
        cfg = self.store.config
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
        self.dispatcher = Dispatcher(self.cq_table.find, self.index, self.checkpoint)
        self.last_cq_flush = self.last_thorough = time.monotonic()
        self.cleaned_to = self.table.get(layout.CLEAN_CQ_MIN_PHY_OFFSET)
        self.stuck_at = -1
        """REPUT_FROM where the last pass met an unreadable record (-1: none)."""
        self.readable_in_bursts = self.store.sync_flush or self.store.pool_enabled
        """Records become readable at each flush (SYNC_FLUSH) or commit (the pool), not at each
        put: fixed for the process's life, asked before every sleep."""
        self.record_bytes = 1 << 30
        """Mean record size (with any BLANK) of the last pass: how many records a pass's bytes
        hold. Until a pass says, any pass counts as small."""

    def _table_min_offset(self, cq: ConsumeQueue) -> int:
        slot = self.store.shm.queues.find(cq.topic, cq.queue_id)
        return self.store.shm.queues.get(slot, qo.MIN_OFFSET) * 20 if slot >= 0 else cq.min_logic_offset

    def interval_s(self) -> float:
        return 0.1

    def spin_s(self) -> float:
        """Consumers' latency runs through reput: with plain ASYNC_FLUSH, where each put makes a
        record readable, it looks for the next one for SPIN_S before sleeping (a cross-process
        wake per message saved under steady load). Under SYNC_FLUSH or with the pool records
        become readable only at the next flush or commit, which wakes it: spinning would only
        take CPU from the producers and the flusher."""
        return 0.0 if self.readable_in_bursts else SPIN_S

    def min_pass_interval_s(self) -> float:
        """`reputBatchIntervalMs` where records become readable in bursts (SYNC_FLUSH: at each
        flush; the pool: at each commit): a pass costs ~0.1 ms before its first record, so one
        per flush took half a core from SYNC producers and slowed the flusher's fsync. Plain
        ASYNC_FLUSH dispatches at once: consumers' latency runs through reput."""
        return self.store.config.reput_batch_interval_ms / 1000 if self.readable_in_bursts else 0.0

    def has_work(self) -> bool:
        """Records past REPUT_FROM are readable (and the last pass did not stop short of them on
        an unreadable record: that one waits for the interval, not a busy loop)."""
        reput_from = self.table.get(layout.REPUT_FROM_OFFSET)
        return self.store.readable_end() > reput_from and reput_from != self.stuck_at

    def dispatch(self, limit: int = MAX_RECORDS_PER_PASS) -> int:
        """Dispatch up to ``limit`` records from REPUT_FROM; returns how many.

        A batch (`CommitLog.iter_batches`, `Dispatcher.dispatch_batch`) costs about 0.6 ms of
        numpy set-up and then 1-2 us a record, one record (`Dispatcher.dispatch`) about 25 us:
        a pass expected to hold fewer than SMALL_PASS_RECORDS (its bytes over the last passes'
        mean record size) goes one by one, up to that many, and the rest (or a bigger pass
        whole) in batches. Light load, where consumers wait on reput, is a record or two a
        pass; a backlog, or a paced pass under SYNC_FLUSH, many. Both write the same bytes. A
        queue's DISPATCHED and LAST_STORE_TS are published after its entries are written. A
        record that fails its length check is skipped ("[BUG]"), as RocketMQ's reput does; an
        unreadable one stops the pass there."""
        t = self.table
        end = self.store.sync_log()
        start = offset = max(t.get(layout.REPUT_FROM_OFFSET), t.get(layout.MIN_OFFSET))
        self.store.commit_log.release_before(offset)
        touched: set[int] = set()
        dispatched, stopped = 0, False
        if end - offset < SMALL_PASS_RECORDS * self.record_bytes:
            offset, dispatched, stopped = self._dispatch_records(
                offset, end, min(limit, SMALL_PASS_RECORDS), touched
            )
        if not stopped and offset < end and dispatched < limit:
            offset, batched = self._dispatch_batches(offset, end, limit - dispatched, touched)
            dispatched += batched
        if dispatched:
            self.record_bytes = (offset - start) // dispatched
        if offset != t.get(layout.REPUT_FROM_OFFSET):
            t.set(layout.REPUT_FROM_OFFSET, offset)
            t.add(layout.DISPATCH_COUNT, dispatched)
            t.set(layout.LOGICS_MSG_TIMESTAMP, self.checkpoint.logics_msg_timestamp)
            if self.index is not None and self.index.files:
                t.set(layout.INDEX_MSG_TIMESTAMP, self.index.files[-1].end_timestamp)
        if touched:
            self._wake_waiters(touched)
        return dispatched

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

    def _dispatch_records(
        self, offset: int, end: int, limit: int, touched: set[int]
    ) -> tuple[int, int, bool]:
        """Up to ``limit`` records one by one; (next offset, records, stopped at an unreadable one)."""
        dispatched = 0
        log_view = self.store.commit_log
        for phy, req in log_view.iter_dispatch(offset, check_crc=False, end_offset=end):
            if req.success and req.size > 0:
                self.dispatcher.dispatch(req)
                if is_dispatchable(req.sys_flag):
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
        for cq in self.cq_table.all():
            cq.flush(least_pages)
        if thorough:
            if self.index is not None:
                self.index.flush()
            self.checkpoint.physic_msg_timestamp = self.table.get(layout.PHYSIC_MSG_TIMESTAMP)
            if self.index is not None and self.index.files:
                self.checkpoint.index_msg_timestamp = self.index.files[-1].end_timestamp
            self.checkpoint.flush()

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

    def do_work(self) -> None:
        self.drop_deleted_files()
        while self.dispatch() >= MAX_RECORDS_PER_PASS:
            self.heartbeat()
        cfg = self.store.config
        now = time.monotonic()
        if (now - self.last_cq_flush) * 1000 >= cfg.flush_interval_consume_queue:
            thorough = (now - self.last_thorough) * 1000 >= cfg.flush_consume_queue_thorough_interval
            self.flush_queues(thorough)
            self.last_cq_flush = now
            if thorough:
                self.last_thorough = now

    def final_pass(self) -> None:
        while self.dispatch():
            pass
        self.flush_queues(thorough=True)

    def on_exit(self) -> None:
        if hasattr(self, "cq_table"):
            self.cq_table.close()
            if self.index is not None:
                self.index.close()


if __name__ == "__main__":
    sys.exit(main(ReputService))
