"""Startup recovery: find where the CommitLog's valid records end, cut everything after it, and
bring the ConsumeQueues and index back in line.

Mirrors `DefaultMessageStore.load/recover`, `CommitLog.recoverNormally/recoverAbnormally` and
`ConsumeQueue.recover/truncateDirtyLogicFiles` (docs/format.md §8). One pass over the log, as
RocketMQ's abnormal recovery does: each batch of records is checked (body CRC when
`checkCRCOnRecover`) and, from where dispatch must replay, dispatched to the ConsumeQueues and the
index (`record_batch`, `Dispatcher.dispatch_batch`); then the log, queue and index entries at or
past the valid end are cut. The replay range is, after an abnormal exit, from the
checkpoint-selected file; after a normal one, from where dispatch had got to. Dropped byte ranges
go through the store's `Reporter`.

Unlike RocketMQ, a normal recovery (not a slave's) cuts only a damaged tail: a bad record with a
sound record after it was flushed by the clean exit, so it is rot, not a torn write, and it is
stepped over and reported as one in an older file is (`RecoveryPlan.step_over_damage`). Cutting
there lost the intact records after it, and a cut that deleted the newest file moved the next
start's window of three files onto an older damaged record, which that start cut too. After a
crash the same holds for a bad record whose next sound record was stored by the checkpoint's
safe time (`RecoveryPlan.flushed_by_ms`); any other is cut, a torn write being indistinguishable.

`recover` runs four named steps: `plan_recovery` (a `RecoveryPlan` value: the files to check and
where dispatch must replay from), `_check_log` (the pass: the valid end), `_cut` (log, queues and
index at that end) and `_dispatch` (keep the pass's dispatch or dispatch again; rebuild queues
that lack records), then reports.

Queues and index are derived from the log, so before the pass each is checked whole and what is
damaged is rebuilt from the log rather than cut and forgotten (RocketMQ cuts a queue at its first
bad entry and loses the rest): `ConsumeQueue.check` keeps a queue's entries before its first
damaged one, `IndexService.remove_damaged` and `_check_index` remove damaged index files and
those after them (and find files deleted at the head, between two files or at the end by keyed
records in the gap), and the replay starts early enough to rebuild them. A queue whose first file
is gone is found by walking the log below its first record (`_rebuild_missing_heads`); one whose
directory is gone, by records of it in the scanned files that it lacks (`_missing_records`) or by
dispatch meeting a gap; both are rebuilt from the log's beginning.

Why cutting after dispatching gives the same files as cutting first (rmq-mp's earlier two
passes, whose results and reports this keeps): dispatch is idempotent and per queue; it appends
only above a queue's (or the index's) last entry, and a cut removes a suffix of entries, those
ending past the valid end. When the entries are in log order (checked before the pass: each
queue's last file and the newest index file; the index files whole), a queue or index that the cut
shortens already ended past the valid end, so the pass appended nothing to it; one the cut leaves
alone ends up as a dispatch after an (empty) cut would leave it. The pass cannot know that
beforehand, so whenever a cut does drop entries, the replay range is dispatched once more after
the cuts, as the two-pass recovery did (entries now missing are rebuilt, the rest are duplicates);
the same when the replay does not start on a record boundary of the pass, or the checks fail.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rmq_mp.config.store_config import BrokerRole
from rmq_mp.format import record
from rmq_mp.format.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE
from rmq_mp.format.queue_entry import CQ_ENTRY, CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE
from rmq_mp.format.record_batch import RecordBatch
from rmq_mp.progress import progress
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.mapped_file import offset_to_file_name

if TYPE_CHECKING:
    from rmq_mp.config.store_config import MessageStoreConfig
    from rmq_mp.store.checkpoint import StoreCheckpoint
    from rmq_mp.store.commit_log import BatchStep, CommitLog
    from rmq_mp.store.consume_queue import ConsumeQueueTable
    from rmq_mp.store.dispatch import Dispatcher
    from rmq_mp.store.index_service import IndexService
    from rmq_mp.store.reporter import Reporter


class MessageStore(Protocol):
    """What recovery works on: an opened store's files and its dispatcher (`MessageStore` of
    message_store.py, which calls `recover` from its `load`)."""

    config: MessageStoreConfig
    writable: bool
    commit_log: CommitLog
    cq_table: ConsumeQueueTable
    index_service: IndexService | None
    checkpoint: StoreCheckpoint
    dispatcher: Dispatcher
    reporter: Reporter

    def all_consume_queues(self) -> list[ConsumeQueue]: ...

    def destroy_consume_queues(self) -> None: ...

    def recover_topic_queue_table(self) -> None: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found and did."""

    abnormal: bool
    scan_from_offset: int
    recovered_end_offset: int
    dispatch_from_offset: int
    records_dispatched: int
    commit_log_bytes_dropped: int
    cq_entries_truncated: int
    index_entries_truncated: int
    duration_ms: int
    one_pass: bool = False
    """The records were dispatched by the checking pass itself (no second walk after the cuts)."""


def _choose_abnormal_start(store: MessageStore) -> int:
    """Newest file whose first record is older than the checkpoint's safe time (§8.3)."""
    files = store.commit_log.mfq.files
    cfg = store.config
    safe = (
        store.checkpoint.min_timestamp_index()
        if cfg.message_index_enable and cfg.message_index_safe
        else store.checkpoint.min_timestamp()
    )
    for index in range(len(files) - 1, -1, -1):
        mf = files[index]
        if len(mf.buf) < record.POS_SYS_FLAG + 4:
            continue
        _total, magic = record.peek_size_magic(mf.buf, 0)
        if magic not in (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2):
            continue
        store_ts = record.peek_store_timestamp(mf.buf, 0)
        if store_ts != 0 and store_ts <= safe:
            log.info(
                "abnormal recovery starts at file %s (first store time %d <= %d)",
                mf.path.name,
                store_ts,
                safe,
            )
            return index
    return 0


@dataclass(slots=True)
class _Replay:
    """Dispatch of ``[start, valid end)`` as the scan reaches it."""

    store: MessageStore
    start: int
    dispatched: int = 0
    started: bool = False
    exact: bool = True
    """False once the replay cannot be what a dispatch walk from ``start`` would do (it does not
    start on a record boundary of the scan, or that walk would have stopped earlier)."""
    pending: RecordBatch | None = None
    """The newest record, held back while it may be a torn tail (properties ending in NUL)."""

    def batch(self, batch: RecordBatch, step_start: int) -> None:
        """Dispatch the records of ``batch`` (found by a walk step from ``step_start``) that lie
        at or after ``start``; hold back a last record whose properties end in NUL."""
        first = 0
        if not self.started:
            if step_start > self.start:
                self.exact = False  # the scan stepped over `start`: a walk from it would differ
                return
            if step_start < self.start:
                first = int(np.searchsorted(batch.position, self.start))
                if first < len(batch):
                    if int(batch.position[first]) != self.start:
                        self.exact = False  # `start` is inside a record
                        return
                elif not len(batch) or batch.end_offset() != self.start:
                    return  # `start` is further on
            self.started = True
        if first >= len(batch):
            return
        self.flush()
        last = len(batch) - 1 if bool(batch.ends_in_nul[-1]) else len(batch)
        self._dispatch(batch if (first, last) == (0, len(batch)) else batch.slice(first, last))
        if last < len(batch):
            self.pending = batch.slice(last, len(batch))

    def reached(self, offset: int) -> None:
        """The walk moved on to ``offset`` (past a blank record): a held-back record stays."""
        self.flush()
        if not self.started and offset == self.start:
            self.started = True
        elif not self.started and offset > self.start:
            self.exact = False

    def flush(self) -> None:
        if self.pending is not None:
            self._dispatch(self.pending)
            self.pending = None

    def _dispatch(self, batch: RecordBatch) -> None:
        if len(batch):
            self.store.dispatcher.dispatch_batch(batch)
            self.dispatched += len(batch)


@dataclass(frozen=True, slots=True)
class _Scan:
    end: int
    replay: _Replay | None
    missing: set[ConsumeQueue | tuple[str, int]]
    """Queues lacking records found below ``check_below`` (`_missing_records`)."""


def _scan(
    store: MessageStore,
    start_offset: int,
    replay: _Replay | None,
    *,
    check_below: int,
    step_over: bool = False,
    flushed_by_ms: int = 0,
) -> _Scan:
    """The pass: offset just past the last valid record, reporting what lies beyond it; records
    from ``replay.start`` on are dispatched as they are found valid; queues are checked to hold
    the records below ``check_below``. A bad record followed by a sound one is stepped over and
    reported, not cut at, with ``step_over`` (`RecoveryPlan.step_over_damage`), or when that
    sound record was stored at or before ``flushed_by_ms`` (`RecoveryPlan.flushed_by_ms`)."""
    missing: set[ConsumeQueue | tuple[str, int]] = set()
    heads: dict[ConsumeQueue, tuple[int, int] | None] = {}
    commit_log = store.commit_log
    valid_end = start_offset
    last_end = -1
    last_position = -1
    last_nul = False
    file_size = store.config.mapped_file_size_commit_log
    scanned_file = -1
    total = commit_log.max_offset() - start_offset
    offset = start_offset
    with progress("recovery: checking commit log", total=total, unit="bytes") as bar:
        while offset >= 0:
            resume = -1
            for step in commit_log.iter_batches(offset, check_crc=store.config.check_crc_on_recover):
                bar.update(step.stop - start_offset)
                if step.start // file_size != scanned_file:  # RocketMQ: "recover next physics file"
                    scanned_file = step.start // file_size
                    log.info(
                        "recovery: checking commit-log file %s",
                        offset_to_file_name(scanned_file * file_size),
                    )
                batch = step.batch
                if len(batch) and int(batch.position[0]) < check_below:
                    missing |= _missing_records(store, batch, check_below, heads)
                if len(batch):
                    last_position = int(batch.position[-1])
                    last_end = batch.end_offset()
                    last_nul = bool(batch.ends_in_nul[-1])
                    valid_end = last_end
                if replay is not None:
                    replay.batch(batch, step.start)
                tail = step.tail
                if tail is None:
                    continue
                if tail.success:  # blank: the rest of the file is empty
                    valid_end = step.next_offset
                    if replay is not None:
                        replay.reached(valid_end)
                    continue
                garbage_end = commit_log.mfq.last_nonzero(step.stop)
                if step_over or flushed_by_ms > 0:
                    resume, stored_ms = _next_sound_record(store, step.stop, garbage_end)
                    if not step_over and not 0 < stored_ms <= flushed_by_ms:
                        resume = -1  # it may be a torn write: cut, as RocketMQ does
                if resume >= 0:
                    _report_skip(
                        store,
                        step.stop,
                        resume,
                        "recovery went past a damaged record followed by sound ones (flushed before "
                        f"{'the clean exit' if step_over else 'the checkpoint'}: not a torn write): "
                        f"{tail.reason}",
                    )
                    break
                if last_nul and last_end == valid_end:
                    # The final record's properties end in NUL: its tail was zero-filled by a torn write.
                    _report_dropped(
                        store, last_position, "last record's properties end in zero bytes: a torn tail"
                    )
                    if replay is not None:
                        replay.pending = None
                    return _Scan(last_position, replay, missing)
                _report_dropped(store, step.stop, tail.reason, garbage_end)
                break
            offset = resume
    if replay is not None:
        replay.flush()
        if not replay.started and replay.start < valid_end:
            replay.exact = False
    return _Scan(valid_end, replay, missing)


def _next_sound_record(store: MessageStore, phy: int, limit: int) -> tuple[int, int]:
    """Start and store time of the first sound record after the bad one at ``phy`` and before
    ``limit`` (past it the log holds only zeros), found as an older file's walk finds it
    (`CommitLog.next_record_start`, then the scan's own check: CRCs as `checkCRCOnRecover`
    says, header plausibility); (-1, 0) if none: the bad record begins a damaged tail."""
    commit_log = store.commit_log
    check_crc = store.config.check_crc_on_recover
    at = phy
    while at < limit:
        at = commit_log.next_record_start(at)
        if at >= limit:
            break
        req = commit_log.check_at(at, check_crc=check_crc)
        if req.success and req.size > 0:
            return at, req.store_timestamp
    return -1, 0


def _report_skip(store: MessageStore, start: int, resume: int, reason: str) -> None:
    """Report a damaged record a walk went past (``[start, resume)``), once: the scan and the
    walks that dispatch or rebuild after it may each meet it."""
    path = str(store.commit_log.mfq.store_dir)
    if any(
        d.kind == "record-invalid" and (d.path, d.start) == (path, start) for d in store.reporter.findings
    ):
        return
    store.reporter.report("record-invalid", path, start, resume, reason)


def _report_dropped(store: MessageStore, phy: int, reason: str, last_nonzero: int = -1) -> None:
    """Report the non-zero bytes from ``phy`` to the end of the log as one dropped range
    (``last_nonzero``: their end, if known)."""
    if last_nonzero < 0:
        last_nonzero = store.commit_log.mfq.last_nonzero(phy)
    if last_nonzero > phy:
        store.reporter.report(
            "commitlog-truncated", str(store.commit_log.mfq.store_dir), phy, last_nonzero, reason
        )


def _walk_past_damage(
    store: MessageStore, start: int, end: int | None, below: int, *, report: bool = True
) -> Iterator[BatchStep]:
    """`iter_batches` from ``start`` that goes on past a damaged record lying below ``below``
    (older files, which recovery's scan does not read, and the records it stepped over: the log
    is not cut there), at the next sound record (`CommitLog.next_record_start`), reporting the
    range skipped (once: `_report_skip`); at or past
    ``below`` it stops at the first invalid record, as RocketMQ's walk does. CRCs are checked
    as the scan checks them (``checkCRCOnRecover``): a record whose QUEUEID or TOPIC is damaged
    would otherwise make a queue of its own, found damaged and rebuilt again at every start.
    The checks that decide what to rebuild walk the same way (``report=False``: a look, the
    dispatch that follows reports), so they never miss in a queue or the index a record
    dispatch steps over, which would rebuild it at every start."""
    commit_log = store.commit_log
    check_crc = store.config.check_crc_on_recover
    offset = start
    while True:
        resume = -1
        for step in commit_log.iter_batches(offset, check_crc=check_crc, end_offset=end):
            yield step
            if step.tail is not None and not step.tail.success and step.stop < below:
                resume = commit_log.next_record_start(step.stop)
                if report:
                    _report_skip(
                        store, step.stop, resume, f"dispatch went past a damaged record: {step.tail.reason}"
                    )
        if resume < 0 or (end is not None and resume >= end):
            return
        offset = resume


def _dispatch_range(
    store: MessageStore, start: int, end: int | None, label: str, *, index_only: bool, below: int
) -> int:
    """Dispatch the records of ``[start, end)`` (default: to the log's end), past damaged records
    below ``below`` (`_walk_past_damage`); returns how many."""
    commit_log = store.commit_log
    stop = commit_log.max_offset() if end is None else end
    dispatched = 0
    with progress(label, total=max(stop - start, 0), unit="bytes") as bar:
        for step in _walk_past_damage(store, start, end, below):
            bar.update(step.stop - start)
            if index_only:
                assert store.index_service is not None
                store.index_service.build_index_batch(step.batch)
            else:
                store.dispatcher.dispatch_batch(step.batch)
            dispatched += len(step.batch)
    return dispatched


def _pre_range_ok(store: MessageStore, start: int, scan_from: int) -> tuple[int, bool]:
    """Dispatch ``[start, scan_from)`` (replay starting before the scanned files); returns
    (records, whether the walk reached ``scan_from``: if not, a walk from ``start`` stops early)."""
    dispatched = 0
    reached = False
    for step in _walk_past_damage(store, start, scan_from, scan_from):
        store.dispatcher.dispatch_batch(step.batch)
        dispatched += len(step.batch)
        if step.tail is not None and not step.tail.success and step.stop >= scan_from:
            return dispatched, False
        reached = step.next_offset >= scan_from
    return dispatched, reached or start >= scan_from


def _check_queues(store: MessageStore, verify_from_phy: int) -> dict[ConsumeQueue, int]:
    """Check every queue whole (`ConsumeQueue.check`); returns the damaged ones with the phy
    offset from which dispatch must rebuild each."""
    commit_log = store.commit_log
    min_phy = commit_log.min_offset()
    rebuild: dict[ConsumeQueue, int] = {}
    if not store.writable:  # nothing can be rebuilt: find where each queue ends, as RocketMQ does,
        for cq in store.all_consume_queues():  # and let reads skip what is damaged
            cq.recover()
        return rebuild
    for cq in store.all_consume_queues():
        agree = partial(_agree, commit_log, cq.topic, cq.queue_id)
        rebuild_from = cq.check(agree, verify_from_phy)
        if rebuild_from is not None:
            rebuild[cq] = max(rebuild_from, min_phy)
    return rebuild


def _agree(
    commit_log: CommitLog,
    topic: str,
    queue_id: int,
    phy: np.ndarray,
    size: np.ndarray,
    queue_offset: np.ndarray,
) -> int:
    """`CommitLog.first_disagreeing`, except entries whose record is damaged rather than the
    entry: walking the log from the previous entry's record end (a record boundary) does not
    reach this queue's record at this offset sound. Such an entry is kept (the rebuild could
    not put it back, and every later entry would shift); a read skips it and reports it."""
    start = 0
    while start < len(phy):
        wrong = start + commit_log.first_disagreeing(
            phy[start:], size[start:], queue_id, queue_offset[start:]
        )
        if wrong >= len(phy):
            return wrong
        if wrong == 0 or queue_offset[wrong - 1] != queue_offset[wrong] - 1:
            return wrong  # no known record boundary before it: cut, to be safe
        prior_end = int(phy[wrong - 1] + size[wrong - 1])
        bound = int(phy[wrong + 1]) if wrong + 1 < len(phy) else int(phy[wrong] + size[wrong]) + (1 << 16)
        if _reaches(commit_log, prior_end, bound, topic, queue_id, int(queue_offset[wrong])):
            return wrong
        start = wrong + 1
    return len(phy)


def _reaches(
    commit_log: CommitLog, start: int, bound: int, topic: str, queue_id: int, queue_offset: int
) -> bool:
    """A walk of sound records from ``start`` meets the queue's record at ``queue_offset``
    before ``bound``."""
    for phy, req in commit_log.iter_dispatch(start, check_crc=True, end_offset=bound):
        if not req.success:
            return False
        if req.size > 0 and (req.topic, req.queue_id, req.queue_offset) == (topic, queue_id, queue_offset):
            return True
        if phy >= bound:
            return False
    return False


def _queue_head(cq: ConsumeQueue) -> tuple[int, int] | None:
    """(queue offset, phy offset) of the queue's first real entry (pre-blanks skipped)."""
    first = cq.mfq.first_file()
    if first is None or first.wrote_position == 0:
        return None
    for i in range(first.wrote_position // CQ_STORE_UNIT_SIZE):
        phy, size, _tags = CQ_ENTRY.unpack_from(first.buf, i * CQ_STORE_UNIT_SIZE)
        if size != PRE_BLANK_SIZE:
            return first.file_from_offset // CQ_STORE_UNIT_SIZE + i, phy
    return None


def _rebuild_missing_heads(store: MessageStore) -> dict[ConsumeQueue, int]:
    """Queues whose first file is gone (deleted, not expired): a queue starting above offset 0
    whose first record lies above the log's first offset may only do so if the log holds no
    earlier record of it. The log between is walked (only then: with expiry the first record
    is rarely far above the log's first offset); a queue found lacking has its files removed,
    to be rebuilt from the log's beginning."""
    commit_log = store.commit_log
    min_phy = commit_log.min_offset()
    suspects: dict[tuple[str, int], tuple[ConsumeQueue, int, int]] = {}
    for cq in store.all_consume_queues():
        head = _queue_head(cq)
        if head is not None and head[0] > 0 and head[1] > min_phy:
            suspects[(cq.topic, cq.queue_id)] = (cq, head[0], head[1])
    if not suspects:
        return {}
    until = max(phy for _cq, _q, phy in suspects.values())
    lacking: dict[ConsumeQueue, int] = {}
    for step in _walk_past_damage(store, min_phy, until, until, report=False):
        batch = step.batch
        if not len(batch):
            continue
        keys = (batch.topic_index << 32) | (batch.queue_id & 0xFFFFFFFF)
        unique, first_rows = np.unique(keys, return_index=True)
        for key, row in zip(unique.tolist(), first_rows.tolist(), strict=True):
            name = (batch.topics[key >> 32], int(batch.queue_id[row]))
            suspect = suspects.get(name)
            if suspect is None or suspect[0] in lacking:
                continue
            cq, head_offset, head_phy = suspect
            rows = np.flatnonzero(keys == key)
            bound = store.dispatcher.dropped.get(cq.topic)
            if bound is not None:  # a deleted topic's records are not the queue's (deleted_topics.py)
                rows = rows[batch.position[rows] >= bound]
            if ((batch.position[rows] < head_phy) & (batch.queue_offset[rows] < head_offset)).any():
                store.reporter.report(
                    "cq-rebuilt",
                    str(cq.mfq.store_dir),
                    0,
                    cq.mfq.min_offset(),
                    f"the log holds records of queue offsets below {head_offset} (its first file is "
                    "missing); rebuilt from the commit log",
                )
                cq.destroy_files()
                lacking[cq] = min_phy
    return lacking


def _missing_records(
    store: MessageStore, batch: RecordBatch, below: int, heads: dict[ConsumeQueue, tuple[int, int] | None]
) -> set[ConsumeQueue | tuple[str, int]]:
    """Queues lacking records of ``batch`` that lie below ``below`` (which dispatch will not
    add again): a queue directory or file deleted or cut. Compared with the queue's head
    (looked up once a scan, in ``heads``: each look-up maps the queue's first file) and end as
    loaded and checked; a missing queue is named by (topic, queue id)."""
    rows = np.flatnonzero(batch.position < below)
    if not len(rows):
        return set()
    transaction = batch.sys_flag[rows] & TRANSACTION_ROLLBACK_TYPE
    rows = rows[(transaction == 0) | (transaction == TRANSACTION_COMMIT_TYPE)]
    missing: set[ConsumeQueue | tuple[str, int]] = set()
    dropped = store.dispatcher.dropped
    if dropped and len(rows):  # a deleted topic's records below its tombstone lack no queue
        keep = np.ones(len(rows), dtype=bool)
        for topic, bound in dropped.items():
            if topic in batch.topics:
                index = batch.topics.index(topic)
                keep &= ~((batch.topic_index[rows] == index) & (batch.position[rows] < bound))
        rows = rows[keep]
    if not len(rows):
        return missing
    keys = (batch.topic_index[rows] << 32) | (batch.queue_id[rows] & 0xFFFFFFFF)
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for group in np.split(rows[order], bounds):
        first, last = int(group[0]), int(group[-1])
        topic = batch.topics[int(batch.topic_index[first])]
        queue_id = int(batch.queue_id[first])
        cq = store.cq_table.get(topic, queue_id)
        if cq is None:
            missing.add((topic, queue_id))
            continue
        head = heads[cq] if cq in heads else heads.setdefault(cq, _queue_head(cq))
        low = int(batch.queue_offset[group].min())
        high = int(batch.queue_offset[last])
        if head is None or head[0] > low or cq.max_offset_in_queue() <= high:
            missing.add(cq)
    return missing


def _first_keyed(store: MessageStore, after: int, end: int) -> int | None:
    """Position of the first record in ``(after, end)`` whose keys the index holds, or None."""
    start = max(after, store.commit_log.min_offset())
    for step in _walk_past_damage(store, start, end, end, report=False):
        batch = step.batch
        if not len(batch.key_record):
            continue
        keyed = batch.key_record[
            (batch.sys_flag[batch.key_record] & TRANSACTION_ROLLBACK_TYPE) != TRANSACTION_ROLLBACK_TYPE
        ]
        positions = batch.position[keyed]
        later = positions[(positions > after) & (positions < end)]
        if len(later):
            return int(later[0])
    return None


def _check_index(store: MessageStore, replay_from: int) -> int | None:
    """Repair the index's files before dispatch: damaged files and those after them removed, a
    file missing at the head or between two files found by looking for keyed records in the gap
    (files after it removed); returns the phy offset from which the index must be re-keyed
    (None: it holds every key below ``replay_from``)."""
    index = store.index_service
    if index is None or not store.writable:
        return None
    min_phy = store.commit_log.min_offset()
    index.remove_damaged()
    files = [f for f in index.files if f.entry_count() > 0]
    if (
        files
        and files[0].begin_phy_offset > min_phy
        and _first_keyed(store, min_phy - 1, files[0].begin_phy_offset) is not None
    ):
        index.remove_from(
            0, f"keys of [{min_phy}, {files[0].begin_phy_offset}) missing before the first file"
        )
        files = []
    for older, newer in itertools.pairwise(files):
        if newer.begin_phy_offset > older.end_phy_offset:
            gap = _first_keyed(store, older.end_phy_offset, newer.begin_phy_offset)
            if gap is not None:
                index.remove_from(
                    index.files.index(newer), f"keys from {gap} missing between index files (a file deleted)"
                )
                break
    files = [f for f in index.files if f.entry_count() > 0]
    end = files[-1].end_phy_offset if files else min_phy - 1
    if end < replay_from and _first_keyed(store, end, replay_from) is not None:
        store.reporter.report(
            "index-keys-missing",
            str(index.index_dir),
            max(end, min_phy),
            replay_from,
            "keyed records after the index's end" if files else "no index file holds any key",
        )
        return max(end, min_phy)
    return None


def _lacking_queues(
    store: MessageStore, missing: set[ConsumeQueue | tuple[str, int]], *, rebuild_gaps: bool
) -> list[ConsumeQueue]:
    """Queues found lacking records (by the scan, or by dispatch meeting a gap in a queue when it
    did not start at the log's beginning): their files are removed and reported, for a dispatch
    from the log's beginning to rebuild them."""
    lacking: dict[ConsumeQueue, str] = {}
    for item in missing:
        cq = store.cq_table.get(*item) if isinstance(item, tuple) else item
        if cq is not None:
            lacking[cq] = "records of the queue in the commit log are missing from it (files deleted or cut)"
        else:
            lacking[store.cq_table.find(*item)] = "queue directory missing"  # type: ignore[misc]
    for cq in store.all_consume_queues():
        if cq.gap_seen and rebuild_gaps and cq not in lacking:
            lacking[cq] = "dispatch met a gap in the queue's offsets"
        cq.gap_seen = False
    for cq, reason in lacking.items():
        store.reporter.report(
            "cq-rebuilt",
            str(cq.mfq.store_dir),
            cq.mfq.min_offset(),
            cq.mfq.max_offset(),
            f"{reason}; rebuilt from the commit log",
        )
        cq.destroy_files()
    return list(lacking)


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """Step 1, decided before anything is read past the checks or cut: which files the pass
    checks and from where dispatch must replay. A value, so tests build one and assert on it."""

    last_exit_ok: bool
    min_phy_offset: int
    """The log's first byte before the pass (queues that lack records are rebuilt from it)."""
    start_file_index: int
    """First commit-log file the pass checks: the third-last after a normal exit, the
    checkpoint's choice after a crash (§8.2, §8.3)."""
    scan_from_offset: int
    replay_from_offset: int
    """Where dispatch must replay from, as planned before the pass: after a normal exit the
    queues' end (the log's start if the queue table was discarded), after a crash the scan's
    start; earlier when a queue or index file is damaged (``repair_from_offset``)."""
    repair_from_offset: int | None
    """First record a damaged or missing queue or index file needs again, or None."""
    queue_ends: Mapping[ConsumeQueue, int]
    """Each queue's end (phy offset past its last entry) before the pass."""
    sound_queue_end: int = -1
    """The farthest end of a queue whose check found nothing wrong: past the log's end, the
    mark of records lost (a damaged queue's kept entries may point anywhere)."""
    step_over_damage: bool = False
    """A bad record the pass meets with a sound record after it is stepped over, as one in an
    older file is, not cut at: after a clean exit (everything was flushed, so it is rot, not a
    torn write; RocketMQ cuts there, and the next start's window may then take in an older
    damaged record and cut again) of a store that is not a slave (a slave keeps no byte that is
    not its master's: cut, it fetches the record again). After a crash: cut, as RocketMQ does (a
    torn write looks the same), but see ``flushed_by_ms``."""
    flushed_by_ms: int = 0
    """After a crash (not a slave's), the checkpoint's safe store time (`min_timestamp`): a bad
    record whose next sound record was stored at or before it was flushed before the crash
    (RocketMQ trusts the log up to there: it scans no file below the one it picks by it), so it
    is rot, stepped over too. Without it a crash soon after a clean start that stepped over a
    record would cut there, dropping the puts acknowledged since. 0: none."""

    @property
    def max_queue_end(self) -> int:
        return max(self.queue_ends.values(), default=-1)


@dataclass(frozen=True, slots=True)
class _Checked:
    """Step 2's outcome: where the valid log ends and what the pass found on the way."""

    end_offset: int
    missing: set[ConsumeQueue | tuple[str, int]]
    replay: _Replay | None
    """The dispatch done during the pass (one-pass recovery), or None."""
    pre_dispatched: int
    """Records dispatched below the scanned files before the pass (`_pre_range_ok`)."""


@dataclass(frozen=True, slots=True)
class _Cuts:
    """Step 3's outcome: what was cut at the valid end."""

    log_bytes_dropped: int
    cq_entries: int
    truncated_queues: frozenset[ConsumeQueue]
    index_entries: int
    index_damaged: bool


def plan_recovery(store: MessageStore, *, last_exit_ok: bool) -> RecoveryPlan:
    """Step 1: check the queues and index whole (damage found here widens the replay) and plan
    the pass. Writes nothing but the rebuilt heads of queues whose first file is gone."""
    files = store.commit_log.mfq.files
    min_phy = store.commit_log.min_offset()
    slave = store.config.broker_role is BrokerRole.SLAVE
    start_index = 0
    if files:
        start_index = max(0, len(files) - 3) if last_exit_ok else _choose_abnormal_start(store)
    scan_from = files[start_index].file_from_offset if files else 0
    rebuild = _check_queues(store, 0 if store.config.check_consume_queue_on_recover else scan_from)
    if files and store.writable:
        rebuild.update(_rebuild_missing_heads(store))
    queue_ends = {cq: cq.max_physic_offset for cq in store.all_consume_queues()}
    if store.cq_table.discarded:
        planned = min_phy
    elif last_exit_ok:
        planned = max(min_phy, max(queue_ends.values(), default=-1), 0)
    else:
        planned = scan_from
    repair_from = min(rebuild.values(), default=None)
    if files:
        index_from = _check_index(store, planned)
        if index_from is not None:
            repair_from = index_from if repair_from is None else min(repair_from, index_from)
    if repair_from is not None and store.writable:
        log.info("recovery: damaged queue or index files; re-dispatching from %d", repair_from)
        planned = min(planned, repair_from)
    return RecoveryPlan(
        last_exit_ok=last_exit_ok,
        min_phy_offset=min_phy,
        start_file_index=start_index,
        scan_from_offset=scan_from,
        replay_from_offset=planned,
        repair_from_offset=repair_from,
        queue_ends=MappingProxyType(queue_ends),
        sound_queue_end=max((end for cq, end in queue_ends.items() if cq not in rebuild), default=-1),
        step_over_damage=last_exit_ok and not slave,
        flushed_by_ms=0 if last_exit_ok or slave else store.checkpoint.min_timestamp(),
    )


def _check_log(store: MessageStore, plan: RecoveryPlan, *, one_pass: bool) -> _Checked:
    """Step 2: the pass over the log from ``plan.scan_from_offset``, finding where valid records
    end; in one-pass recovery it dispatches the replay range as it goes."""
    files = store.commit_log.mfq.files
    if not files:
        if store.writable:
            store.destroy_consume_queues()
        return _Checked(end_offset=0, missing=set(), replay=None, pre_dispatched=0)
    scan_from, planned = plan.scan_from_offset, plan.replay_from_offset
    log.info(
        "recovery (%s exit): scanning %d of %d commit-log file(s) from offset %d",
        "normal" if plan.last_exit_ok else "abnormal",
        len(files) - plan.start_file_index,
        len(files),
        scan_from,
    )
    index = store.index_service
    replay: _Replay | None = None
    pre_dispatched = 0
    if one_pass and store.writable and (index is None or index.safe_to_extend_before_recovery()):
        replay = _Replay(store, planned)
        if planned < scan_from:
            pre_dispatched, reached = _pre_range_ok(store, planned, scan_from)
            replay = _Replay(store, scan_from) if reached else None
            if not reached:
                log.info("recovery: replay from %d stops before the scanned files", planned)
    elif one_pass and store.writable:
        log.info("recovery: index files cut or out of order; dispatching after the cuts")
    scan = _scan(
        store,
        scan_from,
        replay,
        check_below=planned if store.writable else -1,
        step_over=plan.step_over_damage,
        flushed_by_ms=plan.flushed_by_ms,
    )
    return _Checked(end_offset=scan.end, missing=scan.missing, replay=replay, pre_dispatched=pre_dispatched)


def _cut(store: MessageStore, plan: RecoveryPlan, end: int) -> _Cuts:
    """Step 3: cut the log, the queues and the index at the valid end ``end``."""
    commit_log = store.commit_log
    dropped_before = store.reporter.bytes_dropped("commitlog-truncated")
    commit_log.mfq.truncate_dirty_files(end)
    _report_missing_tail(store, plan, end)
    cq_dropped = 0
    truncated: set[ConsumeQueue] = set()
    if plan.max_queue_end >= end or not plan.last_exit_ok:
        for cq in store.all_consume_queues():
            dropped = cq.truncate_dirty_logic_files(end)
            if dropped:
                truncated.add(cq)
            cq_dropped += dropped
    index_dropped = 0
    index_damaged = False
    index = store.index_service
    if index is not None and store.writable:
        before = store.reporter.count("index-entries-truncated")
        removed_before = store.reporter.count("index-file-removed")
        index.recover(end, lambda phy: commit_log.store_timestamp_at(phy, 1))
        index_dropped = store.reporter.count("index-entries-truncated") - before
        index_damaged = bool(index_dropped) or store.reporter.count("index-file-removed") > removed_before
    return _Cuts(
        log_bytes_dropped=dropped_before,
        cq_entries=cq_dropped,
        truncated_queues=frozenset(truncated),
        index_entries=index_dropped,
        index_damaged=index_damaged,
    )


def _report_missing_tail(store: MessageStore, plan: RecoveryPlan, end: int) -> None:
    """Entries of a sound queue that reach past the log's last byte (past ``end`` and past any
    cut range) name records whose bytes are gone: the newest file deleted, or its end lost.
    Report that range in commit-log offsets as a cut's is, so no record vanishes unnamed
    (RocketMQ drops the entries silently, `truncateDirtyLogicFiles`)."""
    start = max([end, *(d.end for d in store.reporter.findings if d.kind == "commitlog-truncated")])
    if plan.sound_queue_end > start:
        store.reporter.report(
            "commitlog-missing",
            str(store.commit_log.mfq.store_dir),
            start,
            plan.sound_queue_end,
            "queue entries point past the log's last byte: the records there are gone (a file deleted or cut)",
        )


def cut_at(store: MessageStore, end: int) -> None:
    """Cut the log, every queue and the index at ``end`` before recovery runs (a slave whose log
    forked from its master's, rmq_mp/store/fork.py): step 3's truncations, unconditionally."""
    store.commit_log.mfq.truncate_dirty_files(end)
    for cq in store.all_consume_queues():
        cq.truncate_dirty_logic_files(end)
    if store.index_service is not None:
        store.index_service.recover(end, lambda phy: store.commit_log.store_timestamp_at(phy, 1))


def _dispatch_from(store: MessageStore, plan: RecoveryPlan, cuts: _Cuts) -> int:
    """Where dispatch starts once the cuts are made (the plan's start, moved by what they cut)."""
    if store.cq_table.discarded:
        dispatch_from = store.commit_log.min_offset()
    elif plan.last_exit_ok:
        # The queues' ends after the cuts alone: a queue the pass wrote to and no cut touched is
        # as it was before the pass.
        after_cq = max(
            (
                cq.max_physic_offset if cq in cuts.truncated_queues else queue_end
                for cq, queue_end in plan.queue_ends.items()
            ),
            default=-1,
        )
        dispatch_from = max(store.commit_log.min_offset(), after_cq, 0)
    else:
        dispatch_from = plan.scan_from_offset
    if plan.repair_from_offset is not None:
        dispatch_from = min(dispatch_from, plan.repair_from_offset)
    return dispatch_from


def _dispatch(
    store: MessageStore, plan: RecoveryPlan, checked: _Checked, cuts: _Cuts
) -> tuple[int, int, bool]:
    """Step 4: bring the queues and index up to the valid end: accept what the pass dispatched
    when nothing it wrote was cut, else dispatch again; then rebuild queues that lack records.
    Returns (dispatch start, records dispatched, whether the pass's dispatch stood)."""
    end = checked.end_offset
    commit_log, index = store.commit_log, store.index_service
    min_phy = plan.min_phy_offset
    dispatch_from = _dispatch_from(store, plan, cuts)
    replay = checked.replay
    one_pass_done = replay is not None and replay.exact and not (cuts.cq_entries or cuts.index_damaged)
    if not store.writable:
        return dispatch_from, 0, one_pass_done
    if one_pass_done:
        assert replay is not None
        dispatched = checked.pre_dispatched + replay.dispatched
        log.info("recovery: dispatched [%d, %d) while checking", dispatch_from, end)
    else:
        if index is not None and cuts.index_damaged and index.end_phy_offset() < dispatch_from:
            # The index lost its tail (a cut file): re-key from its own end; duplicates are skipped.
            index_from = max(index.end_phy_offset(), commit_log.min_offset())
            log.info("recovery: rebuilding index keys of [%d, %d)", index_from, dispatch_from)
            _dispatch_range(
                store,
                index_from,
                dispatch_from,
                "recovery: rebuilding index",
                index_only=True,
                below=end,
            )
        log.info("recovery: dispatching [%d, %d) to ConsumeQueue and index", dispatch_from, end)
        dispatched = _dispatch_range(
            store, dispatch_from, None, "recovery: dispatching", index_only=False, below=end
        )
    first_dispatch = plan.replay_from_offset if one_pass_done else dispatch_from
    lacking = _lacking_queues(store, checked.missing, rebuild_gaps=first_dispatch > min_phy)
    if lacking:
        log.info("recovery: %d queue(s) lack records; rebuilding them from %d", len(lacking), min_phy)
        dispatch_from = min_phy
        dispatched += _dispatch_range(
            store, min_phy, None, "recovery: rebuilding queues", index_only=False, below=end
        )
    return dispatch_from, dispatched, one_pass_done


def recover(store: MessageStore, *, last_exit_ok: bool, one_pass: bool = True) -> RecoveryReport:
    """Run recovery on a loaded store: plan, check the log, cut at its valid end, dispatch,
    report. Read-only stores get the same analysis, nothing written. ``one_pass=False`` cuts
    first and dispatches after, in a second walk (what the one pass is tested against)."""
    started = time.monotonic()
    plan = plan_recovery(store, last_exit_ok=last_exit_ok)
    checked = _check_log(store, plan, one_pass=one_pass)
    cuts = _cut(store, plan, checked.end_offset)
    dispatch_from, dispatched, one_pass_done = _dispatch(store, plan, checked, cuts)
    store.recover_topic_queue_table()
    report = RecoveryReport(
        abnormal=not last_exit_ok,
        scan_from_offset=plan.scan_from_offset,
        recovered_end_offset=checked.end_offset,
        dispatch_from_offset=dispatch_from,
        records_dispatched=dispatched,
        commit_log_bytes_dropped=cuts.log_bytes_dropped,
        cq_entries_truncated=cuts.cq_entries,
        index_entries_truncated=cuts.index_entries,
        duration_ms=int((time.monotonic() - started) * 1000),
        one_pass=store.writable and one_pass_done,
    )
    log.info("recovery done: %s", report)
    return report
