"""The `rmq` PySpark data source: batch and Structured Streaming reads of ConsumeQueues.

Mirrors Spark's Kafka source (options, offsets JSON, `failOnDataLoss`, `maxRecordsPerTrigger`)
on RocketMQ's read path (`getMessage`: ConsumeQueue entry → CommitLog record). Partitions are
(store, topic, queue, offset range), narrowed by the options only: Spark applies every filter
itself (no pushdown: see `RmqBatchReader`). `read()` yields Arrow batches (columns.py).
A row is served only if its record passes a pull's checks (body CRC, a whole record, the one its
entry promises: `columns.servable_rows`); another is skipped and reported as a pull skips it
(rmq_mp/store/read_damage.py: logged by the Spark worker, counted in a running store's
``read_skipped_records``), and the read goes on.

Offsets in a stream checkpoint: ``{"<store root>": {"<topic>": {"<queueId>": next_offset}}}``
(queue ids as strings: offsets round-trip through JSON). Option names are case-insensitive
(`self.options` lower-cases them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from rmq_mp.errors import ConfigError, CorruptRecordError, DataLossError
from rmq_mp.spark.columns import SCHEMA_DDL, decode_batch, servable_rows
from rmq_mp.spark.store_files import (
    QueueRange,
    SegmentReader,
    StoreRef,
    first_offset_at_or_after,
    queue_ranges,
    read_cq_entries,
    resolve_store,
    valid_entries,
)
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.read_damage import ReadSkips, gathered_problem, running_store_counter
from rmq_mp.store.reporter import Reporter
from rmq_mp.validators import check_option_names, topic_problem

EARLIEST = -2
LATEST = -1
BATCH_ROWS = 65536
BATCH_BYTES = 32 << 20
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------------------------- options

SOURCE_OPTIONS = ("store", "path", "conf", "topic", "topics", "startingOffsets", "endingOffsets",
                  "startingTimestamp", "maxRecordsPerPartition", "maxRecordsPerTrigger",
                  "includeProperties", "failOnDataLoss")  # fmt: skip


@dataclass(frozen=True)
class ReadOptions:
    """The source's options, parsed and checked once on the driver side."""

    stores: tuple[StoreRef, ...]
    topics: frozenset[str] | None
    starting: str | dict[str, dict[int, int]]
    ending: str | dict[str, dict[int, int]]
    starting_timestamp_ms: int | None
    max_records_per_partition: int
    max_records_per_trigger: int | None
    include_properties: bool
    fail_on_data_loss: bool

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        check_option_names("rmq source", options, SOURCE_OPTIONS)
        opts = {k.lower(): v for k, v in options.items()}
        spec = opts.get("store") or opts.get("path")
        if not spec:
            raise ConfigError("rmq source: option 'store' (a store directory or shm name) is required")
        stores = tuple(resolve_store(s, opts.get("conf")) for s in spec.split(",") if s.strip())
        if len({s.root for s in stores}) != len(stores):
            raise ConfigError(f"rmq source: option 'store' names the same store twice: {spec!r}")
        topics = _topics_option(opts)
        return cls(
            stores=stores,
            topics=topics,
            starting=_offsets_option(opts, "startingoffsets", "latest" if streaming else "earliest"),
            ending=_offsets_option(opts, "endingoffsets", "latest"),
            starting_timestamp_ms=_int_option(opts, "startingtimestamp", None, minimum=0),
            max_records_per_partition=_int_option(
                opts, "maxrecordsperpartition", DEFAULT_MAX_RECORDS_PER_PARTITION, minimum=1
            )
            or DEFAULT_MAX_RECORDS_PER_PARTITION,
            max_records_per_trigger=_int_option(opts, "maxrecordspertrigger", None, minimum=1),
            include_properties=_bool_option(opts, "includeproperties", True),
            fail_on_data_loss=_bool_option(opts, "failondataloss", True),
        )


def _topics_option(opts: dict[str, str]) -> frozenset[str] | None:
    """``topics`` (or ``topic``): comma-separated names, each one the store can hold (the rules
    every put and `rmq-admin` apply); None when the option is absent (every topic). An empty
    option or a bad name is a ConfigError: it would silently read everything or nothing."""
    key = "topics" if "topics" in opts else "topic" if "topic" in opts else None
    if key is None:
        return None
    names = [t.strip() for t in opts[key].split(",")]
    if not any(names):
        raise ConfigError(f"rmq source: option {key} is empty: leave it out to read every topic")
    for name in names:
        if problem := topic_problem(name):
            raise ConfigError(f"rmq source: option {key}: {problem}")
    return frozenset(names)


def _int_option(opts: dict[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"rmq source: option {name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ConfigError(f"rmq source: option {name} must be >= {minimum}, got {value}")
    return value


def _bool_option(opts: dict[str, str], name: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(f"rmq source: option {name} must be true or false, got {text!r}")
    return text.strip().lower() == "true"


def _offsets_option(opts: dict[str, str], name: str, default: str) -> str | dict[str, dict[int, int]]:
    """``earliest``, ``latest`` or Kafka-style ``{"topic": {"queueId": offset}}`` (-2 earliest,
    -1 latest)."""
    text = opts.get(name, default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        raw = json.loads(text)
        parsed = {str(topic): {int(q): int(o) for q, o in queues.items()} for topic, queues in raw.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f'rmq source: option {name} must be earliest, latest or {{"topic": {{"queueId": offset}}}}, '
            f"got {text!r}"
        ) from exc
    for topic, queues in parsed.items():
        for queue_id, offset in queues.items():
            if queue_id < 0 or offset < EARLIEST:
                raise ConfigError(f"rmq source: option {name}: bad entry {topic}/{queue_id} = {offset}")
    return parsed


def _resolve(option: str | dict[str, dict[int, int]], q: QueueRange, *, absent: int) -> int:
    """The queue offset an offsets option names for one queue."""
    if option == "earliest":
        return q.min_offset
    if option == "latest":
        return q.max_offset
    assert isinstance(option, dict)
    value = option.get(q.topic, {}).get(q.queue_id, absent)
    return q.min_offset if value == EARLIEST else q.max_offset if value == LATEST else value


# ------------------------------------------------------------------------------------- partitions


@dataclass
class QueueSlice(InputPartition):
    """Queue offsets ``[start, end)`` of one queue of one store."""

    store: StoreRef
    topic: str
    queue_id: int
    start: int
    end: int


def _split(store: StoreRef, topic: str, queue_id: int, start: int, end: int, size: int) -> list[QueueSlice]:
    return [QueueSlice(store, topic, queue_id, s, min(end, s + size)) for s in range(start, end, size)]


def plan_batch(opts: ReadOptions) -> list[QueueSlice]:
    """Partitions of a batch read: every queue of the chosen topics, offsets narrowed by the
    options only (a start time by binary search on the queue)."""
    slices: list[QueueSlice] = []
    for store in opts.stores:
        for q in queue_ranges(store, opts.topics):
            start = _resolve(opts.starting, q, absent=q.min_offset)
            end = _resolve(opts.ending, q, absent=q.max_offset)
            if start < q.min_offset:
                if opts.fail_on_data_loss:
                    raise DataLossError(
                        f"{store.root} {q.topic}/{q.queue_id}: starting offset {start} is below the queue's "
                        f"minimum {q.min_offset} (deleted); set failOnDataLoss=false to skip"
                    )
                start = q.min_offset
            end = min(end, q.max_offset)
            if opts.starting_timestamp_ms is not None and start < end:
                start = first_offset_at_or_after(store, q, start, end, opts.starting_timestamp_ms)
            slices.extend(_split(store, q.topic, q.queue_id, start, end, opts.max_records_per_partition))
    return slices


# ------------------------------------------------------------------------------------- reading


def read_slice(
    part: QueueSlice, *, include_properties: bool, fail_on_data_loss: bool = True
) -> Iterator[pa.RecordBatch]:
    """The rows of one partition as Arrow batches of at most BATCH_ROWS rows / ~BATCH_BYTES."""
    reader = SegmentReader(part.store)
    file_size = part.store.commit_log_file_size
    skips = ReadSkips(
        REPORTER, publish=running_store_counter(part.store.shm_base) if part.store.shm_base else None
    )
    try:
        offset = part.start
        while offset < part.end:
            upto = min(part.end, offset + BATCH_ROWS)
            try:
                entries = read_cq_entries(part.store, part.topic, part.queue_id, offset, upto)
            except DataLossError:
                if fail_on_data_loss:
                    raise
                offset = upto
                continue
            queue_offsets = np.arange(offset, upto, dtype=np.int64)
            keep = valid_entries(entries)
            phy = entries["phy"].astype(np.int64)
            size = entries["size"].astype(np.int64)
            phy, size, queue_offsets = phy[keep], size[keep], queue_offsets[keep]
            # Cut the batch by bytes too, so huge bodies never build a giant buffer.
            if len(size) and int(size.sum()) > BATCH_BYTES:
                cut = max(1, int(np.searchsorted(np.cumsum(size), BATCH_BYTES)))
                upto = int(queue_offsets[cut - 1]) + 1
                phy, size = phy[:cut], size[:cut]
            offset = upto
            if not len(phy):
                continue
            inside = (phy >= 0) & (size > 0) & (phy % file_size + size <= file_size)
            if not inside.all():  # no record crosses a segment's end: nothing to gather
                for i in np.flatnonzero(~inside).tolist():
                    problem = CorruptRecordError(
                        f"it points outside one commit-log segment of {file_size} bytes"
                    )
                    _skip(skips, part, int(queue_offsets[i]), int(phy[i]), int(size[i]), problem)
                phy, size, queue_offsets = phy[inside], size[inside], queue_offsets[inside]
                if not len(phy):
                    continue
            try:
                buf, starts = reader.gather(phy, size)
            except DataLossError:
                if fail_on_data_loss:
                    raise
                continue
            batch = _decode_served(buf, starts, phy, size, queue_offsets, part, skips, include_properties)
            if batch.num_rows:
                yield batch
    finally:
        reader.close()


REPORTER = Reporter()
"""This process's findings of the source (a Spark worker logs them to its stderr)."""


def _decode_served(
    buf: np.ndarray,
    starts: np.ndarray,
    phy: np.ndarray,
    size: np.ndarray,
    queue_offsets: np.ndarray,
    part: QueueSlice,
    skips: ReadSkips,
    include_properties: bool,
) -> pa.RecordBatch:
    """`decode_batch` of the gathered records that may be served (`servable_rows`); the others
    are skipped and reported with the reason a pull gives (`gathered_problem`), as a pull skips
    them. Properties that are not UTF-8, which the column check does not look for, make
    `decode_batch` raise: then the rows are checked one by one and it decodes the good ones."""
    view = memoryview(buf.data)

    def skip_bad(rows: list[int], *, rejected: bool) -> None:
        for i in rows:
            problem = gathered_problem(
                view, int(starts[i]), phy_offset=int(phy[i]), size=int(size[i]), topic=part.topic,
                queue_id=part.queue_id, queue_offset=int(queue_offsets[i]),
            )  # fmt: skip
            if problem is None and rejected:
                problem = CorruptRecordError("it fails the column-wise record check")
            if problem is not None:
                good[i] = False
                _skip(skips, part, int(queue_offsets[i]), int(phy[i]), int(size[i]), problem)

    good = servable_rows(
        buf, starts, phy=phy, size=size, topic=part.topic, queue_id=part.queue_id, queue_offsets=queue_offsets
    )
    skip_bad(np.flatnonzero(~good).tolist(), rejected=True)

    def decode() -> pa.RecordBatch:
        return decode_batch(
            buf, starts[good], broker=part.store.broker, expected_phy=phy[good], expected_size=size[good],
            include_properties=include_properties,
        )  # fmt: skip

    try:
        return decode()
    except CorruptRecordError:
        skip_bad(np.flatnonzero(good).tolist(), rejected=False)
        return decode()


def _skip(
    skips: ReadSkips, part: QueueSlice, queue_offset: int, phy: int, size: int, problem: CorruptRecordError
) -> None:
    file_size = part.store.commit_log_file_size
    log_path = Path(part.store.commit_log_dir) / offset_to_file_name(phy - phy % file_size)
    skips.bad_entry(
        log_path,
        part.store.cq_dir(part.topic, part.queue_id),
        part.store.cq_file_size,
        queue_offset,
        (phy, size),
        problem,
    )


# ------------------------------------------------------------------------------------- batch


class RmqBatchReader(DataSourceReader):
    """No `pushFilters`: PySpark 4.3 keeps the read plan of the last query that pushed a filter
    on the DataFrame's source (`PythonDataSourceV2.readInfo`) and reuses it for a later query
    on that DataFrame that pushes none, so pushed filters would leak into it (issue 19). Spark
    applies every `where` itself; narrow a read with the offsets and topics options. The same
    cache makes a DataFrame read the queue ends its first query planned, whatever it filters."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[QueueSlice]:
        return plan_batch(self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):  # Spark's stand-in when partitions() is empty
            return iter(())
        return read_slice(partition, include_properties=self.opts.include_properties)


# ------------------------------------------------------------------------------------- streaming

StreamOffset = dict[str, dict[str, dict[str, int]]]


def _offset_of(ranges: Mapping[str, list[QueueRange]], pick: Any) -> StreamOffset:
    return {
        root: _nest((q.topic, q.queue_id, pick(root, q)) for q in queues) for root, queues in ranges.items()
    }


def _nest(items: Iterable[tuple[str, int, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for topic, queue_id, offset in items:
        out.setdefault(topic, {})[str(queue_id)] = offset
    return out


class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of per-queue offset ranges. New queues are read from their minimum offset;
    an offset the cleaner has deleted is `DataLossError`, or skipped with failOnDataLoss=false."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._initial: StreamOffset | None = None
        self._target: StreamOffset | None = None

    def _ranges(self) -> dict[str, list[QueueRange]]:
        return {store.root: queue_ranges(store, self.opts.topics) for store in self.opts.stores}

    def initialOffset(self) -> StreamOffset:
        if self._initial is None:
            start = self.opts.starting
            ts = self.opts.starting_timestamp_ms
            stores = {s.root: s for s in self.opts.stores}

            def pick(root: str, q: QueueRange) -> int:
                offset = _resolve(start, q, absent=q.min_offset)
                if ts is not None:
                    offset = first_offset_at_or_after(
                        stores[root], q, max(offset, q.min_offset), q.max_offset, ts
                    )
                return offset

            self._initial = _offset_of(self._ranges(), pick)
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _offset_of(self._ranges(), lambda _root, q: q.max_offset)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:
        latest = self._target or _offset_of(self._ranges(), lambda _root, q: q.max_offset)
        if not isinstance(limit, ReadMaxRows):
            return _union(start, latest)
        budget = limit.max_rows
        wanted = {
            (root, topic, qid): max(0, end - start.get(root, {}).get(topic, {}).get(qid, 0))
            for root, topics in latest.items()
            for topic, queues in topics.items()
            for qid, end in queues.items()
        }
        total = sum(wanted.values())
        grant = {k: (v * budget // total if total else 0) for k, v in wanted.items()}
        left = min(budget, total) - sum(grant.values())
        for k in sorted(wanted):  # hand the rounding remainder out in a stable order
            extra = min(left, wanted[k] - grant[k])
            grant[k] += extra
            left -= extra
        capped = {
            root: {
                topic: {
                    qid: start.get(root, {}).get(topic, {}).get(qid, 0) + grant[(root, topic, qid)]
                    for qid in queues
                }
                for topic, queues in topics.items()
            }
            for root, topics in latest.items()
        }
        return _union(start, capped)

    def partitions(self, start: StreamOffset, end: StreamOffset) -> list[QueueSlice]:
        stores = {s.root: s for s in self.opts.stores}
        current = {root: {(q.topic, q.queue_id): q for q in qs} for root, qs in self._ranges().items()}
        slices: list[QueueSlice] = []
        for root, topics in end.items():
            store = stores.get(root)
            if store is None:
                raise ConfigError(
                    f"rmq source: the checkpoint names store {root}, which the query no longer reads"
                )
            for topic, queues in topics.items():
                for qid_text, end_offset in queues.items():
                    queue_id = int(qid_text)
                    q = current[root].get((topic, queue_id))
                    min_offset = q.min_offset if q else 0
                    begin = start.get(root, {}).get(topic, {}).get(qid_text)
                    if begin is None:
                        begin = min_offset  # a queue that appeared after the query started
                    if begin < min_offset:
                        if self.opts.fail_on_data_loss:
                            raise DataLossError(
                                f"{root} {topic}/{queue_id}: offsets [{begin}, {min_offset}) were deleted before "
                                "they were read; set failOnDataLoss=false to skip them"
                            )
                        begin = min_offset
                    slices.extend(
                        _split(store, topic, queue_id, begin, end_offset, self.opts.max_records_per_partition)
                    )
        return slices

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):
            return iter(())
        return read_slice(
            partition,
            include_properties=self.opts.include_properties,
            fail_on_data_loss=self.opts.fail_on_data_loss,
        )

    def commit(self, end: StreamOffset) -> None:
        """Nothing to do: the query's checkpoint holds the offsets (commit runs a batch late)."""


def _union(start: StreamOffset, end: StreamOffset) -> StreamOffset:
    """``end``, keeping queues only ``start`` knows and never moving a queue backwards."""
    out: StreamOffset = json.loads(json.dumps(start))
    for root, topics in end.items():
        for topic, queues in topics.items():
            for qid, offset in queues.items():
                queues_out = out.setdefault(root, {}).setdefault(topic, {})
                queues_out[qid] = max(offset, queues_out.get(qid, 0))
    return out


# ------------------------------------------------------------------------------------- source


class RmqDataSource(DataSource):
    """``spark.read.format("rmq")``, ``spark.readStream.format("rmq")``, ``df.write.format("rmq")``."""

    @classmethod
    def name(cls) -> str:
        return "rmq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return RmqBatchReader(ReadOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RmqStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from rmq_mp.spark.sink import RmqWriter, SinkOptions

        return RmqWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from rmq_mp.spark.sink import RmqStreamWriter, SinkOptions

        return RmqStreamWriter(SinkOptions.parse(self.options, schema))


def ms_to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)
