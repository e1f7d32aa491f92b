"""The flusher's gather (workers/flusher.py `GroupGather.wait`) and the producers' side of
its wake (rmq_mp/put/flush_wait.py `FlushRequests.request`, `wake_gather`), in real shared
memory and semaphores: the gather watches for its group for up to GATHER_SPIN_S, then arms
FLUSH_GATHER_TICKET and sleeps, and the last request of its group must end that sleep (a wake
lost here costs every SYNC put the gather's whole bound, not a timeout, so no live test would
fail on it). A group that never comes back (its producers died) ends the gather at its bound.

The gather is the flusher's own `GroupGather` on a store's real shared memory (`StoreShm.create`,
attached as the flusher and as a producer), without the worker process around it, as its last
pass leaves it. The group's puts come from a producer thread."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_mp.put.flush_wait import FlushRequests
from shm import layout
from shm.layout import Role
from shm.names import ShmNames
from shm.store_shm import ShmSizes, StoreShm
from workers.flusher import GATHER_SPIN_S, GroupGather

GROUP = 4
BOUND_S = 30.0
"""The gather's bound here: long, so that only the last request's post ends it early."""


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[tuple[StoreShm, StoreShm]]:
    names = ShmNames.for_store(str(tmp_path))
    sizes = ShmSizes(
        pool_buffers=0, pool_buffer_size=0, flush_ring=16, waiters=2, queues=4, groups=4, delay_levels=1
    )
    created = StoreShm.create(names, sizes)
    flusher, producer = StoreShm.attach(names, Role.FLUSHER), StoreShm.attach(names, Role.PRODUCER)
    try:
        yield flusher, producer
    finally:
        for one in (producer, flusher, created):
            one.close()
        StoreShm.unlink_all(names)
        assert names.leftovers() == []


def last_pass_gather(shm: StoreShm, gather_max_s: float) -> GroupGather:
    """The flusher's gather as its last pass leaves it: GROUP producers just woken (tickets up to
    the current FLUSH_REQUEST_SEQ answered), gathering for at most ``gather_max_s``."""
    gather = GroupGather(shm, gather_max_s, group_max=2 * GROUP)
    gather.woke(GROUP, shm.table.get(layout.FLUSH_REQUEST_SEQ), left_open=0)
    gather.passed(gather_max_s)
    return gather


def put_group_once_armed(producer: StoreShm, failures: list[str]) -> None:
    """The woken group's puts, as a producer makes them (a ticket each under the put lock, then
    `wake_gather` after it), once the gather has armed its ticket."""
    deadline = time.monotonic() + BOUND_S
    while producer.table.get(layout.FLUSH_GATHER_TICKET) == 0:  # the gather arming, shared state
        if time.monotonic() > deadline:
            failures.append("the gather never armed FLUSH_GATHER_TICKET")
            return
        os.sched_yield()
    requests = FlushRequests(producer, producer.table.words(layout.FLUSH_REQUEST_SEQ), 60_000, os.getpid())
    flusher_wakeup = producer.wakeup("flusher")
    for i in range(GROUP):  # one producer here: the put lock, which `request` needs, is uncontended
        requests.request(1000 + i, int(time.time() * 1000))
        requests.wake_gather(flusher_wakeup)


def test_a_group_back_after_the_watch_wakes_the_sleeping_gather(shm: tuple[StoreShm, StoreShm]) -> None:
    flusher_shm, producer_shm = shm
    gather = last_pass_gather(flusher_shm, BOUND_S)
    since = gather.woken_after_ticket
    failures: list[str] = []
    thread = threading.Thread(target=put_group_once_armed, args=(producer_shm, failures))
    thread.start()
    began = time.monotonic()
    gather.wait(since)
    took_s = time.monotonic() - began
    thread.join(BOUND_S)
    assert not failures, failures
    assert flusher_shm.table.get(layout.FLUSH_REQUEST_SEQ) - since == GROUP, (
        "the gather ended before its group"
    )
    assert took_s < BOUND_S / 2, f"the group's last request did not end the sleep ({took_s:.1f} s)"
    assert flusher_shm.table.get(layout.FLUSH_GATHER_TICKET) == 0, "the ticket stays armed after the gather"


def test_a_group_that_never_comes_back_ends_the_gather_at_its_bound(shm: tuple[StoreShm, StoreShm]) -> None:
    flusher_shm, _ = shm
    gather = last_pass_gather(flusher_shm, 20 * GATHER_SPIN_S)
    gather.wait(gather.woken_after_ticket)
    assert flusher_shm.table.get(layout.FLUSH_GATHER_TICKET) == 0, "the ticket stays armed after the gather"
