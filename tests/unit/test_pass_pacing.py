"""Reput's pacing (reputBatchIntervalMs, where records become readable in bursts): only a pass
that dispatched paces the next one, so a record after a quiet spell is dispatched at the wake
its flush or commit sends. Checked on `ServiceLoop._wait` itself with a fake clock: the wall
clock could not tell the two apart on a loaded machine, where a SCHED_IDLE reput waited longer
than the interval for a CPU (tests/integration/test_service.py asserted < 0.7 s and failed at
1.1 s beside two CPU burners)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import workers.service
from workers.reput import ReputService

INTERVAL_MS = 1000


class FakeClock:
    """`time` as workers.service uses it: a sleep moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self.slept_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept_s += seconds
        self.now_s += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(workers.service, "time", fake)
    return fake


def reput_after_a_pass(clock: FakeClock, records: int, pass_s: float, bursts: bool = True) -> ReputService:
    """A reput whose last pass began ``pass_s`` ago and dispatched ``records``; a record is
    readable now (its flush's wake)."""
    reput = object.__new__(ReputService)
    reput.readable_in_bursts = bursts
    reput.last_pass_records = records
    reput.store = SimpleNamespace(config=SimpleNamespace(reput_batch_interval_ms=INTERVAL_MS))  # type: ignore[assignment]
    reput._pass_started = clock.now_s - pass_s
    reput.wakeup = SimpleNamespace(wait=lambda _timeout_s, ready: ready())  # type: ignore[assignment]
    vars(reput).update(stopping=lambda: False, has_work=lambda: True)
    return reput


def test_a_pass_after_an_idle_pass_begins_at_the_wake(clock: FakeClock) -> None:
    assert reput_after_a_pass(clock, records=0, pass_s=0.01)._wait()
    assert clock.slept_s == 0, "a record after a quiet spell waits for no interval"


def test_a_pass_after_one_that_dispatched_begins_an_interval_after_it(clock: FakeClock) -> None:
    assert reput_after_a_pass(clock, records=5, pass_s=0.3)._wait()
    assert clock.slept_s == pytest.approx(INTERVAL_MS / 1000 - 0.3), "paced from the last pass's start"


def test_plain_async_flush_is_never_paced(clock: FakeClock) -> None:
    assert reput_after_a_pass(clock, records=5, pass_s=0.01, bursts=False)._wait()
    assert clock.slept_s == 0, "each put makes a record readable: consumers' latency runs through reput"
