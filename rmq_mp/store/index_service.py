"""IndexService: the index files of a store, rolled when full, queried newest first.

Mirrors `IndexService` (docs/format.md §5.4-§5.6). Keys indexed per record: ``topic#UNIQ_KEY``
then ``topic#<key>`` for each word of KEYS; ROLLBACK records are not indexed. File names are the
local creation time ``yyyyMMddHHmmssSSS``. Query results are only candidates (hash equality);
`MessageStore.query_message` checks each against its record (RocketMQ issue #3613).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np

from rmq_mp import file_modes
from rmq_mp.errors import ConfigError
from rmq_mp.format.index_layout import INDEX_HEADER_SIZE, header_end_phy_offset, index_file_size
from rmq_mp.format.message import TRANSACTION_ROLLBACK_TYPE, index_key_hash, transaction_type
from rmq_mp.format.message import index_keys as m_index_keys
from rmq_mp.format.record import DispatchRequest
from rmq_mp.format.record_batch import RecordBatch, RecordRows
from rmq_mp.store.index_file import IndexFile
from rmq_mp.store.reporter import Reporter

log = logging.getLogger(__name__)


def index_keys(req: DispatchRequest) -> list[str]:
    """The keys `buildIndex` puts for one record, in order (`message.index_keys`)."""
    return m_index_keys(req.topic, req.uniq_key, req.keys)


def time_to_file_name(ms: int) -> str:
    """`UtilAll.timeMillisToHumanString`: local ``yyyyMMddHHmmssSSS``."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


class IndexService:
    """Owns the files under ``index/``; one writer (dispatch) at a time."""

    def __init__(
        self,
        index_dir: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        writable: bool,
        reporter: Reporter,
        max_msgs_num_batch: int = 64,
    ) -> None:
        self.index_dir = index_dir
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.writable = writable
        self.reporter = reporter
        self.max_msgs_num_batch = max_msgs_num_batch
        self.files: list[IndexFile] = []

    def load(self) -> None:
        if not self.index_dir.is_dir():
            return
        for path in sorted(p for p in self.index_dir.iterdir() if p.name.isdigit()):
            expected = index_file_size(self.hash_slot_num, self.index_num)
            size = path.stat().st_size
            if size > expected:
                self.reporter.report(
                    "index-file-skipped",
                    str(path),
                    0,
                    size,
                    f"larger than the configured {expected} bytes; left untouched",
                )
                continue
            self.files.append(
                IndexFile(
                    path, self.hash_slot_num, self.index_num, writable=self.writable, reporter=self.reporter
                )
            )

    def recover(self, commit_log_end: int, store_time_of: Callable[[int], int]) -> None:
        """Cut entries pointing at or past the recovered commit-log end, newest file first.

        A file cut inside its slot table is unusable and removed (its range is re-dispatched by
        abnormal recovery); empty trailing files are removed."""
        for index_file in reversed(list(self.files)):
            if index_file.intact_entry_limit() == 0 and index_file._intact_bytes < index_file.file_size:
                self.reporter.report(
                    "index-file-removed",
                    str(index_file.path),
                    0,
                    index_file._intact_bytes,
                    "file cut inside its header or slot table",
                )
                self._remove(index_file)
                continue
            index_file.truncate(commit_log_end, store_time_of)
            if index_file.entry_count() == 0 and index_file is self.files[-1] and len(self.files) > 1:
                self._remove(index_file)

    def remove_damaged(self) -> bool:
        """Remove the first file that fails its check (`IndexFile.damage`; a file cut short
        counts unless it is the newest, whose cut `recover` trims) and every newer one, reporting
        each: recovery re-keys their range from the commit log. True if any was removed."""
        for position, index_file in enumerate(self.files):
            reason = index_file.damage()
            if reason is None and not index_file.is_intact() and index_file is not self.files[-1]:
                reason = "file cut short"
            if reason is None:
                continue
            self.remove_from(position, reason)
            return True
        return False

    def remove_from(self, position: int, reason: str) -> None:
        """Remove the files from ``position`` on, reporting each, so the index can be re-keyed
        from the end of the file before them (the index appends only above its end)."""
        for index_file in list(self.files[position:]):
            self.reporter.report(
                "index-file-removed",
                str(index_file.path),
                0,
                index_file.index_count,
                f"{reason}; re-keyed from the commit log"
                if index_file is self.files[position]
                else f"newer than a damaged file ({reason}); re-keyed from the commit log",
            )
            self._remove(index_file)

    def safe_to_extend_before_recovery(self) -> bool:
        """Every file is whole and the newest one's entries are in log order: then recovery may
        dispatch before `recover` cuts (its cuts cannot reach what dispatch adds)."""
        return all(f.is_intact() for f in self.files) and (not self.files or self.files[-1].in_order())

    def _remove(self, index_file: IndexFile) -> None:
        self.files.remove(index_file)
        index_file.destroy()

    def _new_file(self) -> IndexFile:
        """The next file, after the last one is flushed. A ConfigError, with no file created,
        when a file would be full at once (every dispatch would leave one more behind)."""
        if self.index_num < 2:
            raise ConfigError(
                f"maxIndexNum={self.index_num} leaves an index file no room for a key (entry 0 is never "
                "used): set maxIndexNum to 2 or more"
            )
        last = self.files[-1] if self.files else None
        if last is not None:
            last.flush()  # before the new file exists: a failed flush leaves no orphan file behind
        now_ms = int(time.time() * 1000)
        self.index_dir.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        path = self.index_dir / time_to_file_name(now_ms)
        while path.exists() or (last is not None and path.name <= last.path.name):
            now_ms += 1
            path = self.index_dir / time_to_file_name(now_ms)
        created = IndexFile(
            path,
            self.hash_slot_num,
            self.index_num,
            writable=True,
            reporter=self.reporter,
            create=True,
            seed_end_phy_offset=last.end_phy_offset if last else 0,
            seed_end_timestamp=last.end_timestamp if last else 0,
        )
        self.files.append(created)
        return created

    def drop_deleted_files(self) -> int:
        """Unmap leading files the cleaner (another process) deleted, never the last one."""
        dropped = 0
        while len(self.files) > 1 and not self.files[0].path.exists():
            self.files.pop(0).close()
            dropped += 1
        return dropped

    def last_file(self) -> IndexFile:
        if not self.files or self.files[-1].is_full():
            return self._new_file()
        return self.files[-1]

    def build_index(self, req: DispatchRequest) -> None:
        """Index one dispatched record; idempotent under re-dispatch."""
        if transaction_type(req.sys_flag) == TRANSACTION_ROLLBACK_TYPE:
            return
        keys = index_keys(req)
        if keys:
            self.build_index_hashes(req.phy_offset, req.store_timestamp, [index_key_hash(k) for k in keys])

    def build_index_hashes(self, phy_offset: int, store_timestamp: int, key_hashes: list[int]) -> None:
        """`build_index` of one record with keys, given their `indexKeyHashMethod` values."""
        current = self.last_file()
        if phy_offset < current.end_phy_offset:
            return
        if phy_offset == current.end_phy_offset and (holders := self._holders_of_end(current)):
            # Partly indexed before a crash or a cut: skip the keys already there, in whichever
            # file holds them (RocketMQ adds them twice).
            key_hashes = [
                h
                for h in key_hashes
                if not any(phy_offset in f.select_by_hash(h, 1 << 30, 0, 1 << 62) for f in holders)
            ]
        for key_hash in key_hashes:
            if not current.put_hash(key_hash, phy_offset, store_timestamp):
                current = self._new_file()
                if not current.put_hash(key_hash, phy_offset, store_timestamp):
                    raise AssertionError("a fresh index file must accept a key")

    def _holders_of_end(self, current: IndexFile) -> list[IndexFile]:
        """The files holding keys of the record at the index's end, newest first: every file from
        the newest back that ends at it. A roll when a file filled may split a record's keys
        between two files (or more), and the newest may hold none yet."""
        end = current.end_phy_offset
        holders: list[IndexFile] = []
        for index_file in reversed(self.files):
            if index_file.end_phy_offset != end:
                break
            if index_file.entry_count() > 0:
                holders.append(index_file)
        return holders

    def build_index_batch(self, batch: RecordBatch) -> None:
        """`build_index` for every record of a dispatch batch, in order, with the same bytes.

        Records come in runs: those below the index's end are skipped as one record would be;
        the record at its end (partly indexed before a crash) goes alone; then a run of records
        at strictly increasing offsets puts its keys in blocks of `IndexFile.put_hashes`, a new
        file whenever one fills (mid-record too, as one key at a time would)."""
        if not len(batch.key_record):
            return
        indexed = (batch.sys_flag[batch.key_record] & TRANSACTION_ROLLBACK_TYPE) != TRANSACTION_ROLLBACK_TYPE
        key_record = batch.key_record[indexed]
        key_hash = batch.key_hash[indexed]
        if not len(key_record):
            return
        key_start = np.flatnonzero(np.diff(key_record, prepend=-1))  # keys are listed by record
        records = key_record[key_start]
        key_stop = np.append(key_start[1:], len(key_record))
        phy = batch.phy_offset[records]
        timestamp = batch.store_timestamp[records]
        rising = np.flatnonzero(phy[1:] <= phy[:-1])  # run breaks: record i+1 not above record i
        key_phy = batch.phy_offset[key_record]
        key_timestamp = batch.store_timestamp[key_record]
        i, n = 0, len(records)
        while i < n:
            current = self.last_file()
            end = current.end_phy_offset
            if phy[i] < end:
                i = _first_at_least(phy, i, end)  # already indexed: skipped as one record would be
                continue
            if phy[i] == end and self._holders_of_end(current):
                self.build_index_hashes(
                    int(phy[i]), int(timestamp[i]), key_hash[key_start[i] : key_stop[i]].tolist()
                )
                i += 1
                continue
            later = rising[np.searchsorted(rising, i) :]
            run_end = int(later[0]) + 1 if len(later) else n
            done, stop = int(key_start[i]), int(key_stop[run_end - 1])
            while True:
                done += current.put_hashes(key_hash[done:stop], key_phy[done:stop], key_timestamp[done:stop])
                if done >= stop:
                    break
                current = self._new_file()
                if current.is_full():
                    raise AssertionError("a fresh index file must accept a key")
            i = run_end

    def build_index_rows(self, rows: RecordRows) -> None:
        """`build_index_batch` of a few records as Python lists (reput's small passes), with the
        same bytes. Their offsets rise (one scan of the log), so they are one run: the keys of
        records below the index's end are skipped, those of the record at its end go alone, and
        the rest with `IndexFile.put_hash_rows`, a new file whenever one fills."""
        key_record, key_hash = rows.key_record, rows.key_hash
        if not key_record:
            return
        phy, timestamp, sys_flag = rows.phy_offset, rows.store_timestamp, rows.sys_flag
        if any(flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE for flag in sys_flag):
            kept = [
                k
                for k, row in enumerate(key_record)
                if sys_flag[row] & TRANSACTION_ROLLBACK_TYPE != TRANSACTION_ROLLBACK_TYPE
            ]
            key_record, key_hash = [key_record[k] for k in kept], [key_hash[k] for k in kept]
            if not key_record:  # ROLLBACK records' keys alone: no index file made for them
                return
        n = len(key_record)
        current = self.last_file()
        end = current.end_phy_offset
        k = 0
        while k < n and phy[key_record[k]] < end:
            k += 1  # already indexed: skipped as one record would be
        if k < n and phy[key_record[k]] == end and self._holders_of_end(current):
            row, first = key_record[k], k
            while k < n and key_record[k] == row:
                k += 1
            self.build_index_hashes(phy[row], timestamp[row], key_hash[first:k])
            current = self.last_file()
        if k >= n:
            return
        hashes = key_hash[k:]
        key_phy = [phy[row] for row in key_record[k:]]
        key_timestamp = [timestamp[row] for row in key_record[k:]]
        done, stop = 0, len(hashes)
        while True:
            done += current.put_hash_rows(hashes[done:], key_phy[done:], key_timestamp[done:])
            if done >= stop:
                break
            current = self._new_file()
            if current.is_full():
                raise AssertionError("a fresh index file must accept a key")

    def query_offset(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """Candidate phy offsets for a full key (``topic#key``), newest first (`queryOffset`)."""
        max_num = min(max_num, self.max_msgs_num_batch)
        found: list[int] = []
        for index_file in reversed(self.files):
            if index_file.is_time_matched(begin, end):
                found.extend(index_file.select_phy_offsets(key, max_num - len(found), begin, end))
            if index_file.begin_timestamp < begin or len(found) >= max_num:
                break
        return found

    def end_phy_offset(self) -> int:
        return self.files[-1].end_phy_offset if self.files else 0

    def flush(self) -> None:
        for index_file in self.files:
            index_file.flush()

    def close(self) -> None:
        for index_file in self.files:
            index_file.close()
        self.files = []


def _first_at_least(values: np.ndarray, start: int, bound: int) -> int:
    """First index from ``start`` whose value is at least ``bound`` (len if none), looking at
    windows that double in size, so a long run costs one pass and a short one little."""
    step = 64
    while start < len(values):
        found = np.flatnonzero(values[start : start + step] >= bound)
        if len(found):
            return start + int(found[0])
        start += step
        step *= 2
    return len(values)


def expired_index_files(index_dir: Path, min_phy_offset: int) -> list[Path]:
    """`IndexService.deleteExpiredFile`: index files, oldest first and never the last (reput
    writes it), whose newest entry points below ``min_phy_offset``. Read from the headers alone."""
    if not index_dir.is_dir():
        return []
    paths = sorted(p for p in index_dir.iterdir() if p.name.isdigit())
    doomed = []
    for path in paths[:-1]:
        with path.open("rb") as f:
            header = f.read(INDEX_HEADER_SIZE)
        if len(header) < INDEX_HEADER_SIZE or header_end_phy_offset(header) >= min_phy_offset:
            break
        doomed.append(path)
    return doomed
