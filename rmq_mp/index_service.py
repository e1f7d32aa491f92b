"""IndexService: the index files of a store, rolled when full, queried newest first.

Mirrors `IndexService` (rocketmq-format.md §5.4-§5.6). Keys indexed per record: ``topic#UNIQ_KEY``
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

from rmq_mp.index_file import INDEX_HEADER_SIZE, IndexFile, header_end_phy_offset, index_file_size
from rmq_mp.message import TRANSACTION_ROLLBACK_TYPE, split_keys, transaction_type
from rmq_mp.record import DispatchRequest
from rmq_mp.reporter import Reporter

log = logging.getLogger(__name__)


def index_keys(req: DispatchRequest) -> list[str]:
    """The keys `buildIndex` puts for one record, in order."""
    keys = [f"{req.topic}#{req.uniq_key}"] if req.uniq_key else []
    keys.extend(f"{req.topic}#{k}" for k in split_keys(req.keys))
    return keys


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

    def _remove(self, index_file: IndexFile) -> None:
        self.files.remove(index_file)
        index_file.destroy()

    def _new_file(self) -> IndexFile:
        last = self.files[-1] if self.files else None
        now_ms = int(time.time() * 1000)
        self.index_dir.mkdir(parents=True, exist_ok=True)
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
        if last is not None:
            last.flush()
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
        if not keys:
            return
        current = self.last_file()
        if req.phy_offset < current.end_phy_offset:
            return
        if req.phy_offset == current.end_phy_offset and current.entry_count() > 0:
            # Partly indexed before a crash: skip the keys already there (RocketMQ adds them twice).
            keys = [
                k for k in keys if req.phy_offset not in current.select_phy_offsets(k, 1 << 30, 0, 1 << 62)
            ]
        for key in keys:
            if not current.put_key(key, req.phy_offset, req.store_timestamp):
                current = self._new_file()
                if not current.put_key(key, req.phy_offset, req.store_timestamp):
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
