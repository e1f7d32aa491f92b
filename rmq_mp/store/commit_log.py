"""CommitLog: the message log over a MappedFileQueue. Log logic only, no services.

Mirrors the data half of RocketMQ's `CommitLog` (docs/format.md §2, §3.4, §7.3): appending an
encoded record (with the end-of-file blank and the roll to the next file), reading a record at a
physical offset, and walking records for recovery and reput (one record at a time, or as
`record_batch` columns). The flush, commit and reput services that RocketMQ hides inside this
class live in `workers/`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rmq_mp.errors import MessageNotFoundError
from rmq_mp.format import record, record_batch
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import AppendMessageStatus
from rmq_mp.store.mapped_file import MappedFile
from rmq_mp.store.mapped_file_queue import MappedFileQueue
from rmq_mp.store.reporter import Reporter

BATCH_RECORDS = 65_536
"""Records per `iter_batches` step by default: enough to amortise numpy's fixed cost per call,
few enough that a step's columns stay a few MiB."""
SCAN_ROWS_CAP = 64
"""Records `scan_rows` reads at most (its kept columns' size)."""


@dataclass(frozen=True, slots=True)
class AppendMessageResult:
    """RocketMQ's AppendMessageResult, reduced to what callers use."""

    status: AppendMessageStatus
    phy_offset: int = -1
    wrote_bytes: int = 0


class CommitLog:
    """Records of every topic in arrival order, in segments of ``mapped_file_size`` bytes."""

    def __init__(
        self,
        store_dir: Path,
        mapped_file_size: int,
        *,
        writable: bool,
        reporter: Reporter,
        delay_level_ms: list[int] | None = None,
    ) -> None:
        self.mfq = MappedFileQueue(store_dir, mapped_file_size, writable=writable, reporter=reporter)
        self.mapped_file_size = mapped_file_size
        self.reporter = reporter
        self.delay_level_ms = delay_level_ms or record.DEFAULT_DELAY_LEVEL_MS
        self._row_scanner: record_batch.RowScanner | None = None

    def load(self) -> None:
        self.mfq.load()

    def close(self) -> None:
        self.mfq.close()

    # ------------------------------------------------------------------ offsets

    def min_offset(self) -> int:
        """First stored phy offset (0 for an empty log)."""
        first = self.mfq.first_file()
        return first.file_from_offset if first else 0

    def max_offset(self) -> int:
        """End of readable records."""
        return self.mfq.max_offset()

    def first_disagreeing(
        self, phy_offset: np.ndarray, size: np.ndarray, queue_id: int, queue_offset: np.ndarray
    ) -> int:
        """Index of the first ConsumeQueue entry whose record's header disagrees with it (magic,
        TOTALSIZE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET), ``len`` if none does. Entries whose
        record is not in the mapped log (expired, or past its end) are not judged. Vectorised:
        one gather of 36 header bytes per entry, file by file."""
        n = len(phy_offset)
        first_bad = n
        files = self.mfq.files
        if not n or not files:
            return n
        origin = files[0].file_from_offset
        low = max(0, (int(phy_offset.min()) - origin) // self.mapped_file_size)
        high = (int(phy_offset.max()) - origin) // self.mapped_file_size + 1
        for mf in files[low:high]:
            base = mf.file_from_offset
            inside = np.flatnonzero(
                (phy_offset >= base) & (phy_offset + record.POS_SYS_FLAG <= base + mf.read_position)
            )
            if not len(inside) or int(inside[0]) >= first_bad:
                continue
            view = np.frombuffer(mf.buf, dtype=np.uint8, count=mf.read_position)
            try:
                at = (phy_offset[inside] - base)[:, None] + np.arange(record.POS_SYS_FLAG)
                header = view[at]
            finally:
                del view
            fields = header.view(">i4")  # rows of 9 big-endian ints
            total_size = fields[:, 0].astype(np.int64)
            magic = fields[:, 1]
            queue_ids = fields[:, 3]
            queue_offsets = (
                header[:, record.POS_QUEUE_OFFSET : record.POS_PHY_OFFSET].copy().view(">i8")[:, 0]
            )
            phys = header[:, record.POS_PHY_OFFSET : record.POS_SYS_FLAG].copy().view(">i8")[:, 0]
            wrong = np.flatnonzero(
                ((magic != record.MESSAGE_MAGIC_CODE) & (magic != record.MESSAGE_MAGIC_CODE_V2))
                | (total_size != size[inside])
                | (queue_ids != queue_id)
                | (queue_offsets != queue_offset[inside])
                | (phys != phy_offset[inside])
            )
            if len(wrong):
                first_bad = min(first_bad, int(inside[wrong[0]]))
        return first_bad

    def next_record_start(self, phy_offset: int) -> int:
        """Where a walk stopped by a damaged record at ``phy_offset`` can go on: the next position
        in the same file holding a record's magic code and its own offset as PHYSICALOFFSET (an
        8-byte self-reference a body almost never holds by chance), else the next file."""
        mf = self.mfq.find_mapped_file_by_offset(phy_offset)
        file_end = self.roll_next_file(phy_offset)
        if mf is None:
            return file_end
        buf = mf.buf
        limit = mf.read_position
        magic = record.MAGIC_CODE_BYTES
        pos = phy_offset - mf.file_from_offset + 1
        while True:
            found = buf.find(magic, pos + record.POS_MAGIC, limit)
            if found < 0:
                return file_end
            start = found - record.POS_MAGIC
            phy = mf.file_from_offset + start
            if start + record.POS_SYS_FLAG <= limit and record.peek_phy_offset(buf, start) == phy:
                return phy
            pos = start + 1

    def roll_next_file(self, phy_offset: int) -> int:
        """Start of the file after the one holding ``phy_offset``."""
        return phy_offset + self.mapped_file_size - phy_offset % self.mapped_file_size

    # ------------------------------------------------------------------ append

    def append(
        self, encoded: bytearray, *, sys_flag: int, queue_offset: int, store_timestamp: int, crc: bool = False
    ) -> AppendMessageResult:
        """Append one encoded record at the end of the log (the caller holds the put lock):
        `append_to` on the last file, and once more on the next file after END_OF_FILE.
        ``crc``: the record carries the CRC tail (`record.fill_record_crc`)."""
        for _ in range(2):
            mf = self.mfq.get_last_mapped_file(0)
            if mf is None:
                return AppendMessageResult(AppendMessageStatus.UNKNOWN_ERROR)
            result = self.append_to(
                mf,
                encoded,
                sys_flag=sys_flag,
                queue_offset=queue_offset,
                store_timestamp=store_timestamp,
                crc=crc,
            )
            if result.status is not AppendMessageStatus.END_OF_FILE:
                return result
        return AppendMessageResult(AppendMessageStatus.UNKNOWN_ERROR)

    def append_to(
        self,
        mf: MappedFile,
        encoded: bytearray,
        *,
        sys_flag: int,
        queue_offset: int,
        store_timestamp: int,
        crc: bool = False,
    ) -> AppendMessageResult:
        """RocketMQ's `doAppend` on one file at its write position: patch the lock-decided fields
        and copy the record, or close the file with a blank record (END_OF_FILE) if it does not
        fit. Writes go to the file's pool buffer when it has one."""
        size = len(encoded)
        if size + record.END_FILE_MIN_BLANK_LENGTH > self.mapped_file_size:
            return AppendMessageResult(AppendMessageStatus.MESSAGE_SIZE_EXCEEDED)
        pos = mf.wrote_position
        max_blank = mf.file_size - pos
        if size + record.END_FILE_MIN_BLANK_LENGTH > max_blank:
            self.end_file(mf)
            return AppendMessageResult(AppendMessageStatus.END_OF_FILE, mf.file_from_offset + pos, max_blank)
        phy_offset = mf.file_from_offset + pos
        record.patch_record(
            encoded,
            0,
            queue_offset=queue_offset,
            phy_offset=phy_offset,
            store_timestamp=store_timestamp,
            sys_flag=sys_flag,
            crc=crc,
        )
        mf.append(encoded)
        mf.last_store_timestamp = store_timestamp
        return AppendMessageResult(AppendMessageStatus.PUT_OK, phy_offset, size)

    @staticmethod
    def end_file(mf: MappedFile) -> None:
        """Close ``mf`` at its write position with a BLANK record (§2.8) and mark it full."""
        pos = mf.wrote_position
        max_blank = mf.file_size - pos
        blank = record.encode_blank(max_blank)
        if mf.write_buffer is not None:
            # A reused pool buffer still holds its previous file's bytes, and the commit copies
            # up to the file's end: zero them so the file keeps zeros after its blank record.
            blank += bytes(max_blank - len(blank))
        mf.reserve_range(pos, pos + len(blank))  # ENOSPC as an OSError, never a SIGBUS in the fill
        mf.fill(pos, blank)
        mf.advance_wrote(mf.file_size)

    # ------------------------------------------------------------------ read

    def _file_for(self, phy_offset: int) -> MappedFile:
        mf = self.mfq.find_mapped_file_by_offset(phy_offset)
        if mf is None or phy_offset - mf.file_from_offset >= mf.read_position:
            raise MessageNotFoundError(
                f"commit-log offset {phy_offset} is outside [{self.min_offset()}, {self.max_offset()})"
            )
        return mf

    def look_message_by_offset(self, phy_offset: int) -> MessageExt:
        """Decode the record starting at ``phy_offset`` (`lookMessageByOffset`), checked as
        `record.decode_message` checks it (body CRC included): `CorruptRecordError` /
        `BodyCrcError` rather than a damaged message."""
        mf = self._file_for(phy_offset)
        pos = phy_offset - mf.file_from_offset
        return record.decode_message(mf.buf, pos, mf.read_position, file_position=phy_offset)

    def total_size_at(self, phy_offset: int) -> int:
        """TOTALSIZE of the record at ``phy_offset`` (its first 4 bytes, unchecked)."""
        mf = self._file_for(phy_offset)
        return record.peek_total_size(mf.buf, phy_offset - mf.file_from_offset)

    def check_at(self, phy_offset: int, *, check_crc: bool = False) -> record.DispatchRequest:
        """Validate the record at ``phy_offset`` without decoding its body."""
        mf = self._file_for(phy_offset)
        return record.check_record(
            mf.buf,
            phy_offset - mf.file_from_offset,
            mf.read_position,
            check_crc=check_crc,
            delay_level_ms=self.delay_level_ms,
        )

    def store_timestamp_at(self, phy_offset: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``phy_offset`` (`pickupStoreTimestamp`); -1 if gone."""
        try:
            mf = self._file_for(phy_offset)
        except MessageNotFoundError:
            return -1
        pos = phy_offset - mf.file_from_offset
        if pos + size > mf.read_position:
            return -1
        return record.peek_store_timestamp(mf.buf, pos)

    def _span(self, offset: int, end: int) -> tuple[MappedFile, int, int] | int | None:
        """Where a walk at ``offset`` (up to ``end``) reads next: (file, position, limit) inside one
        file; the next file's offset when this one is read to its end; None where the log ends."""
        mf = self.mfq.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        limit = min(mf.read_position, end - mf.file_from_offset)
        if pos < limit:
            return mf, pos, limit
        return self.roll_next_file(offset) if mf.read_position >= mf.file_size else None

    def iter_dispatch(
        self, from_offset: int, *, check_crc: bool, end_offset: int | None = None
    ) -> Iterator[tuple[int, record.DispatchRequest]]:
        """Walk records from ``from_offset`` to ``end_offset`` (default: the readable end), rolling
        over blank records. Yields (phy offset, request); stops after the first failure, which is
        yielded too so the caller can decide (recovery cuts, reput skips or waits)."""
        end = self.max_offset() if end_offset is None else end_offset
        offset = from_offset
        while offset < end:
            span = self._span(offset, end)
            if span is None:
                return
            if isinstance(span, int):
                offset = span
                continue
            mf, pos, limit = span
            req = record.check_record(
                mf.buf, pos, limit, check_crc=check_crc, delay_level_ms=self.delay_level_ms
            )
            if req.success and req.size > 0:
                req.phy_offset = offset  # its place, whatever a damaged PHYSICALOFFSET says (RecordBatch)
            yield offset, req
            if not req.success:
                return
            offset = self.roll_next_file(offset) if req.size == 0 else offset + req.size

    def iter_batches(
        self,
        from_offset: int,
        *,
        check_crc: bool,
        end_offset: int | None = None,
        max_records: int | None = None,
        batch_records: int = BATCH_RECORDS,
    ) -> Iterator[BatchStep]:
        """`iter_dispatch` in columns: walk from ``from_offset`` to ``end_offset`` (default: the
        readable end), at most ``max_records`` records (default: no limit), one
        `record_batch.scan_segment` of at most ``batch_records`` per step (a step stays within a
        file). Blank records roll to the next file inside the walk; it stops after the first
        failure, which the last step carries in ``tail`` for the caller to decide on."""
        end = self.max_offset() if end_offset is None else end_offset
        offset = from_offset
        remaining = (1 << 62) if max_records is None else max_records
        while offset < end and remaining > 0:
            span = self._span(offset, end)
            if span is None:
                return
            if isinstance(span, int):
                offset = span
                continue
            mf, pos, limit = span
            scan = record_batch.scan_segment(
                mf.buf,
                pos,
                limit,
                file_from_offset=mf.file_from_offset,
                check_crc=check_crc,
                delay_level_ms=self.delay_level_ms,
                max_records=min(remaining, batch_records),
            )
            stop = mf.file_from_offset + scan.stop
            tail = scan.tail
            if tail is not None and tail.success:  # a blank record: the rest of the file is empty
                next_offset = self.roll_next_file(stop)
            else:
                next_offset = stop
            yield BatchStep(scan.batch, offset, stop, tail, next_offset)
            remaining -= len(scan.batch)
            if tail is not None and not tail.success:
                return
            offset = next_offset

    def scan_rows(self, offset: int, end: int, max_records: int) -> record_batch.RecordRows | None:
        """The first step of `iter_batches` as `RecordRows`, for a small span (reput's small
        passes): the records from ``offset`` on, up to ``end``, ``max_records``, `SCAN_ROWS_CAP`,
        the file's end or the first record the compiled scan does not read itself (``stop``:
        where they end). None, nothing decided, when that leaves none (a blank or an unusual
        record at ``offset``) or there is no compiled scan: `iter_batches` reads on from there."""
        span = self._span(offset, end)
        if not isinstance(span, tuple):
            return None
        if self._row_scanner is None:
            self._row_scanner = record_batch.RowScanner(SCAN_ROWS_CAP, self.delay_level_ms)
        mf, pos, limit = span
        return self._row_scanner.scan(mf.buf, pos, limit, mf.file_from_offset, max_records)

    def flush(self) -> bool:
        return self.mfq.flush()


@dataclass(frozen=True, slots=True)
class BatchStep:
    """One part of an `iter_batches` walk: the valid records of ``[start, stop)`` and what stopped
    it at ``stop`` (``tail``: None at the walk's limit, `record.BLANK` at a file's end, else the
    invalid record). ``next_offset`` is where the walk goes on (the next file after a blank)."""

    batch: record_batch.RecordBatch
    start: int
    stop: int
    tail: record.DispatchRequest | None
    next_offset: int
