"""The `rmq` source's Kafka-style options and progress (issue 34): latestOffset and offsets
behind, checkpoints that survive moving the store, timestamp bounds, topic patterns, tag
pushdown, starting from and committing to a consumer group, min-rows triggers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format.message import PROPERTY_TAGS, Message
from rmq_mp.store.message_store import MessageStore
from tests.service import running_service, wait_until

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

KEY = ["topic", "queue_id", "queue_offset"]


def _config(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig().replace(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=256 * 1024,
        mapped_file_size_consume_queue=20 * 1000,
        message_index_enable=False,
    )


def _put(root: Path, first: int, count: int, topics: tuple[str, ...] = ("T",)) -> None:
    """Messages ``first..first+count-1`` round robin over ``topics``, two queues each, tag T<i % 10>."""
    with MessageStore.open(config=_config(root)) as store:
        for i in range(first, first + count):
            message = Message(
                topic=topics[i % len(topics)],
                body=f"message {i}".encode(),
                queue_id=i % 2,
                properties={PROPERTY_TAGS: f"T{i % 10}"},
            )
            assert store.put_message(message).ok


_SINKS: dict[str, Path] = {}
"""Each run's Parquet sink by run name (the memory sink cannot go on from a checkpoint)."""


def _stream(spark, store: str, checkpoint: Path, name: str, **options: str):
    """One availableNow run of a query (its checkpoint) into a Parquet sink of its own."""
    _SINKS[name] = checkpoint.parent / "sinks" / name
    query = (
        spark.readStream.format("rmq")
        .option("store", store)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
        .select("topic", "queue_id", "queue_offset", "body", "tags")
        .writeStream.format("parquet")
        .option("path", str(_SINKS[name]))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "availableNow query did not finish"
    assert query.exception() is None
    return query


def _table(spark, name: str):
    """The run's files, not its directory: a sink's metadata log begins at the run's batch id."""
    files = sorted(str(f) for f in _SINKS[name].glob("*.parquet"))
    return spark.read.parquet(*files) if files else None


def _rows(spark, name: str) -> list[tuple]:
    table = _table(spark, name)
    return [] if table is None else sorted(tuple(r) for r in table.select(*KEY).collect())


def test_progress_reports_latest_offset_and_offsets_behind_and_the_checkpoint_names_no_path(
    spark, tmp_path: Path
) -> None:
    from rmq_mp.spark.source import offsets_behind

    root = tmp_path / "store"
    _put(root, 0, 300)
    query = _stream(spark, str(root), tmp_path / "cp", "progress", maxRecordsPerTrigger="100")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in progress] == [100, 100, 100]
    latest = [json.loads(p["sources"][0]["latestOffset"]) for p in progress]
    assert latest == [{"store0": {"T": {"0": 150, "1": 150}}}] * 3
    behind = [offsets_behind(p) for p in progress]
    assert behind[0] == {
        "minOffsetsBehindLatest": 100,
        "avgOffsetsBehindLatest": 100,
        "maxOffsetsBehindLatest": 100,
    }
    assert behind[1]["maxOffsetsBehindLatest"] == 50
    assert behind[2] == {
        "minOffsetsBehindLatest": 0,
        "avgOffsetsBehindLatest": 0,
        "maxOffsetsBehindLatest": 0,
    }
    offsets = "".join(p.read_text() for p in (tmp_path / "cp" / "offsets").iterdir() if p.name.isdigit())
    assert str(root) not in offsets
    assert "store0" in offsets


def test_a_checkpoint_goes_on_after_the_store_moves(spark, tmp_path: Path) -> None:
    root, moved = tmp_path / "store", tmp_path / "elsewhere" / "store"
    _put(root, 0, 40)
    _stream(spark, str(root), tmp_path / "cp", "moved_1")
    assert len(_rows(spark, "moved_1")) == 40
    moved.parent.mkdir()
    root.rename(moved)
    _put(moved, 40, 30)
    _stream(spark, str(moved), tmp_path / "cp", "moved_2")
    assert _rows(spark, "moved_2") == sorted(("T", i % 2, i // 2) for i in range(40, 70))


def test_an_older_checkpoint_keyed_by_path_is_read_and_a_stranger_is_refused(tmp_path: Path) -> None:
    from rmq_mp.errors import ConfigError
    from rmq_mp.spark.source import ReadOptions, RmqStreamReader

    root = tmp_path / "store"
    _put(root, 0, 10)
    reader = RmqStreamReader(ReadOptions.parse({"store": str(root)}, streaming=True))
    old = {str(root.resolve()): {"T": {"0": 3, "1": 2}}}
    assert reader.latestOffset(old, reader.getDefaultReadLimit()) == {"store0": {"T": {"0": 5, "1": 5}}}
    assert [
        (p.queue_id, p.start, p.end) for p in reader.partitions(old, {"store0": {"T": {"0": 5, "1": 5}}})
    ] == [
        (0, 3, 5),
        (1, 2, 5),
    ]
    _put(tmp_path / "other", 0, 1)
    two = RmqStreamReader(ReadOptions.parse({"store": f"{root},{tmp_path / 'other'}"}, streaming=True))
    with pytest.raises(ConfigError, match="no longer reads"):
        two.latestOffset({"/gone/store": {"T": {"0": 1}}}, two.getDefaultReadLimit())


def test_timestamp_bounds_pick_the_first_offset_stored_at_or_after_them(spark, tmp_path: Path) -> None:
    root = tmp_path / "store"
    _put(root, 0, 200)
    plain = spark.read.format("rmq").option("store", str(root)).load()
    rows = sorted((r.queue_id, r.queue_offset, r.store_timestamp) for r in plain.collect())
    t_start, t_end = rows[60][2], rows[140][2]  # store times of queue 0: ascending with offsets

    def read(**options: str) -> list[tuple]:
        df = spark.read.format("rmq").option("store", str(root)).options(**options).load()
        return sorted((r.queue_id, r.queue_offset) for r in df.collect())

    ms = lambda t: str(int(t.timestamp() * 1000))  # noqa: E731
    assert read(startingTimestamp=ms(t_start), endingTimestamp=ms(t_end)) == sorted(
        (q, o) for q, o, t in rows if t_start <= t < t_end
    )
    by_queue = json.dumps({"T": {"0": int(ms(t_start))}})
    assert read(startingOffsetsByTimestamp=by_queue) == sorted(
        (q, o) for q, o, t in rows if q == 1 or t >= t_start
    )
    assert read(endingOffsetsByTimestamp=json.dumps({"T": {"1": int(ms(t_end))}})) == sorted(
        (q, o) for q, o, t in rows if q == 0 or t < t_end
    )


def test_a_topic_pattern_reads_the_matching_topics_and_picks_up_new_ones(spark, tmp_path: Path) -> None:
    root = tmp_path / "store"
    _put(root, 0, 60, ("Orders", "Audit", "OrderLog"))
    query_rows = lambda name: {t for t, _q, _o in _rows(spark, name)}  # noqa: E731
    batch = spark.read.format("rmq").option("store", str(root)).option("topicPattern", "Order.*").load()
    assert {r.topic for r in batch.collect()} == {"Orders", "OrderLog"}
    assert batch.count() == 40
    _stream(spark, str(root), tmp_path / "cp", "pattern_1", topicPattern="Order.*")
    assert query_rows("pattern_1") == {"Orders", "OrderLog"}
    _put(root, 60, 20, ("OrdersEU", "AuditEU"))
    _stream(spark, str(root), tmp_path / "cp", "pattern_2", topicPattern="Order.*")
    assert len(_rows(spark, "pattern_2")) == 10
    assert query_rows("pattern_2") == {"OrdersEU"}


def test_a_tags_option_reads_only_those_tags(spark, tmp_path: Path) -> None:
    root = tmp_path / "store"
    _put(root, 0, 500)
    plain = spark.read.format("rmq").option("store", str(root)).load()
    want = sorted(tuple(r) for r in plain.where("tags in ('T1', 'T7')").select(*KEY).collect())
    tagged = spark.read.format("rmq").option("store", str(root)).option("tags", "T1 || T7").load()
    assert sorted(tuple(r) for r in tagged.select(*KEY).collect()) == want
    assert len(want) == 100
    _stream(spark, str(root), tmp_path / "cp", "tags_stream", tags="T3")
    assert len(_rows(spark, "tags_stream")) == 50
    assert {r.tags for r in _table(spark, "tags_stream").collect()} == {"T3"}


def test_a_stream_starts_from_and_commits_to_a_consumer_group(spark, tmp_path: Path) -> None:
    from rmq_mp.client.consumer import Consumer
    from rmq_mp.put.producer import Producer
    from rmq_mp.spark.store_files import queue_ranges, resolve_store

    def committed(service) -> int:
        with Consumer.attach(service.names.base, "spark_group") as consumer:
            return sum(
                max(0, consumer.committed_offset(q.topic, q.queue_id))
                for q in queue_ranges(resolve_store(store))
            )

    with running_service(tmp_path) as service:
        store = str(service.root)

        def produce(count: int, total: int) -> None:
            with Producer.attach(service.root) as producer:
                for i in range(count):
                    assert producer.send("Orders", f"order {i}".encode()).ok
            wait_until(
                lambda: sum(q.max_offset for q in queue_ranges(resolve_store(store))) == total,
                30,
                f"{total} dispatched",
            )

        produce(300, 300)
        options = {"consumerGroup": "spark_group", "maxRecordsPerTrigger": "100", "topic": "Orders"}
        _stream(spark, store, tmp_path / "cp1", "group_1", **options)
        assert len(_rows(spark, "group_1")) == 300
        # A batch is committed when the next is planned: the group may trail by the last batch.
        assert committed(service) in (200, 300)
        _stream(spark, store, tmp_path / "cp1", "group_2", **options)  # nothing new: the last lands
        assert committed(service) == 300
        produce(120, 420)
        # A new query (new checkpoint) of the group starts where the group is, not at the earliest.
        _stream(spark, store, tmp_path / "cp2", "group_3", **options)
        assert len(_rows(spark, "group_3")) == 120
        assert all(o >= 0 for _t, _q, o in _rows(spark, "group_3"))


def test_min_offsets_per_trigger_waits_for_rows_or_the_trigger_delay(tmp_path: Path) -> None:
    """Spark's calls, as a processingTime trigger makes them, on a real store with a given clock."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rmq_mp.errors import ConfigError
    from rmq_mp.spark.source import ReadOptions, RmqStreamReader

    root = tmp_path / "store"
    _put(root, 0, 30)
    now = [0]
    opts = ReadOptions.parse(
        {
            "store": str(root),
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "50",
            "maxTriggerDelay": "2m",
        },
        streaming=True,
    )
    assert opts.max_trigger_delay_ms == 120_000
    reader = RmqStreamReader(opts, clock_ms=lambda: now[0])
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # 30 < 50: no batch
    assert reader.reportLatestOffset() == {"store0": {"T": {"0": 15, "1": 15}}}
    _put(root, 30, 30)
    end = reader.latestOffset(start, ReadAllAvailable())  # 60 >= 50: a batch of all
    assert end == {"store0": {"T": {"0": 30, "1": 30}}}
    _put(root, 60, 10)
    now[0] = 119_999
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # 10 wait, the delay has not passed
    now[0] = 120_000
    assert reader.latestOffset(end, ReadAllAvailable()) == {"store0": {"T": {"0": 35, "1": 35}}}
    for bad in ({"maxTriggerDelay": "soon"}, {"minOffsetsPerTrigger": "0"}, {"endingTimestamp": "5"}):
        with pytest.raises(ConfigError):
            ReadOptions.parse({"store": str(root), **bad}, streaming=True)


def test_a_read_cut_by_bytes_serves_every_row_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More than BATCH_BYTES of records in BATCH_ROWS entries: the batch is cut at the byte limit
    and the read goes on from there (the cut once left the queue offsets uncut and failed)."""
    from rmq_mp.spark import source

    root = tmp_path / "store"
    _put(root, 0, 300)
    monkeypatch.setattr(source, "BATCH_BYTES", 4000)
    opts = source.ReadOptions.parse({"store": str(root)}, streaming=False)
    batches = [
        b for part in source.plan_batch(opts) for b in source.read_slice(part, include_properties=False)
    ]
    assert len(batches) > 2
    got = sorted(
        (q, o)
        for b in batches
        for q, o in zip(b["queue_id"].to_pylist(), b["queue_offset"].to_pylist(), strict=True)
    )
    assert got == sorted((i % 2, i // 2) for i in range(300))
    tagged = [
        b
        for part in source.plan_batch(opts)
        for b in source.read_slice(part, include_properties=False, tags=frozenset({"T4"}))
    ]
    assert sorted(o for b in tagged for o in b["queue_offset"].to_pylist()) == sorted(
        i // 2 for i in range(4, 300, 10)
    )
