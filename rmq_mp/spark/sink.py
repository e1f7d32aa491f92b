"""The `rmq` sink: ``df.write.format("rmq")`` and ``writeStream.format("rmq")`` send rows to a
running store through `Producer`s attached by shm name (one per Spark task).

Rows: the message body as ``body`` or Kafka's ``value`` (binary or string); the topic as the
``topic`` option, which overrides a ``topic`` column (as Kafka's sink), or that column; and
optionally ``tags``, ``keys`` (array or space-separated string) or Kafka's ``key`` (one key,
binary or string), ``properties`` (map) or Kafka's ``headers`` (array of key/value structs; values
UTF-8), and ``queue_id`` or Kafka's ``partition`` (null: round robin, as the producer does). A
DataFrame written to Kafka can be written here unchanged. Spark hands each task its rows as Arrow
batches (`DataSourceArrowWriter`), turned into messages a column at a time.

Delivery is at least once, as with Spark's Kafka sink: a retried task sends its rows again. A send
the store refuses fails the task with `SinkError` naming the status, so a write never reports
success for a message that was not stored. Every send goes through `_send` (one batch, one call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from rmq_mp.errors import ConfigError, StoreError
from rmq_mp.validators import check_option_names

SEND_BATCH = 256
SINK_OPTIONS = ("store", "path", "topic", "checkpointLocation")
"""checkpointLocation: a streaming write's, which Spark passes to the sink too."""

ALIASES = {"body": ("body", "value"), "keys": ("keys", "key"), "properties": ("properties", "headers"),
           "queue_id": ("queue_id", "partition")}  # fmt: skip
"""Each message field and the columns that may carry it: ours, then Kafka's."""


class SinkError(StoreError):
    """The store refused a message a Spark write sent (status and reason in the message)."""


@dataclass(frozen=True)
class SinkOptions:
    store: str
    topic: str | None
    columns: tuple[tuple[str, str], ...] = ()
    """(message field, the DataFrame column carrying it)."""

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        check_option_names("rmq sink", options, SINK_OPTIONS)
        opts = {k.lower(): v for k, v in options.items()}
        store = opts.get("store") or opts.get("path")
        if not store:
            raise ConfigError(
                "rmq sink: option 'store' (a running store's shm name or directory) is required"
            )
        names = set(schema.fieldNames())
        columns = []
        for field, candidates in ALIASES.items():
            present = [c for c in candidates if c in names]
            if len(present) > 1:
                raise ConfigError(
                    f"rmq sink: columns {' and '.join(present)} both give the {field}: keep one"
                )
            if present:
                columns.append((field, present[0]))
        if "body" not in dict(columns):
            raise ConfigError("rmq sink: the DataFrame needs a 'body' column (or Kafka's 'value')")
        if "tags" in names:
            columns.append(("tags", "tags"))
        topic = opts.get("topic")
        if topic is not None and not topic.strip():
            raise ConfigError("rmq sink: option topic is empty")
        if topic is None:
            if "topic" not in names:
                raise ConfigError("rmq sink: give a 'topic' column or the 'topic' option")
            columns.append(("topic", "topic"))
        return cls(store=store, topic=topic, columns=tuple(columns))


@dataclass
class SinkCommit(WriterCommitMessage):
    sent: int


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise SinkError(f"rmq sink: a {what} that is not UTF-8 cannot be sent: {value[:40]!r}") from None
    return str(value)


def _keys(value: Any) -> str | list[str] | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):  # Kafka's key: one key
        return _text(value, "key")
    return [_text(k, "key") for k in value]


def _properties(value: Any) -> dict[str, str] | None:
    if not value:
        return None
    if isinstance(value, list) and value and isinstance(value[0], dict):  # Kafka's headers
        return {
            _text(h["key"], "header name"): _text(h["value"], "header value")
            for h in value
            if h["value"] is not None
        }
    return {k: v for k, v in value}  # a map column comes as (key, value) pairs


def messages(opts: SinkOptions, batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The messages of one Arrow batch, built a column at a time."""
    n = batch.num_rows
    column = {field: batch.column(name).to_pylist() for field, name in opts.columns}
    topics = column.get("topic") or [opts.topic] * n
    bodies, tags = column["body"], column.get("tags") or [None] * n
    keys, props = column.get("keys") or [None] * n, column.get("properties") or [None] * n
    queue_ids = column.get("queue_id") or [None] * n
    out = []
    for topic, body, tag, key, prop, queue_id in zip(
        topics, bodies, tags, keys, props, queue_ids, strict=True
    ):
        if not topic or body is None:
            raise SinkError(f"rmq sink: a row without topic or body cannot be sent (topic {topic!r})")
        out.append(
            {
                "topic": topic,
                "body": body.encode("utf-8") if isinstance(body, str) else body,
                "tags": tag,
                "keys": _keys(key),
                "properties": _properties(prop),
                "queue_id": queue_id,
            }
        )
    return out


def send_batches(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    from rmq_mp.put.producer import Producer

    sent = 0
    with Producer.attach(opts.store) as producer:
        for batch in batches:
            pending = messages(opts, batch)
            for at in range(0, len(pending), SEND_BATCH):
                sent += _send(producer, pending[at : at + SEND_BATCH])
    return sent


def _send(producer: Any, batch: list[dict[str, Any]]) -> int:
    """The one call into the producer: a batch of messages, each acknowledged or the task fails."""
    for message, result in zip(batch, producer.send_batch(batch), strict=True):
        if not result.ok:
            raise SinkError(
                f"rmq sink: store refused a message to {message['topic']}: {result.status.name} {result.reason}"
            )
    return len(batch)


class RmqWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return SinkCommit(send_batches(self.opts, iterator))


class RmqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return SinkCommit(send_batches(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row was acknowledged by the store when its task finished: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Sent messages cannot be taken back (at-least-once, as Spark's Kafka sink)."""
