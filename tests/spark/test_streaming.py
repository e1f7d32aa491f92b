"""Structured Streaming from the `rmq` source (issue 7): availableNow runs over a running store,
across a supervisor restart, new queues, maxRecordsPerTrigger, and data deleted before it was read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format.message import Message
from rmq_mp.put.producer import Producer
from rmq_mp.store.message_store import MessageStore
from tests.service import RunningService, running_service, wait_until

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

KEY = ["topic", "queue_id", "queue_offset"]


def _dispatched(service: RunningService, count: int) -> None:
    from rmq_mp.spark.store_files import queue_ranges, resolve_store

    store = resolve_store(str(service.root))
    wait_until(lambda: sum(q.max_offset for q in queue_ranges(store)) == count, 30, f"{count} dispatched")


def _run_available_now(spark, store: str, sink: Path, checkpoint: Path, **options: str):
    query = (
        spark.readStream.format("rmq")
        .option("store", store)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "availableNow query did not finish"
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_available_now_runs_deliver_every_message_exactly_once_across_a_restart(
    spark, tmp_path: Path
) -> None:
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    sent: dict[tuple[str, int, int], bytes] = {}

    def produce(service: RunningService, first: int, count: int, topics: tuple[str, ...]) -> None:
        with Producer.attach(service.root) as producer:
            for i in range(first, first + count):
                body = f"message {i} ".encode() * (1 + i % 7)
                result = producer.send(topics[i % len(topics)], body, tags=f"T{i % 3}", keys=[f"k{i}"])
                assert result.ok, result
                sent[(topics[i % len(topics)], result.queue_id, result.queue_offset)] = body
        _dispatched(service, len(sent))

    with running_service(tmp_path) as service:
        store = str(service.root)
        produce(service, 0, 300, ("Orders",))
        assert _run_available_now(spark, store, sink, checkpoint) == [300]
        # A topic that did not exist before: its queues are picked up from their first offset.
        produce(service, 300, 200, ("Orders", "Audit"))
        batches = _run_available_now(spark, store, sink, checkpoint, maxRecordsPerTrigger="90")
        assert sum(batches) == 200
        assert max(batches) <= 90
        assert len(batches) >= 3
        assert _run_available_now(spark, store, sink, checkpoint) == []  # nothing new: nothing read
    with running_service(tmp_path) as service:  # the same store, a new supervisor
        produce(service, 500, 250, ("Orders", "Audit"))
        assert _run_available_now(spark, store, sink, checkpoint) == [250]

    rows = spark.read.parquet(str(sink)).select("topic", "queue_id", "queue_offset", "body").collect()
    assert len(rows) == len(sent) == 750
    assert {(r.topic, r.queue_id, r.queue_offset): bytes(r.body) for r in rows} == sent


def _library_store(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig().replace(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 100,
        message_index_enable=False,
    )


def _put(config: MessageStoreConfig, first: int, count: int) -> None:
    with MessageStore.open(config=config) as store:
        for i in range(first, first + count):
            assert store.put_message(Message(topic="T", body=b"x" * 200 + str(i).encode())).ok


def test_offsets_deleted_before_they_were_read_fail_the_query_or_are_skipped(spark, tmp_path: Path) -> None:
    from pyspark.errors import PySparkException

    config = _library_store(tmp_path / "store")
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    _put(config, 0, 50)
    assert _run_available_now(spark, str(config.store_path_root_dir), sink, checkpoint) == [50]
    _put(config, 50, 400)
    # What the cleaner does: the oldest ConsumeQueue files (offsets 0-199) and the commit-log
    # segments wholly below the first remaining entry go.
    cq_dir = tmp_path / "store" / "consumequeue" / "T" / "0"
    for name in ("00000000000000000000", "00000000000000002000"):
        (cq_dir / name).unlink()
    first_phy = int.from_bytes((cq_dir / "00000000000000004000").read_bytes()[:8], "big")
    for segment in sorted((tmp_path / "store" / "commitlog").iterdir()):
        if int(segment.name) + 64 * 1024 <= first_phy:
            segment.unlink()
    skipping = tmp_path / "checkpoint-skip"
    shutil.copytree(checkpoint, skipping)
    with pytest.raises(PySparkException, match=r"offsets \[50, 200\) were deleted before they were read"):
        _run_available_now(spark, str(config.store_path_root_dir), sink, checkpoint)
    assert _run_available_now(
        spark, str(config.store_path_root_dir), sink, skipping, failOnDataLoss="false"
    ) == [250]
    offsets = sorted(r.queue_offset for r in spark.read.parquet(str(sink)).select("queue_offset").collect())
    assert offsets == list(range(50)) + list(range(200, 450))


def test_each_streaming_query_on_one_dataframe_sees_exactly_its_own_filters(
    spark, clean_store: Path, tmp_path: Path
) -> None:
    """Issue 19: unfiltered, filtered, differently filtered and unfiltered queries of one
    streaming DataFrame each deliver what a plain batch read filtered alike returns."""
    plain = spark.read.format("rmq").option("store", str(clean_store)).load()
    stream = (
        spark.readStream.format("rmq")
        .option("store", str(clean_store))
        .option("startingOffsets", "earliest")
        .load()
    )
    for i, where in enumerate(
        [None, "queue_id = 1 and tags = 'TagA'", "queue_offset < 3 or tags = 'TagB'", None]
    ):
        query = (
            (stream.where(where) if where else stream)
            .select("topic", "queue_id", "queue_offset")
            .writeStream.format("memory")
            .queryName(f"each_query_{i}")
            .option("checkpointLocation", str(tmp_path / f"checkpoint{i}"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180), "availableNow query did not finish"
        assert query.exception() is None
        got = sorted(tuple(r) for r in spark.table(f"each_query_{i}").collect())
        want = sorted(tuple(r) for r in (plain.where(where) if where else plain).select(*KEY).collect())
        assert len(got) > 0, where
        assert got == want, where
