"""SYNC_MASTER, the producer's side of the replica-request ring (shm/replica_requests.py; the
master's ha worker completes requests, workers/ha.py).

A put that waits for the store takes a ticket under the put lock for the end of what the lock
hold wrote (`ReplicaRequests.request`), unless no slave is connected or the best one is
haSlaveFallbehindMax or more behind (RocketMQ's isSlaveOK: SLAVE_NOT_AVAILABLE at once). With
the lock released it sleeps on its slot's semaphore until the ha worker answers or the deadline
passes: slaveTimeout counted from the put (the lock hold's time), not from any wake-up, so a big
message that took many frames is not given a fresh timeout per wake (RocketMQ #1244, #1535).
"""

from __future__ import annotations

import contextlib
import socket
import time

from rmq_mp.outcomes import PutMessageStatus
from shm import flush_requests as fr
from shm import layout
from shm.semaphores import acquire
from shm.store_shm import StoreShm

NO_SLAVE = -2
"""`request`'s answer when no slave could take the put (SLAVE_NOT_AVAILABLE)."""
NOT_REQUESTED = -3
"""No request was taken (the put stored nothing): nothing to wait for."""
RING_FULL = "every SYNC_MASTER request slot is taken (maxSyncFlushRequestNum): raise it"
NO_SLAVE_REASON = "stored, but no slave is connected or the best one is haSlaveFallbehindMax behind"
TIMEOUT_REASON = "stored, but no slave acknowledged it within slaveTimeout"
_SEQ = layout.HA_REQUEST_SEQ.index
_ACKED = layout.HA_ACKED_OFFSET.index
_CONNECTIONS = layout.HA_CONNECTIONS.index


class ReplicaRequests:
    """One producer's handle on the ring (``table_words``: its pointer-table words)."""

    def __init__(
        self, shm: StoreShm, table_words: memoryview, timeout_ms: int, fallbehind_max: int, pid: int
    ) -> None:
        assert shm.replicas is not None, "a SYNC_MASTER store has the replica-request ring"
        self.shm = shm
        self.ring = shm.replicas
        shm.table.words(layout.HA_REQUEST_SEQ)  # the writer check for the word store below
        self._words = table_words
        self.timeout_ms = timeout_ms
        self.fallbehind_max = fallbehind_max
        self.pid = pid
        self._poke = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._poke.setblocking(False)
        self._wake_address = shm.names.ha_wake

    def wake(self) -> None:
        """After the put lock is released: poke the ha worker's select, so the put's bytes leave
        now rather than at its next look (a lost poke costs one look, 10 ms at most)."""
        with contextlib.suppress(OSError):  # its buffer is full (it looks anyway), or it restarts
            self._poke.sendto(b"\0", self._wake_address)

    def close(self) -> None:
        self._poke.close()

    def request(self, end_offset: int, put_ms: int) -> int:
        """Put lock held: a ring slot for the bytes below ``end_offset``; NO_SLAVE, or -1 when
        the ring is full."""
        w = self._words
        if w[_CONNECTIONS] <= 0 or end_offset - w[_ACKED] >= self.fallbehind_max:
            return NO_SLAVE
        slot, ticket = self.ring.take(w[_SEQ], end_offset, put_ms, self.timeout_ms, self.pid)
        w[_SEQ] = ticket  # published after its slot says WAITING (`FlushRequestRing.take`)
        return slot

    def outcome(self, slot: int, put_ms: int) -> tuple[PutMessageStatus, str]:
        """Wait for the request in ``slot`` (lock released): PUT_OK, SLAVE_NOT_AVAILABLE or
        FLUSH_SLAVE_TIMEOUT, with the reason; counted in the pointer table when not PUT_OK."""
        if slot == NOT_REQUESTED:
            return PutMessageStatus.PUT_OK, ""
        if slot >= 0:
            self.wake()
        if slot == NO_SLAVE:
            status, reason = PutMessageStatus.SLAVE_NOT_AVAILABLE, NO_SLAVE_REASON
        elif slot < 0:
            status, reason = PutMessageStatus.FLUSH_SLAVE_TIMEOUT, RING_FULL
        elif self._wait(slot, put_ms) == fr.DONE_OK:
            return PutMessageStatus.PUT_OK, ""
        else:
            status, reason = PutMessageStatus.FLUSH_SLAVE_TIMEOUT, TIMEOUT_REASON
        self.count(slot == NO_SLAVE)
        return status, reason

    def count(self, no_slave: bool) -> None:
        """One put answered SLAVE_NOT_AVAILABLE (``no_slave``) or FLUSH_SLAVE_TIMEOUT, under the
        flags lock (the compiled core calls this too: rmq_mp/put/_core.c `replica_acknowledge`)."""
        with self.shm.flags_lock("count a SYNC_MASTER outcome"):
            if no_slave:
                self.shm.table.add(layout.HA_SLAVE_NOT_AVAILABLE, 1)
            else:
                self.shm.table.add(layout.HA_FLUSH_SLAVE_TIMEOUT, 1)

    def _wait(self, slot: int, put_ms: int) -> int:
        """DONE_OK or DONE_TIMEOUT; the slot freed (or abandoned when the ha worker never answers)."""
        sem = self.shm.replica_done(slot)
        ring = self.ring
        deadline = time.monotonic() + (put_ms + self.timeout_ms - time.time_ns() // 1_000_000) / 1000
        while True:
            seen = ring.collect(slot)
            if seen == fr.DONE_OK or seen == fr.DONE_TIMEOUT:
                return seen
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # the ha worker is not answering (stopped, dead, or slow)
                ring.abandon(slot, seen)
                return fr.DONE_TIMEOUT
            acquire(sem, remaining)
