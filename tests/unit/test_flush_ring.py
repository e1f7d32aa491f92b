"""The SYNC flush-request ring's state machine (shm/flush_requests.py) against a model.

Producers take requests under the (here single-threaded) put lock, the flusher completes those
its flushed offset covers and times out those past their deadline, waiters collect their answer
or give up, a dead producer never comes back, and slots are reused. The ring lives in real
shared memory, opened once per role as the processes open it; each transition's assertions run.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shm import flush_requests as fr
from shm.flush_requests import FlushRequestRing
from shm.layout import Role
from shm.segment import SharedSegment

_names = itertools.count()


@dataclass
class Request:
    ticket: int
    slot: int
    end_offset: int
    deadline_ms: int
    waiter: str = "waiting"
    """waiting (its producer waits), done (it collected its answer), gone (gave up or died)."""
    answer: int = fr.WAITING


class RingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rings: list[FlushRequestRing] = []

    @initialize(capacity=st.integers(1, 6))
    def create(self, capacity: int) -> None:
        name = f"/rmqtest_ring_{os.getpid()}_{time.monotonic_ns()}_{next(_names)}"
        self.rings = [FlushRequestRing.create(name, capacity)]
        self.producer = FlushRequestRing.attach(name, Role.PRODUCER)
        self.flusher = FlushRequestRing.attach(name, Role.FLUSHER)
        self.rings += [self.producer, self.flusher]
        self.capacity = capacity
        self.seq = 0  # FLUSH_REQUEST_SEQ
        self.answered_through = 0  # the flusher's
        self.wrote = self.flushed = 0
        self.now_ms = 1_000_000
        self.holder: dict[int, Request] = {}
        """Slot -> the last request that took it (the model of who a slot belongs to)."""
        self.requests: list[Request] = []

    def teardown(self) -> None:
        if self.rings:
            name = self.rings[0].segment.name
            for ring in self.rings:
                ring.close()
            SharedSegment.unlink(name)

    def _state(self, slot: int) -> int:
        return self.producer.state(slot)

    def _takeable(self, slot: int) -> bool:
        """The protocol: a free slot, or a finished one STALE_MS past its deadline."""
        state = self._state(slot)
        held = self.holder.get(slot)
        return state == fr.FREE or (
            state != fr.WAITING and held is not None and held.deadline_ms + fr.STALE_MS < self.now_ms
        )

    @rule(size=st.integers(1, 5000), timeout_ms=st.sampled_from([5, 100, 1000, 5000]))
    def request(self, size: int, timeout_ms: int) -> None:
        self.wrote += size
        takeable = [s for s in range(self.capacity) if self._takeable(s)]
        slot, ticket = self.producer.take(self.seq, self.wrote, self.now_ms, timeout_ms, pid=4242)
        if slot < 0:
            assert takeable == [], "a slot was free, yet the ring said full"
            assert ticket == self.seq + self.capacity
        else:
            assert slot in takeable, f"slot {slot} was taken from {fr.STATE_NAMES[self._state(slot)]}"
            assert slot == ticket % self.capacity
            assert self.seq < ticket <= self.seq + self.capacity
            before = self.holder.get(slot)
            if before is not None and before.waiter == "waiting":
                before.waiter = "gone"  # reused after deadline + STALE_MS: its waiter left long ago
            request = Request(ticket, slot, self.wrote, self.now_ms + timeout_ms)
            self.holder[slot] = request
            self.requests.append(request)
            assert self._state(slot) == fr.WAITING
        self.seq = ticket  # published after the slot says WAITING

    @rule(advance=st.integers(0, 8000), elapsed_ms=st.integers(0, 3000))
    def flusher_pass(self, advance: int, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms
        self.flushed = min(self.wrote, self.flushed + advance)
        expect_ok = {s for s, r in self.holder.items() if self._open(r) and r.end_offset <= self.flushed}
        expect_timeout = {
            s
            for s, r in self.holder.items()
            if self._open(r) and s not in expect_ok and r.deadline_ms <= self.now_ms
        }
        abandoned = {s for s in range(self.capacity) if self._state(s) == fr.ABANDONED}
        self.answered_through, completed = self.flusher.answer(
            self.answered_through, self.seq, self.flushed, self.now_ms
        )
        assert set(completed) == expect_ok | expect_timeout
        assert len(completed) == len(set(completed))
        for slot in expect_ok:
            assert self._state(slot) == fr.DONE_OK
        for slot in expect_timeout:
            assert self._state(slot) == fr.DONE_TIMEOUT
        for slot in abandoned:
            assert self._state(slot) == fr.FREE, "the flusher frees every abandoned slot it passes"

    def _open(self, request: Request) -> bool:
        return self._state(request.slot) == fr.WAITING and self.holder.get(request.slot) is request

    def _waiters(self) -> list[Request]:
        return [r for r in self.requests if r.waiter == "waiting" and self.holder.get(r.slot) is r]

    @precondition(lambda self: bool(self._waiters()))
    @rule(data=st.data())
    def waiter_collects(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self._waiters()))
        before = self._state(request.slot)
        seen = self.producer.collect(request.slot)
        assert seen == before
        if seen in (fr.DONE_OK, fr.DONE_TIMEOUT):
            if seen == fr.DONE_OK:
                assert request.end_offset <= self.flushed, "answered OK before its bytes were flushed"
            request.waiter, request.answer = "done", seen
            assert self._state(request.slot) == fr.FREE
        else:
            assert seen == fr.WAITING

    @precondition(lambda self: any(self._state(r.slot) == fr.WAITING for r in self._waiters()))
    @rule(data=st.data())
    def waiter_gives_up(self, data: st.DataObject) -> None:
        """Its own wait timed out (the flusher stopped): WAITING -> ABANDONED."""
        request = data.draw(
            st.sampled_from([r for r in self._waiters() if self._state(r.slot) == fr.WAITING])
        )
        self.producer.abandon(request.slot, fr.WAITING)
        request.waiter = "gone"
        assert self._state(request.slot) == fr.ABANDONED

    @precondition(lambda self: bool(self._waiters()))
    @rule(data=st.data())
    def producer_dies(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self._waiters())).waiter = "gone"

    @rule(elapsed_ms=st.integers(0, 10_000))
    def time_passes(self, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms

    @invariant()
    def no_two_requests_share_a_slot_and_every_slot_says_its_request(self) -> None:
        if not self.rings:
            return
        for slot in range(self.capacity):
            request = self.holder.get(slot)
            state = self._state(slot)
            if request is None:
                assert state == fr.FREE
            elif state == fr.WAITING:
                assert self.producer.get(slot, fr.NEXT_OFFSET) == request.end_offset
                assert self.producer.get(slot, fr.DEADLINE_MS) == request.deadline_ms
        assert self.producer.waiting() == sum(self._state(s) == fr.WAITING for s in range(self.capacity))

    @invariant()
    def the_flushers_next_pass_looks_at_every_open_request(self) -> None:
        """It looks at the tickets (answered_through, FLUSH_REQUEST_SEQ], at most one lap: every
        waiting slot must be among them (under a ticket of its own, or of a lap that skipped it
        while the ring was full), or its producer would wait out syncFlushTimeout for nothing."""
        if not self.rings:
            return
        assert self.answered_through <= self.seq
        first = max(self.answered_through, self.seq - self.capacity) + 1
        looked_at = {ticket % self.capacity for ticket in range(first, self.seq + 1)}
        for slot in range(self.capacity):
            if self._state(slot) == fr.WAITING:
                assert slot in looked_at, f"open request in slot {slot} is out of the flusher's sight"


TestFlushRequestRing = RingMachine.TestCase
TestFlushRequestRing.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_transition_the_state_machine_does_not_allow_is_refused() -> None:
    name = f"/rmqtest_ring_{os.getpid()}_{time.monotonic_ns()}_{next(_names)}"
    created = FlushRequestRing.create(name, 2)
    flusher = FlushRequestRing.attach(name, Role.FLUSHER)
    producer = FlushRequestRing.attach(name, Role.PRODUCER)
    try:
        with pytest.raises(AssertionError, match="from FREE to DONE_OK"):
            flusher.complete(0, fr.FREE, fr.DONE_OK)
        with pytest.raises(AssertionError, match="from DONE_OK to FREE"):
            flusher.release(0, fr.DONE_OK)
        with pytest.raises(PermissionError, match=r"flusher may not write FlushRequestRing\.next_offset"):
            flusher.take(0, 100, 0, 10, 1)
        with pytest.raises(PermissionError, match=r"supervisor may not write FlushRequestRing\.state"):
            created.set(0, fr.STATE, fr.WAITING)
        assert producer.take(0, 100, 0, 10, 1) == (1, 1)
        producer.abandon(1, fr.DONE_OK)  # no longer its own: left as it is
        assert producer.state(1) == fr.WAITING
    finally:
        for ring in (producer, flusher, created):
            ring.close()
        SharedSegment.unlink(name)
