"""`_scan.queue_ends`, the slave ha worker's walk of the master's bytes (workers/ha.py `_walk`):
every record it takes is one `record.check_record` takes too (without CRC, as the slave's
scan), with the same topic, queue id and queue offset; it hands back every other record, the
deleteTopic marker and SCHEDULE_TOPIC_XXXX included, to the reference path; and each queue's
row is its first queue offset and its highest + 1, as `_queue_ends` gives them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.format import message as m
from rmq_mp.format import native, record, topic_marker
from tests.unit.test_record_batch import Spec, build_log, per_record, props, specs, uniq

MARKER = topic_marker.TOPIC.encode("ascii")
END, DEFER, FULL = 0, 1, 2

pytestmark = pytest.mark.skipif(
    native.scan.built is None, reason=f"no compiled scan: {native.scan.why_not_built}"
)


def walk(
    buf: bytes, pos: int = 0, max_records: int = 1 << 30, cap: int = 4096
) -> tuple[int, int, dict[tuple[str, int], tuple[int, int]], int]:
    """(records, stop, {(topic, queue id): (first, end)}, why) of one walk."""
    assert native.scan.built is not None
    out = np.empty((4, cap), dtype=np.int64)
    ids: dict[bytes, int] = {}
    topics: list[str] = []
    n, stop, queues, why = native.scan.built.queue_ends(
        buf, pos, len(buf), max_records, MARKER, ids, topics, out
    )
    rows = {(topics[t], q): (f, e) for t, q, f, e in zip(*out[:, :queues].tolist(), strict=True)}
    assert len(rows) == queues, "one row a queue"
    return n, stop, rows, why


def assert_walk_agrees(buf: bytes, pos: int = 0) -> tuple[int, int, int]:
    """The walk from ``pos`` against `check_record` one record at a time; (records, stop, why)."""
    n, stop, rows, why = walk(buf, pos)
    found, _, _ = per_record(buf, pos, stop, False, 1 << 30)
    assert len(found) == n
    assert pos + sum(req.size for _, req in found) == stop
    expected: dict[tuple[str, int], tuple[int, int]] = {}
    for _, req in found:
        key = (req.topic, req.queue_id)
        first, end = expected.get(key, (req.queue_offset, 0))
        expected[key] = (first, max(end, req.queue_offset + 1))
    assert rows == expected
    if stop < len(buf):
        assert why == DEFER
    return n, stop, why


def producer_log(count: int, queues: int = 4) -> list[Spec]:
    return [
        Spec(props=props(("UNIQ_KEY", uniq(i)), ("TAGS", "t")), queue_id=i % queues, queue_offset=i // queues)
        for i in range(count)
    ]


def test_a_producer_log_is_walked_to_its_end() -> None:
    log = bytes(build_log(producer_log(500)))
    assert assert_walk_agrees(log) == (500, len(log), END)
    rows = walk(log)[2]
    assert rows == {("BenchTopic", q): (0, 125) for q in range(4)}


def test_max_records_and_a_start_inside_the_log() -> None:
    specs_ = producer_log(40)
    log = bytes(build_log(specs_))
    n, stop, _rows, why = walk(log, max_records=7)
    assert (n, why) == (7, END)
    assert assert_walk_agrees(log, stop)[:2] == (33, len(log))


@pytest.mark.parametrize(
    "odd",
    [
        Spec(topic=topic_marker.TOPIC.encode(), body=b"Gone"),
        Spec(topic=m.SCHEDULE_TOPIC.encode(), props=b"DELAY\x013\x02TAGS\x01t"),
        Spec(topic="主题-τ".encode()),
        Spec(props="k\x01ü".encode()),
        Spec(v2=True),
        Spec(size_delta=1),
        Spec(size_delta=-1),
        Spec(topic=b""),
        Spec(topic=b"a\x00b"),
        Spec(props=b"\x00\x00"),
    ],
    ids=[
        "marker",
        "schedule",
        "utf8-topic",
        "utf8-props",
        "v2",
        "long",
        "short",
        "empty-topic",
        "nul-topic",
        "nul",
    ],
)
def test_it_hands_back_every_record_but_the_common_one(odd: Spec) -> None:
    """It stops before the record, whatever check_record makes of it (the reference reads it)."""
    log = bytes(build_log([*producer_log(30), odd, *producer_log(5)]))
    n, stop, why = assert_walk_agrees(log)
    assert (n, why) == (30, DEFER)
    assert walk(log, stop)[:2] == (0, stop)


def test_torn_blank_and_garbage_ends() -> None:
    whole = bytes(build_log(producer_log(30)))
    for cut in (len(whole) - 1, len(whole) - 40, len(whole) - 100, len(whole) - 200):
        _n, stop, why = assert_walk_agrees(whole[:cut])
        assert stop <= cut
        assert why == DEFER
    assert assert_walk_agrees(bytes(build_log(producer_log(30), blank_after=9)))[0] == 10
    assert assert_walk_agrees(whole + bytes(64))[:2] == (30, len(whole))


def test_a_full_output_stops_before_the_first_queue_it_cannot_hold() -> None:
    log = bytes(build_log([Spec(queue_id=q, queue_offset=5) for q in range(10)]))
    n, stop, rows, why = walk(log, cap=3)
    assert (n, why) == (3, FULL)
    assert rows == {("BenchTopic", q): (5, 6) for q in range(3)}
    assert walk(log, stop, cap=3)[0] == 3


def test_bad_arguments_are_errors() -> None:
    assert native.scan.built is not None
    out = np.empty((4, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="out of range"):
        native.scan.built.queue_ends(b"x" * 10, 0, 20, 1, MARKER, {}, [], out)
    with pytest.raises(ValueError, match="out of range"):
        native.scan.built.queue_ends(b"x" * 10, 0, 10, 1, MARKER, {}, [], bytearray(16))
    with pytest.raises(TypeError):
        native.scan.built.queue_ends(b"x" * 10, 0, 10, 1, MARKER, {}, [], b"read-only" * 8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(specs(), min_size=1, max_size=12), st.integers(1, 30))
def test_any_log_walks_as_check_record_reads_it(template: list[Spec], repeat: int) -> None:
    """Everything it takes, check_record takes the same; walked again from each stop past the
    record handed back, the whole log agrees."""
    log = bytes(build_log([template[i % len(template)] for i in range(repeat * len(template))]))
    pos = 0
    while pos < len(log):
        _n, stop, _why = assert_walk_agrees(log, pos)
        req = record.check_record(log, stop, len(log), check_crc=False)
        if stop >= len(log) or not (req.success and req.size > 0):
            break
        pos = stop + req.size
