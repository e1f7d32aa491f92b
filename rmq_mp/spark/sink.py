"""The `rmq` sink: ``df.write.format("rmq")`` and ``writeStream.format("rmq")`` send rows to a
running store through `Producer`s attached by shm name (one per Spark task).

Rows: ``topic`` (or the ``topic`` option), ``body`` (binary or string), and optionally ``tags``,
``keys`` (array or space-separated string), ``properties`` (map) and ``queue_id`` (null: round
robin, as the producer does). Delivery is at least once, as with Spark's Kafka sink: a retried
task sends its rows again. A send the store refuses fails the task with `SinkError` naming the
status, so a write never reports success for a message that was not stored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from rmq_mp.errors import ConfigError, StoreError
from rmq_mp.validators import check_option_names

SEND_BATCH = 256
SINK_OPTIONS = ("store", "path", "topic", "checkpointLocation")
"""checkpointLocation: a streaming write's, which Spark passes to the sink too."""


class SinkError(StoreError):
    """The store refused a message a Spark write sent (status and reason in the message)."""


@dataclass(frozen=True)
class SinkOptions:
    store: str
    topic: str | None

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
        if "body" not in names:
            raise ConfigError("rmq sink: the DataFrame needs a 'body' column")
        if "topic" not in names and not opts.get("topic"):
            raise ConfigError("rmq sink: give a 'topic' column or the 'topic' option")
        return cls(store=store, topic=opts.get("topic"))


@dataclass
class SinkCommit(WriterCommitMessage):
    sent: int


def _message(row: Row, default_topic: str | None) -> dict[str, Any]:
    data = row.asDict()
    topic = data.get("topic") or default_topic
    body = data.get("body")
    if not topic or body is None:
        raise SinkError(f"rmq sink: a row without topic or body cannot be sent: {data!r}")
    keys = data.get("keys")
    properties = data.get("properties")
    return {
        "topic": topic,
        "body": body.encode("utf-8") if isinstance(body, str) else bytes(body),
        "tags": data.get("tags"),
        "keys": keys if keys is None or isinstance(keys, str) else [str(k) for k in keys],
        "properties": dict(properties) if properties else None,
        "queue_id": data.get("queue_id"),
    }


def send_rows(opts: SinkOptions, rows: Iterator[Row]) -> int:
    from rmq_mp.put.producer import Producer

    sent = 0
    with Producer.attach(opts.store) as producer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(_message(row, opts.topic))
            if len(batch) >= SEND_BATCH:
                sent += _send(producer, batch)
                batch = []
        if batch:
            sent += _send(producer, batch)
    return sent


def _send(producer: Any, batch: list[dict[str, Any]]) -> int:
    for message, result in zip(batch, producer.send_batch(batch), strict=True):
        if not result.ok:
            raise SinkError(
                f"rmq sink: store refused a message to {message['topic']}: {result.status.name} {result.reason}"
            )
    return len(batch)


class RmqWriter(DataSourceWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return SinkCommit(send_rows(self.opts, iterator))


class RmqStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return SinkCommit(send_rows(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row was acknowledged by the store when its task finished: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Sent messages cannot be taken back (at-least-once, as Spark's Kafka sink)."""
