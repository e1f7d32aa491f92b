"""AllocateMessageQueueAveragely as RocketMQ computes it (rmq_mp/client/rebalance.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_mp.client.rebalance import allocate_averagely


def java_allocate(cid: str, mqs: list[int], cids: list[str]) -> list[int]:
    """RocketMQ 4.9.8 AllocateMessageQueueAveragely.allocate, statement by statement."""
    if cid not in cids:
        return []
    index = cids.index(cid)
    mod = len(mqs) % len(cids)
    average = (
        1
        if len(mqs) <= len(cids)
        else (len(mqs) // len(cids) + 1 if mod > 0 and index < mod else len(mqs) // len(cids))
    )
    start = index * average if mod > 0 and index < mod else index * average + mod
    return [mqs[(start + i) % len(mqs)] for i in range(min(average, len(mqs) - start))]


@pytest.mark.parametrize(
    ("queues", "members", "expected"),
    [
        # Known outputs of RocketMQ's average allocation (the first mod members get one more).
        (16, 4, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
        (16, 3, [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]),
        (3, 5, [[0], [1], [2], [], []]),
        (4, 4, [[0], [1], [2], [3]]),
        (1, 2, [[0], []]),
    ],
)
def test_known_allocations(queues: int, members: int, expected: list[list[int]]) -> None:
    cids = [f"127.0.0.1@{100 + i}" for i in range(members)]
    assert [allocate_averagely(c, list(range(queues)), cids) for c in cids] == expected


def test_an_unknown_member_and_no_queues_get_nothing() -> None:
    assert allocate_averagely("x", [0, 1], ["a", "b"]) == []
    assert allocate_averagely("a", [], ["a", "b"]) == []


@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=64, unique=True),
    st.lists(
        st.text("abcdefghij0123456789@.#", min_size=1, max_size=12), min_size=1, max_size=20, unique=True
    ),
)
def test_every_queue_goes_to_exactly_one_member(queue_ids: list[int], cids: list[str]) -> None:
    mqs, members = sorted(queue_ids), sorted(cids)
    shares = [allocate_averagely(c, mqs, members) for c in members]
    assigned = [q for share in shares for q in share]
    assert sorted(assigned) == mqs, "every queue to exactly one member"
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1
    assert shares == [java_allocate(c, mqs, members) for c in members]
    assert all(share == sorted(share) for share in shares), "contiguous runs of the sorted queues"
