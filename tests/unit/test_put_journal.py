"""The put journal's protocol (shm/put_journal.py) against a model: a put interrupted at any
step is found by the next lock taker exactly when it did not reach its commit point."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given
from hypothesis import strategies as st

from shm import layout
from shm import put_journal as journal
from shm.layout import Role
from shm.pointer_table import PointerTable

STEPS = ("begin", "bytes", "queue offset", "commit")


@contextmanager
def fresh_table() -> Iterator[PointerTable]:
    created = PointerTable.create(f"/rmqtest_journal_{os.getpid()}_{time.monotonic_ns()}")
    name = created.segment.name
    try:
        producer = PointerTable.attach(name, Role.PRODUCER)  # the put path's role
        try:
            yield producer
        finally:
            producer.close()
    finally:
        created.close()
        created.segment.unlink(name)


def put(
    table: PointerTable, words: memoryview, wrote: int, size: int, slot: int, offset: int, steps: int
) -> None:
    """A put from ``wrote`` that stops after ``steps`` of STEPS (4: it completed)."""
    if steps >= 1:
        journal.begin(words, wrote, wrote + size, slot, offset)
    if steps >= 4:
        journal.commit(words, wrote + size)


@given(
    puts=st.lists(
        st.tuples(st.integers(1, 1 << 20), st.integers(-1, 100), st.integers(0, 1 << 40)),
        min_size=1,
        max_size=5,
    ),
    last_steps=st.integers(0, 4),
)
def test_only_a_put_short_of_its_commit_point_is_undone(
    puts: list[tuple[int, int, int]], last_steps: int
) -> None:
    with fresh_table() as table:
        check(table, puts, last_steps)


def check(table: PointerTable, puts: list[tuple[int, int, int]], last_steps: int) -> None:
    words = table.words(*journal.FIELDS)
    journal.commit(words, 0)
    wrote = 0
    for size, slot, offset in puts[:-1]:
        put(table, words, wrote, size, slot, offset, 4)
        wrote += size
    size, slot, offset = puts[-1]
    put(table, words, wrote, size, slot, offset, last_steps)
    found = journal.interrupted(table)
    if 1 <= last_steps < 4:  # journalled, not committed: the taker undoes exactly this put
        assert found == journal.Interrupted(wrote, wrote + size, slot, offset)
    else:  # nothing begun, or committed: nothing to undo
        assert found is None
        assert table.get(layout.WROTE_POSITION) == wrote + (size if last_steps == 4 else 0)
    journal.close(table)
    assert journal.interrupted(table) is None
