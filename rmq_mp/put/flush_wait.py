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
from shm.semaphores import acquire
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
        self._ring_words = shm.ring.words
        self._words = table_words
        self.timeout_ms = timeout_ms
        self.pid = pid

    def request(self, end_offset: int, now_ms: int) -> int:
        """Take a ring slot for a group-commit request (put lock held); -1 if the ring is full.

        The ticket is published (FLUSH_REQUEST_SEQ) only after its slot says WAITING: the flusher
        reads the sequence without the lock, and a ticket it saw before the slot was filled
        would look answered and never be looked at again (the put then timed out). Word stores
        (as the rest of the put path), since every SYNC put comes here under the lock."""
        ring, w = self._ring_words, self._words
        word = self.ring.word_index
        capacity = self.ring.capacity
        ticket = w[_FLUSH_SEQ]
        for _ in range(capacity):
            ticket += 1
            slot = ticket % capacity
            state = ring[word(slot, fr.STATE)]
            # A DONE_* slot belongs to its waiter until the waiter frees it (shm/flush_requests.py);
            # taking it earlier let that waiter's FREE overwrite the new request. Past its deadline
            # (+1 s) its waiter has read it or given up, so it may be taken whatever it says.
            if state == fr.FREE or (state != fr.WAITING and ring[word(slot, fr.DEADLINE_MS)] + 1000 < now_ms):
                ring[word(slot, fr.NEXT_OFFSET)] = end_offset
                ring[word(slot, fr.DEADLINE_MS)] = now_ms + self.timeout_ms
                ring[word(slot, fr.PID)] = self.pid
                ring[word(slot, fr.STATE)] = fr.WAITING
                w[_FLUSH_SEQ] = ticket
                return slot
        w[_FLUSH_SEQ] = ticket
        return -1

    def failure(self, ring_slot: int) -> str:
        """Wait for a SYNC put's flush request: "" once its bytes are on disk, else why they
        are FLUSH_DISK_TIMEOUT (no ring slot was free, or the flusher did not answer in time)."""
        if ring_slot < 0:
            return RING_FULL
        return "" if self.wait(ring_slot) == fr.DONE_OK else NOT_FLUSHED

    def wait(self, ring_slot: int) -> int:
        """Wait for a request's completion (the flusher, or its watcher, completes it); returns
        DONE_OK or DONE_TIMEOUT, and frees the slot."""
        sem = self.shm.flush_done(ring_slot)
        ring = self._ring_words
        state_word = self.ring.word_index(ring_slot, fr.STATE)
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            state = ring[state_word]
            if state == fr.DONE_OK or state == fr.DONE_TIMEOUT:
                ring[state_word] = fr.FREE
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # the flusher is not answering (stopped, or dead)
                ring[state_word] = fr.ABANDONED
                return fr.DONE_TIMEOUT
            acquire(sem, remaining)
