"""Cleaner: expires CommitLog files, then the ConsumeQueue and index files below them; checks disks.

Mirrors CleanCommitLogService, CleanConsumeQueueService and the disk check of RocketMQ 4.9.8's
DefaultMessageStore (docs/format.md §10):

- **Disk check**, on its own thread and schedule (`diskCheckIntervalMs`, 10 s as RocketMQ's
  scheduled `isSpaceFull`, whatever `cleanResourceInterval` is; RocketMQ issue #1400: never
  inside a deletion run): measures the commit-log and consume-queue partitions, sets DISK_FULL
  above `diskSpaceWarningLevelRatio` (puts are then refused with the ratio named) and clears it
  once usage drops. A store that cleans hourly is still protected within seconds.
- **CommitLog expiry**, every `cleanResourceInterval` or when woken by a manual request: runs
  only when a trigger holds (the `deleteWhen` hour, a partition above `diskMaxUsedSpaceRatio`, or
  one of the 20 runs a manual request buys); deletes files older than `fileReservedTime` hours,
  oldest first, at most 10 a run, `deleteCommitLogFilesInterval` apart, stopping at the first file
  that must stay. Above `diskSpaceCleanForciblyRatio` and with `cleanFileForciblyEnable`, age no
  longer matters. Never the file being written, nor one holding records not yet committed or
  dispatched.
- **Readers in other processes** (RocketMQ's `ReferenceResource` across processes): a file is
  first made unavailable (MIN_OFFSET moves past it, so new readers treat it as removed), then
  deleted once no live consumer holds an offset in it, or anyway after
  `destroyMapedFileIntervalForcibly`. A reader's mapping survives the unlink (POSIX), so a
  forced deletion never makes anyone read freed memory; the disk space returns when it unmaps.
- **ConsumeQueue and index cleanup** follows the new minimum: queue files whose last entry is
  below it and index files whose newest entry is below it go (never a queue's or the index's
  last file, which reput appends to); each queue's new minimum offset is published before its
  files are unlinked. Reput drops its own mappings of deleted files.
- `cleanProtectConsumerOffsets` (rmq-mp, RocketMQ #4549): files holding messages a known
  consumer group has not consumed are kept unless the disk is past the warning ratio.

Every triggered run is logged and recorded (CLEAN_* fields: triggers, what it deleted, why it
stopped), and a run that had to free space but could not says why (RocketMQ issue #4042).
Writes MIN_OFFSET, the CLEAN_*/DISK_* fields, DISK_FULL (flags lock) and each queue's minimum
offset. Final pass: nothing; a file left unavailable is re-admitted by the next start.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rmq_mp.config.offsets import TOPIC_GROUP_SEPARATOR
from rmq_mp.format.queue_entry import effective_file_size
from rmq_mp.outcomes import RunningFlags
from rmq_mp.store.cleaning import DELETE_FILES_BATCH_MAX, describe_triggers, explain
from rmq_mp.store.consume_queue import ExpiredQueueFiles, plan_expired_files, read_entry
from rmq_mp.store.disk import DiskLevel, DiskThresholds, disk_used_ratio
from rmq_mp.store.index_service import expired_index_files
from rmq_mp.store.mapped_file import offset_to_file_name
from shm import layout
from shm import queue_offsets as qo
from shm.pointer_table import now_ms, pid_alive_since
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.cleaner")

MAX_MANUAL_DELETE_FILE_TIMES = 20
"""Runs a manual request (`rmq-admin deleteExpiredCommitLog`) makes eligible, as RocketMQ."""
MIN_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one commit-log cleaning run did, and why it stopped where it did."""

    deleted_files: int
    deleted_bytes: int
    outcome: int
    outcome_offset: int = -1
    outcome_detail: int = 0


class DiskCheck(threading.Thread):
    """`isSpaceFull` on its own schedule (`diskCheckIntervalMs`), never the cleaning runs'
    (`cleanResourceInterval`): the DISK_FULL flag and the measured ratios."""

    def __init__(self, cleaner: CleanerService) -> None:
        super().__init__(name="rmq-disk-check", daemon=True)
        self.cleaner = cleaner
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.cleaner.check_disk()
            except Exception:
                log.exception("disk check failed")
            self.stopped.wait(self.cleaner.disk_check_interval_s())


class CleanerService(ServiceLoop):
    role = "cleaner"

    def on_start(self) -> None:
        cfg = self.store.config
        self.thresholds = DiskThresholds.of(cfg)
        self.file_size = cfg.mapped_file_size_commit_log
        self.cq_file_size = effective_file_size(cfg.mapped_file_size_consume_queue)
        self.manual_seen = self.table.get(layout.MANUAL_DELETE_DONE_SEQ)
        self.manual_runs_left = 0
        self.disk_check = DiskCheck(self)
        self.disk_check.start()

    def on_settings(self) -> None:
        self.thresholds = DiskThresholds.of(self.store.config)  # diskMaxUsedSpaceRatio is live

    def on_exit(self) -> None:
        if hasattr(self, "disk_check"):
            self.disk_check.stopped.set()
            self.disk_check.join(5)

    def interval_s(self) -> float:
        return max(self.store.config.clean_resource_interval / 1000, MIN_INTERVAL_S)

    def disk_check_interval_s(self) -> float:
        return self.store.config.disk_check_interval_ms / 1000

    # ------------------------------------------------------------------ disk

    def measure(self) -> tuple[float, float]:
        """(commit-log, consume-queue) partition usage, recorded in the pointer table."""
        commit_log = disk_used_ratio(self.store.paths.commit_log)
        consume_queue = disk_used_ratio(self.store.paths.consume_queue)
        if consume_queue < 0:  # not created yet: it lives beside the commit log
            consume_queue = disk_used_ratio(self.store.paths.root)
        t = self.table
        t.set(layout.DISK_USED_PERMILLE, round(commit_log * 1000))
        t.set(layout.CQ_DISK_USED_PERMILLE, round(consume_queue * 1000))
        return commit_log, consume_queue

    def check_disk(self) -> None:
        """`isSpaceFull`: DISK_FULL above diskSpaceWarningLevelRatio, cleared below it. DISK_CHECK_MS
        is written last, so whoever sees a check's time sees the flag that check decided."""
        commit_log, _consume_queue = self.measure()
        full = self.thresholds.level(commit_log) is DiskLevel.WARNING
        shm = self.store.shm
        if full:
            before = shm.update_running_flags(set_bits=RunningFlags.DISK_FULL)
            if not before & RunningFlags.DISK_FULL:
                log.error(
                    "DISK_FULL: %s; puts are refused", self.thresholds.describe("commit-log", commit_log)
                )
        elif self.table.get(layout.RUNNING_FLAGS) & RunningFlags.DISK_FULL:
            shm.update_running_flags(clear_bits=RunningFlags.DISK_FULL)
            log.warning(
                "disk OK again: %s; puts accepted", self.thresholds.describe("commit-log", commit_log)
            )
        self.table.set(layout.DISK_CHECK_MS, now_ms())

    # ------------------------------------------------------------------ the loop

    def do_work(self) -> None:
        self.retry_pending_file()
        self.clean_commit_log()
        self.clean_consume_queues()

    def triggers(self, commit_log: float, consume_queue: float) -> int:
        """RocketMQ's three triggers (and clean-immediately) as TRIGGER_* bits."""
        cfg = self.store.config
        bits = 0
        if datetime.now().hour in cfg.delete_when_hours:
            bits |= layout.TRIGGER_TIME
        if self.thresholds.space_to_delete(commit_log) or self.thresholds.space_to_delete(consume_queue):
            bits |= layout.TRIGGER_SPACE
        levels = (self.thresholds.level(commit_log), self.thresholds.level(consume_queue))
        seq = self.table.get(layout.MANUAL_DELETE_SEQ)
        if seq > self.manual_seen:
            self.manual_seen = seq
            self.manual_runs_left = MAX_MANUAL_DELETE_FILE_TIMES
        if self.manual_runs_left > 0:
            self.manual_runs_left -= 1
            bits |= layout.TRIGGER_MANUAL
        if cfg.clean_file_forcibly_enable and any(level >= DiskLevel.CLEAN_FORCIBLY for level in levels):
            bits |= layout.TRIGGER_FORCIBLY
        return bits

    def clean_commit_log(self) -> None:
        commit_log, consume_queue = self.measure()
        bits = self.triggers(commit_log, consume_queue)
        if not bits & (layout.TRIGGER_TIME | layout.TRIGGER_SPACE | layout.TRIGGER_MANUAL):
            return
        warning = max(commit_log, consume_queue) > self.thresholds.warning
        result = self.delete_expired_files(
            clean_at_once=bool(bits & layout.TRIGGER_FORCIBLY),
            protect=self.store.config.clean_protect_consumer_offsets and not warning,
        )
        self.record(bits, result)
        if bits & layout.TRIGGER_MANUAL:
            self.table.set(layout.MANUAL_DELETE_DONE_SEQ, self.manual_seen)

    def record(self, bits: int, result: RunResult) -> None:
        t = self.table
        t.set(layout.CLEAN_LAST_RUN_MS, now_ms())
        t.set(layout.CLEAN_LAST_TRIGGERS, bits)
        t.set(layout.CLEAN_LAST_DELETED_FILES, result.deleted_files)
        t.set(layout.CLEAN_LAST_DELETED_BYTES, result.deleted_bytes)
        t.set(layout.CLEAN_LAST_OUTCOME, result.outcome)
        t.set(layout.CLEAN_LAST_OUTCOME_OFFSET, result.outcome_offset)
        t.set(layout.CLEAN_LAST_OUTCOME_DETAIL, result.outcome_detail)
        t.add(layout.CLEAN_DELETED_FILES, result.deleted_files)
        t.add(layout.CLEAN_DELETED_BYTES, result.deleted_bytes)
        t.add(layout.CLEAN_RUNS, 1)  # last: a reader that sees the count sees the run's fields
        why = explain(
            result.outcome,
            result.outcome_offset,
            result.outcome_detail,
            reserved_hours=self.store.config.file_reserved_time,
        )
        if result.deleted_files:
            log.info(
                "cleaning run (%s): deleted %d commit-log files (%d bytes); stopped: %s",
                describe_triggers(bits),
                result.deleted_files,
                result.deleted_bytes,
                why,
            )
        elif bits & layout.TRIGGER_SPACE:
            log.warning("disk space will be full soon, but delete file failed: %s", why)
        else:
            log.info("cleaning run (%s): nothing deleted: %s", describe_triggers(bits), why)

    # ------------------------------------------------------------------ commit-log files

    def deletable_end(self) -> tuple[int, int]:
        """(first offset that must stay, OUTCOME_* naming why): the start of the file being
        written, or of the file holding the first record still in a pool buffer or not yet
        dispatched, to every queue (deleting it would lose queue entries: a queue reput
        quarantined re-dispatches from QUEUE_REDISPATCH_FROM)."""
        t = self.table
        wrote = t.get(layout.WROTE_POSITION)
        current = wrote - wrote % self.file_size
        pending = min(
            t.written_end(),
            t.get(layout.REPUT_FROM_OFFSET),
        )
        if t.get(layout.DISPATCH_FAILED_QUEUES):
            pending = min(pending, t.get(layout.QUEUE_REDISPATCH_FROM))
        pending_file = pending - pending % self.file_size
        if pending_file < current:
            return pending_file, layout.OUTCOME_UNDISPATCHED
        return current, layout.OUTCOME_CURRENT_FILE

    def delete_expired_files(self, *, clean_at_once: bool, protect: bool) -> RunResult:
        """`deleteExpiredFileByTime`: oldest first, at most a batch, stop at the first keeper."""
        cfg = self.store.config
        expired_before = time.time() - cfg.file_reserved_time * 3600
        protected_from = self.unconsumed_offset() if protect else -1
        pending = self.table.get(layout.CLEAN_PENDING_OFFSET)
        if pending >= 0:  # the oldest file still waits for a reader: nothing after it may go first
            holders = self.store.shm.waiters.holders_below(pending + self.file_size, pid_alive_since)
            return RunResult(0, 0, layout.OUTCOME_HELD_BY_READER, pending, holders[0] if holders else 0)
        offset = self.table.get(layout.MIN_OFFSET)
        deleted = 0
        while True:
            end, why = self.deletable_end()
            if offset >= end:
                return RunResult(deleted, deleted * self.file_size, why, end)
            if deleted >= DELETE_FILES_BATCH_MAX:
                return RunResult(deleted, deleted * self.file_size, layout.OUTCOME_BATCH_LIMIT, offset)
            path = self.store.paths.commit_log / offset_to_file_name(offset)
            try:
                modified = path.stat().st_mtime
            except FileNotFoundError:
                modified = 0.0
            if not clean_at_once and modified > expired_before:
                age_s = int(time.time() - modified)
                return RunResult(deleted, deleted * self.file_size, layout.OUTCOME_NOT_EXPIRED, offset, age_s)
            if 0 <= protected_from < offset + self.file_size:
                return RunResult(
                    deleted, deleted * self.file_size, layout.OUTCOME_PROTECTED, offset, protected_from
                )
            if deleted:
                time.sleep(cfg.delete_commit_log_files_interval / 1000)
            outcome, detail = self.destroy(offset, path)
            if outcome != layout.OUTCOME_NONE:
                return RunResult(deleted, deleted * self.file_size, outcome, offset, detail)
            deleted += 1
            offset += self.file_size

    def destroy(self, offset: int, path: Path) -> tuple[int, int]:
        """`MappedFile.destroy(intervalForcibly)` across processes: make the file unavailable,
        then unlink it unless a live consumer holds it and the forcible interval has not passed.
        Returns (OUTCOME_NONE, 0) once deleted, else (outcome, holder pid or errno)."""
        t = self.table
        end = offset + self.file_size
        if t.get(layout.MIN_OFFSET) < end:
            t.set(layout.MIN_OFFSET, end)  # new readers now see the file as removed
        if t.get(layout.CLEAN_PENDING_OFFSET) != offset:
            t.set(layout.CLEAN_PENDING_OFFSET, offset)
            t.set(layout.CLEAN_PENDING_SINCE_MS, now_ms())
        holders = self.store.shm.waiters.holders_below(end, pid_alive_since)
        if holders:
            held_ms = now_ms() - t.get(layout.CLEAN_PENDING_SINCE_MS)
            if held_ms < self.store.config.destroy_maped_file_interval_forcibly:
                return layout.OUTCOME_HELD_BY_READER, holders[0]
            log.warning(
                "deleting %s although consumer pid(s) %s still hold it (held %d ms >= "
                "destroyMapedFileIntervalForcibly); their mappings stay valid until they release them",
                path.name,
                holders,
                held_ms,
            )
            t.add(layout.CLEAN_FORCED_DESTROYS, 1)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            t.set(layout.MIN_OFFSET, offset)  # still on disk, so still readable
            t.set(layout.CLEAN_PENDING_OFFSET, -1)
            log.error("could not delete commit-log file %s: %s", path, exc)
            return layout.OUTCOME_DELETE_FAILED, exc.errno or 0
        t.set(layout.CLEAN_PENDING_OFFSET, -1)
        log.info("deleted commit-log file %s", path.name)
        return layout.OUTCOME_NONE, 0

    def retry_pending_file(self) -> None:
        """`redeleteHangedFile`: a file made unavailable but held by a reader is deleted once
        released, or once the forcible interval has passed, whatever triggers say."""
        offset = self.table.get(layout.CLEAN_PENDING_OFFSET)
        if offset >= 0:
            path = self.store.paths.commit_log / offset_to_file_name(offset)
            if self.destroy(offset, path)[0] == layout.OUTCOME_NONE:
                self.table.add(layout.CLEAN_DELETED_FILES, 1)
                self.table.add(layout.CLEAN_DELETED_BYTES, self.file_size)

    def unconsumed_offset(self) -> int:
        """Lowest commit-log offset of a message some known group has not consumed, -1 none."""
        queues = self.store.shm.queues
        groups = self.store.shm.groups
        lowest = -1
        for key, queue_id, slot in groups.queues():
            topic, _, _group = key.partition(TOPIC_GROUP_SEPARATOR)
            consumed = groups.get(slot, qo.COMMITTED)
            queue_slot = queues.find(topic, queue_id)
            if queue_slot < 0 or consumed >= queues.get(queue_slot, qo.DISPATCHED):
                continue
            queue_dir = self.store.paths.consume_queue / topic / str(queue_id)
            entry = read_entry(
                queue_dir, self.cq_file_size, max(consumed, queues.get(queue_slot, qo.MIN_OFFSET))
            )
            if entry is not None and (lowest < 0 or entry[0] < lowest):
                lowest = entry[0]
        return lowest

    # ------------------------------------------------------------------ queues and index

    def lowest_stored_offset(self) -> int:
        """The first commit-log byte still on disk (a held, unavailable file included)."""
        pending = self.table.get(layout.CLEAN_PENDING_OFFSET)
        return pending if pending >= 0 else self.table.get(layout.MIN_OFFSET)

    def _publish(self, plan: ExpiredQueueFiles, slot: int, resets: int) -> bool:
        """One queue's new minimum, then its expired files, unless reput removed or reset a
        deleted topic's queues since the plan (QUEUE_RESETS moved): the plan may be of the old
        topic's queue, whose minimum must not land on the new one's slot, nor its file names
        delete the new queue's files. Under the flags lock, which reput's QUEUE_RESETS takes."""
        queues = self.store.shm.queues
        if not plan.paths and (slot < 0 or plan.min_queue_offset <= queues.get(slot, qo.MIN_OFFSET)):
            return True  # nothing to change: no lock
        with self.store.shm.flags_lock("clean consume queue"):
            if self.table.get(layout.QUEUE_RESETS) != resets:
                return False
            if slot >= 0 and plan.min_queue_offset > queues.get(slot, qo.MIN_OFFSET):
                queues.set(slot, qo.MIN_OFFSET, plan.min_queue_offset)  # published first
            for path in plan.paths:
                path.unlink(missing_ok=True)
        return True

    def clean_consume_queues(self) -> None:
        """CleanConsumeQueueService: once the commit-log minimum rose, drop what points below it."""
        min_phy = self.lowest_stored_offset()
        if min_phy <= self.table.get(layout.CLEAN_CQ_MIN_PHY_OFFSET):
            return
        t = self.table
        queues = self.store.shm.queues
        root = self.store.paths.consume_queue
        cq_files = 0
        deferred = False
        for topic_dir in sorted(root.iterdir()) if root.is_dir() else []:
            try:  # a deleted topic's directory (rmq-admin deleteTopic) may go meanwhile
                queue_dirs = sorted(topic_dir.iterdir())
            except FileNotFoundError:
                continue
            for queue_dir in queue_dirs:
                if not queue_dir.name.isdigit() or not queue_dir.is_dir():
                    continue
                resets = t.get(layout.QUEUE_RESETS)
                if resets % 2:  # reput is resetting a deleted topic's queues: the next pass
                    deferred = True
                    continue
                try:
                    plan = plan_expired_files(queue_dir, self.cq_file_size, min_phy)
                except FileNotFoundError:
                    continue
                if not self._publish(plan, queues.find(topic_dir.name, int(queue_dir.name)), resets):
                    deferred = True  # it reset them since the plan
                    continue
                if plan.paths:
                    cq_files += len(plan.paths)
                    time.sleep(self.store.config.delete_consume_queue_files_interval / 1000)
        index_files = expired_index_files(self.store.paths.index, min_phy)
        for path in index_files:
            path.unlink(missing_ok=True)
        t.add(layout.CLEAN_CQ_DELETED_FILES, cq_files)
        t.add(layout.CLEAN_INDEX_DELETED_FILES, len(index_files))
        if not deferred:
            t.set(layout.CLEAN_CQ_MIN_PHY_OFFSET, min_phy)
        if cq_files or index_files:
            log.info(
                "consume queues and index follow the commit-log minimum %d: deleted %d queue files, "
                "%d index files",
                min_phy,
                cq_files,
                len(index_files),
            )


if __name__ == "__main__":
    sys.exit(main(CleanerService))
