"""A signal whose handler returns does not end a semaphore wait (EINTR is retried).

The supervisor installs a SIGTERM handler that only sets its stop flag; a stop that arrived
while it waited for a restarted worker's ready semaphore used to escape as posix_ipc.SignalError
and kill the supervisor (seen in the kill matrix, async-pool, flusher 1302 and reput 1402)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import posix_ipc
import pytest

from shm.semaphores import acquire


@pytest.fixture
def semaphore() -> Iterator[posix_ipc.Semaphore]:
    name = f"/rmq_test_eintr_{os.getpid()}_{time.monotonic_ns()}"
    sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=0)
    try:
        yield sem
    finally:
        sem.close()
        posix_ipc.unlink_semaphore(name)


@pytest.fixture
def alarm_handler() -> Iterator[list[int]]:
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        yield seen
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_interrupted_wait_times_out_after_the_whole_timeout(
    semaphore: posix_ipc.Semaphore, alarm_handler: list[int]
) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    started = time.monotonic()
    assert acquire(semaphore, 0.3) is False
    assert alarm_handler == [signal.SIGALRM]
    assert time.monotonic() - started >= 0.29


def test_interrupted_wait_still_takes_a_later_release(
    semaphore: posix_ipc.Semaphore, alarm_handler: list[int]
) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    releaser = threading.Timer(0.15, semaphore.release)
    releaser.start()
    try:
        assert acquire(semaphore, 5) is True
    finally:
        releaser.join()
    assert alarm_handler == [signal.SIGALRM]
