"""Batch reads of the `rmq` source (issue 7): the RocketMQ-written fixture store, offsets
options, filters (applied by Spark: the source pushes none down) and several stores read as
one dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmq_mp.format.message import is_dispatchable, split_keys

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

KEY = ["topic", "queue_id", "queue_offset"]


def _ms(ts: Any) -> int:
    return int(ts.value // 1_000_000) if hasattr(ts, "value") else int(ts.timestamp() * 1000)


def _fixture_messages(rocketmq_fixtures: Path) -> list[dict]:
    with (rocketmq_fixtures / "clean-store.messages.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_batch_read_returns_every_dispatched_message_once_as_rocketmq_decoded_it(
    spark, clean_store: Path, rocketmq_fixtures: Path
) -> None:
    expected = {
        m["commitLogOffset"]: m for m in _fixture_messages(rocketmq_fixtures) if is_dispatchable(m["sysFlag"])
    }
    rows = spark.read.format("rmq").option("store", str(clean_store)).load().collect()
    assert len(rows) == len(expected) == 11_518
    assert len({r.commit_log_offset for r in rows}) == len(rows)
    for row in rows:
        m = expected[row.commit_log_offset]
        assert (row.topic, row.queue_id, row.queue_offset) == (m["topic"], m["queueId"], m["queueOffset"])
        assert row.msg_id == m["msgId"]
        assert row.body.hex() == m["body"]
        assert dict(row.properties) == m["properties"]
        assert row.tags == m["tags"]
        assert row.keys == split_keys(m["keys"])
        assert (_ms(row.born_timestamp), _ms(row.store_timestamp)) == (
            m["bornTimestamp"],
            m["storeTimestamp"],
        )
        assert (row.born_host, row.store_host) == (m["bornHost"], m["storeHost"])
        assert (row.sys_flag, row.reconsume_times) == (m["sysFlag"], m["reconsumeTimes"])
        assert row.broker == str(clean_store.resolve())


@pytest.fixture(scope="module")
def full(spark, clean_store: Path):
    """The whole fixture store as pandas, the reference every narrowed read is compared with."""
    return spark.read.format("rmq").option("store", str(clean_store)).load().toPandas()


def _keys_of(pdf) -> list[tuple]:
    return sorted(map(tuple, pdf[KEY].itertuples(index=False)))


def _read(spark, clean_store: Path, where: str | None = None, **options: str):
    df = spark.read.format("rmq").option("store", str(clean_store)).options(**options).load()
    return df.where(where) if where else df


@pytest.mark.parametrize(
    ("where", "expect"),
    [
        ("queue_id = 1 and queue_offset between 5 and 9", lambda d: (d.queue_id == 1) & d.queue_offset.between(5, 9)),
        ("queue_id in (0, 2) and queue_offset > 700", lambda d: d.queue_id.isin([0, 2]) & (d.queue_offset > 700)),
        ("queue_offset < 3", lambda d: d.queue_offset < 3),
        ("tags = 'TagB'", lambda d: d.tags == "TagB"),
        ("tags in ('TagA', 'TagC') and topic = 'Payments'", lambda d: d.tags.isin(["TagA", "TagC"]) & (d.topic == "Payments")),
        ("commit_log_offset >= 4000000 and commit_log_offset < 4100000",
         lambda d: (d.commit_log_offset >= 4_000_000) & (d.commit_log_offset < 4_100_000)),
    ],
)  # fmt: skip
def test_filters_return_exactly_the_rows_of_a_full_read_filtered_in_pandas(
    spark, clean_store: Path, full, where: str, expect
) -> None:
    got = _read(spark, clean_store, where).toPandas()
    want = full[expect(full)]
    assert len(want) > 0
    assert _keys_of(got) == _keys_of(want)
    assert sorted(got.body.map(bytes)) == sorted(want.body.map(bytes))


@pytest.mark.parametrize("pushdown", ["false", "true"])
def test_each_query_on_one_dataframe_sees_exactly_its_own_filters(
    spark, clean_store: Path, full, pushdown: str
) -> None:
    """Issue 19: PySpark 4.3 keeps the plan a filtered query pushed down on the DataFrame's
    source and reuses it for a later query that pushes nothing (no filter, or only an OR).
    Also with Python filter pushdown on, as a user's own session may have it: a source that
    accepted pushed filters again would fail here (local_session leaves the setting off)."""
    setting = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(setting)
    spark.conf.set(setting, pushdown)
    try:
        df = _read(spark, clean_store)
        every = (None, lambda d: d.queue_id >= 0)
        queries = [  # an unfiltered query right after each filtered one, as the count()s
            every,
            ("queue_id = 1 and tags = 'TagA'", lambda d: (d.queue_id == 1) & (d.tags == "TagA")),
            every,
            (
                "queue_offset < 3 and topic = 'Payments'",
                lambda d: (d.queue_offset < 3) & (d.topic == "Payments"),
            ),
            every,
            ("queue_id = 0 or tags = 'TagB'", lambda d: (d.queue_id == 0) | (d.tags == "TagB")),
            every,
        ]
        for where, expect in queries:
            got = (df.where(where) if where else df).toPandas()
            assert _keys_of(got) == _keys_of(full[expect(full)]), where
        assert df.count() == len(full)
    finally:
        spark.conf.set(setting, before)


def test_store_time_filters_are_exact(spark, clean_store: Path, full) -> None:
    times = sorted(full.store_timestamp.unique())
    lo, hi = times[len(times) // 3], times[2 * len(times) // 3]
    got = _read(spark, clean_store, f"store_timestamp >= '{lo}' and store_timestamp < '{hi}'").toPandas()
    want = full[(full.store_timestamp >= lo) & (full.store_timestamp < hi)]
    assert 0 < len(want) < len(full)
    assert _keys_of(got) == _keys_of(want)


def test_partitions_are_one_per_queue_narrowed_by_the_options(spark, clean_store: Path) -> None:
    every = _read(spark, clean_store).rdd.getNumPartitions()
    one_topic = _read(spark, clean_store, topics="Payments").rdd.getNumPartitions()
    assert every == 15
    assert 1 <= one_topic < every
    split = _read(spark, clean_store, maxRecordsPerPartition="100").rdd.getNumPartitions()
    assert split > 100


def test_offsets_options_select_per_queue_ranges(spark, clean_store: Path, full) -> None:
    starting = json.dumps({"Payments": {"0": 10, "1": -2}, "OrderTopic": {"0": 2800}})
    ending = json.dumps({"Payments": {"0": 20, "1": 5}, "OrderTopic": {"0": -1}})
    got = _read(
        spark, clean_store, "topic in ('Payments', 'OrderTopic')",
        topics="Payments,OrderTopic", startingOffsets=starting, endingOffsets=ending,
    ).toPandas()  # fmt: skip
    payments, orders = full.topic == "Payments", full.topic == "OrderTopic"
    q, o = full.queue_id, full.queue_offset
    want = full[
        (payments & (q == 0) & o.between(10, 19))
        | (payments & (q == 1) & (o < 5))
        | (payments & (q > 1))
        | (orders & (o >= 2800))
    ]
    assert _keys_of(got) == _keys_of(want)
    latest = _read(spark, clean_store, startingOffsets="latest").count()
    assert latest == 0
    ts = int(sorted(full.store_timestamp)[len(full) // 2].value // 1_000_000)
    since = _read(spark, clean_store, startingTimestamp=str(ts)).toPandas()
    assert _keys_of(since) == _keys_of(full[full.store_timestamp.map(_ms) >= ts])


def test_several_stores_read_as_one_dataset_with_the_broker_column(
    spark, clean_store: Path, rocketmq_fixtures: Path, crashed_store_copy: Path, fixture_config
) -> None:
    from rmq_mp.store.message_store import MessageStore

    with MessageStore.open(crashed_store_copy, fixture_config):  # RocketMQ-style recovery first
        pass
    df = spark.read.format("rmq").option("store", f"{clean_store},{crashed_store_copy}").load()
    counts = {r.broker: r["count"] for r in df.groupBy("broker").count().collect()}
    assert counts == {str(clean_store.resolve()): 11_518, str(crashed_store_copy.resolve()): 6_719}


def test_bad_options_fail_with_a_clear_message(spark, clean_store: Path, tmp_path: Path) -> None:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="startingoffsets must be earliest, latest or"):
        _read(spark, clean_store, startingOffsets="{not json").count()
    with pytest.raises(PySparkException, match="not a directory and no running store"):
        spark.read.format("rmq").option("store", str(tmp_path / "nowhere")).load().count()
    # A misspelled option is named with the closest valid one (issue 19), for the sink too.
    with pytest.raises(
        PySparkException, match="unknown option 'startingoffset'; did you mean 'startingOffsets'"
    ):
        _read(spark, clean_store, startingOffset="earliest").count()
    rows = spark.createDataFrame([("T", b"x")], "topic string, body binary")
    with pytest.raises(PySparkException, match="unknown option 'topik'; did you mean 'topic'"):
        rows.write.format("rmq").option("store", str(tmp_path)).option("topik", "T").mode("append").save()


def test_a_topics_option_that_is_empty_or_not_a_topic_is_refused(clean_store: Path) -> None:
    """Issue 19: ``topics=""`` read every topic and ``topics="a/b"`` silently read nothing. The
    option is parsed without a session, so no Spark job is needed to check it."""
    from rmq_mp.errors import ConfigError
    from rmq_mp.spark.source import ReadOptions

    for value, message in (("", "is empty"), (" , ", "is empty"), ("a/b", "cannot name a consume-queue"),
                           ("Orders,", "cannot name a consume-queue"), ("x" * 128, "longer than 127")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            ReadOptions.parse({"store": str(clean_store), "topics": value}, streaming=False)
    parsed = ReadOptions.parse({"store": str(clean_store), "topic": " Orders , Payments "}, streaming=False)
    assert parsed.topics == frozenset({"Orders", "Payments"})
    assert ReadOptions.parse({"store": str(clean_store)}, streaming=False).topics is None
