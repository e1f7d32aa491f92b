"""The `rmq` PySpark data source: batch and Structured Streaming reads of ConsumeQueues.

Mirrors Spark's Kafka source (options, offsets JSON, `failOnDataLoss`, `maxRecordsPerTrigger`)
on RocketMQ's read path (`getMessage`: ConsumeQueue entry → CommitLog record). Partitions are
(store, topic, queue, offset range), narrowed by the options only: Spark applies every filter
itself (no pushdown: see `RmqBatchReader`). `read()` yields Arrow batches (columns.py).
A row is served only if its record passes a pull's checks (body CRC, a whole record, the one its
entry promises: `columns.servable_rows`); another is skipped and reported as a pull skips it
(rmq_mp/store/read_damage.py: logged by the Spark worker, counted in a running store's
``read_skipped_records``), and the read goes on.

Offsets in a stream checkpoint: ``{"store0": {"<topic>": {"<queueId>": next_offset}}}``, a store
named by its place in the ``store`` option (``store0``, ``store1``, ...), never by its path, so
a store moved to another directory (or read by its shm name instead) goes on from its checkpoint;
a checkpoint of the older shape, keyed by the store's absolute path, is read too. Queue ids are
strings (offsets round-trip through JSON). Option names are case-insensitive (`self.options`
lower-cases them).

Progress: `reportLatestOffset` gives each query's ``latestOffset`` (the queues' dispatched ends);
PySpark 4.3 has no hook for a Python source's custom metrics (its `PythonMicroBatchStream` does
not implement `ReportsSourceMetrics`), so Kafka's ``avgOffsetsBehindLatest`` and
``maxOffsetsBehindLatest`` come from `offsets_behind` over a progress's ``endOffset`` and
``latestOffset``.

A ``tags`` option (RocketMQ's subscription expression, ``TagA || TagB``) is pushed into the read:
ConsumeQueue entries whose tags code (the tag's Java hash, as the broker's filter compares) is
not among the wanted ones are dropped before their records are read, and the rows read are then
matched on the tag itself (two tags may share a code), as RocketMQ's client does.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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

from rmq_mp.errors import ConfigError, CorruptRecordError, DataLossError, StoreError
from rmq_mp.format.message import tags_code
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

SOURCE_OPTIONS = ("store", "path", "conf", "topic", "topics", "topicPattern", "startingOffsets",
                  "endingOffsets", "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp",
                  "endingOffsetsByTimestamp", "maxRecordsPerPartition", "maxRecordsPerTrigger",
                  "minOffsetsPerTrigger", "maxTriggerDelay", "consumerGroup", "commitToGroup", "tags",
                  "includeProperties", "failOnDataLoss")  # fmt: skip
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
"""Kafka's ``maxTriggerDelay`` default (15m)."""


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
    topic_pattern: re.Pattern[str] | None = None
    """``topicPattern``: a regular expression every topic read matches whole (Kafka's
    ``subscribePattern``); topics created later are picked up by a stream."""
    ending_timestamp_ms: int | None = None
    starting_by_timestamp: dict[str, dict[int, int]] | None = None
    ending_by_timestamp: dict[str, dict[int, int]] | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    consumer_group: str | None = None
    """Queues this group committed start at its offsets (the others as ``startingOffsets``)."""
    commit_to_group: bool = False
    """A stream commits each finished batch's end offsets to ``consumer_group``."""
    tags: frozenset[str] | None = None

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
        pattern = _pattern_option(opts)
        if pattern is not None and topics is not None:
            raise ConfigError("rmq source: give topic/topics or topicPattern, not both")
        if streaming:
            for name in ("endingtimestamp", "endingoffsetsbytimestamp"):
                if name in opts:
                    raise ConfigError(f"rmq source: option {name} is for batch reads (a stream has no end)")
        group = opts.get("consumergroup")
        if group is not None:
            from rmq_mp import validators

            try:
                validators.check_group(group)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"rmq source: option consumerGroup: {exc}") from None
        commit = _bool_option(opts, "committogroup", group is not None)
        if commit and group is None:
            raise ConfigError("rmq source: option commitToGroup needs consumerGroup")
        tags = None
        if "tags" in opts:
            from rmq_mp.client.consumer import parse_tag_expression

            tags = parse_tag_expression(opts["tags"])
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
            topic_pattern=pattern,
            ending_timestamp_ms=_int_option(opts, "endingtimestamp", None, minimum=0),
            starting_by_timestamp=_timestamps_option(opts, "startingoffsetsbytimestamp"),
            ending_by_timestamp=_timestamps_option(opts, "endingoffsetsbytimestamp"),
            min_offsets_per_trigger=_int_option(opts, "minoffsetspertrigger", None, minimum=1),
            max_trigger_delay_ms=_duration_ms_option(opts, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
            consumer_group=group,
            commit_to_group=commit,
            tags=tags,
        )

    def queues(self, store: StoreRef) -> list[QueueRange]:
        """The store's queues this read covers (``topics`` or ``topicPattern``), sorted."""
        found = queue_ranges(store, self.topics)
        if self.topic_pattern is None:
            return found
        return [q for q in found if self.topic_pattern.fullmatch(q.topic)]


def _pattern_option(opts: dict[str, str]) -> re.Pattern[str] | None:
    text = opts.get("topicpattern")
    if text is None:
        return None
    if not text.strip():
        raise ConfigError("rmq source: option topicPattern is empty: leave it out to read every topic")
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(
            f"rmq source: option topicPattern {text!r} is not a regular expression: {exc}"
        ) from None


def _timestamps_option(opts: dict[str, str], name: str) -> dict[str, dict[int, int]] | None:
    """Kafka's ``{"topic": {"queueId": timestamp_ms}}``."""
    text = opts.get(name)
    if text is None:
        return None
    try:
        raw = json.loads(text)
        parsed = {str(t): {int(q): int(ms) for q, ms in queues.items()} for t, queues in raw.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f'rmq source: option {name} must be {{"topic": {{"queueId": timestamp_ms}}}}, got {text!r}'
        ) from exc
    for topic, queues in parsed.items():
        for queue_id, ms in queues.items():
            if queue_id < 0 or ms < 0:
                raise ConfigError(f"rmq source: option {name}: bad entry {topic}/{queue_id} = {ms}")
    return parsed


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms_option(opts: dict[str, str], name: str, default: int) -> int:
    """A duration as Spark writes one (``15m``, ``30s``, ``500ms``; a bare number is ms)."""
    text = opts.get(name)
    if text is None:
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    unit = match.group(2) if match else None
    if match is None or (unit and unit not in _DURATION_UNITS_MS):
        raise ConfigError(
            f"rmq source: option {name} must be a duration such as 15m, 30s or 500ms, got {text!r}"
        )
    return int(match.group(1)) * _DURATION_UNITS_MS[unit or "ms"]


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


def _timestamp_for(
    q: QueueRange, everywhere_ms: int | None, by_queue: dict[str, dict[int, int]] | None
) -> int | None:
    """Kafka's precedence: the one timestamp for every queue, else the queue's own, else none."""
    if everywhere_ms is not None:
        return everywhere_ms
    if by_queue is not None:
        return by_queue.get(q.topic, {}).get(q.queue_id)
    return None


def plan_batch(opts: ReadOptions) -> list[QueueSlice]:
    """Partitions of a batch read: every queue of the chosen topics, offsets narrowed by the
    options only (a start or end time by binary search on the queue: the first offset stored
    at or after it; an end is exclusive, as Kafka's)."""
    slices: list[QueueSlice] = []
    for store in opts.stores:
        committed = group_offsets(store, opts.consumer_group) if opts.consumer_group else {}
        for q in opts.queues(store):
            start = committed.get((q.topic, q.queue_id), _resolve(opts.starting, q, absent=q.min_offset))
            end = _resolve(opts.ending, q, absent=q.max_offset)
            end_ms = _timestamp_for(q, opts.ending_timestamp_ms, opts.ending_by_timestamp)
            if end_ms is not None:
                end = first_offset_at_or_after(store, q, q.min_offset, q.max_offset, end_ms)
            if start < q.min_offset:
                if opts.fail_on_data_loss:
                    raise DataLossError(
                        f"{store.root} {q.topic}/{q.queue_id}: starting offset {start} is below the queue's "
                        f"minimum {q.min_offset} (deleted); set failOnDataLoss=false to skip"
                    )
                start = q.min_offset
            end = min(end, q.max_offset)
            start_ms = _timestamp_for(q, opts.starting_timestamp_ms, opts.starting_by_timestamp)
            if start_ms is not None and start < end:
                start = first_offset_at_or_after(store, q, start, end, start_ms)
            slices.extend(_split(store, q.topic, q.queue_id, start, end, opts.max_records_per_partition))
    return slices


# ------------------------------------------------------------------------------------- reading


def read_slice(
    part: QueueSlice,
    *,
    include_properties: bool,
    fail_on_data_loss: bool = True,
    tags: frozenset[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of one partition as Arrow batches of at most BATCH_ROWS rows / ~BATCH_BYTES;
    with ``tags``, only the rows with one of them (entries filtered on their tags code first)."""
    codes = None if tags is None else np.array(sorted({tags_code(t) for t in tags}), dtype=np.int64)
    wanted = None if tags is None else pa.array(sorted(tags), type=pa.string())
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
            if codes is not None:  # the broker's filter: the tags code, no record read
                keep &= np.isin(entries["tags"].astype(np.int64), codes)
            phy = entries["phy"].astype(np.int64)
            size = entries["size"].astype(np.int64)
            phy, size, queue_offsets = phy[keep], size[keep], queue_offsets[keep]
            # Cut the batch by bytes too, so huge bodies never build a giant buffer.
            if len(size) and int(size.sum()) > BATCH_BYTES:
                cut = max(1, int(np.searchsorted(np.cumsum(size), BATCH_BYTES)))
                upto = int(queue_offsets[cut - 1]) + 1
                phy, size, queue_offsets = phy[:cut], size[:cut], queue_offsets[:cut]
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
            if wanted is not None and batch.num_rows:  # two tags may share a code: match the text
                batch = batch.filter(pc.fill_null(pc.is_in(batch.column("tags"), value_set=wanted), False))
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
    applies every `where` itself; narrow a read with the offsets, topics and tags options. The same
    cache makes a DataFrame read the queue ends its first query planned, whatever it filters."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[QueueSlice]:
        return plan_batch(self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):  # Spark's stand-in when partitions() is empty
            return iter(())
        return read_slice(partition, include_properties=self.opts.include_properties, tags=self.opts.tags)


# ------------------------------------------------------------------------------------- streaming

StreamOffset = dict[str, dict[str, dict[str, int]]]


def store_label(index: int) -> str:
    """A store's name in a stream's offsets: its place in the ``store`` option, not its path."""
    return f"store{index}"


def _offset_of(ranges: Mapping[str, list[QueueRange]], pick: Any) -> StreamOffset:
    return {
        label: _nest((q.topic, q.queue_id, pick(label, q)) for q in queues)
        for label, queues in ranges.items()
    }


def _nest(items: Iterable[tuple[str, int, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for topic, queue_id, offset in items:
        out.setdefault(topic, {})[str(queue_id)] = offset
    return out


def offsets_behind(progress: Mapping[str, Any]) -> dict[str, int]:
    """Kafka's ``minOffsetsBehindLatest``, ``avgOffsetsBehindLatest`` and ``maxOffsetsBehindLatest``
    of an `rmq` source's progress (a ``query.lastProgress["sources"][i]`` dict, or the whole
    ``lastProgress`` of a query with one source): per queue, its latest offset less the offset the
    query has read to. PySpark 4.3 lets a Python source report ``latestOffset`` but no metrics."""
    if "sources" in progress:
        (progress,) = progress["sources"]

    def parsed(key: str) -> StreamOffset:
        value = progress.get(key)
        if value is None:
            raise ValueError(f"the progress has no {key} (a query before its first batch)")
        return json.loads(value) if isinstance(value, str) else dict(value)

    latest, read_to = parsed("latestOffset"), parsed("endOffset")
    behind = [
        max(0, offset - read_to.get(label, {}).get(topic, {}).get(qid, 0))
        for label, topics in latest.items()
        for topic, queues in topics.items()
        for qid, offset in queues.items()
    ]
    if not behind:
        return {"minOffsetsBehindLatest": 0, "avgOffsetsBehindLatest": 0, "maxOffsetsBehindLatest": 0}
    return {
        "minOffsetsBehindLatest": min(behind),
        "avgOffsetsBehindLatest": sum(behind) // len(behind),
        "maxOffsetsBehindLatest": max(behind),
    }


class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of per-queue offset ranges. New queues are read from their minimum offset;
    an offset the cleaner has deleted is `DataLossError`, or skipped with failOnDataLoss=false.

    ``minOffsetsPerTrigger`` holds a trigger back (its end is its start: no batch) until that
    many offsets wait in all, or ``maxTriggerDelay`` has passed since the last batch, as Kafka's
    source; an availableNow run reads everything regardless."""

    def __init__(self, opts: ReadOptions, clock_ms: Any = None) -> None:
        self.opts = opts
        self._initial: StreamOffset | None = None
        self._target: StreamOffset | None = None
        self._latest: StreamOffset | None = None
        self._clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self._last_batch_ms: int | None = None
        self._committed: StreamOffset | None = None
        self._stores = {store_label(i): s for i, s in enumerate(opts.stores)}

    def _ranges(self) -> dict[str, list[QueueRange]]:
        return {label: self.opts.queues(store) for label, store in self._stores.items()}

    def _rekeyed(self, offset: StreamOffset) -> StreamOffset:
        """``offset`` with every store named by its label: a checkpoint written before stores
        were labelled names them by absolute path (one store alone is taken as the query's one)."""
        if all(key in self._stores for key in offset):
            return offset
        by_root = {s.root: label for label, s in self._stores.items()}
        out: StreamOffset = {}
        for key, topics in offset.items():
            label = key if key in self._stores else by_root.get(key)
            if label is None and len(offset) == 1 and len(self._stores) == 1:
                label = store_label(0)  # the one store of an older checkpoint, moved since
            if label is None:
                raise ConfigError(
                    f"rmq source: the checkpoint names store {key}, which the query no longer reads"
                )
            out[label] = topics
        return out

    def initialOffset(self) -> StreamOffset:
        if self._initial is None:
            start = self.opts.starting
            groups = {
                label: group_offsets(store, self.opts.consumer_group) if self.opts.consumer_group else {}
                for label, store in self._stores.items()
            }

            def pick(label: str, q: QueueRange) -> int:
                committed = groups[label].get((q.topic, q.queue_id))
                if committed is not None:
                    return committed
                offset = _resolve(start, q, absent=q.min_offset)
                ts = _timestamp_for(q, self.opts.starting_timestamp_ms, self.opts.starting_by_timestamp)
                if ts is not None:
                    offset = first_offset_at_or_after(
                        self._stores[label], q, max(offset, q.min_offset), q.max_offset, ts
                    )
                return offset

            self._initial = _offset_of(self._ranges(), pick)
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _offset_of(self._ranges(), lambda _label, q: q.max_offset)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def reportLatestOffset(self) -> StreamOffset | None:
        """The queues' ends seen by the last `latestOffset`: the progress's ``latestOffset``."""
        return self._latest

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:
        start = self._rekeyed(start)
        self._commit_to_group(start)  # the batch that ended there is done (Spark runs them in turn)
        latest = self._target or _offset_of(self._ranges(), lambda _label, q: q.max_offset)
        self._latest = _union(start, latest)
        waiting = _new_offsets(start, latest)
        now_ms = self._clock_ms()
        if self._last_batch_ms is None:
            self._last_batch_ms = now_ms
        minimum = self.opts.min_offsets_per_trigger
        if (
            minimum is not None
            and self._target is None
            and sum(waiting.values()) < minimum
            and now_ms - self._last_batch_ms < self.opts.max_trigger_delay_ms
        ):
            return start  # too few offsets wait, and not for long: no batch this trigger
        if not isinstance(limit, ReadMaxRows):
            end = _union(start, latest)
        else:
            end = _capped(start, latest, waiting, limit.max_rows)
        if end != start:
            self._last_batch_ms = now_ms
        return end

    def partitions(self, start: StreamOffset, end: StreamOffset) -> list[QueueSlice]:
        start, end = self._rekeyed(start), self._rekeyed(end)
        current = {label: {(q.topic, q.queue_id): q for q in qs} for label, qs in self._ranges().items()}
        slices: list[QueueSlice] = []
        for label, topics in end.items():
            store = self._stores[label]
            for topic, queues in topics.items():
                for qid_text, end_offset in queues.items():
                    queue_id = int(qid_text)
                    q = current[label].get((topic, queue_id))
                    min_offset = q.min_offset if q else 0
                    begin = start.get(label, {}).get(topic, {}).get(qid_text)
                    if begin is None:
                        begin = min_offset  # a queue that appeared after the query started
                    if begin < min_offset:
                        if self.opts.fail_on_data_loss:
                            raise DataLossError(
                                f"{store.root} {topic}/{queue_id}: offsets [{begin}, {min_offset}) were deleted "
                                "before they were read; set failOnDataLoss=false to skip them"
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
            tags=self.opts.tags,
        )

    def commit(self, end: StreamOffset) -> None:
        """With ``commitToGroup``, a finished batch's end offsets become the consumer group's.
        Spark calls this when it plans the next batch, and an availableNow run's last batch only
        in the next run, so `latestOffset` commits its start too (the end of the batch before,
        which is done: at least once, as Kafka's group commits). The query's checkpoint stays the
        source of truth."""
        self._commit_to_group(self._rekeyed(end))

    def _commit_to_group(self, offsets: StreamOffset) -> None:
        if not self.opts.commit_to_group or self.opts.consumer_group is None or offsets == self._committed:
            return
        for label, topics in offsets.items():
            commit_group_offsets(
                self._stores[label],
                self.opts.consumer_group,
                {
                    (topic, int(qid)): offset
                    for topic, queues in topics.items()
                    for qid, offset in queues.items()
                },
            )
        self._committed = offsets


def _new_offsets(start: StreamOffset, latest: StreamOffset) -> dict[tuple[str, str, str], int]:
    return {
        (label, topic, qid): max(0, end - start.get(label, {}).get(topic, {}).get(qid, 0))
        for label, topics in latest.items()
        for topic, queues in topics.items()
        for qid, end in queues.items()
    }


def _capped(
    start: StreamOffset, latest: StreamOffset, wanted: dict[tuple[str, str, str], int], budget: int
) -> StreamOffset:
    """``latest`` cut to ``budget`` offsets in all, shared in proportion to what each queue has."""
    total = sum(wanted.values())
    grant = {k: (v * budget // total if total else 0) for k, v in wanted.items()}
    left = min(budget, total) - sum(grant.values())
    for k in sorted(wanted):  # hand the rounding remainder out in a stable order
        extra = min(left, wanted[k] - grant[k])
        grant[k] += extra
        left -= extra
    capped = {
        label: {
            topic: {
                qid: start.get(label, {}).get(topic, {}).get(qid, 0) + grant[(label, topic, qid)]
                for qid in queues
            }
            for topic, queues in topics.items()
        }
        for label, topics in latest.items()
    }
    return _union(start, capped)


# ------------------------------------------------------------------------------------- groups


def group_offsets(store: StoreRef, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets in the store: a running store's from shared memory (what
    its members committed), an offline one's from ``config/consumerOffset.json``."""
    if store.running:
        from rmq_mp.client.consumer import Consumer

        consumer = Consumer.attach(store.shm_base or store.root, group)
        try:
            found = {}
            for q in queue_ranges(store):
                offset = consumer.committed_offset(q.topic, q.queue_id)
                if offset >= 0:
                    found[(q.topic, q.queue_id)] = offset
            return found
        finally:
            consumer.close()
    manager = _offset_manager(store)
    return {
        (topic, queue_id): offset
        for topic in manager.topics_of_group(group)
        for queue_id, offset in manager.offsets_of(group, topic).items()
    }


def commit_group_offsets(store: StoreRef, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Record ``offsets`` as the group's: through a running store's shared memory (its
    supervisor persists them), or into an offline store's ``consumerOffset.json``."""
    if not offsets:
        return
    if store.running:
        from rmq_mp.client.consumer import Consumer

        consumer = Consumer.attach(store.shm_base or store.root, group)
        try:
            consumer.commit(offsets)
        finally:
            consumer.close()
        return
    manager = _offset_manager(store)
    for (topic, queue_id), offset in offsets.items():
        manager.commit_offset(group, topic, queue_id, offset)
    manager.persist()


def _offset_manager(store: StoreRef) -> Any:
    from rmq_mp.config.offsets import ConsumerOffsetManager
    from rmq_mp.paths import StorePaths

    manager = ConsumerOffsetManager(StorePaths.of(store.root).consumer_offset)
    try:
        manager.load()
    except (OSError, ValueError) as exc:
        raise StoreError(f"{store.root}: cannot read the consumer offsets: {exc}") from exc
    return manager


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
