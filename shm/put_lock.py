"""The put lock on atomics: the low 32 bits of PUT_LOCK_OWNER_PID are the lock (PUT_LOCK_KIND
LOCK_ATOMIC, chosen by the supervisor when the compiled core is there).

Taking it is one compare-and-swap of 0 to the taker's pid; a contended taker watches it for
SPIN_NS, then sleeps in a futex on that word (bit 30 says someone may sleep, so a release
without waiters makes no system call). The pid in the word is written by the same instruction
that takes the lock, so a holder's death is visible at once: no window between taking a
semaphore and writing its owner, as `shm.semaphores.PutLock` has (ORPHAN_AFTER_MS). A waiter
that finds the owner dead takes the word over with one compare-and-swap (so exactly one waiter
wins) and undoes the dead owner's journal (`on_takeover`), as the semaphore lock does.

The mechanics are in rmq_mp/put/_core.c (Python has no compare-and-swap on shared memory); the
policy (how long to wait, when the lock is busy, when its owner is dead) is here, shared with
the compiled `send`, which takes the lock itself and hands anything but a quick hold to this
class through the Python put path.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from shm import layout
from shm.pointer_table import PointerTable, pid_alive

SPIN_NS = 20_000
"""How long a contended taker watches before sleeping (as shm.semaphores.SPIN_S)."""
SLICE_MS = 50
"""A sleeper looks at its owner's health and its deadline this often."""
_WORD = layout.PUT_LOCK_OWNER_PID.index
_SINCE = layout.PUT_LOCK_SINCE_MS.index


def busy_refusal(words: memoryview, busy_ms: int) -> str:
    """Why a put should not queue for the lock (RocketMQ's isOSPageCacheBusy): a live holder has
    held it over ``busy_ms``; '' otherwise (SINCE is 0 when the lock is free). Either lock kind:
    the owner's pid is `layout.lock_owner` of the owner word."""
    held_ms = time.time_ns() // 1_000_000 - words[_SINCE]
    owner = layout.lock_owner(words[_WORD])
    if busy_ms < held_ms < 10_000_000 and owner and pid_alive(owner):
        return f"the put lock has been held for {held_ms} ms, more than osPageCacheBusyTimeOutMills"
    return ""


class LockCore(Protocol):
    """What rmq_mp/put/_core.c offers for the lock."""

    def lock_acquire(self, table: Any, index: int, pid: int, spin_ns: int, wait_ms: int, /) -> bool: ...
    def lock_release(self, table: Any, index: int, /) -> None: ...
    def lock_cas(self, table: Any, index: int, expected: int, new: int, /) -> bool: ...


class HeldPutLock(ABC):
    """What both kinds of put lock keep of a hold: ``held`` (this process's view, asserted by
    writers), when it began (``acquired_ms``, the put's store timestamp as RocketMQ's
    ``beginLockTimestamp``; PUT_LOCK_SINCE_MS for everyone else), how long the last one lasted,
    and RocketMQ's isOSPageCacheBusy refusal. `AtomicPutLock` and `shm.semaphores.PutLock` add
    how the lock is taken, released and taken over from a dead holder."""

    def __init__(
        self, table: PointerTable, on_takeover: Callable[[], None], *, spin: bool, busy_ms: int
    ) -> None:
        self.table = table
        self.on_takeover = on_takeover
        """Called with the lock taken over from a dead holder: undo its half-done put."""
        self.spin = spin
        """RocketMQ's spin lock (useReentrantLockWhenPutMessage=false): a contended taker never
        sleeps in the kernel, yielding the CPU between looks (for few producers on idle cores)."""
        self.busy_ms = busy_ms
        """RocketMQ's osPageCacheBusyTimeOutMills: a lock a live put has held longer is "busy",
        and a contended `acquire` gives up at once instead of queueing behind it."""
        self.refusal = ""
        """Why the last `acquire` returned False."""
        self.pid = os.getpid()
        self.held = False
        self.acquired_ms = 0
        self.last_hold_ns = -1
        """Duration of this process's last hold (metrics; -1 until a hold ends)."""
        self._owned_ns = 0
        self._words = table.words(layout.PUT_LOCK_OWNER_PID, layout.PUT_LOCK_SINCE_MS)

    def _busy(self) -> bool:
        """A live holder has held the lock longer than ``busy_ms`` (`busy_refusal`)."""
        why = busy_refusal(self._words, self.busy_ms)
        if why:
            self.refusal = why
        return bool(why)

    def _owned(self) -> bool:
        """The hold begins (the lock is this process's)."""
        self.held = True
        self._owned_ns = now_ns = time.time_ns()
        self.acquired_ms = now_ns // 1_000_000
        self._words[_SINCE] = self.acquired_ms
        return True

    def _taken_over(self) -> bool:
        """The hold begins with a dead holder's lock: counted, and its put undone."""
        self._owned()
        self.table.add(layout.LOCK_RECOVERIES, 1)
        self.on_takeover()
        return True

    def _hold_ends(self) -> None:
        assert self.held, "release of a put lock this process does not hold"
        self._words[_SINCE] = 0
        self.held = False
        self.last_hold_ns = time.time_ns() - self._owned_ns  # wall clock: may step, metrics only

    def __enter__(self) -> HeldPutLock:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.release()

    @abstractmethod
    def acquire(self, timeout_s: float) -> bool:
        """Take the lock within ``timeout_s``; False (with `refusal`) if not."""

    @abstractmethod
    def release(self) -> None:
        """End this process's hold."""


class AtomicPutLock(HeldPutLock):
    """One process's handle on the atomic put lock."""

    def __init__(
        self,
        core: LockCore,
        table: PointerTable,
        on_takeover: Callable[[], None],
        *,
        spin: bool = False,
        busy_ms: int = 1000,
    ) -> None:
        super().__init__(table, on_takeover, spin=spin, busy_ms=busy_ms)
        if not 0 < self.pid <= layout.LOCK_OWNER_MASK:
            raise ValueError(f"pid {self.pid} does not fit the lock word")
        self.core = core
        self._buf = table.segment.mm

    def acquire(self, timeout_s: float) -> bool:
        """Take the lock within ``timeout_s``; False on timeout or while a live owner has held
        it over ``busy_ms`` (RocketMQ's isOSPageCacheBusy), with `refusal` saying which."""
        core, buf, pid = self.core, self._buf, self.pid
        if core.lock_acquire(buf, _WORD, pid, 0, 0):
            return self._owned()
        deadline = time.monotonic() + timeout_s
        spin_ns = SLICE_MS * 1_000_000 if self.spin else SPIN_NS
        while True:
            if self._busy():
                return False
            if core.lock_acquire(buf, _WORD, pid, spin_ns, 0 if self.spin else SLICE_MS):
                return self._owned()
            word = self._words[_WORD] & 0xFFFFFFFF
            owner = layout.lock_owner(word)
            if (
                owner
                and not pid_alive(owner)
                and core.lock_cas(buf, _WORD, word, pid | layout.LOCK_WAITERS_BIT)
            ):
                return self._taken_over()
            if time.monotonic() >= deadline:
                self.refusal = "put lock busy"
                return False

    def release(self) -> None:
        self._hold_ends()
        self.core.lock_release(self._buf, _WORD)
