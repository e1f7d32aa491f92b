"""Named POSIX semaphores standing in for RocketMQ's locks and CountDownLatches.

- `PutLock`: the commit-log put lock (a binary semaphore). Its owner's pid is in the pointer
  table; a waiter that finds the owner dead takes the lock over (under a takeover semaphore so
  only one does), undoes the dead owner's half-done put from the put journal and carries on.
- `Wakeup`: a worker's ServiceThread `wakeup()`/`waitForRunning()` pair: a counting semaphore
  plus the worker's ``notified`` flag so wakers do not pile up posts.
Created (mode 0600, exclusive) and unlinked only by the supervisor; everyone else attaches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import posix_ipc

from rmq_mp.errors import ShmAttachError
from shm import layout
from shm.pointer_table import PointerTable, now_ms, pid_alive

SPIN_TRIES = 64
"""Non-blocking tries before sleeping in the kernel: contended hand-offs that sleep do not scale
(measurements.md: spinning briefly before blocking roughly doubles multi-producer throughput)."""
ORPHAN_AFTER_MS = 1000
"""A lock held with no owner pid for this long was left by a process that died between taking
(or releasing) the semaphore and writing the owner field."""
_SLICE_S = 0.05


def create_semaphore(name: str, initial: int) -> posix_ipc.Semaphore:
    return posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=initial)


def attach_semaphore(name: str) -> posix_ipc.Semaphore:
    try:
        return posix_ipc.Semaphore(name)
    except posix_ipc.ExistentialError as exc:
        raise ShmAttachError(f"no semaphore {name}: is the store running?") from exc
    except posix_ipc.PermissionsError as exc:
        raise ShmAttachError(f"not allowed to open semaphore {name} (it belongs to another user)") from exc


def unlink_semaphore(name: str) -> bool:
    try:
        posix_ipc.unlink_semaphore(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def try_acquire(sem: posix_ipc.Semaphore) -> bool:
    try:
        sem.acquire(0)
    except posix_ipc.BusyError:
        return False
    return True


def acquire(sem: posix_ipc.Semaphore, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` (0 = poll). False on timeout. A signal whose Python handler
    returns (the supervisor's SIGTERM sets its stop flag) does not end the wait: posix_ipc
    reports the EINTR as SignalError, and the wait goes on for the time left, as SA_RESTART
    would (the supervisor died of it while waiting for a restarted worker's ready semaphore)."""
    deadline = time.monotonic() + max(timeout_s, 0)
    while True:
        try:
            sem.acquire(max(deadline - time.monotonic(), 0))
        except posix_ipc.BusyError:
            return False
        except posix_ipc.SignalError:
            continue
        return True


class PutLock:
    """The put lock of one process. ``held`` is this process's view (asserted by writers)."""

    def __init__(
        self,
        sem: posix_ipc.Semaphore,
        takeover: posix_ipc.Semaphore,
        table: PointerTable,
        on_takeover: Callable[[], None],
    ) -> None:
        self.sem = sem
        self.takeover = takeover
        self.table = table
        self.on_takeover = on_takeover
        self.pid = os.getpid()
        self.held = False
        self._owned_ns = 0
        self.last_hold_ns = -1
        """Duration of this process's last hold (metrics; -1 until a hold ends)."""

    def acquire(self, timeout_s: float) -> bool:
        """Take the lock within ``timeout_s``; False on timeout (a live owner kept it)."""
        for _ in range(SPIN_TRIES):
            if try_acquire(self.sem):
                return self._owned()
        deadline = time.monotonic() + timeout_s
        orphan_since = 0.0
        while True:
            remaining = deadline - time.monotonic()
            if acquire(self.sem, min(_SLICE_S, max(remaining, 0))):
                return self._owned()
            owner = self.table.get(layout.PUT_LOCK_OWNER_PID)
            if owner and not pid_alive(owner):
                if self._take_over(owner):
                    return True
            elif not owner:
                orphan_since = orphan_since or time.monotonic()
                if (time.monotonic() - orphan_since) * 1000 >= ORPHAN_AFTER_MS and self._take_over(0):
                    return True
            else:
                orphan_since = 0.0
            if remaining <= 0:
                return False

    def _owned(self) -> bool:
        self.held = True
        self._owned_ns = time.perf_counter_ns()
        self.table.set(layout.PUT_LOCK_OWNER_PID, self.pid)
        self.table.set(layout.PUT_LOCK_SINCE_MS, now_ms())
        return True

    def _take_over(self, dead_owner: int) -> bool:
        """Inherit a lock whose owner died holding it. One taker wins (takeover semaphore)."""
        if not try_acquire(self.takeover):
            return False
        try:
            if try_acquire(self.sem):  # released meanwhile: plain ownership
                return self._owned()
            if self.table.get(layout.PUT_LOCK_OWNER_PID) != dead_owner:
                return False  # another waiter took it over first
            self._owned()
            self.table.add(layout.LOCK_RECOVERIES, 1)
            self.on_takeover()
            return True
        finally:
            self.takeover.release()

    def release(self) -> None:
        assert self.held, "release of a put lock this process does not hold"
        self.table.set(layout.PUT_LOCK_OWNER_PID, 0)
        self.table.set(layout.PUT_LOCK_SINCE_MS, 0)
        self.held = False
        self.last_hold_ns = time.perf_counter_ns() - self._owned_ns
        self.sem.release()

    def __enter__(self) -> PutLock:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.release()


class Wakeup:
    """ServiceThread's wakeup/waitForRunning across processes."""

    def __init__(self, sem: posix_ipc.Semaphore, table: PointerTable, role: str) -> None:
        self.sem = sem
        self.table = table
        self.notified = layout.worker_field(role, "notified")

    def wakeup(self) -> None:
        if self.table.get(self.notified) == 0:
            self.table.set(self.notified, 1)
            self.sem.release()

    def wait(self, timeout_s: float) -> bool:
        """Wait for a wakeup or the timeout; True if woken. Clears the notified flag."""
        woken = acquire(self.sem, timeout_s)
        self.table.set(self.notified, 0)
        return woken
