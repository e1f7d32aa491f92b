"""Records a read must not serve: the checks behind every message handed to a user, and the
one place a skipped record is reported.

Why: recovery after a clean stop checks the last three commit-log files only, and RocketMQ never
checks a record again after that, so a body byte flipped on disk in an older file would be served
as intact, and a damaged ConsumeQueue entry would stop its consumer at that offset for good.
rmq-mp checks each record as it serves it: a whole record whose PHYSICALOFFSET is its position
and whose body CRC is BODYCRC (`record.decode_message`), and on a queue read the record the
ConsumeQueue entry promised (`entry_problem`: its TOTALSIZE, topic, queue id and queue offset).

A look-up of one exact record raises (`CorruptRecordError`, `BodyCrcError`). A queue read or a
scan skips the record and goes on past it, so a consumer is never stuck on it, and reports it
through `ReadSkips`: once per record per process (not on every re-read) to the reader's
`Reporter` (logged as damage, kept in ``findings``), counted in ``ReadSkips.skipped`` and, for a
reader of a running store, in the pointer table's ``read_skipped_records`` (``run.py status``,
the metric ``rmq_read_skipped_records``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmq_mp.errors import BodyCrcError, CorruptRecordError, ShmAttachError
from rmq_mp.format import record
from rmq_mp.format.message import MessageExt
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.reporter import Reporter

if TYPE_CHECKING:
    from rmq_mp.store.commit_log import CommitLog
    from shm.store_shm import StoreShm

log = logging.getLogger(__name__)

RECORD_CRC_FAILED = "record-crc-failed"
"""A whole record whose body CRC fails; range: its bytes, in commit-log offsets."""
RECORD_INVALID = "record-invalid"
"""A scan of the log met bytes that are not a record before the log's end; range: from there to
where the scan goes on (the next record, or the next file)."""
QUEUE_ENTRY_INVALID = "queue-entry-invalid"
"""A ConsumeQueue entry that does not point at a whole, matching record of its queue; range: the
entry's 20 bytes, in the queue's byte positions (its files are named by them)."""
INDEX_ENTRY_INVALID = "index-entry-invalid"
"""An index hit where no valid record starts; range: that commit-log offset."""

_seen: set[tuple[str, str, int]] = set()
"""(kind, path, start) of every skip reported by this process."""
_seen_lock = threading.Lock()
os.register_at_fork(after_in_child=_seen.clear)  # a forked reader reports for itself


@dataclass
class ReadSkips:
    """Where one reader reports what it skipped. ``publish`` adds to a shared counter (a reader
    of a running store: `shm_counter`)."""

    reporter: Reporter
    publish: Callable[[int], None] | None = None
    skipped: int = 0
    """Skips this reader reported (a record already reported in this process is not counted)."""

    def skip(self, kind: str, path: str | Path, start: int, end: int, reason: str) -> None:
        key = (kind, str(path), start)
        with _seen_lock:
            if key in _seen:
                return
            _seen.add(key)
        self.reporter.report(kind, str(path), start, end, reason)
        self.skipped += 1
        if self.publish is not None:
            self.publish(1)

    def bad_record(
        self,
        commit_log: CommitLog,
        phy_offset: int,
        exc: CorruptRecordError,
        *,
        invalid_kind: str,
        size: int | None = None,
    ) -> None:
        """A record a scan or a look-up by key met at ``phy_offset`` and will not serve: a body
        CRC failure is RECORD_CRC_FAILED, anything else ``invalid_kind``; the range is ``size``
        bytes when the caller knows the record's size, else its TOTALSIZE for a CRC failure
        (the record is whole) and the offset alone otherwise."""
        if size is None:
            size = commit_log.total_size_at(phy_offset) if isinstance(exc, BodyCrcError) else 0
        kind = RECORD_CRC_FAILED if isinstance(exc, BodyCrcError) else invalid_kind
        self.skip(kind, log_file(commit_log, phy_offset), phy_offset, phy_offset + size, str(exc))

    def bad_entry(
        self,
        log_path: Path,
        queue_dir: Path,
        queue_file_size: int,
        queue_offset: int,
        entry: tuple[int, int],
        exc: CorruptRecordError,
    ) -> None:
        """The entry at ``queue_offset`` of the queue in ``queue_dir``, (phy offset, size)
        ``entry``, gave ``exc``: a record whose body CRC fails is reported as that record (of the
        commit-log file ``log_path``), anything else as the entry."""
        phy_offset, size = entry
        if isinstance(exc, BodyCrcError):
            self.skip(RECORD_CRC_FAILED, log_path, phy_offset, phy_offset + size, str(exc))
            return
        position = queue_offset * CQ_STORE_UNIT_SIZE
        self.skip(
            QUEUE_ENTRY_INVALID,
            queue_dir / offset_to_file_name(position - position % queue_file_size),
            position,
            position + CQ_STORE_UNIT_SIZE,
            f"queue offset {queue_offset} (commit-log offset {phy_offset}, size {size}): {exc}",
        )


def log_file(commit_log: CommitLog, phy_offset: int) -> Path:
    """The commit-log file holding ``phy_offset``."""
    size = commit_log.mapped_file_size
    return commit_log.mfq.store_dir / offset_to_file_name(phy_offset - phy_offset % size)


def entry_problem(msg: MessageExt, *, size: int, topic: str, queue_id: int, queue_offset: int) -> str:
    """'' when ``msg`` is the record a ConsumeQueue entry of ``size`` bytes at ``queue_offset`` of
    ``topic``/``queue_id`` promises; else what disagrees."""
    if (msg.store_size, msg.queue_offset, msg.queue_id, msg.topic) == (size, queue_offset, queue_id, topic):
        return ""
    return (
        f"the entry says {topic} queue {queue_id} offset {queue_offset}, {size} bytes; the record "
        f"there is {msg.topic} queue {msg.queue_id} offset {msg.queue_offset}, {msg.store_size} bytes"
    )


def queue_message(
    commit_log: CommitLog,
    entry: tuple[int, int],
    *,
    topic: str,
    queue_id: int,
    queue_offset: int,
    end_offset: int | None = None,
) -> MessageExt:
    """The message a ConsumeQueue entry (phy offset, size) points at, checked before it is served.
    `MessageNotFoundError` where the log no longer holds it; `BodyCrcError` for a record whose
    body CRC fails; `CorruptRecordError` where the entry points past the log's readable end
    (``end_offset``, default `CommitLog.max_offset`), at bytes that are no whole record, or at a
    record that is not the one it promises."""
    phy_offset, size = entry
    end = commit_log.max_offset() if end_offset is None else end_offset
    if phy_offset < 0 or size <= 0 or phy_offset + size > end:
        raise CorruptRecordError(f"it points outside the commit log's readable bytes [0, {end})")
    msg = commit_log.look_message_by_offset(phy_offset)
    if (msg.store_size, msg.queue_offset, msg.queue_id, msg.topic) != (size, queue_offset, queue_id, topic):
        raise CorruptRecordError(
            entry_problem(msg, size=size, topic=topic, queue_id=queue_id, queue_offset=queue_offset)
        )
    return msg


def gathered_problem(
    buf: Any, pos: int, *, phy_offset: int, size: int, topic: str, queue_id: int, queue_offset: int
) -> CorruptRecordError | None:
    """Why the record copied to ``buf[pos:]`` from the commit-log offset a ConsumeQueue entry
    (``phy_offset``, ``size``) names must not be served, as `queue_message` finds it; None when
    it may be. The Spark source asks this of the rows its column-wise check rejected."""
    try:
        msg = record.decode_message(buf, pos, len(buf), file_position=phy_offset)
    except CorruptRecordError as exc:
        return exc
    problem = entry_problem(msg, size=size, topic=topic, queue_id=queue_id, queue_offset=queue_offset)
    return CorruptRecordError(problem) if problem else None


def shm_counter(shm: StoreShm) -> Callable[[int], None]:
    """`ReadSkips.publish` for a reader of a running store: adds to ``read_skipped_records``
    under the flags lock (readers in many processes write it; a skip is rare)."""
    from shm import layout  # not at import: shm imports rmq_mp, whose MessageStore imports this

    def publish(count: int) -> None:
        try:
            with shm.flags_lock("count a skipped record"):
                shm.table.set(layout.READ_SKIPPED_RECORDS, shm.table.get(layout.READ_SKIPPED_RECORDS) + count)
        except ShmAttachError as exc:  # the report is logged already; only the count is lost
            log.warning("skipped record not counted in shared memory: %s", exc)

    return publish


def running_store_counter(shm_base: str) -> Callable[[int], None]:
    """`ReadSkips.publish` for a reader that reads a running store's files without attaching
    to it (the Spark source): attaches for the count only."""

    def publish(count: int) -> None:
        from shm.layout import Role
        from shm.names import ShmNames
        from shm.store_shm import StoreShm

        try:
            shm = StoreShm.attach(ShmNames(shm_base), Role.CONSUMER)
        except ShmAttachError as exc:  # stopped meanwhile: nobody to show the count to
            log.warning("skipped record not counted in shared memory: %s", exc)
            return
        try:
            shm_counter(shm)(count)
        finally:
            shm.close()

    return publish
