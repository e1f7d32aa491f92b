"""The fence: a start of the store that someone stops or starts over takes no more puts.

Producers are processes of their own, attached by shm name: a supervisor's death does not stop
them, and they go on writing into the start's pool buffers, pointer table and commit-log files.
Whoever ends a start therefore fences it first, and only then saves its pool, removes its shared
memory or recovers its files:

- `run.py stop` finding the supervisor dead (FENCED_BY_STOP),
- `run.py start` finding a dead supervisor's shared memory (FENCED_BY_START),
- the supervisor's own shutdown, once the scheduler's last deliveries are in (FENCED_BY_SHUTDOWN).

Fencing takes the put lock (a dead holder's lock is taken over and its half-done put undone, as
any put does) and sets `layout.FENCE` under it; every put reads that word right after taking
the lock (`Producer._fenced_under_lock`, and `fenced` in rmq_mp/put/_core.c), so no put lands
after the fencer's hold: the write position the fencer sees is final, and what the stop saves is
every put ever acknowledged. A live holder that keeps the lock past `FENCE_WAIT_S` (a producer
stopped or hung mid-put) makes the fence refuse, naming its pid: its bytes may still come.

A fenced producer's puts are answered SERVICE_NOT_AVAILABLE with the reason (`fenced_reason`);
its next send attaches to the store's next start by itself once there is one (`_reattach`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rmq_mp.errors import FenceRefusedError, ShmAttachError
from rmq_mp.put.producer import Producer, fenced_reason
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm.layout import Role

FENCE_WAIT_S = 5.0
"""How long a fencer waits for a live put-lock holder (a put takes microseconds; a SYNC put
waits for its flush off the lock) before refusing, naming it."""

__all__ = ["FENCE_WAIT_S", "Fenced", "fence_start", "fenced_reason", "holding_put_lock"]


@dataclass(frozen=True, slots=True)
class Fenced:
    """What fencing a start found."""

    generation: int
    """The start fenced (GENERATION)."""
    wrote_position: int
    """Its write position, final from the fence on."""
    taken_over: int
    """Put locks taken over from a dead holder on the way (its half-done put undone)."""
    already: bool
    """It was fenced before (a stop run twice, a start after a stop that failed later)."""

    def describe(self) -> str:
        took = f", put lock taken over from a dead producer ({self.taken_over})" if self.taken_over else ""
        return f"start {self.generation} fenced at write position {self.wrote_position}{took}"


def attached_producer(name: str) -> Producer:
    """A producer of store ``name``'s start, for the put lock's holders outside the put path
    (`ShmAttachError` when there is no start to attach to)."""
    store = RunningStore.attach(name, Role.PRODUCER, writable_log=True)
    try:
        return Producer(store)
    except BaseException:
        store.close()
        raise


def fence_start(name: str, fenced_by: int, *, wait_s: float = FENCE_WAIT_S) -> Fenced | None:
    """Fence the start of store ``name`` whose shared memory is there (``fenced_by``: one of
    `layout.FENCED_BY_*`). None when there is nothing a producer could attach to (no pointer
    table or no descriptor: no producer ever put there). `FenceRefusedError` when a live
    producer holds the put lock for ``wait_s``."""
    try:
        producer = attached_producer(name)
    except ShmAttachError:
        return None
    try:
        table = producer.table
        already = table.get(layout.FENCE) != layout.FENCE_OPEN
        taken_over = producer.fence(fenced_by, wait_s)
        return Fenced(table.get(layout.GENERATION), table.get(layout.WROTE_POSITION), taken_over, already)
    finally:
        producer.close()


@contextmanager
def holding_put_lock(name: str, what: str, *, wait_s: float = FENCE_WAIT_S) -> Iterator[Producer]:
    """Hold store ``name``'s put lock (a dead holder's taken over, its half-done put undone, as
    a fence takes it) for a change no put may interleave with: rmq-admin deleteTopic's marker
    record and reset of a topic's next queue offsets (workers/topic_delete.py). Yields the
    producer holding it (its appender puts under the lock as a send does). `FenceRefusedError`
    when a live producer keeps it ``wait_s``."""
    producer = attached_producer(name)
    try:
        lock = producer.lock
        lock.busy_ms = 1 << 40
        if not lock.acquire(wait_s):
            holder = layout.lock_owner(producer.table.get(layout.PUT_LOCK_OWNER_PID))
            raise FenceRefusedError(
                f"store {name}: producer pid {holder} holds the put lock after {wait_s:g} s; {what} waits"
            )
        try:
            yield producer
        finally:
            lock.release()
    finally:
        producer.close()
