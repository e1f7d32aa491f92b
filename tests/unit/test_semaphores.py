"""Semaphore waits survive signals: a wait interrupted by a signal with a Python handler goes
on for the time left (the supervisor, which handles SIGTERM, died of posix_ipc.SignalError while
it restarted a killed worker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import posix_ipc

CHILD = """
import signal, sys, time
import posix_ipc
from shm.semaphores import acquire
handled = []
signal.signal(signal.SIGUSR1, lambda *_: handled.append(1))
sem = posix_ipc.Semaphore(sys.argv[1])
print("waiting", flush=True)
started = time.monotonic()
got = acquire(sem, 10.0)
print(got, len(handled), round(time.monotonic() - started, 1), flush=True)
"""


def test_a_signal_does_not_end_a_semaphore_wait() -> None:
    name = f"/rmq_test_sigwait_{os.getpid()}"
    sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=0)
    try:
        with subprocess.Popen(
            [sys.executable, "-c", CHILD, name],
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        ) as child:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "waiting"
            time.sleep(0.3)
            child.send_signal(signal.SIGUSR1)
            time.sleep(0.3)
            sem.release()
            got, handled, waited_s = child.stdout.readline().split()
            assert child.wait(10) == 0
        assert got == "True", "the wait went on after the signal and got the post"
        assert handled == "1", "the signal's handler ran"
        assert 0.4 <= float(waited_s) < 5
    finally:
        sem.unlink()
        sem.close()
