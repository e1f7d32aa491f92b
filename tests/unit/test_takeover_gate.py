"""The takeover gate (shm/semaphores.py `TakeoverGate`): one taker at a time, and a taker
killed -9 inside it blocks no later one (the semaphore it replaced stayed taken for good)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from shm.segment import SharedSegment
from shm.semaphores import TakeoverGate
from tests.service import ROOT

INSIDE = """
import sys, time
from shm.semaphores import TakeoverGate
with TakeoverGate(sys.argv[1], TakeoverGate.FLAGS).entered() as entered:
    print("inside" if entered else "refused", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def segment_path() -> Iterator[str]:
    name = f"/rmqtest_gate_{os.getpid()}_{time.monotonic_ns()}"
    segment = SharedSegment.create(name, 4096)
    try:
        yield "/dev/shm" + name
    finally:
        segment.close()
        SharedSegment.unlink(name)


def _taker(path: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", INSIDE, path], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "inside"
    return proc


def test_one_taker_at_a_time_and_a_killed_one_frees_the_gate(segment_path: str) -> None:
    gate = TakeoverGate(segment_path, TakeoverGate.FLAGS)
    taker = _taker(segment_path)
    try:
        with gate.entered() as entered:
            assert not entered, "a live taker is inside"
        with TakeoverGate(segment_path, TakeoverGate.PUT).entered() as entered:
            assert entered, "the other lock's gate is its own"
        taker.kill()
        taker.wait(30)
        with gate.entered() as entered:
            assert entered, "the kernel released the killed taker's gate"
            with gate.entered() as again:
                assert not again, "one open file description at a time, also within one process"
        with gate.entered() as entered:
            assert entered, "left when the block ended"
    finally:
        taker.kill()
        taker.wait(30)
        if taker.stdout is not None:
            taker.stdout.close()


def test_a_missing_segment_is_no_gate(tmp_path: object) -> None:
    with TakeoverGate("/dev/shm/rmqtest_gate_absent", TakeoverGate.PUT).entered() as entered:
        assert not entered
