"""SYNC_FLUSH request ring: GroupCommitService's request list across processes.

``maxSyncFlushRequestNum`` slots (the setting): one per lock hold waiting for its flush, so
it bounds the SYNC producers that can wait at once; a put that finds every slot taken is
answered FLUSH_DISK_TIMEOUT with that reason. A producer that needs its record durable takes
a ticket under the put lock, writes (next_offset, deadline) into slot ``ticket % capacity``
and waits on that slot's semaphore. The flusher completes every waiting slot whose offset is
flushed (FlushDiskWatcher's role too: a waiting slot past its deadline is completed as timed
out). Slot layout (native int64):

    off field        writer
      0 state        producer and flusher, by the transitions below
      8 next_offset  producer under the put lock (end offset of its record)
     16 deadline_ms  producer under the put lock (creation + syncFlushTimeout)
     24 pid          producer under the put lock
     32 started_ns   producer under the put lock (CLOCK_MONOTONIC when its send began, before
                     the lock: the flusher's gather bounds a request's wait by its age)

The state machine, all of it here (one method per transition; rmq_mp/put/flush_wait.py is the
producer's side, workers/flusher.py the flusher's, rmq_mp/put/_core.c `take_ring_slot`,
`wait_for_flush` and `give_up` repeat `take`, `collect` and `abandon` in C with these constants):

    FREE ---take (producer, put lock)---> WAITING
    WAITING ---complete (flusher)---> DONE_OK      its bytes are flushed
    WAITING ---complete (flusher)---> DONE_TIMEOUT past its deadline (the watcher)
    WAITING ---abandon (producer)---> ABANDONED    its own wait timed out: the flusher is stuck
    DONE_OK, DONE_TIMEOUT ---collect (producer)---> FREE   the waiter read its answer
    ABANDONED ---release (flusher)---> FREE
    DONE_*, ABANDONED ---take, once deadline + STALE_MS passed---> WAITING

A DONE_* slot belongs to its waiter until the waiter frees it; taking it earlier let that
waiter's FREE overwrite the new request. Past its deadline + STALE_MS its waiter has read it or
given up (or died), so `take` may reuse it whatever it says. Each transition asserts that it
leaves a state the table above allows (`TRANSITIONS`): an invariant of this process's own
logic, checked on the state this process read. Two processes may race on one slot, and the
protocol tolerates it. A producer abandoning just as the flusher completes: the compiled core
abandons by compare-and-swap from WAITING, so it finds the answer instead and collects it; the
Python reference cannot compare-and-swap and stores ABANDONED over an answer that came between
its read and its store (a spurious FLUSH_DISK_TIMEOUT, never a false PUT_OK; the slot is reused
after STALE_MS). A late semaphore post on a reused slot is harmless, since a waiter re-reads
``state`` after every wake.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from shm.layout import Lock, Role
from shm.slot_table import SlotTable, Writers, check_slot_layout

SLOT_SIZE = 40
FREE, WAITING, DONE_OK, DONE_TIMEOUT, ABANDONED = 0, 1, 2, 3, 4
STATE, NEXT_OFFSET, DEADLINE_MS, PID, STARTED_NS = 0, 8, 16, 24, 32
STATE_NAMES = ("FREE", "WAITING", "DONE_OK", "DONE_TIMEOUT", "ABANDONED")
STALE_MS = 1000
"""A DONE_* or ABANDONED slot this long past its deadline is reused by `take`."""

TRANSITIONS: dict[int, frozenset[int]] = {
    FREE: frozenset({WAITING}),
    WAITING: frozenset({DONE_OK, DONE_TIMEOUT, ABANDONED}),
    DONE_OK: frozenset({FREE, WAITING}),
    DONE_TIMEOUT: frozenset({FREE, WAITING}),
    ABANDONED: frozenset({FREE, WAITING}),
}
"""Legal moves: state -> the states it may become (the diagram above)."""


def _legal(seen: int, to: int) -> bool:
    return to in TRANSITIONS.get(seen, frozenset())


def _moved(seen: int, to: int) -> str:
    name = STATE_NAMES[seen] if 0 <= seen < len(STATE_NAMES) else str(seen)
    return f"flush-request slot moved from {name} to {STATE_NAMES[to]}"


class FlushRequestRing(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    FIELDS: ClassVar[dict[str, int]] = {
        "state": STATE,
        "next_offset": NEXT_OFFSET,
        "deadline_ms": DEADLINE_MS,
        "pid": PID,
        "started_ns": STARTED_NS,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        "state": Writers(Role.PRODUCER, Role.FLUSHER),
        "next_offset": Writers(Role.PRODUCER, lock=Lock.PUT),
        "deadline_ms": Writers(Role.PRODUCER, lock=Lock.PUT),
        "pid": Writers(Role.PRODUCER, lock=Lock.PUT),
        "started_ns": Writers(Role.PRODUCER, lock=Lock.PUT),
    }

    def waiting(self) -> int:
        """Requests waiting for their flush now (the fill level against maxSyncFlushRequestNum)."""
        return int(np.count_nonzero(self.column(STATE) == WAITING))

    def state(self, slot: int) -> int:
        return self.get(slot, STATE)

    # ------------------------------------------------------------------ the producer's moves

    def take(
        self, last_ticket: int, end_offset: int, now_ms: int, timeout_ms: int, pid: int, started_ns: int = 0
    ) -> tuple[int, int]:
        """FREE (or stale DONE_*/ABANDONED) -> WAITING, put lock held: a request for the bytes
        below ``end_offset``. Tries the tickets after ``last_ticket`` (FLUSH_REQUEST_SEQ) for at
        most one lap; returns (slot, ticket), slot -1 when every slot is taken. The caller
        publishes ``ticket`` as FLUSH_REQUEST_SEQ after this returns, and only then: the flusher
        reads the sequence without the lock, and a ticket it saw before its slot said WAITING
        would look answered and never be looked at again. ``started_ns``: when the send began
        (CLOCK_MONOTONIC). Word stores: every SYNC put comes here."""
        self.check_writes(NEXT_OFFSET, DEADLINE_MS, PID, STARTED_NS, STATE)
        w = self._words
        base, size, capacity = self._base, self.SLOT_SIZE, self.capacity
        ticket = last_ticket
        for _ in range(capacity):
            ticket += 1
            slot = ticket % capacity
            at = (base + slot * size) >> 3
            seen = w[at + (STATE >> 3)]
            if seen == FREE or (seen != WAITING and w[at + (DEADLINE_MS >> 3)] + STALE_MS < now_ms):
                assert _legal(seen, WAITING), _moved(seen, WAITING)
                w[at + (NEXT_OFFSET >> 3)] = end_offset
                w[at + (DEADLINE_MS >> 3)] = now_ms + timeout_ms
                w[at + (PID >> 3)] = pid
                w[at + (STARTED_NS >> 3)] = started_ns
                w[at + (STATE >> 3)] = WAITING  # last: the request is whole when it says WAITING
                return slot, ticket
        return -1, ticket

    def collect(self, slot: int) -> int:
        """DONE_OK/DONE_TIMEOUT -> FREE: the waiter reads its answer and frees its slot. Returns
        the state it read: the answer (now collected), or the unanswered state, unchanged."""
        seen = self.get(slot, STATE)
        if seen != DONE_OK and seen != DONE_TIMEOUT:
            return seen
        assert _legal(seen, FREE), _moved(seen, FREE)
        self.set(slot, STATE, FREE)
        return seen

    def abandon(self, slot: int, seen: int) -> None:
        """WAITING -> ABANDONED: the waiter's own wait timed out (the flusher is stopped or dead);
        the flusher frees the slot when it next looks. ``seen`` is the state the waiter last read:
        a slot no longer WAITING (a waiter stopped past deadline + STALE_MS finds it reused and
        answered) is not its own any more, and is left as it is."""
        if seen != WAITING:
            return
        assert _legal(seen, ABANDONED), _moved(seen, ABANDONED)
        self.set(slot, STATE, ABANDONED)

    # ------------------------------------------------------------------ the flusher's moves

    def complete(self, slot: int, seen: int, answer: int) -> None:
        """WAITING -> DONE_OK (flushed) or DONE_TIMEOUT (past its deadline); the caller then
        posts the slot's semaphore."""
        assert answer in (DONE_OK, DONE_TIMEOUT), answer
        assert _legal(seen, answer), _moved(seen, answer)
        self.set(slot, STATE, answer)

    def release(self, slot: int, seen: int) -> None:
        """ABANDONED -> FREE: the flusher frees a slot its waiter gave up."""
        assert seen == ABANDONED, _moved(seen, FREE)
        self.set(slot, STATE, FREE)

    def oldest_started_ns(self, after_ticket: int, last_ticket: int) -> int:
        """When the oldest send still waiting among the tickets ``(after_ticket, last_ticket]``
        began (CLOCK_MONOTONIC ns; 0: none waits). The flusher's gather reads it: a request
        whose send began long ago (its producer was slow to the lock, or it came during the
        last fsync) is not held for others. A slot reused meanwhile reads a newer request's
        start, which only makes the gather wait less than it could."""
        capacity = self.capacity
        oldest = 0
        for ticket in range(max(after_ticket, last_ticket - capacity) + 1, last_ticket + 1):
            slot = ticket % capacity
            if self.get(slot, STATE) == WAITING:
                started = self.get(slot, STARTED_NS)
                if not oldest or started < oldest:
                    oldest = started
        return oldest

    def answer(
        self, after_ticket: int, last_ticket: int, flushed_offset: int, now_ms: int
    ) -> tuple[int, list[int]]:
        """The flusher's pass over the open tickets ``(after_ticket, last_ticket]``: complete each
        waiting request whose bytes are below ``flushed_offset`` or whose deadline passed, release
        abandoned slots. Returns (the last ticket such that every one up to it is answered, the
        slots completed, whose semaphores the caller posts). A request's end offset grows with its
        ticket (both are taken under the put lock), so with 8 producers the open range is a
        handful of slots, not the whole ring."""
        capacity = self.capacity
        first = max(after_ticket, last_ticket - capacity) + 1
        answered_through = last_ticket
        completed: list[int] = []
        for ticket in range(first, last_ticket + 1):
            slot = ticket % capacity
            seen = self.get(slot, STATE)
            if seen == WAITING:
                if self.get(slot, NEXT_OFFSET) <= flushed_offset:
                    self.complete(slot, seen, DONE_OK)
                    completed.append(slot)
                elif self.get(slot, DEADLINE_MS) <= now_ms:
                    self.complete(slot, seen, DONE_TIMEOUT)
                    completed.append(slot)
                else:
                    answered_through = min(answered_through, ticket - 1)
            elif seen == ABANDONED:
                self.release(slot, seen)
        return answered_through, completed


check_slot_layout("FlushRequestRing", SLOT_SIZE, FlushRequestRing.FIELDS, writers=FlushRequestRing.WRITERS)
