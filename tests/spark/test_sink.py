"""The `rmq` sink (issue 7): DataFrames written to a running store through producers, read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_mp.format.message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
from tests.service import RunningService, running_service, wait_until

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

SYSTEM_PROPERTIES = {PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}
SCHEMA = (
    "topic string, body binary, tags string, keys array<string>, properties map<string,string>, queue_id int"
)


def _rows(count: int) -> list[tuple]:
    rows = []
    for i in range(count):
        rows.append(
            (
                ("Orders", "主题-τ", "Payments")[i % 3],
                bytes((i * 7 + j) % 256 for j in range(i % 50)) if i % 4 else f"订单 {i}".encode(),
                None if i % 5 == 0 else f"Tag{i % 4}",
                [] if i % 6 == 0 else [f"key-{i}", f"group-{i % 10}"],
                {} if i % 7 == 0 else {"seq": str(i), "note": "line1\nline2", "city": "São Paulo"},
                None if i % 2 else i % 4,
            )
        )
    return rows


def _wait_dispatched(service: RunningService, count: int) -> None:
    from rmq_mp.spark.store_files import queue_ranges, resolve_store

    store = resolve_store(str(service.root))
    wait_until(lambda: sum(q.max_offset for q in queue_ranges(store)) == count, 30, f"{count} dispatched")


def _as_written(row) -> tuple:
    properties = {k: v for k, v in (row.properties or {}).items() if k not in SYSTEM_PROPERTIES}
    return (row.topic, bytes(row.body), row.tags, list(row.keys or []), sorted(properties.items()))


def test_a_dataframe_written_to_a_running_store_reads_back_identically(spark, tmp_path: Path) -> None:
    rows = _rows(600)
    with running_service(tmp_path) as service:
        df = spark.createDataFrame(rows, SCHEMA).repartition(3)
        df.write.format("rmq").option("store", service.names.base).mode("append").save()
        _wait_dispatched(service, len(rows))
        back = spark.read.format("rmq").option("store", str(service.root)).load().collect()
    assert sorted(map(_as_written, back)) == sorted(
        (t, b, tags, keys, sorted(p.items())) for t, b, tags, keys, p, _q in rows
    )
    by_body = {(r.topic, bytes(r.body)): r for r in back}
    for topic, body, _tags, _keys, _props, queue_id in rows:
        if queue_id is not None:
            assert by_body[(topic, body)].queue_id == queue_id
    assert all(r.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] for r in back)


def test_a_stream_copies_a_store_into_a_running_store(spark, tmp_path: Path, clean_store: Path) -> None:
    source = (
        spark.readStream.format("rmq")
        .option("store", str(clean_store))
        .option("topic", "Payments")
        .option("startingOffsets", "earliest")
        .load()
        .select("topic", "body", "tags", "keys", "properties", "queue_id")
    )
    expected = (
        spark.read.format("rmq")
        .option("store", str(clean_store))
        .option("topic", "Payments")
        .load()
        .collect()
    )
    with running_service(tmp_path) as service:
        query = (
            source.writeStream.format("rmq")
            .option("store", service.names.base)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)
        assert query.exception() is None
        _wait_dispatched(service, len(expected))
        copied = spark.read.format("rmq").option("store", str(service.root)).load().collect()
    key = lambda r: (r.queue_id, r.queue_offset)  # noqa: E731
    assert len(copied) == len(expected) > 1000
    for ours, theirs in zip(sorted(copied, key=key), sorted(expected, key=key), strict=True):
        assert (ours.topic, ours.queue_id, ours.queue_offset, bytes(ours.body), ours.tags, ours.keys) == (
            theirs.topic, theirs.queue_id, theirs.queue_offset, bytes(theirs.body), theirs.tags, theirs.keys,
        )  # fmt: skip


def test_a_write_to_a_store_that_is_not_running_fails_clearly(spark, tmp_path: Path) -> None:
    from pyspark.errors import PySparkException

    df = spark.createDataFrame(_rows(3), SCHEMA)
    with pytest.raises(PySparkException, match="is not running"):
        df.write.format("rmq").option("store", "rmq_not_running_here").mode("append").save()
    with pytest.raises(PySparkException, match="needs a 'body' column"):
        df.drop("body").write.format("rmq").option("store", "rmq_x").mode("append").save()


def test_a_kafka_shaped_dataframe_is_written_and_the_topic_option_overrides_the_column(
    spark, tmp_path: Path
) -> None:
    """Issue 34: ``value``, ``key``, ``headers`` and ``partition`` as Kafka's sink takes them;
    the ``topic`` option wins over a ``topic`` column (as Kafka's), rows arrive as Arrow batches."""
    kafka_schema = "topic string, key binary, value binary, headers array<struct<key:string,value:binary>>, partition int"
    rows = [
        (
            "Ignored",
            None if i % 3 == 0 else f"k{i}".encode(),
            f"value {i}".encode() * (1 + i % 5),
            [] if i % 4 == 0 else [("seq", str(i).encode()), ("city", "São Paulo".encode())],
            None if i % 2 else i % 4,
        )
        for i in range(400)
    ]
    with running_service(tmp_path) as service:
        df = spark.createDataFrame(rows, kafka_schema).repartition(2)
        df.write.format("rmq").option("store", service.names.base).option("topic", "Orders").mode(
            "append"
        ).save()
        strings = spark.createDataFrame([("Audit", "plain text value")], "topic string, value string")
        strings.write.format("rmq").option("store", service.names.base).mode("append").save()
        _wait_dispatched(service, len(rows) + 1)
        back = spark.read.format("rmq").option("store", str(service.root)).load().collect()
    got = {
        bytes(r.body): (
            r.topic,
            list(r.keys or []),
            {k: v for k, v in (r.properties or {}).items() if k in ("seq", "city")},
        )
        for r in back
    }
    assert len(back) == len(rows) + 1
    assert got[b"plain text value"] == ("Audit", [], {})
    for i, (_topic, key, value, headers, partition) in enumerate(rows):
        assert got[value] == (
            "Orders",
            [] if key is None else [key.decode()],
            {k: v.decode() for k, v in headers},
        ), i
        if partition is not None:
            assert next(r.queue_id for r in back if bytes(r.body) == value) == partition


def test_a_dataframe_with_both_kafka_and_rmq_columns_is_refused(spark) -> None:
    from pyspark.errors import PySparkException

    both = spark.createDataFrame([("T", b"a", b"b")], "topic string, body binary, value binary")
    with pytest.raises(PySparkException, match="columns body and value both give the body"):
        both.write.format("rmq").option("store", "rmq_x").mode("append").save()
