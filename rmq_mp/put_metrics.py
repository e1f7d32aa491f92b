"""The producer's metrics hook: `timed_send` wraps `Producer.send_batch`.

Kept outside `producer.py` so the put path stays the put path (one decorator line there). Each
producer process claims one slot of the store's metrics segment (`shm.metrics`) the first time it
sends, and adds every call's latency, put-lock hold, message count and failures to it. The
supervisor serves the sums (`workers.ops`). A store without the segment, or with every slot
held by a live process, records nothing and says so once in the producer's log.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from rmq_mp.errors import ShmAttachError
from rmq_mp.running_store import RunningStore
from shm import layout
from shm.metrics import MetricsTable
from shm.pointer_table import pid_alive
from shm.semaphores import PutLock

log = logging.getLogger("rmq_mp.producer")


class _Sender(Protocol):
    store: RunningStore
    lock: PutLock


class _Result(Protocol):
    @property
    def ok(self) -> bool: ...


_S = TypeVar("_S", bound=_Sender)
_R = TypeVar("_R", bound=_Result)


class _Recorder:
    """This process's slot in one store's metrics segment (re-claimed after a store restart)."""

    def __init__(self) -> None:
        self.table: MetricsTable | None = None
        self.slot = -1
        self.generation = 0

    def slot_for(self, store: RunningStore) -> tuple[MetricsTable, int] | None:
        generation = store.table.get(layout.GENERATION)
        if generation != self.generation:
            self.generation = generation
            self._claim(store)
        return (self.table, self.slot) if self.table is not None and self.slot >= 0 else None

    def _claim(self, store: RunningStore) -> None:
        if self.table is not None:
            self.table.close()
        self.table, self.slot = None, -1
        try:
            table = MetricsTable.attach(store.names.metrics)
        except ShmAttachError:
            return
        try:
            with store.shm.flags_lock("claim a metrics slot"):
                pid = os.getpid()
                for slot in range(table.slots):
                    owner = table.owner(slot)
                    if owner in (0, pid) or not pid_alive(owner):
                        table.claim(slot, pid)
                        self.table, self.slot = table, slot
                        return
        except ShmAttachError:
            table.close()
            return
        table.close()
        log.warning(
            "all %d producer metrics slots are in use: this producer's puts go unmeasured", table.slots
        )


_RECORDERS: dict[str, _Recorder] = {}
"""Per store (shm base name): producers of one process share a slot."""


def timed_send(method: Callable[[_S, Any], list[_R]]) -> Callable[[_S, Any], list[_R]]:
    """Decorate ``send_batch``: measure the call and the put-lock hold, record them in shm."""

    @functools.wraps(method)
    def wrapper(self: _S, messages: Any) -> list[_R]:
        self.lock.last_hold_ns = -1  # stays -1 when the call never took the lock
        started_ns = time.perf_counter_ns()
        results = method(self, messages)
        latency_us = (time.perf_counter_ns() - started_ns) // 1000
        recorder = _RECORDERS.setdefault(self.store.names.base, _Recorder())
        found = recorder.slot_for(self.store)
        if found is not None:
            table, slot = found
            hold_ns = self.lock.last_hold_ns
            table.record(
                slot,
                puts=len(results),
                failures=sum(not r.ok for r in results),
                latency_us=latency_us,
                lock_hold_us=hold_ns // 1000 if hold_ns >= 0 else -1,
            )
        return results

    return wrapper
