"""A Spark batch read of a damaged store returns no bad body (issue 18, item 2): the source
skips what a pull skips (tests/integration/test_read_damage.py checks the reports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_read_damage import (
    COUNT,
    QUEUES,
    TOPIC,
    damage_for_spark,
    expected,
    store_config,
    write_store,
)

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]


def test_a_batch_read_of_a_damaged_store_returns_every_good_message_and_no_bad_body(
    spark, tmp_path: Path
) -> None:
    config = store_config(tmp_path / "store")
    written = write_store(config)
    bad = damage_for_spark(config, written)
    rows = spark.read.format("rmq").option("store", config.store_path_root_dir).load().collect()
    got = sorted((r.queue_id, r.queue_offset, bytes(r.body)) for r in rows)
    assert got == sorted(row for q in range(QUEUES) for row in expected(written, q, without=bad[q]))
    assert len(got) == COUNT - len(bad[0])
    assert {r.topic for r in rows} == {TOPIC}
