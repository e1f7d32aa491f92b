"""StoreShm: every shared object of one running store, created by the supervisor or attached.

Creation order and sizes are fixed at start (nothing on the put path allocates shared
memory). `unlink_all` removes everything with the store's name prefix, which is
also how a restarted supervisor clears a crashed run's leftovers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import posix_ipc

from rmq_mp.errors import ShmAttachError
from shm import layout
from shm.flush_requests import FlushRequestRing
from shm.layout import Role
from shm.members import MemberTable
from shm.names import ShmNames
from shm.pointer_table import PointerTable, now_ms, pid_alive_since
from shm.queue_offsets import GroupOffsetTable, QueueOffsetTable
from shm.replica_requests import ReplicaRequestRing
from shm.roles import ROLES
from shm.schedule_offsets import ScheduleOffsetTable
from shm.segment import SharedSegment
from shm.semaphores import (
    ORPHAN_AFTER_MS,
    TakeoverGate,
    Wakeup,
    acquire,
    attach_semaphore,
    create_semaphore,
    try_acquire,
    unlink_semaphore,
)
from shm.transient_pool import FREE, TransientPool
from shm.waiters import WaiterTable

log = logging.getLogger("rmq_mp.shm")

FLAGS_LOCK_TIMEOUT_S = 5.0
"""The flags lock guards a few loads and stores; a wait this long means a holder died in it."""


@dataclass(frozen=True, slots=True)
class ShmSizes:
    """Capacities fixed at start, from broker.conf (the supervisor reads them; each table's header
    records its own, so attachers open the same objects)."""

    pool_buffers: int
    pool_buffer_size: int
    flush_ring: int
    """maxSyncFlushRequestNum"""
    waiters: int
    """maxConsumerNum"""
    queues: int
    """maxConsumeQueueNum"""
    groups: int
    """maxConsumerOffsetNum"""
    delay_levels: int
    """messageDelayLevel entries"""
    replica_ring: int = 0
    """SYNC_MASTER: maxSyncFlushRequestNum (0: no replica-request ring)"""


class StoreShm:
    """One process's handles on the store's shared memory and semaphores."""

    def __init__(
        self,
        names: ShmNames,
        role: Role,
        table: PointerTable,
        queues: QueueOffsetTable,
        ring: FlushRequestRing,
        waiters: WaiterTable,
        pool: TransientPool,
        groups: GroupOffsetTable,
        members: MemberTable,
        schedule: ScheduleOffsetTable,
    ) -> None:
        self.names = names
        self.groups = groups
        self.members = members
        self.schedule = schedule
        self.role = role
        self.table = table
        self.queues = queues
        self.ring = ring
        self.waiters = waiters
        self.pool = pool
        self._sems: dict[str, posix_ipc.Semaphore] = {}
        self._flush_done: list[posix_ipc.Semaphore | None] = [None] * ring.capacity
        self.replicas: ReplicaRequestRing | None = None
        """SYNC_MASTER's replica-request ring (shm/replica_requests.py); None for other roles."""
        self._replica_done: list[posix_ipc.Semaphore | None] = []
        self._wakeups: dict[str, Wakeup] = {}

    # ------------------------------------------------------------------ create / attach

    @classmethod
    def create(cls, names: ShmNames, sizes: ShmSizes) -> StoreShm:
        """Supervisor only: create everything (exclusive, mode 0600)."""
        table = PointerTable.create(names.pointer_table)
        queues = QueueOffsetTable.create(names.queue_offsets, sizes.queues)
        ring = FlushRequestRing.create(names.flush_requests, sizes.flush_ring)
        waiters = WaiterTable.create(names.waiters, sizes.waiters)
        groups = GroupOffsetTable.create(names.group_offsets, sizes.groups)
        members = MemberTable.create(names.members, sizes.waiters)
        schedule = ScheduleOffsetTable.create(names.schedule_offsets, sizes.delay_levels)
        buffers = [
            SharedSegment.create(names.pool_buffer(i), sizes.pool_buffer_size)
            for i in range(sizes.pool_buffers)
        ]
        table.set(layout.POOL_SIZE, sizes.pool_buffers)
        assert sizes.pool_buffers <= layout.POOL_SLOTS, "config validation bounds transientStorePoolSize"
        for i in range(layout.POOL_SLOTS):
            table.set(layout.pool_file_offset(i), FREE)
        shm = cls(
            names,
            Role.SUPERVISOR,
            table,
            queues,
            ring,
            waiters,
            TransientPool(table, buffers),
            groups,
            members,
            schedule,
        )
        if sizes.replica_ring:
            shm._set_replicas(ReplicaRequestRing.create(names.replica_requests, sizes.replica_ring))
        for name, initial in shm._semaphore_specs(sizes):
            shm._sems[name] = create_semaphore(name, initial)
        return shm

    def _set_replicas(self, ring: ReplicaRequestRing) -> None:
        self.replicas = ring
        self._replica_done = [None] * ring.capacity

    def replica_done(self, slot: int) -> posix_ipc.Semaphore:
        """The completion semaphore of replica-request ring slot ``slot``."""
        sem = self._replica_done[slot]
        if sem is None:
            sem = self._replica_done[slot] = self.semaphore(self.names.replica_done(slot))
        return sem

    def _semaphore_specs(self, sizes: ShmSizes) -> list[tuple[str, int]]:
        n = self.names
        specs = [(n.put_lock, 1), (n.flags_lock, 1)]
        specs += [(n.wakeup(r), 0) for r in ROLES] + [(n.ready(r), 0) for r in ROLES]
        specs += [(n.flush_done(i), 0) for i in range(sizes.flush_ring)]
        specs += [(n.replica_done(i), 0) for i in range(sizes.replica_ring)]
        specs += [(n.waiter(i), 0) for i in range(sizes.waiters)]
        return specs

    @classmethod
    def attach(cls, names: ShmNames, role: Role) -> StoreShm:
        table = PointerTable.attach(names.pointer_table, role)
        try:
            queues = QueueOffsetTable.attach(names.queue_offsets, role)
            ring = FlushRequestRing.attach(names.flush_requests, role)
            waiters = WaiterTable.attach(names.waiters, role)
            groups = GroupOffsetTable.attach(names.group_offsets, role)
            members = MemberTable.attach(names.members, role)
            schedule = ScheduleOffsetTable.attach(names.schedule_offsets, role)
            buffers = [SharedSegment.attach(names.pool_buffer(i)) for i in range(table.get(layout.POOL_SIZE))]
        except ShmAttachError:
            table.close()
            raise
        shm = cls(
            names,
            role,
            table,
            queues,
            ring,
            waiters,
            TransientPool(table, buffers),
            groups,
            members,
            schedule,
        )
        with contextlib.suppress(ShmAttachError):  # absent but for a SYNC_MASTER
            shm._set_replicas(ReplicaRequestRing.attach(names.replica_requests, role))
        return shm

    def semaphore(self, name: str) -> posix_ipc.Semaphore:
        sem = self._sems.get(name)
        if sem is None:
            sem = self._sems[name] = attach_semaphore(name)
        return sem

    def flush_done(self, slot: int) -> posix_ipc.Semaphore:
        """The completion semaphore of flush-request ring slot ``slot`` (by index: a SYNC put
        waits on one every time, and naming it each time cost more than the lookup)."""
        sem = self._flush_done[slot]
        if sem is None:
            sem = self._flush_done[slot] = self.semaphore(self.names.flush_done(slot))
        return sem

    def waiter(self, slot: int) -> posix_ipc.Semaphore:
        """The semaphore of consumer-table slot ``slot``, which reput posts to wake a parked
        consumer (opened on first use: most of maxConsumerNum slots are never used)."""
        return self.semaphore(self.names.waiter(slot))

    def wakeup(self, role: str) -> Wakeup:
        wakeup = self._wakeups.get(role)
        if wakeup is None:
            wakeup = self._wakeups[role] = Wakeup(self.semaphore(self.names.wakeup(role)), self.table, role)
        return wakeup

    def wake(self, role: str) -> None:
        """Wake a worker (RocketMQ's ``service.wakeup()``)."""
        self.wakeup(role).wakeup()

    @contextmanager
    def flags_lock(self, purpose: str) -> Iterator[None]:
        """Hold the store's flags lock: it guards the running flags, slot claims in the consumer,
        group-offset and metrics tables, manual requests and the supervisor's config persist.
        Its owner's pid is written just after it is taken, so a holder killed inside is found
        dead and the lock taken over (`_take_flags_lock_over`). Raises ShmAttachError naming
        ``purpose`` and the holder if a live one keeps it FLAGS_LOCK_TIMEOUT_S."""
        lock = self.semaphore(self.names.flags_lock)
        if not (try_acquire(lock) or self._flags_lock_contended(lock)):
            holder = self.table.get(layout.FLAGS_LOCK_OWNER_PID)
            raise ShmAttachError(
                f"flags lock of {self.names.base} busy for {FLAGS_LOCK_TIMEOUT_S:.0f} s (held by pid "
                f"{holder or 'unknown'}, alive): cannot {purpose}"
            )
        table = self.table
        table.set(layout.FLAGS_LOCK_OWNER_PID, os.getpid())
        table.set(layout.FLAGS_LOCK_SINCE_MS, now_ms())
        try:
            yield
        finally:
            table.set(layout.FLAGS_LOCK_OWNER_PID, 0)
            table.set(layout.FLAGS_LOCK_SINCE_MS, 0)
            lock.release()

    def _flags_lock_contended(self, lock: posix_ipc.Semaphore) -> bool:
        """Wait for the flags lock in slices; between them, a holder found dead (or none written
        for ORPHAN_AFTER_MS: it died between taking the lock and writing its pid) is taken over.
        True once this process holds it. A holder pid now running a process started after the
        lock was taken (FLAGS_LOCK_SINCE_MS) is a reused pid: its holder is dead."""
        deadline = time.monotonic() + FLAGS_LOCK_TIMEOUT_S
        orphan_since = 0.0
        while True:
            if acquire(lock, min(0.05, max(deadline - time.monotonic(), 0))):
                return True
            owner = self.table.get(layout.FLAGS_LOCK_OWNER_PID)
            if owner and not pid_alive_since(owner, self.table.get(layout.FLAGS_LOCK_SINCE_MS)):
                if self._take_flags_lock_over(lock, owner):
                    return True
            elif not owner:
                orphan_since = orphan_since or time.monotonic()
                if (time.monotonic() - orphan_since) * 1000 >= ORPHAN_AFTER_MS and self._take_flags_lock_over(
                    lock, 0
                ):
                    return True
            else:
                orphan_since = 0.0
            if time.monotonic() >= deadline:
                return False

    def _take_flags_lock_over(self, lock: posix_ipc.Semaphore, dead_owner: int) -> bool:
        """Inherit a flags lock whose holder died in it; one taker wins (`TakeoverGate`, itself
        released by the kernel if that taker dies too). What it guards needs no undo: each guarded
        change is one aligned word store (the running flags' read-modify-write, a slot's owner
        pid, a request counter), or a slot claim whose owner pid is written last and is reaped as
        dead by the claims' own liveness checks."""
        with self.takeover_gate(TakeoverGate.FLAGS).entered() as entered:
            if not entered:
                return False
            if try_acquire(lock):  # released meanwhile: plain ownership
                return True
            if self.table.get(layout.FLAGS_LOCK_OWNER_PID) != dead_owner:
                return False  # another waiter took it over first
            self.table.add(layout.FLAGS_LOCK_RECOVERIES, 1)
            self.table.set(layout.FLAGS_LOCK_LAST_DEAD_PID, dead_owner)
            log.warning("flags lock of %s taken over from dead holder pid %d", self.names.base, dead_owner)
            return True

    def takeover_gate(self, gate: int) -> TakeoverGate:
        """The gate of a lock takeover (`TakeoverGate.PUT` or `.FLAGS`) of this store."""
        return TakeoverGate("/dev/shm" + self.names.pointer_table, gate)

    def update_running_flags(self, *, set_bits: int = 0, clear_bits: int = 0) -> int:
        """RunningFlags read-modify-write under the flags lock (several workers write them).
        Returns the flags before the change (RocketMQ's getAndMakeDiskFull/-OK tell whether
        the bit changed)."""
        with self.flags_lock("update the running flags"):
            before = self.table.get(layout.RUNNING_FLAGS)
            after = (before | set_bits) & ~clear_bits
            if after != before:
                self.table.set(layout.RUNNING_FLAGS, after)
            return before

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        for sem in self._sems.values():
            sem.close()
        self._sems.clear()
        self._wakeups.clear()
        for table in (
            self.table,
            self.queues,
            self.ring,
            self.waiters,
            self.groups,
            self.members,
            self.schedule,
        ):
            table.close()
        if self.replicas is not None:
            self.replicas.close()
        for buf in self.pool.buffers:
            buf.close()

    @staticmethod
    def unlink_all(names: ShmNames) -> list[str]:
        """Supervisor only: remove every segment and semaphore of this store. Returns what went."""
        removed = []
        for entry in names.leftovers():
            if entry.startswith("sem."):
                if unlink_semaphore("/" + entry[4:]):
                    removed.append(entry)
            elif SharedSegment.unlink("/" + entry):
                removed.append(entry)
        return removed


DESCRIPTOR_SIZE = 64 * 1024


def write_descriptor(names: ShmNames, payload: dict[str, object]) -> SharedSegment:
    """Supervisor only: publish the store's root and effective settings, so any process can
    attach by shm name alone. Length-prefixed UTF-8 JSON in its own segment."""
    raw = json.dumps(payload, sort_keys=True).encode("utf-8")
    if len(raw) + 8 > DESCRIPTOR_SIZE:
        raise ValueError("store descriptor too large")
    segment = SharedSegment.create(names.descriptor, DESCRIPTOR_SIZE)
    segment.mm[8 : 8 + len(raw)] = raw
    segment.mm[0:8] = len(raw).to_bytes(8, "little")
    return segment


def read_descriptor(names: ShmNames) -> dict[str, Any]:
    segment = SharedSegment.attach(names.descriptor)
    try:
        length = int.from_bytes(segment.mm[0:8], "little")
        payload: dict[str, Any] = json.loads(bytes(segment.mm[8 : 8 + length]))
    finally:
        segment.close()
    return payload
