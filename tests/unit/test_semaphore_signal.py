"""A signal whose handler returns does not end a semaphore wait (EINTR is retried).

The supervisor installs a SIGTERM handler that only sets its stop flag; a stop that arrived
while it waited for a restarted worker's ready semaphore used to escape as posix_ipc.SignalError
and kill the supervisor (seen in the kill matrix, async-pool, flusher 1302 and reput 1402)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

import posix_ipc
import pytest

from shm.semaphores import acquire
from tests.service import wait_in, wait_until


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
        signal.signal(signal.SIGALRM, previous)


def interrupt_in_acquire(waiter: threading.Thread, seen: list[int]) -> list[bool]:
    """From another thread: once ``waiter`` is inside `acquire` (its stack says so, no timer
    guessing), send it SIGALRM and wait for the handler; the result then says whether ``waiter``
    was still inside `acquire` after its handler ran (the wait went on)."""
    still_waiting: list[bool] = []

    def run() -> None:
        wait_in(waiter, "acquire")
        assert waiter.ident is not None
        signal.pthread_kill(waiter.ident, signal.SIGALRM)
        wait_until(lambda: seen != [], 10, "the handler to run")
        frame = sys._current_frames().get(waiter.ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        still_waiting.append("acquire" in names)

    threading.Thread(target=run, daemon=True).start()
    return still_waiting


def test_interrupted_wait_times_out_after_the_whole_timeout(
    semaphore: posix_ipc.Semaphore, alarm_handler: list[int]
) -> None:
    still_waiting = interrupt_in_acquire(threading.current_thread(), alarm_handler)
    started = time.monotonic()
    assert acquire(semaphore, 1.0) is False
    assert time.monotonic() - started >= 0.99
    assert alarm_handler == [signal.SIGALRM]
    wait_until(lambda: still_waiting != [], 10, "the interrupter's finding")
    assert still_waiting == [True], "the handler ran inside the wait, which went on"


def test_interrupted_wait_still_takes_a_later_release(
    semaphore: posix_ipc.Semaphore, alarm_handler: list[int]
) -> None:
    still_waiting = interrupt_in_acquire(threading.current_thread(), alarm_handler)

    def release_after_the_interrupt() -> None:
        wait_until(lambda: still_waiting != [], 10, "the interrupt")
        semaphore.release()

    releaser = threading.Thread(target=release_after_the_interrupt, daemon=True)
    releaser.start()
    assert acquire(semaphore, 5) is True  # released only after the handler ran inside the wait
    releaser.join(10)
    assert still_waiting == [True]
    assert alarm_handler == [signal.SIGALRM]
