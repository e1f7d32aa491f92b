"""Batch decoding of CommitLog records for dispatch: what reput and recovery need from a run of
records, as numpy columns, in one pass over a mapped segment.

Why: reading one record at a time (`record.check_record`: struct unpacking, UTF-8 decoding, a
properties dict, Java hash codes character by character) costs about 10 us a record, so reput
fell behind producers and recovery took several times a read of the log. Dispatch needs only
the header fields, the topic, and the hash codes of TAGS, UNIQ_KEY and the words of KEYS. So a
scan (bench/NOTES.md has the measurements behind each step):

1. walks the TOTALSIZE chain: a run of records of equal size is guessed from two equal heads
   and verified with numpy; other records are stepped one at a time;
2. locates the fixed fields of every record with `record_columns.RecordColumns` (the core the
   Spark source shares: the first 112 bytes of every record in one copy, an overlapping
   zero-copy view of the segment indexed by the record positions, whose overlapping dtype fields
   cover every host layout of record.py's table), and gathers the record's tail (topic length, topic, properties length, properties) in a
   second; checks the lengths as `calMsgLength` does, and with ``check_crc`` the body CRC
   (zlib over a slice of the map, no copy);
3. reads the properties of all records at once as `string_to_properties` would: chunks
   between \x02 separators, each counting when its first \x01 leaves a non-empty name and
   value, the last chunk of a name winning (names compared as 4- or 8-byte words);
4. computes Java `String.hashCode` over rows of equal length (ASCII text: one code unit a byte),
   and the index key hash of ``topic#key`` as ``hash(topic#) * 31^len(key) + hash(key)``
   (mod 2^32), then `IndexFile.indexKeyHashMethod`'s abs.

Records whose properties hold a byte >= 0x80 have them parsed one record at a time (the
"loose" path; their hash codes are still computed together, over UTF-16 code units). Anything
else unusual goes through `record.check_record` alone: v2 magic, NUL bytes in the properties (a
torn tail), a topic it would refuse, SCHEDULE_TOPIC_XXXX (the tags code is a delivery time), a
tail over MAX_TAIL_BYTES, a failed check. So a batch holds exactly what the per-record reader
yields, in log order, and a scan stops where that reader stops: at a blank record (end of file)
or an invalid one, which it returns as the ``tail`` for the caller to decide on (recovery cuts,
reput skips or waits).

Nothing returned refers to the map: every column is a copy, so the segment can be unmapped.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from rmq_mp.format import message as m
from rmq_mp.format import native, record
from rmq_mp.format.record import DispatchRequest
from rmq_mp.format.record_columns import HEAD_BYTES, RecordColumns
from rmq_mp.format.record_columns import gather as _gather
from rmq_mp.format.record_columns import gather_rows as _gather_rows

_U4 = np.dtype("<u4")
_U8 = np.dtype("<u8")
_NAME_CODES = {
    name: int.from_bytes(name.encode(), "little")
    for name in (m.PROPERTY_TAGS, m.INDEX_KEY_WORDS, m.INDEX_KEY_WHOLE)
}
"""The property names dispatch reads, as the little-endian word of their 4 or 8 bytes."""
_SPACE = ord(m.KEY_SEPARATOR)
RUN_PROBE_RECORDS = 16384
"""How many equal-size records one numpy probe checks at most (probes start at 64 and double
while the runs fill them)."""
MAX_TOPICS_PER_LENGTH = 16
"""Distinct topics of one length picked out column-wise before the rest go one by one."""
MAX_TAIL_BYTES = 1024
"""Longest record tail (topic and properties with their lengths) decoded column-wise; records
with more go through `check_record`."""
_MASK32 = 0xFFFFFFFF
MIN_RECORD_BYTES = record.field_offsets(False, False)["BODY"] + 4
"""The shortest valid record (empty body, one-byte topic, no properties): bounds the rows a
segment can hold."""
MAX_KEYS_PER_RECORD = record.MAX_PROPERTIES_BYTES // 2 + 1
"""Index keys one record can have at most (UNIQ_KEY and one-letter words of KEYS)."""


# ----------------------------------------------------------------------------------- result


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Valid records in log order, as columns (int64 unless said), plus their index keys.

    ``phy_offset`` is where a record lies in the log (``position`` says the same): what dispatch
    writes. A sound record's PHYSICALOFFSET field says it too; one whose field was damaged is
    still put at its place (never at the offset the field names, past the log's end or inside
    another record), so a read of its entry finds the disagreement, skips and reports it.
    ``key_record`` and ``key_hash`` list
    the index keys `IndexService.buildIndex` puts, in its order (record by record: UNIQ_KEY,
    then each word of KEYS), as the record's index in the batch and
    `IndexFile.indexKeyHashMethod` of ``topic#key``. Keys are listed for ROLLBACK records too;
    the index skips them."""

    topics: list[str]
    topic_index: np.ndarray
    phy_offset: np.ndarray
    size: np.ndarray
    queue_id: np.ndarray
    queue_offset: np.ndarray
    sys_flag: np.ndarray
    store_timestamp: np.ndarray
    tags_code: np.ndarray
    ends_in_nul: np.ndarray
    """bool: the properties end in NUL (a torn tail if this is the log's last record)."""
    key_record: np.ndarray
    key_hash: np.ndarray

    @property
    def position(self) -> np.ndarray:
        """Where each record lies in the log: `phy_offset`, by that name where recovery walks
        the log rather than dispatching it."""
        return self.phy_offset

    def __len__(self) -> int:
        return len(self.phy_offset)

    def end_offset(self) -> int:
        """Just past the last record (its position + size); -1 for an empty batch."""
        return int(self.position[-1] + self.size[-1]) if len(self.position) else -1

    def slice(self, start: int, stop: int) -> RecordBatch:
        """Records ``[start, stop)`` with their keys (record numbers renumbered from 0)."""
        k0, k1 = np.searchsorted(self.key_record, [start, stop])
        return RecordBatch(
            topics=self.topics,
            topic_index=self.topic_index[start:stop],
            phy_offset=self.phy_offset[start:stop],
            size=self.size[start:stop],
            queue_id=self.queue_id[start:stop],
            queue_offset=self.queue_offset[start:stop],
            sys_flag=self.sys_flag[start:stop],
            store_timestamp=self.store_timestamp[start:stop],
            tags_code=self.tags_code[start:stop],
            ends_in_nul=self.ends_in_nul[start:stop],
            key_record=self.key_record[k0:k1] - start,
            key_hash=self.key_hash[k0:k1],
        )

    @classmethod
    def concat(cls, pieces: Sequence[RecordBatch]) -> RecordBatch:
        """The records of ``pieces`` in order, with their keys (`slice`'s inverse). The pieces
        share one topic list."""
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:
            return cls.empty()
        columns = {
            f.name: np.concatenate([getattr(p, f.name) for p in pieces])
            for f in fields(cls)
            if f.name not in ("topics", "key_record")
        }
        first_rows = np.cumsum([0, *(len(p) for p in pieces[:-1])]).tolist()
        key_record = np.concatenate([p.key_record + row for p, row in zip(pieces, first_rows, strict=True)])
        return cls(topics=pieces[0].topics, key_record=key_record, **columns)

    @classmethod
    def empty(cls) -> RecordBatch:
        z = np.zeros(0, dtype=np.int64)
        return cls([], z, z, z, z, z, z, z, z, np.zeros(0, dtype=bool), z, z)


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What `scan_segment` found: ``batch`` covers ``[start, stop)`` of the segment (positions
    in the file). ``tail`` is the record at ``stop`` when the scan stopped on it: `record.BLANK`
    (go to the next file) or a failed `DispatchRequest`; None when the scan reached its limit
    or ``max_records``."""

    batch: RecordBatch
    start: int
    stop: int
    tail: DispatchRequest | None
    one_by_one: int = 0
    """Records of the batch whose properties (or whole record) were read one at a time."""


# ----------------------------------------------------------------------------------- hashing


_POW_CACHE: dict[int, np.ndarray] = {}


def _powers(length: int) -> np.ndarray:
    """31^(length-1-i) mod 2^32, i < length: the weights of `String.hashCode`."""
    weights = _POW_CACHE.get(length)
    if weights is None:
        weights = np.array([pow(31, length - 1 - i, 1 << 32) for i in range(length)], dtype=np.uint32)
        _POW_CACHE[length] = weights
    return weights


def java_hash_rows(rows: np.ndarray) -> np.ndarray:
    """Java `String.hashCode` of each row of ASCII bytes, as uint32 (uint32 arithmetic wraps
    modulo 2^32 as Java's int does)."""
    if rows.shape[1] == 0:
        return np.zeros(rows.shape[0], dtype=np.uint32)
    return np.einsum("ij,j->i", rows, _powers(rows.shape[1]), dtype=np.uint32)


def index_hash(prefix_hash: np.ndarray, key_length: int, key_hash: np.ndarray) -> np.ndarray:
    """`indexKeyHashMethod(topic + "#" + key)` from the hash of ``topic#`` (uint32) and of an
    ASCII key of ``key_length`` bytes: abs of the int hash, 0 for Integer.MIN_VALUE."""
    combined = prefix_hash * np.uint32(pow(31, key_length, 1 << 32)) + key_hash
    signed = combined.view(np.int32).astype(np.int64)
    magnitude = np.abs(signed)
    magnitude[magnitude > 0x7FFFFFFF] = 0
    return magnitude


def java_hash_strings(texts: Sequence[str]) -> np.ndarray:
    """Java `String.hashCode` of each text (UTF-16 code units), as uint32, in one numpy pass
    per distinct length instead of a Python loop per character."""
    units = [t.encode("utf-16-be") for t in texts]
    lengths = np.fromiter((len(u) // 2 for u in units), dtype=np.int64, count=len(units))
    result = np.zeros(len(units), dtype=np.uint32)
    if not len(units):
        return result
    flat = np.frombuffer(b"".join(units), dtype=">u2").astype(np.uint32)
    starts = np.zeros(len(units), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    for length in distinct(lengths):
        if length == 0:
            continue
        rows = np.flatnonzero(lengths == length)
        matrix = flat[starts[rows][:, None] + np.arange(length)]
        result[rows] = np.einsum("ij,j->i", matrix, _powers(length), dtype=np.uint32)
    return result


def index_hash_strings(keys: Sequence[str]) -> np.ndarray:
    """`IndexFile.indexKeyHashMethod` of each full key (``topic#key``), as int64."""
    signed = java_hash_strings(keys).view(np.int32).astype(np.int64)
    magnitude = np.abs(signed)
    magnitude[magnitude > 0x7FFFFFFF] = 0
    return magnitude


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values, ascending; without a sort when they are all the same (the common
    case: one topic length, one key length)."""
    if not len(values):
        return []
    low, high = int(values.min()), int(values.max())
    return [low] if low == high else np.unique(values).tolist()


# ----------------------------------------------------------------------------------- scan


def scan_segment(
    buf: Any,
    pos: int,
    limit: int,
    *,
    file_from_offset: int,
    check_crc: bool,
    delay_level_ms: Sequence[int] = record.DEFAULT_DELAY_LEVEL_MS,
    max_records: int,
) -> SegmentScan:
    """Decode the records of ``buf[pos:limit]`` (one mapped segment starting at log offset
    ``file_from_offset``), at most ``max_records``, as `record.check_record` would one by one:
    with the compiled scan where it is built (`native.scan`), else with numpy alone (also for
    a CRC-checked scan when the compiled scan was built without zlib)."""
    compiled = native.scan.active
    if compiled is None or (check_crc and not compiled.HAVE_CRC):
        return scan_segment_numpy(
            buf,
            pos,
            limit,
            file_from_offset=file_from_offset,
            check_crc=check_crc,
            delay_level_ms=delay_level_ms,
            max_records=max_records,
        )
    return _NativeScan(buf, file_from_offset, check_crc, delay_level_ms).scan(pos, limit, max_records)


def scan_segment_numpy(
    buf: Any,
    pos: int,
    limit: int,
    *,
    file_from_offset: int,
    check_crc: bool,
    delay_level_ms: Sequence[int] = record.DEFAULT_DELAY_LEVEL_MS,
    max_records: int,
) -> SegmentScan:
    """`scan_segment` in numpy: the reference, and the compiled scan's reader of the records it
    hands back."""
    view = np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.zeros(0, dtype=np.uint8)
    try:
        walk = _walk(buf, view, pos, limit, max_records, check_crc, delay_level_ms)
        decoder = _Decoder(buf, view, limit, walk, check_crc, delay_level_ms)
        batch, stop, tail = decoder.decode(file_from_offset)
    finally:
        del view
    one_by_one = int(np.count_nonzero((decoder.slow | decoder.loose)[: len(batch)]))
    return SegmentScan(batch, pos, stop, tail, one_by_one)


NATIVE_COLUMNS = (
    "position", "size", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "tags_code", "topic_index"
)  # fmt: skip
"""The rows of `_scan.scan`'s output array, in its order (the C enum)."""
FALLBACK_RECORDS = 256
"""Records the numpy decoder reads after the compiled scan hands one back, at first: a run of
unusual records is read as a batch, not one `scan_segment_numpy` set-up (~0.1 ms) per record.
While the compiled scan keeps handing back within fewer records than numpy just read (a log
where unusual records are everywhere, e.g. a non-ASCII topic among others), numpy's share
doubles: such a log costs what numpy alone costs."""
_SCAN_END, _SCAN_DEFER, _SCAN_KEYS_FULL = 0, 1, 2


class _NativeScan:
    """`scan_segment` with the compiled scan (rmq_mp/format/_scan.c): it writes the common
    records straight into int64 columns and stops at any other one, which `scan_segment_numpy`
    reads (up to FALLBACK_RECORDS at a time) before the compiled scan goes on. The pieces are
    joined in log order over one topic list."""

    def __init__(
        self, buf: Any, file_from_offset: int, check_crc: bool, delay_level_ms: Sequence[int]
    ) -> None:
        self.buf = buf
        self.file_from_offset = file_from_offset
        self.check_crc = check_crc
        self.delay_level_ms = delay_level_ms
        self.level_ms = _level_tuple(delay_level_ms)
        """The delay table as the compiled scan takes it: it reads SCHEDULE_TOPIC_XXXX records too."""
        self.topics: list[str] = []
        self.topic_ids: dict[bytes, int] = {}
        """Topic bytes -> index in `topics`: the compiled scan looks up and adds topics here."""

    def scan(self, pos: int, limit: int, max_records: int) -> SegmentScan:
        assert native.scan.active is not None
        scan = native.scan.active.scan
        cap = max(min(max_records, (limit - pos) // MIN_RECORD_BYTES + 1), 0)
        cols = np.empty((len(NATIVE_COLUMNS), cap), dtype=np.int64)
        keys = np.empty((2, cap + 16), dtype=np.int64)
        pieces: list[RecordBatch] = []
        one_by_one = 0
        row = key_row = run_row = run_key = 0
        p, tail = pos, None
        fallback = FALLBACK_RECORDS
        while p < limit and row < max_records:
            done, p, key_count, why = scan(
                self.buf, p, limit, min(max_records, cap) - row, self.check_crc, self.topic_ids, self.topics,
                cols, row, keys, key_row, self.level_ms,
            )  # fmt: skip
            row += done
            key_row += key_count
            if why == _SCAN_KEYS_FULL:
                keys = _grown(keys, key_row, 2 * keys.shape[1] + MAX_KEYS_PER_RECORD)
                continue
            if why == _SCAN_DEFER:
                chunk = fallback
                fallback = chunk * 2 if row - run_row < chunk else FALLBACK_RECORDS
                if row > run_row:
                    pieces.append(self._columns(cols[:, run_row:row], keys[:, run_key:key_row], run_row))
                numpy_scan = scan_segment_numpy(
                    self.buf,
                    p,
                    limit,
                    file_from_offset=self.file_from_offset,
                    check_crc=self.check_crc,
                    delay_level_ms=self.delay_level_ms,
                    max_records=min(max_records - row, chunk),
                )
                pieces.append(numpy_scan.batch)
                one_by_one += numpy_scan.one_by_one
                row += len(numpy_scan.batch)
                run_row, run_key = row, key_row
                p, tail = numpy_scan.stop, numpy_scan.tail
                if tail is not None:
                    break
        if row > run_row:
            pieces.append(self._columns(cols[:, run_row:row], keys[:, run_key:key_row], run_row))
        return SegmentScan(self._join(pieces), pos, p, tail, one_by_one)

    def _columns(self, cols: np.ndarray, keys: np.ndarray, first_row: int) -> RecordBatch:
        """A batch of the compiled scan's rows (copies: nothing refers to the segment)."""
        c = dict(zip(NATIVE_COLUMNS, cols.copy(), strict=True))
        return RecordBatch(
            topics=self.topics,
            topic_index=c["topic_index"],
            phy_offset=c["position"] + self.file_from_offset,
            size=c["size"],
            queue_id=c["queue_id"],
            queue_offset=c["queue_offset"],
            sys_flag=c["sys_flag"],
            store_timestamp=c["store_timestamp"],
            tags_code=c["tags_code"],
            ends_in_nul=np.zeros(cols.shape[1], dtype=bool),
            key_record=keys[0] - first_row,
            key_hash=keys[1].copy(),
        )

    def _join(self, pieces: list[RecordBatch]) -> RecordBatch:
        """One batch over `topics`: numpy pieces have their own topic lists, mapped here."""
        return RecordBatch.concat([p if p.topics is self.topics else self._retopic(p) for p in pieces])

    def _retopic(self, piece: RecordBatch) -> RecordBatch:
        indexes = np.array([self._topic_index(t) for t in piece.topics], dtype=np.int64)
        return replace(piece, topics=self.topics, topic_index=indexes[piece.topic_index])

    def _topic_index(self, topic: str) -> int:
        raw = topic.encode("utf-8")
        index = self.topic_ids.get(raw)
        if index is None:
            index = self.topic_ids[raw] = len(self.topics)
            self.topics.append(topic)
        return index


@dataclass(frozen=True, slots=True)
class RecordRows:
    """A few records as Python lists, one per `RecordBatch` column (``topic_index`` into
    ``topics``; ``key_record`` and ``key_hash`` as there): what a small dispatch pass reads,
    without the arrays a batch builds (each numpy call costs microseconds, a pass of ~14
    records under SYNC_FLUSH made ~100 of them). ``stop``: the log offset after the last."""

    topics: list[str]
    topic_index: list[int]
    phy_offset: list[int]
    size: list[int]
    queue_id: list[int]
    queue_offset: list[int]
    sys_flag: list[int]
    store_timestamp: list[int]
    tags_code: list[int]
    key_record: list[int]
    key_hash: list[int]
    stop: int

    def __len__(self) -> int:
        return len(self.phy_offset)


class RowScanner:
    """The compiled scan (rmq_mp/format/_scan.c) of up to ``cap`` common records into
    `RecordRows`, for a caller that scans small spans again and again (reput's passes): its
    column arrays and topic list are kept from scan to scan. It stops before anything the
    compiled scan hands back (an unusual record, a blank, a damaged one): the caller reads from
    there with `scan_segment`, which decides on it exactly as before."""

    def __init__(self, cap: int, delay_level_ms: Sequence[int]) -> None:
        self.cap = cap
        self.level_ms = _level_tuple(delay_level_ms)
        self.cols = np.empty((len(NATIVE_COLUMNS), cap), dtype=np.int64)
        self.keys = np.empty((2, 2 * cap + MAX_KEYS_PER_RECORD), dtype=np.int64)
        self.topics: list[str] = []
        self.topic_ids: dict[bytes, int] = {}

    def scan(
        self, buf: Any, pos: int, limit: int, file_from_offset: int, max_records: int
    ) -> RecordRows | None:
        """The records of ``buf[pos:limit]`` up to the first the compiled scan hands back, at
        most ``max_records`` and ``cap`` (``stop`` says where they end); None when there are
        none or the compiled scan is off."""
        compiled = native.scan.active
        if compiled is None:
            return None
        n, p, key_count, _why = compiled.scan(
            buf, pos, limit, min(max_records, self.cap), False, self.topic_ids, self.topics, self.cols, 0, self.keys, 0,
            self.level_ms,
        )  # fmt: skip
        if n == 0:
            return None
        position, size, queue_id, queue_offset, sys_flag, store_ts, tags_code, topic_index = self.cols[
            :, :n
        ].tolist()
        key_record, key_hash = self.keys[:, :key_count].tolist()
        return RecordRows(
            topics=self.topics,
            topic_index=topic_index,
            phy_offset=[file_from_offset + q for q in position],
            size=size,
            queue_id=queue_id,
            queue_offset=queue_offset,
            sys_flag=sys_flag,
            store_timestamp=store_ts,
            tags_code=tags_code,
            key_record=key_record,
            key_hash=key_hash,
            stop=file_from_offset + p,
        )


def _level_tuple(delay_level_ms: Sequence[int]) -> tuple[int, ...]:
    """``delay_level_ms`` as a tuple (the default's made once, not per scan)."""
    if delay_level_ms is record.DEFAULT_DELAY_LEVEL_MS:
        return _DEFAULT_LEVELS
    return tuple(delay_level_ms)


_DEFAULT_LEVELS = tuple(record.DEFAULT_DELAY_LEVEL_MS)


def _grown(keys: np.ndarray, used: int, width: int) -> np.ndarray:
    grown = np.empty((2, width), dtype=np.int64)
    grown[:, :used] = keys[:, :used]
    return grown


@dataclass(slots=True)
class _Walk:
    starts: np.ndarray
    """Record positions in the file, in order."""
    decoded: dict[int, DispatchRequest]
    """Records the walk already read with `check_record` (its quick test did not pass them)."""
    stop: int
    tail: DispatchRequest | None


def _walk(
    buf: Any,
    view: np.ndarray,
    pos: int,
    limit: int,
    max_records: int,
    check_crc: bool,
    delay_level_ms: Sequence[int],
) -> _Walk:
    """Follow the TOTALSIZE chain from ``pos``. A record whose magic is v1 and whose size fits
    is taken as a record here (the decoder checks it fully); anything else goes through
    `check_record`, which decides: a valid record (v2 magic), a blank, or the end of the walk."""
    chunks: list[np.ndarray] = []
    singles: list[int] = []
    decoded: dict[int, DispatchRequest] = {}
    count = 0
    p = pos
    tail: DispatchRequest | None = None
    unpack = record._SIZE_MAGIC.unpack_from
    v1 = record.MESSAGE_MAGIC_CODE
    head_size = record._HEAD.size
    probe_size = 64
    while p < limit and count < max_records:
        if limit - p >= 8:
            size, magic = unpack(buf, p)
            if magic == v1 and size >= head_size and p + size <= limit:
                nxt = p + size
                probe = min((limit - p) // size, max_records - count, probe_size)
                if probe >= 4 and unpack(buf, nxt) == (size, magic):
                    heads = _gather(view, p + np.arange(probe, dtype=np.int64) * size, _U8)
                    differ = np.flatnonzero(heads != heads[0])
                    run = int(differ[0]) if len(differ) else probe
                    # Long runs: probe further next time; short ones: probe little.
                    probe_size = min(probe_size * 2, RUN_PROBE_RECORDS) if run == probe else 64
                    if singles:
                        chunks.append(np.array(singles, dtype=np.int64))
                        singles = []
                    chunks.append(p + np.arange(run, dtype=np.int64) * size)
                    p += run * size
                    count += run
                    continue
                singles.append(p)
                p = nxt
                count += 1
                continue
        req = record.check_record(buf, p, limit, check_crc=check_crc, delay_level_ms=delay_level_ms)
        if req.success and req.size > 0:
            decoded[p] = req
            singles.append(p)
            p += req.size
            count += 1
            continue
        tail = req
        break
    if singles:
        chunks.append(np.array(singles, dtype=np.int64))
    starts = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    return _Walk(starts, decoded, p, tail)


class _Decoder:
    """Columns for the records of one walk, in three tiers. Records whose topic and properties
    lengths and properties layout enough others share are decoded column-wise; the ``loose``
    rows (a sound header, but a rare layout or non-ASCII properties) have their topic and
    properties parsed in Python; the ``slow`` rows are read whole by `check_record`. Hash codes
    of the text the last two find are computed together at the end."""

    def __init__(
        self,
        buf: Any,
        view: np.ndarray,
        limit: int,
        walk: _Walk,
        check_crc: bool,
        delay_level_ms: Sequence[int],
    ) -> None:
        self.buf = buf
        self.view = view
        self.limit = limit
        self.walk = walk
        self.check_crc = check_crc
        self.delay_level_ms = delay_level_ms
        n = len(walk.starts)
        self.n = n
        self.slow = np.zeros(n, dtype=bool)
        if walk.decoded:
            self.slow[np.isin(walk.starts, np.fromiter(walk.decoded, dtype=np.int64))] = True
        self.loose = np.zeros(n, dtype=bool)
        self.tail = np.zeros((n, 0), dtype=np.uint8)
        """Each record's last ``tail_width`` bytes: topic length, topic, properties length and
        properties of every record whose tail is that short (one gather for all)."""
        self.tail_len = np.zeros(n, dtype=np.int64)
        self.topic_len = np.zeros(n, dtype=np.int64)
        self.topics: list[str] = []
        self.topic_ids: dict[str, int] = {}
        self.prefix_hash: list[int] = []
        """Java hash of ``topic#`` per topic index, as an unsigned int."""
        self.topic_index = np.zeros(n, dtype=np.int64)
        self.tags_code = np.zeros(n, dtype=np.int64)
        self.key_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        """(record, order within the record, key hash) arrays."""

    # -------------------------------------------------------------- header

    def decode(self, file_from_offset: int) -> tuple[RecordBatch, int, DispatchRequest | None]:
        n = self.n
        starts = self.walk.starts
        if n == 0:
            return RecordBatch.empty(), self.walk.stop, self.walk.tail
        view = self.view
        if len(view) < HEAD_BYTES:  # too short for a gather: decode one by one
            view = np.concatenate((view, np.zeros(HEAD_BYTES, dtype=np.uint8)))
        cols = RecordColumns(view, starts)  # a head not wholly inside goes one by one (~ok)
        total = cols.field("TOTALSIZE")
        sys_flag = cols.sys_flag
        store_ts = cols.field("STORETIMESTAMP")
        body_len = cols.field("BODYLEN")
        body_offset = cols.offset("BODY")
        fixed = body_offset + 3  # calMsgLength with empty body, topic and properties
        ends = starts + total
        ok = cols.inside & ~self.slow & (total >= fixed) & (body_len >= 0)
        tail_len = np.where(ok, total - body_offset - body_len, 3)  # 1 + topic + 2 + properties
        ok &= tail_len >= 3
        width = min(int(tail_len[ok].max()) if ok.any() else 3, MAX_TAIL_BYTES)
        ok &= (tail_len <= width) & (ends - width >= 0)
        tail = _gather_rows(view, np.where(ok, ends - width, 0), width)
        rows = np.arange(n)
        col = np.where(ok, width - tail_len, 0)
        topic_len = tail[rows, col].astype(np.int64)
        props_len_col = np.where(ok, col + 1 + topic_len, 0)
        ok &= props_len_col + 2 <= width
        props_len_col = np.where(ok, props_len_col, 0)
        props_len = (tail[rows, props_len_col].astype(np.int64) << 8) | tail[rows, props_len_col + 1]
        ok &= props_len == tail_len - 3 - topic_len  # total == calMsgLength, PROPLEN >= 0
        if self.check_crc:
            ok &= self._crc_ok(ok, starts + body_offset, body_len, cols.raw("BODYCRC"))
            ok &= self._record_crc_ok(ok, starts, total, props_len)
        self.slow |= ~ok
        self.tail, self.tail_len, self.topic_len = tail, tail_len, topic_len
        self._topics(np.flatnonzero(ok))
        self._properties(np.flatnonzero(~self.slow))
        return self._finish(file_from_offset, cols, total, sys_flag, store_ts)

    def _crc_ok(
        self, ok: np.ndarray, body_start: np.ndarray, body_len: np.ndarray, stored: np.ndarray
    ) -> np.ndarray:
        """`checkCRCOnRecover`: zlib CRC of each body, read in place."""
        result = np.ones(self.n, dtype=bool)
        rows = np.flatnonzero(ok)
        mv = memoryview(self.buf)
        try:
            crc32 = zlib.crc32
            for row, start, length, crc in zip(
                rows.tolist(),
                body_start[rows].tolist(),
                body_len[rows].tolist(),
                stored[rows].astype(np.int64).tolist(),
                strict=True,
            ):
                if crc32(mv[start : start + length]) & 0x7FFFFFFF != crc:
                    result[row] = False
        finally:
            mv.release()
        return result

    def _record_crc_ok(
        self, ok: np.ndarray, starts: np.ndarray, total: np.ndarray, props_len: np.ndarray
    ) -> np.ndarray:
        """The whole-record CRC (`record.record_crc_problem`) of each record whose properties
        can hold one; a failing record goes to `check_record`, which names it."""
        result = np.ones(self.n, dtype=bool)
        rows = np.flatnonzero(ok & (props_len >= record.CRC32_RESERVED_LEN))
        reserved = record.CRC32_RESERVED_LEN
        mv = memoryview(self.buf)
        try:
            for row, start, size in zip(
                rows.tolist(), starts[rows].tolist(), total[rows].tolist(), strict=True
            ):
                end = start + size
                if record.record_crc_problem(mv, start, size, bytes(mv[end - reserved : end])):
                    result[row] = False
        finally:
            mv.release()
        return result

    # -------------------------------------------------------------- topics

    def _topics(self, rows: np.ndarray) -> None:
        """Topic index of each row, per distinct topic length (a 2D gather from the tails)."""
        width = self.tail.shape[1]
        lengths = self.topic_len[rows]
        for length in distinct(lengths):
            group = rows[lengths == length]
            first = group * width + width - (self.tail_len[group] - 1)
            matrix = _gather_rows(self.tail.reshape(-1), first, length)
            ids = self._topic_ids_of(matrix)
            self.topic_index[group] = ids
            self.slow[group[ids < 0]] = True

    def _topic_id(self, topic: str) -> int:
        index = self.topic_ids.get(topic)
        if index is None:
            index = self.topic_ids[topic] = len(self.topics)
            self.topics.append(topic)
            self.prefix_hash.append(m.java_string_hash(f"{topic}#") & _MASK32)
        return index

    def _topic_id_of(self, raw: bytes) -> int:
        """The topic's index, or -1 for one `check_record` must look at: empty, NUL, not UTF-8
        (it refuses those), or SCHEDULE_TOPIC_XXXX (its tags code is a delivery time)."""
        try:
            topic = raw.decode("utf-8")
        except UnicodeDecodeError:
            return -1
        if not raw or b"\0" in raw or topic == m.SCHEDULE_TOPIC:
            return -1
        return self._topic_id(topic)

    def _topic_ids_of(self, matrix: np.ndarray) -> np.ndarray:
        """Topic index of each row of topic bytes: rows equal to the first remaining one at a
        time (a batch has few topics), then one by one."""
        ids = np.full(len(matrix), -1, dtype=np.int64)
        if matrix.shape[1] == 0:
            return ids
        remaining = np.arange(len(matrix))
        for _ in range(MAX_TOPICS_PER_LENGTH):
            if not len(remaining):
                return ids
            first = int(remaining[0])
            candidates = matrix if len(remaining) == len(matrix) else matrix[remaining]
            same = np.ones(len(remaining), dtype=bool)
            same[np.flatnonzero(candidates != matrix[first]) // matrix.shape[1]] = False
            ids[remaining[same]] = self._topic_id_of(bytes(matrix[first]))
            remaining = remaining[~same]
        for row in remaining.tolist():
            ids[row] = self._topic_id_of(bytes(matrix[row]))
        return ids

    # -------------------------------------------------------------- properties

    def _properties(self, rows: np.ndarray) -> None:
        """TAGS hash and index keys of ``rows``, `string_to_properties` done on all their
        properties at once: chunks run from the start or a \\x02 to the next \\x02 or the end; a
        chunk counts when its first \\x01 leaves a non-empty name and value; the last such chunk
        of a name wins. Properties with a byte >= 0x80 (they need a UTF-8 check) go to the loose
        path, with a NUL (a torn tail looks like that) to `check_record`."""
        props_len = self.tail_len[rows] - 3 - self.topic_len[rows]
        rows, props_len = rows[props_len > 0], props_len[props_len > 0]  # none: no tags, no keys
        if not len(rows):
            return
        width = int(props_len.max())
        tails = self.tail if len(rows) == self.n else self.tail[rows]
        props = np.ascontiguousarray(tails[:, tails.shape[1] - width :])  # right-aligned
        start_col = width - props_len
        in_props = None if not start_col.any() else np.arange(width) >= start_col[:, None]
        flat = props.reshape(-1)
        # One comparison finds the separators and the odd bytes: as int8, NUL is 0 and bytes
        # >= 0x80 are negative. A row with odd bytes is set aside, its separators ignored.
        special_mask = flat.view(np.int8) <= 2
        if in_props is not None:
            special_mask &= in_props.reshape(-1)
        at = np.flatnonzero(special_mask)
        values = flat[at]
        odd_at = at[(values == 0) | (values >= 0x80)]
        if len(odd_at):
            odd = np.unique(odd_at // width)
            nul = np.unique(odd_at[flat[odd_at] == 0] // width)
            self.slow[rows[nul]] = True
            self.loose[rows[np.setdiff1d(odd, nul, assume_unique=True)]] = True
            set_aside = np.zeros(len(rows), dtype=bool)
            set_aside[odd] = True
            at = at[~set_aside[at // width] & ((values == 1) | (values == 2))]
        row = at // width
        is_two = flat[at] == 2
        # For each \x01: the chunk around it (bounded by \x02s and its row's properties).
        last_two = np.where(is_two, at, -1)
        np.maximum.accumulate(last_two, out=last_two)
        next_two = np.where(is_two, at, len(flat))[::-1]
        next_two = np.minimum.accumulate(next_two)[::-1]
        first_one = ~is_two
        first_one[1:] &= ~(~is_two[:-1] & (row[1:] == row[:-1]))  # no \x01 before it in the chunk
        sep = at[first_one]
        row = row[first_one]
        chunk_start = np.maximum(last_two[first_one] + 1, row * width + start_col[row])
        chunk_end = np.minimum(next_two[first_one], (row + 1) * width)
        valid = (sep > chunk_start) & (sep < chunk_end - 1)  # non-empty name and value
        name_len = sep - chunk_start
        prefix = np.array(self.prefix_hash or [0], dtype=np.uint32)[self.topic_index[rows]]
        for name, code in _NAME_CODES.items():
            candidates = np.flatnonzero(valid & (name_len == len(name)))
            match = candidates[_gather(flat, chunk_start[candidates], _U4 if len(name) == 4 else _U8) == code]
            if not len(match):
                continue
            last = np.ones(len(match), dtype=bool)
            last[:-1] = row[match][1:] != row[match][:-1]  # string_to_properties: the last one wins
            match = match[last]
            value_start, value_end = sep[match] + 1, chunk_end[match]
            if name == m.PROPERTY_TAGS:
                which, hashes = self._hash_values(flat, value_start, value_end, width)
                self.tags_code[rows[which]] = hashes.view(np.int32).astype(np.int64)
            elif name == m.INDEX_KEY_WHOLE:
                self._add_keys(flat, value_start, value_end, width, rows, prefix, first=True)
            else:
                spaces = np.flatnonzero(flat == _SPACE)
                spaces = spaces[_within(spaces, value_start, value_end)]
                # Words: between a value's start, its spaces and its end; empty ones skipped.
                marks = np.concatenate([value_start - 1, spaces, value_end])
                marks.sort()
                word_start, word_end = marks[:-1] + 1, marks[1:]
                real = (word_end > word_start) & _within(word_start, value_start, value_end)
                self._add_keys(flat, word_start[real], word_end[real], width, rows, prefix, first=False)

    def _hash_values(
        self, flat: np.ndarray, start: np.ndarray, end: np.ndarray, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(row, Java hash as uint32) of each text ``flat[start:end]``, per distinct length."""
        length = end - start
        row = start // width
        hashes = np.zeros(len(start), dtype=np.uint32)
        for size in distinct(length):
            pick = np.flatnonzero(length == size)
            hashes[pick] = java_hash_rows(_gather_rows(flat, start[pick], size))
        return row, hashes

    def _add_keys(
        self,
        flat: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        width: int,
        rows: np.ndarray,
        prefix: np.ndarray,
        *,
        first: bool,
    ) -> None:
        """Index keys ``topic#text`` for texts ``flat[start:end]`` (ASCII: one unit a byte)."""
        length = end - start
        row, hashes = self._hash_values(flat, start, end, width)
        for size in distinct(length):
            pick = np.flatnonzero(length == size)
            hashes_full = index_hash(prefix[row[pick]], size, hashes[pick])
            order = np.zeros(len(pick), dtype=np.int64) if first else 1 + start[pick] % width
            self.key_parts.append((rows[row[pick]], order, hashes_full))

    def _loose(self, row: int) -> tuple[str, dict[str, str]] | None:
        """Topic and properties of a loose row, None if `check_record` must read it."""
        width = self.tail.shape[1]
        start = width - int(self.tail_len[row]) + 1
        topic_end = start + int(self.topic_len[row])
        topic_id = self._topic_id_of(bytes(self.tail[row, start:topic_end]))
        raw = bytes(self.tail[row, topic_end + 2 :])
        if topic_id < 0 or b"\0" in raw:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        self.topic_index[row] = topic_id
        return self.topics[topic_id], m.string_to_properties(text)

    # -------------------------------------------------------------- assembly

    def _finish(
        self,
        file_from_offset: int,
        cols: RecordColumns,
        total: np.ndarray,
        sys_flag: np.ndarray,
        store_ts: np.ndarray,
    ) -> tuple[RecordBatch, int, DispatchRequest | None]:
        """Read the loose and slow rows in order, stopping at the first invalid record."""
        starts = self.walk.starts
        queue_id = cols.field("QUEUEID")
        queue_offset = cols.field("QUEUEOFFSET")
        ends_in_nul = np.zeros(self.n, dtype=bool)
        cut = self.n
        tail = self.walk.tail
        stop = self.walk.stop
        key_rows: list[int] = []
        key_order: list[int] = []
        key_texts: list[str] = []
        tag_rows: list[int] = []
        tag_texts: list[str] = []
        for row in np.flatnonzero(self.slow | self.loose).tolist():
            found = None if self.slow[row] else self._loose(row)
            if found is not None:
                topic, properties = found
                tags = properties.get(m.PROPERTY_TAGS)
                if tags:
                    tag_rows.append(row)
                    tag_texts.append(tags)
                keys = m.index_keys(
                    topic,
                    properties.get(m.INDEX_KEY_WHOLE),
                    properties.get(m.INDEX_KEY_WORDS),
                )
            else:
                pos = int(starts[row])
                req = self.walk.decoded.get(pos) or record.check_record(
                    self.buf, pos, self.limit, check_crc=self.check_crc, delay_level_ms=self.delay_level_ms
                )
                if not (req.success and req.size > 0):
                    cut, tail, stop = row, req, pos
                    break
                total[row] = req.size  # the head of a record near the buffer's end was not read
                sys_flag[row] = req.sys_flag
                store_ts[row] = req.store_timestamp
                queue_id[row] = req.queue_id
                queue_offset[row] = req.queue_offset
                self.tags_code[row] = req.tags_code
                self.topic_index[row] = self._topic_id(req.topic)
                ends_in_nul[row] = req.ends_in_nul
                keys = m.index_keys(req.topic, req.uniq_key, req.keys)
            key_rows.extend([row] * len(keys))
            key_order.extend(range(len(keys)))
            key_texts.extend(keys)
        if tag_rows:
            self.tags_code[tag_rows] = java_hash_strings(tag_texts).view(np.int32).astype(np.int64)
        if key_rows:
            self.key_parts.append(
                (
                    np.array(key_rows, dtype=np.int64),
                    np.array(key_order, dtype=np.int64),
                    index_hash_strings(key_texts),
                )
            )
        key_record, key_hash = self._keys(cut)
        batch = RecordBatch(
            topics=self.topics,
            topic_index=self.topic_index[:cut],
            phy_offset=starts[:cut] + file_from_offset,
            size=total[:cut],
            queue_id=queue_id[:cut],
            queue_offset=queue_offset[:cut],
            sys_flag=sys_flag[:cut],
            store_timestamp=store_ts[:cut],
            tags_code=self.tags_code[:cut],
            ends_in_nul=ends_in_nul[:cut],
            key_record=key_record,
            key_hash=key_hash,
        )
        return batch, stop, tail

    def _keys(self, cut: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.key_parts:
            z = np.zeros(0, dtype=np.int64)
            return z, z
        rec = np.concatenate([p[0] for p in self.key_parts])
        order_in_record = np.concatenate([p[1] for p in self.key_parts])
        hashes = np.concatenate([p[2] for p in self.key_parts])
        keep = rec < cut
        rec, order_in_record, hashes = rec[keep], order_in_record[keep], hashes[keep]
        order = np.lexsort((order_in_record, rec))
        return rec[order], hashes[order]


def _within(positions: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """bool: each position lies in one of the sorted, disjoint ranges ``[starts, ends)``."""
    owner = np.searchsorted(starts, positions, side="right") - 1
    return (owner >= 0) & (positions < ends[np.maximum(owner, 0)])
