"""Both kinds of put lock against real holders in other processes: the semaphore lock
(shm/semaphores.py `PutLock`, the reference and a store without the compiled core) and the
atomic lock (shm/put_lock.py `AtomicPutLock`). A live holder keeps it (a timeout, or RocketMQ's
isOSPageCacheBusy refusal at once), a release hands it on, a holder killed -9 inside is taken
over with its put undone and counted, and (semaphore only) a holder killed between taking the
semaphore and writing its pid is taken over after ORPHAN_AFTER_MS. The put-path tests run the
same locks under stores; these pin each rule to one process and one kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import posix_ipc
import pytest

from rmq_mp.put import native
from shm import layout
from shm.pointer_table import PointerTable
from shm.put_lock import AtomicPutLock, HeldPutLock
from shm.roles import Role
from shm.semaphores import ORPHAN_AFTER_MS, PutLock, TakeoverGate, create_semaphore, unlink_semaphore
from tests.service import ROOT

KINDS = ["semaphore", "atomic"]

HOLDER = """
import os, sys
from tests.unit.test_put_locks import open_lock
kind, table_name, sem_name, mode = sys.argv[1:5]
lock, _table = open_lock(kind, table_name, sem_name, lambda: None)
if mode == "orphan":  # dies between the semaphore and its pid, as a kill there would leave it
    lock.sem.acquire()
    os._exit(0)
assert lock.acquire(5)
print("held", flush=True)
sys.stdin.readline()  # EOF (the test's end) or a line: release
lock.release()
print("released", flush=True)
"""


@dataclass
class Names:
    table: str
    sem: str


def open_lock(
    kind: str, table_name: str, sem_name: str, on_takeover: Callable[[], None], **kw: object
) -> tuple[HeldPutLock, PointerTable]:
    """This process's handle on the test's lock of ``kind``, as a producer opens it."""
    table = PointerTable.attach(table_name, Role.PRODUCER)
    if kind == "atomic":
        assert native.lock_core is not None
        return AtomicPutLock(native.lock_core, table, on_takeover, **kw), table  # type: ignore[arg-type]
    gate = TakeoverGate("/dev/shm" + table_name, TakeoverGate.PUT)
    return PutLock(posix_ipc.Semaphore(sem_name), gate, table, on_takeover, **kw), table  # type: ignore[arg-type]


@pytest.fixture
def names() -> Iterator[Names]:
    base = f"/rmqtest_lock_{os.getpid()}_{time.monotonic_ns()}"
    table = PointerTable.create(base)
    create_semaphore(base + "_put", 1)
    try:
        yield Names(base, base + "_put")
    finally:
        table.segment.close()
        table.segment.unlink(base)
        unlink_semaphore(base + "_put")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "atomic" and native.lock_core is None:
        pytest.skip(f"no compiled core: {native.why_reference}")
    return str(request.param)


class Holder:
    """A process holding the lock until told to release (a line) or killed."""

    def __init__(self, kind: str, names: Names, mode: str = "hold") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, kind, names.table, names.sem, mode],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdin is not None
        self.stdout, self.stdin = self.proc.stdout, self.proc.stdin
        if mode == "hold":
            assert self.stdout.readline().strip() == "held"
        else:
            assert self.proc.wait(30) == 0

    def release(self) -> None:
        self.stdin.write("release\n")
        self.stdin.flush()
        assert self.stdout.readline().strip() == "released"
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.stdin.close()
        self.stdout.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.close()


def _owner(table: PointerTable) -> int:
    return layout.lock_owner(table.get(layout.PUT_LOCK_OWNER_PID) & 0xFFFFFFFF)


def test_a_free_lock_is_taken_at_once_and_its_release_clears_owner_and_since(kind: str, names: Names) -> None:
    lock, table = open_lock(kind, names.table, names.sem, lambda: None)
    assert lock.acquire(0)
    assert lock.held
    assert _owner(table) == os.getpid()
    assert table.get(layout.PUT_LOCK_SINCE_MS) == lock.acquired_ms > 0
    lock.release()
    assert not lock.held
    assert _owner(table) == 0
    assert table.get(layout.PUT_LOCK_SINCE_MS) == 0
    assert lock.last_hold_ns >= 0
    with lock:
        assert lock.acquire(0)
    assert not lock.held, "the block's end released it"
    with pytest.raises(AssertionError, match="does not hold"):
        lock.release()


@pytest.mark.parametrize("spin", [False, True], ids=["mutex", "spin"])
def test_a_live_holder_keeps_it_until_the_timeout_then_its_release_hands_it_on(
    kind: str, names: Names, holders: list[Holder], spin: bool
) -> None:
    holders.append(holder := Holder(kind, names))
    lock, table = open_lock(kind, names.table, names.sem, pytest.fail, spin=spin, busy_ms=60_000)
    assert not lock.acquire(0.12)
    assert lock.refusal == "put lock busy"
    assert not lock.held
    assert _owner(table) == holder.proc.pid
    holder.release()
    assert lock.acquire(10), lock.refusal
    assert _owner(table) == os.getpid()
    assert table.get(layout.LOCK_RECOVERIES) == 0
    lock.release()


def test_a_lock_held_past_the_busy_bound_is_refused_at_once(
    kind: str, names: Names, holders: list[Holder]
) -> None:
    holders.append(Holder(kind, names))
    lock, table = open_lock(kind, names.table, names.sem, pytest.fail, busy_ms=1)
    since_ms = table.get(layout.PUT_LOCK_SINCE_MS)
    while time.time_ns() // 1_000_000 <= since_ms + 1:  # the hold is older than busy_ms
        time.sleep(0.001)
    started = time.monotonic()
    assert not lock.acquire(60)
    assert "osPageCacheBusyTimeOutMills" in lock.refusal
    assert time.monotonic() - started < 30, "refused, not queued for the minute"


@pytest.mark.parametrize("spin", [False, True], ids=["mutex", "spin"])
def test_a_holder_killed_inside_is_taken_over_with_its_put_undone_and_counted(
    kind: str, names: Names, holders: list[Holder], spin: bool
) -> None:
    holders.append(holder := Holder(kind, names))
    undone: list[int] = []
    lock, table = open_lock(kind, names.table, names.sem, lambda: undone.append(1), spin=spin)
    holder.kill()
    assert lock.acquire(10), lock.refusal
    assert undone == [1]
    assert table.get(layout.LOCK_RECOVERIES) == 1
    assert _owner(table) == os.getpid()
    lock.release()
    assert lock.acquire(0), "a taken-over lock is released as any other"
    lock.release()
    assert undone == [1]


def test_a_semaphore_taken_by_a_process_that_died_before_its_pid_is_taken_over_after_the_orphan_bound(
    names: Names, holders: list[Holder]
) -> None:
    holders.append(Holder("semaphore", names, mode="orphan"))
    undone: list[int] = []
    lock, table = open_lock("semaphore", names.table, names.sem, lambda: undone.append(1))
    assert table.get(layout.PUT_LOCK_OWNER_PID) == 0
    assert not lock.acquire(ORPHAN_AFTER_MS / 1000 / 4), "too early for an orphan"
    assert lock.acquire(10 + ORPHAN_AFTER_MS / 1000), lock.refusal
    assert undone == [1]
    assert table.get(layout.LOCK_RECOVERIES) == 1
    lock.release()
    assert lock.acquire(0)
    lock.release()
