"""Per-segment work for the `rmq-spark` jobs: one Spark task walks one CommitLog segment.

Why per segment: segments are independent files of fixed size, so a store of N segments is N
tasks with no shuffle; each task maps its file by path (never shipping 1 GiB through Spark).
A walk follows the record chain from the segment's first byte (TOTALSIZE to TOTALSIZE) to the
end-of-file BLANK record, as RocketMQ's recovery does (`checkMessageAndReturnSize`, docs/format.md §2.10).
On a running store the walk stops at the store's readable end (`RunningStore.readable_end`):
the bytes after it are the file being written (zeros until the next put) and files allocated
ahead, which hold nothing yet and are not damage. A store read offline (or one whose readable end
is not known, such as a running store attached by a directory whose shm name differs) ends where
the zeros begin, as RocketMQ's recovery ends there: zeros at a record boundary are damage only when
some record lies after them, in the rest of the file or in a later one (`Segment.data_after`).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rmq_mp import file_modes
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.queue_entry import CQ_ENTRY, CQ_STORE_UNIT_SIZE
from rmq_mp.spark.columns import decode_batch
from rmq_mp.store.mapped_file import offset_to_file_name

EXPORT_BATCH_RECORDS = 65536


@dataclass(frozen=True, slots=True)
class Segment:
    """One CommitLog file, as a task receives it."""

    path: str
    file_offset: int
    is_last: bool
    readable_bytes: int | None = None
    """On a running store: the bytes of this file below the store's readable end (0 for a file
    allocated ahead); None offline, where the whole file is read."""
    data_after: bool = True
    """Whether a later file begins with something other than zeros (a record or damage): then
    zeros in this one are a hole, not the log's end."""


def list_segments(commit_log_dir: str | os.PathLike[str], readable_end: int | None = None) -> list[Segment]:
    """The CommitLog files in offset order; ``readable_end`` (a running store's) bounds each."""
    paths = sorted(p for p in Path(commit_log_dir).iterdir() if p.name.isdigit() and len(p.name) == 20)
    begins_with_data = [_begins_with_data(p) for p in paths]
    return [
        Segment(
            str(p),
            int(p.name),
            i == len(paths) - 1,
            None if readable_end is None else max(0, readable_end - int(p.name)),
            any(begins_with_data[i + 1 :]),
        )
        for i, p in enumerate(paths)
    ]


def _begins_with_data(path: Path) -> bool:
    """Whether a file's first record header (TOTALSIZE, MAGICCODE) is not all zeros: a file the
    log has reached begins with a record or an end-of-file blank; one allocated ahead with zeros."""
    with path.open("rb") as f:
        return any(f.read(record.SIZE_MAGIC_LENGTH))


@dataclass
class SegmentAudit:
    """What `audit` found in one segment. ``errors``: (commit-log offset, problem)."""

    path: str
    file_offset: int
    records: int = 0
    record_bytes: int = 0
    blank_at: int | None = None
    errors: list[tuple[int, str]] = field(default_factory=list)


def _walk(seg: Segment, buf: mmap.mmap, audit: SegmentAudit) -> Iterator[tuple[int, record.DispatchRequest]]:
    """Valid records of the segment in order, (position, request); problems go to ``audit``.

    A record whose body CRC fails, or whose PHYSICALOFFSET is not its position, is reported and
    the walk goes on (its TOTALSIZE is sound); a broken chain (bad magic or size, zero bytes
    before the end-of-file blank in a segment that is not the last) ends the walk there. On a
    running store the walk ends cleanly at the readable end, which is a record boundary."""
    pos = 0
    running = seg.readable_bytes is not None
    limit = len(buf) if seg.readable_bytes is None else min(len(buf), seg.readable_bytes)
    writing = limit < len(buf)  # the file being written: what lies after is not written yet
    while pos + record.END_FILE_MIN_BLANK_LENGTH <= limit:
        total, magic = record.peek_size_magic(buf, pos)
        phy = seg.file_offset + pos
        if magic == record.BLANK_MAGIC_CODE:
            audit.blank_at = phy
            if pos + total != len(buf):
                audit.errors.append((phy, f"end-of-file blank of {total} bytes does not reach the file end"))
            return
        if total == 0 and magic == 0:
            # A running store wrote every byte below its readable end; offline, zeros followed by
            # nothing but zeros are where the log ends (the file being written, or one ahead).
            if running or seg.data_after or _any_nonzero(buf, pos, limit):
                audit.errors.append((phy, "zero bytes where a record or the end-of-file blank should be"))
            return
        req = record.check_record(buf, pos, limit, check_crc=True)
        if not req.success:
            plain = record.check_record(buf, pos, limit, check_crc=False)
            if plain.success:  # only the CRC failed: the chain goes on, the record is not used
                audit.errors.append((phy, req.reason))
                audit.records += 1
                audit.record_bytes += plain.size
                pos += plain.size
                continue
            audit.errors.append((phy, plain.reason or req.reason))
            if plain.size <= 0:
                return
            pos += plain.size
            continue
        if req.phy_offset != phy:
            audit.errors.append((phy, f"PHYSICALOFFSET field says {req.phy_offset}"))
        audit.records += 1
        audit.record_bytes += req.size
        yield pos, req
        pos += req.size
    if writing:
        if pos != limit:
            audit.errors.append(
                (
                    seg.file_offset + pos,
                    f"the store's readable end {seg.file_offset + limit} is inside a record",
                )
            )
    elif running or seg.data_after:
        audit.errors.append((seg.file_offset + pos, "segment ends without an end-of-file blank"))


def _any_nonzero(buf: mmap.mmap, start: int, end: int) -> bool:
    """Whether ``buf[start:end]`` holds a non-zero byte (checked 16 MiB at a time)."""
    step = 16 << 20
    view = np.frombuffer(buf, dtype=np.uint8)
    return any(view[p : min(end, p + step)].any() for p in range(start, end, step))


def _map(seg: Segment) -> mmap.mmap | None:
    with open(seg.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None


def audit_segment(seg: Segment) -> SegmentAudit:
    """Decode every record (CRC, chain, PHYSICALOFFSET) of one segment."""
    audit = SegmentAudit(seg.path, seg.file_offset)
    if seg.readable_bytes == 0:
        return audit  # allocated ahead of a running store's write position: nothing written yet
    buf = _map(seg)
    if buf is None:
        audit.errors.append((seg.file_offset, "empty segment file"))
        return audit
    try:
        for _ in _walk(seg, buf, audit):
            pass
    finally:
        buf.close()
    return audit


# ------------------------------------------------------------------------------------- rebuild


@dataclass
class SegmentRebuild:
    """A task's share of `rebuild-index`: CQ entries written, index keys in commit-log order."""

    audit: SegmentAudit
    cq_entries: int = 0
    index_records: list[tuple[int, int, int, str, str, str | None]] = field(default_factory=list)
    """(phy offset, store timestamp, sys flag, topic, keys, uniq key) of each record to index."""


def rebuild_segment(
    seg: Segment, target_root: str, cq_file_size: int, delay_level_ms: list[int]
) -> SegmentRebuild:
    """Write this segment's ConsumeQueue entries into ``target_root/consumequeue`` at their
    positions (``queue_offset * 20``; tasks never overlap, so no shuffle and no lock) and return
    what the single index writer needs."""
    out = SegmentRebuild(SegmentAudit(seg.path, seg.file_offset))
    buf = _map(seg)
    if buf is None:
        return out
    by_file: dict[Path, list[tuple[int, bytes]]] = {}
    try:
        for pos, req in _walk(seg, buf, out.audit):
            phy = seg.file_offset + pos
            if m.is_dispatchable(req.sys_flag):
                position = req.queue_offset * CQ_STORE_UNIT_SIZE
                file_offset = position - position % cq_file_size
                path = (
                    Path(target_root)
                    / "consumequeue"
                    / req.topic
                    / str(req.queue_id)
                    / offset_to_file_name(file_offset)
                )
                tags_code = record.cq_tags_code(
                    req.topic, req.properties, req.store_timestamp, delay_level_ms
                )
                by_file.setdefault(path, []).append(
                    (position - file_offset, CQ_ENTRY.pack(phy, req.size, tags_code))
                )
                out.cq_entries += 1
            if m.transaction_type(req.sys_flag) != m.TRANSACTION_ROLLBACK_TYPE and (req.uniq_key or req.keys):
                out.index_records.append(
                    (phy, req.store_timestamp, req.sys_flag, req.topic, req.keys, req.uniq_key)
                )
    finally:
        buf.close()
    for path, writes in by_file.items():
        file_modes.make_dirs(path.parent, Path(target_root))  # an executor's umask is not the store's
        fd = os.open(path, os.O_RDWR | os.O_CREAT, file_modes.file_mode())
        try:
            if os.fstat(fd).st_size < cq_file_size:
                os.ftruncate(fd, cq_file_size)  # same size from every task: never cuts another's writes
            for position, entry in writes:
                os.pwrite(fd, entry, position)
            os.fsync(fd)
        finally:
            os.close(fd)
    return out


# ------------------------------------------------------------------------------------- export


def escape_partition_value(value: str) -> str:
    """Spark's `ExternalCatalogUtils.escapePathName`, so Spark reads the topic back unchanged."""
    special = set("\"#%'*/:=?\\\x7f{[]^")
    return "".join(f"%{ord(c):02X}" if c in special or ord(c) < 0x20 else c for c in value)


@dataclass
class SegmentExport:
    audit: SegmentAudit
    rows: int = 0
    bytes_written: int = 0
    files: list[str] = field(default_factory=list)


def export_segment(seg: Segment, topics: frozenset[str] | None, target: str, broker: str) -> SegmentExport:
    """This segment's dispatched messages of ``topics`` as Parquet, one file per (topic, queue)
    under Hive-style ``topic=…/queue_id=…`` directories, written to a temporary name and renamed
    (a retried task rewrites the same names)."""
    out = SegmentExport(SegmentAudit(seg.path, seg.file_offset))
    buf = _map(seg)
    if buf is None:
        return out
    try:
        starts = [
            pos
            for pos, req in _walk(seg, buf, out.audit)
            if m.is_dispatchable(req.sys_flag) and (topics is None or req.topic in topics)
        ]
        if not starts:
            return out
        data = np.frombuffer(buf, dtype=np.uint8)
        try:
            table = pa.Table.from_batches(
                [
                    decode_batch(
                        data, np.array(starts[i : i + EXPORT_BATCH_RECORDS], dtype=np.int64), broker=broker
                    )
                    for i in range(0, len(starts), EXPORT_BATCH_RECORDS)
                ]
            )
        finally:
            del data
    finally:
        buf.close()
    keys = table.select(["topic", "queue_id"]).group_by(["topic", "queue_id"]).aggregate([]).to_pylist()
    for key in sorted(keys, key=lambda k: (k["topic"], k["queue_id"])):
        part = table.filter(
            (pa.compute.field("topic") == key["topic"]) & (pa.compute.field("queue_id") == key["queue_id"])
        ).drop_columns(["topic", "queue_id"])
        directory = (
            Path(target) / f"topic={escape_partition_value(key['topic'])}" / f"queue_id={key['queue_id']}"
        )
        directory.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        path = directory / f"part-{offset_to_file_name(seg.file_offset)}.parquet"
        tmp = path.with_name("." + path.name + ".tmp")
        pq.write_table(part, tmp)
        os.replace(tmp, path)
        out.rows += part.num_rows
        out.bytes_written += path.stat().st_size
        out.files.append(str(path))
    return out


# ------------------------------------------------------------------------------------- stats


@dataclass
class QueueStats:
    count: int = 0
    record_bytes: int = 0
    body_bytes: int = 0
    first_store_ms: int = 1 << 62
    last_store_ms: int = 0

    def merge(self, other: QueueStats) -> None:
        self.count += other.count
        self.record_bytes += other.record_bytes
        self.body_bytes += other.body_bytes
        self.first_store_ms = min(self.first_store_ms, other.first_store_ms)
        self.last_store_ms = max(self.last_store_ms, other.last_store_ms)


@dataclass
class SegmentStats:
    audit: SegmentAudit
    queues: dict[tuple[str, int], QueueStats] = field(default_factory=dict)
    keys: Counter[tuple[str, str]] = field(default_factory=Counter)


def stats_segment(seg: Segment, topics: frozenset[str] | None) -> SegmentStats:
    """Counts, bytes and store-time range per queue, and KEYS counts per topic, of one segment."""
    out = SegmentStats(SegmentAudit(seg.path, seg.file_offset))
    buf = _map(seg)
    if buf is None:
        return out
    try:
        for pos, req in _walk(seg, buf, out.audit):
            if not m.is_dispatchable(req.sys_flag) or (topics is not None and req.topic not in topics):
                continue
            q = out.queues.setdefault((req.topic, req.queue_id), QueueStats())
            q.count += 1
            q.record_bytes += req.size
            (body_len,) = struct.unpack_from(">i", buf, pos + _body_len_position(req.sys_flag))
            q.body_bytes += body_len
            q.first_store_ms = min(q.first_store_ms, req.store_timestamp)
            q.last_store_ms = max(q.last_store_ms, req.store_timestamp)
            for key in m.split_keys(req.keys):
                out.keys[(req.topic, key)] += 1
    finally:
        buf.close()
    return out


_HOST_BITS = m.BORNHOST_V6_FLAG | m.STOREHOSTADDRESS_V6_FLAG
_BODY_LEN_POSITIONS = {
    (m.BORNHOST_V6_FLAG if born_v6 else 0)
    | (m.STOREHOSTADDRESS_V6_FLAG if store_v6 else 0): record.field_offsets(born_v6, store_v6)["BODYLEN"]
    for born_v6, store_v6 in record.HOST_LAYOUTS
}
"""BODYLEN's offset by a record's host bits (computed once: asked per record)."""


def _body_len_position(sys_flag: int) -> int:
    return _BODY_LEN_POSITIONS[sys_flag & _HOST_BITS]
