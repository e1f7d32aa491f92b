"""The producer's metrics: every `send`/`send_batch` call's latency, put-lock hold, message count
and failures, added to this process's slot of the store's metrics segment (`shm.metrics`).

Kept outside `producer.py` so the put path stays the put path (one call at the end of a send).
A process claims one slot per store the first time it sends and keeps it; the supervisor serves
the sums (`rmq_mp.tools.monitoring`). A store without the segment, or with every slot held by a live
process, records nothing and says so once in the producer's log. Recording is a few word
stores: it runs on every send, so it must cost well under a microsecond.
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_left
from typing import Any

from rmq_mp.errors import ShmAttachError
from rmq_mp.store.running_store import RunningStore
from shm import layout, metrics
from shm.layout import Role
from shm.metrics import MetricsTable
from shm.pointer_table import pid_alive

log = logging.getLogger("rmq_mp.put.producer")

_BOUNDS = metrics.BOUNDS_US
_FIRST_BOUND_US = _BOUNDS[0]
_SLOTS: dict[tuple[str, int], tuple[MetricsTable, int] | None] = {}
"""Per running store (shm base name and start generation): producers of one process share a slot."""


class PutRecorder:
    """One producer's handle on its process's metrics slot for one store."""

    def __init__(self, store: RunningStore) -> None:
        key = (store.names.base, store.table.get(layout.GENERATION))
        if key not in _SLOTS:
            _SLOTS[key] = _claim(store)
        claimed = _SLOTS[key]
        self._words = claimed[0].writable_words() if claimed else None
        base = claimed[0].slot_word(claimed[1]) if claimed else 0
        self._puts = base + metrics.PUTS // 8
        self._failures = base + metrics.PUT_FAILURES // 8
        self._latency_sum = base + metrics.LATENCY_SUM_US // 8
        self._latency_buckets = base + metrics.LATENCY_BUCKETS // 8
        self._hold_sum = base + metrics.LOCK_HOLD_SUM_US // 8
        self._hold_buckets = base + metrics.LOCK_HOLD_BUCKETS // 8
        self.reference_word = base + metrics.REFERENCE_SENDS // 8 if self._words is not None else -1
        """Word of reference_sends[0] (the compiled core counts there too); -1 without a slot."""

    def native_view(self) -> tuple[Any, ...] | None:
        """What the compiled send records into (rmq_mp/put/_core.c `record_metrics`): the words,
        each field's word index and the bucket bounds; None without a slot."""
        if self._words is None:
            return None
        return (
            self._words,
            self._puts,
            self._failures,
            self._latency_sum,
            self._latency_buckets,
            self._hold_sum,
            self._hold_buckets,
            _BOUNDS,
        )

    def reference(self, why: int, messages: int = 1) -> None:
        """``messages`` sent by the reference for reason ``why`` (an index of REFERENCE_REASONS)."""
        if self._words is not None:
            self._words[self.reference_word + why] += messages

    def record(self, started_ns: int, puts: int, failures: int, lock_hold_ns: int) -> None:
        """One call that began at ``started_ns`` (perf_counter_ns) and ends now;
        ``lock_hold_ns`` < 0 when it never held the put lock. (`MetricsTable.record`'s
        stores, inlined: this runs on every send.)"""
        w = self._words
        if w is None:
            return
        latency_us = (time.perf_counter_ns() - started_ns) // 1000
        w[self._puts] += puts
        if failures:
            w[self._failures] += failures
        w[self._latency_sum] += latency_us
        w[
            self._latency_buckets + (0 if latency_us <= _FIRST_BOUND_US else bisect_left(_BOUNDS, latency_us))
        ] += 1
        if lock_hold_ns >= 0:
            hold_us = lock_hold_ns // 1000
            w[self._hold_sum] += hold_us
            w[self._hold_buckets + (0 if hold_us <= _FIRST_BOUND_US else bisect_left(_BOUNDS, hold_us))] += 1


def _claim(store: RunningStore) -> tuple[MetricsTable, int] | None:
    try:
        table = MetricsTable.attach(store.names.metrics, Role.PRODUCER)
    except ShmAttachError:
        return None
    try:
        with store.shm.flags_lock("claim a metrics slot"):
            pid = os.getpid()
            for slot in range(table.slots):
                owner = table.owner(slot)
                if owner in (0, pid) or not pid_alive(owner):
                    table.claim(slot, pid)
                    return table, slot
    except ShmAttachError:
        table.close()
        return None
    table.close()
    log.warning("all %d producer metrics slots are in use: this producer's puts go unmeasured", table.slots)
    return None
