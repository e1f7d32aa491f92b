"""Every process role, spelled once: `Role` names a writer of a shared field (shm/layout.py)
and a worker process; `WORKERS` and `STOP_ORDER` order the worker roles; `ROLES` is their
names, the words that name their processes, wakeup semaphores and pointer-table blocks.
"""

from __future__ import annotations

import enum


class Role(enum.Enum):
    """Who runs code that writes shared state: the supervisor, producers, each worker, consumers."""

    SUPERVISOR = "supervisor"
    PRODUCER = "producer"
    ALLOCATOR = "allocator"
    COMMITTER = "committer"
    FLUSHER = "flusher"
    REPUT = "reput"
    CLEANER = "cleaner"
    SCHEDULER = "scheduler"
    HA = "ha"
    CONSUMER = "consumer"


WORKERS = (Role.ALLOCATOR, Role.COMMITTER, Role.FLUSHER, Role.REPUT, Role.CLEANER, Role.SCHEDULER, Role.HA)
"""Worker roles, in start order (each depends only on those before it). `ha` (replication) runs
only on a master with haListenPort set or a SLAVE with haMasterAddress. The order is also the
layout's: each worker's pointer-table block is at its index here."""

ROLES = tuple(role.value for role in WORKERS)
"""The worker roles' names, in start order."""

STOP_ORDER = tuple(
    role.value
    for role in (
        Role.HA,
        Role.SCHEDULER,
        Role.COMMITTER,
        Role.FLUSHER,
        Role.REPUT,
        Role.CLEANER,
        Role.ALLOCATOR,
    )
)
"""The worker roles' names, in stop order: replication first (no slave is sent what may yet be
undone), the scheduler before the put fence (its last deliveries are puts), then the committer,
flusher and reput drain what was put; the cleaner and the allocator last."""
