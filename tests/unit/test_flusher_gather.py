"""The flusher's gather (workers/flusher.py `FlusherService.gather`) watches for its group for up
to GATHER_SPIN_S before it arms FLUSH_GATHER_TICKET and sleeps: a group back within the watch is
flushed with no post and no sleep, and one that is not is still woken by the last request it
waits for (the ticket armed before the sleep, or its put would not post and the gather would
sleep out its bound). The gather runs in this process on stand-ins for the table, the ring and
the wakeup, each put landing where the case says; tests/crash/test_sync_group.py and
tests/integration/test_flush_request_start.py run it live."""

from __future__ import annotations

import time
from types import SimpleNamespace

from shm import layout
from workers.flusher import GATHER_SPIN_S, FlusherService

GROUP = 4
SINCE = 100
"""FLUSH_REQUEST_SEQ when the last pass woke its group."""


class Table:
    """The words the gather reads and writes, with every FLUSH_GATHER_TICKET store kept."""

    def __init__(self) -> None:
        self.words = {layout.FLUSH_REQUEST_SEQ.index: SINCE, layout.FLUSH_GATHER_TICKET.index: 0}
        self.armed: list[int] = []

    def get(self, field: layout.Field) -> int:
        return self.words[field.index]

    def set(self, field: layout.Field, value: int) -> None:
        if field is layout.FLUSH_GATHER_TICKET:
            self.armed.append(value)
        self.words[field.index] = value

    def publish(self) -> None:
        """The woken producers put again: their tickets are taken."""
        self.words[layout.FLUSH_REQUEST_SEQ.index] = SINCE + GROUP


class Ring:
    """`oldest_started_ns`: the gather's first look at the ring; the group lands just after it
    when ``lands_after_look``."""

    def __init__(self, table: Table, lands_after_look: bool) -> None:
        self.table = table
        self.lands_after_look = lands_after_look

    def oldest_started_ns(self, after_ticket: int, last_ticket: int) -> int:
        if self.lands_after_look:
            self.table.publish()
        return 0


class Wakeup:
    """The flusher's wakeup: a sleep ends with the last request's post, which comes with the
    group's puts when the ticket it names is armed, and not at all otherwise (the sleep would
    last its bound)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.sleeps: list[float] = []

    def sleep(self, timeout_s: float) -> None:
        self.sleeps.append(timeout_s)
        if self.table.get(layout.FLUSH_GATHER_TICKET) == SINCE + GROUP:
            self.table.publish()


def gathering_flusher(lands_after_look: bool) -> tuple[FlusherService, Table, Wakeup]:
    """A flusher whose last pass woke GROUP producers just now, gathering for at most 500 us."""
    table = Table()
    wakeup = Wakeup(table)
    flusher = FlusherService.__new__(FlusherService)
    state = {
        "table": table,
        "store": SimpleNamespace(shm=SimpleNamespace(ring=Ring(table, lands_after_look))),
        "wakeup": wakeup,
        "woken": GROUP,
        "woken_after_ticket": SINCE,
        "woken_at_ns": time.monotonic_ns(),
        "left_open": 0,
        "gather_group_max": 2 * GROUP,
        "gather_max_s": 500e-6,
        "pass_s": 1.0,
        "answered_through": SINCE,
    }
    vars(flusher).update(state)
    return flusher, table, wakeup


def test_a_group_back_within_the_watch_is_flushed_without_arming_or_sleeping() -> None:
    flusher, table, wakeup = gathering_flusher(lands_after_look=True)
    flusher.gather()
    assert table.get(layout.FLUSH_REQUEST_SEQ) == SINCE + GROUP
    assert wakeup.sleeps == [], "slept although the group was back"
    assert table.armed == [0], "armed the ticket: the last put would post a wake nobody waits for"


def test_a_group_not_back_after_the_watch_is_woken_by_its_last_request() -> None:
    flusher, table, wakeup = gathering_flusher(lands_after_look=False)
    flusher.gather()
    assert table.get(layout.FLUSH_REQUEST_SEQ) == SINCE + GROUP, "the gather ended before its group"
    assert len(wakeup.sleeps) == 1
    assert table.armed == [SINCE + GROUP, 0], "the sleep was not armed for the last request"
    assert wakeup.sleeps[0] <= 500e-6 - GATHER_SPIN_S, "slept without watching first"
