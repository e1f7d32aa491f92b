"""SYNC_FLUSH, the producer's side of the flush-request ring (shm/flush_requests.py holds the
layout and the whole state machine's description; workers/flusher.py completes requests).

A put that must be durable takes a ticket under the put lock (`FlushRequests.request`), then,
with the lock released, waits for the flusher (or its timeout watcher) to complete it
(`FlushRequests.failure`). The compiled core (rmq_mp/put/_core.c `take_ring_slot`,
`wait_for_flush`) does exactly this for the sends it takes.
"""

from __future__ import annotations

import time

from shm import flush_requests as fr
from shm import layout
from shm.semaphores import Wakeup, acquire
from shm.store_shm import StoreShm

RING_FULL = "every SYNC flush-request slot is taken (maxSyncFlushRequestNum): raise it"
NOT_FLUSHED = "not flushed within syncFlushTimeout"
_FLUSH_SEQ = layout.FLUSH_REQUEST_SEQ.index


class FlushRequests:
    """One producer's handle on the ring: ``table_words`` are its pointer-table words (it
    writes FLUSH_REQUEST_SEQ under the put lock), ``timeout_ms`` the syncFlushTimeout."""

    def __init__(self, shm: StoreShm, table_words: memoryview, timeout_ms: int, pid: int) -> None:
        self.shm = shm
        self.ring = shm.ring
        shm.table.words(layout.FLUSH_REQUEST_SEQ)  # the writer check for the word stores below
        self._words = table_words
        self.timeout_ms = timeout_ms
        self.pid = pid
        self.started_ns = 0
        """When the send being put began (CLOCK_MONOTONIC ns, before the lock), set by the
        producer; the next `request` takes it (0: now)."""
        self.ticket = 0
        """The ticket of this hold's request (0: none), for `wake_gather`."""

    def request(self, end_offset: int, now_ms: int) -> int:
        """Take a ring slot for a group-commit request (put lock held); -1 if the ring is full.
        The ticket is published (FLUSH_REQUEST_SEQ) after its slot says WAITING
        (`FlushRequestRing.take` says why). It carries the send's start (`started_ns`), as the
        compiled core's does."""
        w = self._words
        started_ns, self.started_ns = self.started_ns or time.monotonic_ns(), 0
        slot, w[_FLUSH_SEQ] = self.ring.take(
            w[_FLUSH_SEQ], end_offset, now_ms, self.timeout_ms, self.pid, started_ns
        )
        self.ticket = w[_FLUSH_SEQ] if slot >= 0 else 0
        return slot

    def wake_gather(self, flusher: Wakeup) -> None:
        """After the put lock is released: if this hold's request is the one the flusher's gather
        waits for last (FLUSH_GATHER_TICKET), post its wakeup. The gathering flusher keeps its
        notified flag set, so the other requests post nothing: one wake a gather."""
        ticket, self.ticket = self.ticket, 0
        if ticket and self.shm.table.get(layout.FLUSH_GATHER_TICKET) == ticket:
            flusher.interrupt()

    def failure(self, ring_slot: int) -> str:
        """Wait for a SYNC put's flush request: "" once its bytes are on disk, else why they
        are FLUSH_DISK_TIMEOUT (no ring slot was free, or the flusher did not answer in time)."""
        if ring_slot < 0:
            return RING_FULL
        return "" if self.wait(ring_slot) == fr.DONE_OK else NOT_FLUSHED

    def wait(self, ring_slot: int) -> int:
        """Wait for a request's completion (the flusher, or its watcher, completes it); returns
        DONE_OK or DONE_TIMEOUT, and frees the slot (abandons it if the flusher never answers)."""
        sem = self.shm.flush_done(ring_slot)
        ring = self.ring
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            seen = ring.collect(ring_slot)
            if seen == fr.DONE_OK or seen == fr.DONE_TIMEOUT:
                return seen
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # the flusher is not answering (stopped, or dead)
                ring.abandon(ring_slot, seen)
                return fr.DONE_TIMEOUT
            acquire(sem, remaining)
