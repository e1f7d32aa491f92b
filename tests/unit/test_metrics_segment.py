"""shm.metrics: the producers' histogram segment, on real shared memory."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from shm.layout import Role
from shm.metrics import BOUNDS_US, BUCKETS, MetricsTable, bucket_of
from shm.segment import SharedSegment


@pytest.fixture
def table() -> Iterator[MetricsTable]:
    name = f"/rmqtest_metrics_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    created = MetricsTable.create(name, generation=7, slots=4)
    producer = MetricsTable.attach(name, Role.PRODUCER)  # producers write the slots
    try:
        yield producer
    finally:
        producer.close()
        created.close()
        SharedSegment.unlink(name)


def test_buckets_follow_prometheus_le() -> None:
    assert bucket_of(0) == 0
    assert bucket_of(BOUNDS_US[0]) == 0
    assert bucket_of(BOUNDS_US[0] + 1) == 1
    assert bucket_of(BOUNDS_US[-1]) == BUCKETS - 2
    assert bucket_of(BOUNDS_US[-1] + 1) == BUCKETS - 1  # +Inf


def test_slots_sum_and_survive_their_owner(table: MetricsTable) -> None:
    other = MetricsTable.attach(table.segment.name, Role.PRODUCER)
    try:
        assert (other.generation, other.slots) == (7, 4)
        table.claim(0, 111)
        other.claim(1, 222)
        table.record(0, puts=5, failures=1, latency_us=80, lock_hold_us=30)
        other.record(1, puts=1, failures=0, latency_us=600_000, lock_hold_us=-1)  # never held the lock
        totals = other.totals()
        assert (totals.puts, totals.put_failures, totals.producers) == (6, 1, 2)
        assert totals.latency.count == 2
        assert totals.latency.sum_us == 600_080
        assert totals.lock_hold.count == 1
        assert totals.latency.over(500_000) == 1
        cumulative = totals.latency.cumulative()
        assert cumulative[-1] == ("+Inf", 2)
        assert cumulative[1] == (str(100 / 1e6), 1)
        # a new producer takes over a dead owner's slot: the slot keeps counting (counters only grow)
        other.claim(1, 333)
        other.record(1, puts=2, failures=0, latency_us=10, lock_hold_us=5)
        assert other.totals().puts == 8
        assert other.owner(1) == 333
    finally:
        other.close()
