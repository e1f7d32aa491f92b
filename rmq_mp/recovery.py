"""Startup recovery: find where the CommitLog's valid records end, cut everything after it, and
bring the ConsumeQueues and index back in line.

Mirrors `DefaultMessageStore.load/recover`, `CommitLog.recoverNormally/recoverAbnormally` and
`ConsumeQueue.recover/truncateDirtyLogicFiles` (rocketmq-format.md §8). Two passes instead of
RocketMQ's one: the first finds the valid end (body CRC checked when `checkCRCOnRecover`), then
ConsumeQueue and index entries at or past it are cut, then the second pass dispatches the replay
range (after an abnormal exit: from the checkpoint-selected file; after a normal one: from where
dispatch had got to). Dropped byte ranges go through the store's `Reporter`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmq_mp import record
from rmq_mp.mapped_file import offset_to_file_name
from rmq_mp.progress import progress

if TYPE_CHECKING:
    from rmq_mp.message_store import MessageStore

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
        (magic,) = record._INT.unpack_from(mf.buf, record.POS_MAGIC)
        if magic not in (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2):
            continue
        (sys_flag,) = record._INT.unpack_from(mf.buf, record.POS_SYS_FLAG)
        (store_ts,) = record._LONG.unpack_from(mf.buf, record.store_timestamp_position(sys_flag))
        if store_ts != 0 and store_ts <= safe:
            log.info(
                "abnormal recovery starts at file %s (first store time %d <= %d)",
                mf.path.name,
                store_ts,
                safe,
            )
            return index
    return 0


def _find_valid_end(store: MessageStore, start_offset: int) -> int:
    """First pass: offset just past the last valid record, reporting what lies beyond it."""
    commit_log = store.commit_log
    valid_end = start_offset
    last: tuple[int, record.DispatchRequest] | None = None
    file_size = store.config.mapped_file_size_commit_log
    scanned_file = -1
    total = commit_log.max_offset() - start_offset
    with progress("recovery: checking commit log", total=total, unit="bytes") as bar:
        for phy, req in commit_log.iter_dispatch(start_offset, check_crc=store.config.check_crc_on_recover):
            bar.update(phy - start_offset)
            if phy // file_size != scanned_file:  # RocketMQ: "recover next physics file"
                scanned_file = phy // file_size
                log.info(
                    "recovery: checking commit-log file %s", offset_to_file_name(scanned_file * file_size)
                )
            if req.success:
                if req.size:
                    last = (phy, req)
                valid_end = commit_log.roll_next_file(phy) if req.size == 0 else phy + req.size
                continue
            if last is not None and last[1].ends_in_nul and last[0] + last[1].size == valid_end:
                # The final record's properties end in NUL: its tail was zero-filled by a torn write.
                _report_dropped(store, last[0], "last record's properties end in zero bytes: a torn tail")
                return last[0]
            _report_dropped(store, phy, req.reason)
            break
    return valid_end


def _report_dropped(store: MessageStore, phy: int, reason: str) -> None:
    """Report the non-zero bytes from ``phy`` to the end of the log as one dropped range."""
    files = store.commit_log.mfq.files
    last_nonzero = phy
    for mf in files:
        file_end = mf.file_from_offset + mf.file_size
        if file_end <= phy:
            continue
        local_start = max(0, phy - mf.file_from_offset)
        tail = mf.last_nonzero(local_start)
        if tail > local_start:
            last_nonzero = mf.file_from_offset + tail
    if last_nonzero > phy:
        store.reporter.report(
            "commitlog-truncated", str(store.commit_log.mfq.store_dir), phy, last_nonzero, reason
        )


def recover(store: MessageStore, *, last_exit_ok: bool) -> RecoveryReport:
    """Run recovery on a loaded store. Read-only stores get the same analysis, nothing written."""
    started = time.monotonic()
    commit_log = store.commit_log
    files = commit_log.mfq.files
    for cq in store.all_consume_queues():
        cq.recover()
    max_phy_of_cq = max((cq.max_physic_offset for cq in store.all_consume_queues()), default=-1)

    if not files:
        scan_from = end = 0
        if store.writable:
            store.destroy_consume_queues()
    else:
        start_index = max(0, len(files) - 3) if last_exit_ok else _choose_abnormal_start(store)
        scan_from = files[start_index].file_from_offset
        log.info(
            "recovery (%s exit): scanning %d of %d commit-log file(s) from offset %d",
            "normal" if last_exit_ok else "abnormal",
            len(files) - start_index,
            len(files),
            scan_from,
        )
        end = _find_valid_end(store, scan_from)
    dropped_before = store.reporter.bytes_dropped("commitlog-truncated")
    commit_log.mfq.truncate_dirty_files(end)

    cq_dropped = 0
    if max_phy_of_cq >= end or not last_exit_ok:
        cq_dropped = sum(cq.truncate_dirty_logic_files(end) for cq in store.all_consume_queues())
    index_dropped = 0
    index_damaged = False
    if store.index_service is not None and store.writable:
        before = store.reporter.count("index-entries-truncated")
        removed_before = store.reporter.count("index-file-removed")
        store.index_service.recover(end, lambda phy: commit_log.store_timestamp_at(phy, 1))
        index_dropped = store.reporter.count("index-entries-truncated") - before
        index_damaged = bool(index_dropped) or store.reporter.count("index-file-removed") > removed_before

    if store.cq_table.discarded:
        dispatch_from = commit_log.min_offset()
    elif last_exit_ok:
        after_cq = max((cq.max_physic_offset for cq in store.all_consume_queues()), default=-1)
        dispatch_from = max(commit_log.min_offset(), after_cq, 0)
    else:
        dispatch_from = scan_from
    dispatched = 0
    if store.writable:
        index = store.index_service
        if index is not None and index_damaged and index.end_phy_offset() < dispatch_from:
            # The index lost its tail (a cut file): re-key from its own end; duplicates are skipped.
            index_from = max(index.end_phy_offset(), commit_log.min_offset())
            log.info("recovery: rebuilding index keys of [%d, %d)", index_from, dispatch_from)
            with progress(
                "recovery: rebuilding index", total=dispatch_from - index_from, unit="bytes"
            ) as bar:
                for phy, req in commit_log.iter_dispatch(
                    index_from, check_crc=False, end_offset=dispatch_from
                ):
                    bar.update(phy - index_from)
                    if req.success and req.size > 0:
                        index.build_index(req)
        log.info("recovery: dispatching [%d, %d) to ConsumeQueue and index", dispatch_from, end)
        with progress("recovery: dispatching", total=max(end - dispatch_from, 0), unit="bytes") as bar:
            for phy, req in commit_log.iter_dispatch(dispatch_from, check_crc=False):
                bar.update(phy - dispatch_from)
                if req.success and req.size > 0:
                    store.dispatcher.dispatch(req)
                    dispatched += 1
    store.recover_topic_queue_table()
    report = RecoveryReport(
        abnormal=not last_exit_ok,
        scan_from_offset=scan_from,
        recovered_end_offset=end,
        dispatch_from_offset=dispatch_from,
        records_dispatched=dispatched,
        commit_log_bytes_dropped=dropped_before,
        cq_entries_truncated=cq_dropped,
        index_entries_truncated=index_dropped,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    log.info("recovery done: %s", report)
    return report
