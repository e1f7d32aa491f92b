"""Named POSIX semaphores standing in for RocketMQ's locks and CountDownLatches.

- `PutLock`: the commit-log put lock (a binary semaphore). Its owner's pid is in the pointer
  table; a waiter that finds the owner dead takes the lock over (through a `TakeoverGate` so
  only one does), undoes the dead owner's half-done put from the put journal and carries on.
- `TakeoverGate`: one taker at a time for a lock whose holder died, released by the kernel if
  that taker dies too (an open-file-description lock, not a semaphore).
- `Wakeup`: a worker's ServiceThread `wakeup()`/`waitForRunning()` pair: a counting semaphore
  plus the worker's ``notified`` flag so wakers do not pile up posts.
Created (mode 0600, exclusive) and unlinked only by the supervisor; everyone else attaches.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import posix_ipc

from rmq_mp import file_modes
from rmq_mp.errors import ShmAttachError
from shm import layout
from shm.pointer_table import PointerTable, pid_alive
from shm.put_lock import HeldPutLock

SPIN_S = 20e-6
"""How long a contended put lock is watched before sleeping in the kernel: contended hand-offs
that sleep do not scale (measured on this kind of machine before the lock was built:
spinning briefly before blocking roughly doubles multi-producer throughput; `python -m
bench.put_lock` measures the lock today), and a hold is a few microseconds. The watch peeks at the semaphore's
value (80 ns) and tries only when it is free (a failed try raises, 0.7 us), yielding between
peeks so a holder that lost its CPU gets it back (8 producers on 2 cores)."""
ORPHAN_AFTER_MS = 1000
"""A lock held with no owner pid for this long was left by a process that died between taking
(or releasing) the semaphore and writing the owner field."""
_SLICE_S = 0.05
_OWNER = layout.PUT_LOCK_OWNER_PID.index
_SINCE = layout.PUT_LOCK_SINCE_MS.index


def create_semaphore(name: str, initial: int) -> posix_ipc.Semaphore:
    return posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=file_modes.shm_mode(), initial_value=initial)


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


def spin_until(ready: Callable[[], bool], spin_s: float) -> bool:
    """Poll ``ready`` for up to ``spin_s``, yielding the CPU between polls; True once it is.
    A cross-process semaphore wake costs 50-70 us across cores (`python -m bench.wakeup`), a poll of a
    shared word about a microsecond: a waiter that expects more work soon spins first."""
    if spin_s <= 0:
        return False
    deadline = time.perf_counter() + spin_s
    while not ready():
        if time.perf_counter() >= deadline:
            return False
        os.sched_yield()
    return True


class PutLock(HeldPutLock):
    """The put lock on a semaphore (PUT_LOCK_KIND LOCK_SEMAPHORE: the reference, and the lock of a
    store whose supervisor has no compiled core). The owner's pid is written just after the
    semaphore is taken, so a holder that dies in between is taken over after ORPHAN_AFTER_MS.

    As RocketMQ's `useReentrantLockWhenPutMessage`: a mutex (``spin`` False: a contended
    acquire watches the lock for SPIN_S, then sleeps in the kernel) or a spin lock."""

    def __init__(
        self,
        sem: posix_ipc.Semaphore,
        takeover: TakeoverGate,
        table: PointerTable,
        on_takeover: Callable[[], None],
        *,
        spin: bool = False,
        busy_ms: int = 1000,
    ) -> None:
        super().__init__(table, on_takeover, spin=spin, busy_ms=busy_ms)
        self.sem = sem
        self.takeover = takeover

    def acquire(self, timeout_s: float) -> bool:
        """Take the lock within ``timeout_s``; False on timeout (a live owner kept it)."""
        try:
            self.sem.acquire(0)
        except posix_ipc.BusyError:
            return self._acquire_contended(timeout_s)
        self._owned_ns = now_ns = time.time_ns()  # `_owned`, inlined: every put takes the lock
        self.acquired_ms = now_ms = now_ns // 1_000_000
        words = self._words
        words[_OWNER] = self.pid
        words[_SINCE] = now_ms
        self.held = True
        return True

    def _acquire_contended(self, timeout_s: float) -> bool:
        """Watch, then sleep (mutex) or keep watching (spin lock), in slices: between slices a
        holder that died is taken over. Refused at once, and at any slice, while a live holder
        has held the lock over ``busy_ms`` (RocketMQ's isOSPageCacheBusy, checked before a put
        waits: here, off the path of a free lock)."""
        sem = self.sem
        deadline = time.monotonic() + timeout_s
        orphan_since = 0.0
        watch_s = _SLICE_S if self.spin else SPIN_S
        while True:
            if self._busy():
                return False
            watch_until = time.perf_counter() + watch_s
            while time.perf_counter() < watch_until:
                if sem.value and try_acquire(sem):
                    return self._owned()
                os.sched_yield()
            remaining = deadline - time.monotonic()
            if not self.spin and acquire(self.sem, min(_SLICE_S, max(remaining, 0))):
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
                self.refusal = "put lock busy"
                return False

    def _owned(self) -> bool:
        self._words[_OWNER] = self.pid
        return super()._owned()

    def _take_over(self, dead_owner: int) -> bool:
        """Inherit a lock whose owner died holding it. One taker wins (the takeover gate)."""
        with self.takeover.entered() as entered:
            if not entered:
                return False
            if try_acquire(self.sem):  # released meanwhile: plain ownership
                return self._owned()
            if self.table.get(layout.PUT_LOCK_OWNER_PID) != dead_owner:
                return False  # another waiter took it over first
            return self._taken_over()

    def release(self) -> None:
        self._words[_OWNER] = 0
        self._hold_ends()
        self.sem.release()


class Wakeup:
    """ServiceThread's wakeup/waitForRunning across processes, RocketMQ's ``hasNotified`` flag
    included: the worker's ``notified`` word is 1 while it is awake or a wake is pending, so a
    waker posts the semaphore only to a worker that is going to sleep or asleep. (Clearing the
    flag on waking instead made every put during a pass post again: a futex wake per put.)"""

    def __init__(self, sem: posix_ipc.Semaphore, table: PointerTable, role: str) -> None:
        self.sem = sem
        self.table = table
        self.notified = layout.worker_field(role, "notified")
        self._words = table.words(self.notified)
        self._index = self.notified.index

    def wakeup(self) -> None:
        words = self._words
        if words[self._index] == 0:
            words[self._index] = 1
            self.sem.release()

    def interrupt(self) -> None:
        """Post whatever the flag says: a stop request, which must also end a `sleep`."""
        self.sem.release()

    def sleep(self, timeout_s: float) -> None:
        """Sleep ``timeout_s`` through every wakeup but an `interrupt`: the flag stays set, so
        no waker posts (a timed flusher's interval, which puts must not shorten)."""
        acquire(self.sem, timeout_s)

    def wait(self, timeout_s: float, has_work: Callable[[], bool] = lambda: False) -> bool:
        """Sleep until woken or ``timeout_s`` passes; True if woken. The flag is armed first and
        ``has_work`` checked after arming, so work published before the arming is not slept
        through (a waker that saw the flag still set did not post)."""
        words = self._words
        words[self._index] = 0
        if has_work():
            words[self._index] = 1
            return True
        woken = acquire(self.sem, timeout_s)
        words[self._index] = 1
        return woken


class TakeoverGate:
    """One taker at a time for a lock whose holder died (the put lock's semaphore kind, the flags
    lock): an open-file-description lock (F_OFD_SETLK) on one byte of the pointer table's
    segment, past its end. The kernel drops it with the taker's descriptor, so a taker killed
    inside the gate blocks no later one; the POSIX semaphore it replaces stayed taken for good.
    Entered only on a takeover (rare), so its open/lock/close syscalls cost nothing on puts."""

    PUT, FLAGS = 0, 1
    """The gates' bytes (offsets past TABLE_SIZE, so no data is ever locked)."""

    def __init__(self, segment_path: str, gate: int) -> None:
        self.path = segment_path
        self.offset = layout.TABLE_SIZE + gate

    @contextmanager
    def entered(self) -> Iterator[bool]:
        """True inside the gate; False at once if another taker is inside (no waiting: the
        caller's own loop comes back, as it did for the semaphore's try-acquire)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # the segment is gone: the store is being removed, nothing to take over
            yield False
            return
        try:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, self.offset))
            except OSError:  # EAGAIN/EACCES: held by another open file description
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock


def _flock(kind: int, offset: int) -> bytes:
    """A ``struct flock`` for one byte at ``offset`` (l_pid 0, as OFD locks require)."""
    return struct.pack("hhqqi", kind, os.SEEK_SET, offset, 1, 0)
