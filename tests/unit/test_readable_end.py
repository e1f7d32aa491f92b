"""The one readable-end rule (`PointerTable.readable_end`), which the supervisor's clean-stop
check, the flusher's target (`written_end`), the cleaner, reput and every reader
(`RunningStore.readable_end`) share: FLUSHED under SYNC_FLUSH, COMMITTED with the pool, WROTE
otherwise."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from shm import layout
from shm.pointer_table import PointerTable

WROTE, COMMITTED, FLUSHED = 9_000, 5_000, 3_000


@pytest.fixture
def table() -> Iterator[PointerTable]:
    t = PointerTable.create(f"/rmqtest_readable_{os.getpid()}_{time.monotonic_ns()}")
    t.set(layout.STATE, layout.STARTING)  # the supervisor may set any field while starting
    t.set(layout.WROTE_POSITION, WROTE)
    t.set(layout.COMMITTED_POSITION, COMMITTED)
    t.set(layout.FLUSHED_POSITION, FLUSHED)
    try:
        yield t
    finally:
        name = t.segment.name
        t.close()
        t.segment.unlink(name)


@pytest.mark.parametrize(
    ("sync", "pool", "written", "readable"),
    [
        (False, 0, WROTE, WROTE),  # ASYNC_FLUSH: what is written is readable
        (False, 5, COMMITTED, COMMITTED),  # the pool: a record in a buffer is not in the file yet
        (True, 0, WROTE, FLUSHED),  # SYNC_FLUSH: only what is flushed (RocketMQ 5.3)
    ],
)
def test_readable_end_follows_flush_mode_and_pool(
    table: PointerTable, sync: bool, pool: int, written: int, readable: int
) -> None:
    table.set(layout.FLUSH_DISK_SYNC, int(sync))
    table.set(layout.POOL_SIZE, pool)
    assert table.written_end() == written
    assert table.readable_end() == readable


def test_readable_end_reads_the_words_live(table: PointerTable) -> None:
    """Nothing is cached: a moved position is seen on the next call (readers poll it)."""
    table.set(layout.FLUSH_DISK_SYNC, 1)
    assert table.readable_end() == FLUSHED
    table.set(layout.FLUSHED_POSITION, WROTE)
    assert table.readable_end() == WROTE
    table.set(layout.FLUSH_DISK_SYNC, 0)
    table.set(layout.WROTE_POSITION, WROTE + 100)
    assert table.readable_end() == WROTE + 100


@pytest.mark.parametrize("sync", [False, True])
def test_a_fork_bounds_the_readable_end_never_raises_it(table: PointerTable, sync: bool) -> None:
    """FORK_READ_END (a slave whose log forks from its master's there) is -1 in a new table; set,
    readers stop at it, and never read further because of it."""
    table.set(layout.FLUSH_DISK_SYNC, int(sync))
    end = FLUSHED if sync else WROTE
    assert table.get(layout.FORK_READ_END) == -1
    assert table.readable_end() == end
    table.set(layout.FORK_READ_END, 1_000)
    assert table.readable_end() == 1_000
    table.set(layout.FORK_READ_END, 0)  # the logs share nothing: nothing is readable
    assert table.readable_end() == 0
    table.set(layout.FORK_READ_END, end + 500)
    assert table.readable_end() == end
    assert table.written_end() == WROTE  # what a flush may force is not bounded by it
