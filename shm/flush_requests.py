"""SYNC_FLUSH request ring: GroupCommitService's request list across processes.

``maxSyncFlushRequestNum`` slots (the setting): one per lock hold waiting for its flush, so
it bounds the SYNC producers that can wait at once; a put that finds every slot taken is
answered FLUSH_DISK_TIMEOUT with that reason. A producer that needs its record durable takes
a ticket under the put lock, writes
(next_offset, deadline) into slot ``ticket % capacity`` and waits on that slot's semaphore. The
flusher completes every waiting slot whose offset is flushed (FlushDiskWatcher's role too: a
waiting slot past its deadline is completed as timed out). Slot layout (native int64):

    off field        writer
      0 state        producer: FREE->WAITING, DONE_*->FREE; flusher: WAITING->DONE_OK/DONE_TIMEOUT
      8 next_offset  producer under the put lock (end offset of its record)
     16 deadline_ms  producer under the put lock (creation + syncFlushTimeout)
     24 pid          producer under the put lock
A producer that gives up (its own wait timed out) sets ABANDONED; the flusher frees it. A late
post on a reused slot is harmless: the waiter re-checks ``state`` after every wake.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from shm.layout import Lock, Role
from shm.slot_table import SlotTable, Writers, check_slot_layout

SLOT_SIZE = 32
FREE, WAITING, DONE_OK, DONE_TIMEOUT, ABANDONED = 0, 1, 2, 3, 4
STATE, NEXT_OFFSET, DEADLINE_MS, PID = 0, 8, 16, 24


class FlushRequestRing(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    FIELDS: ClassVar[dict[str, int]] = {
        "state": STATE,
        "next_offset": NEXT_OFFSET,
        "deadline_ms": DEADLINE_MS,
        "pid": PID,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        "state": Writers(Role.PRODUCER, Role.FLUSHER),
        "next_offset": Writers(Role.PRODUCER, lock=Lock.PUT),
        "deadline_ms": Writers(Role.PRODUCER, lock=Lock.PUT),
        "pid": Writers(Role.PRODUCER, lock=Lock.PUT),
    }

    def waiting(self) -> int:
        """Requests waiting for their flush now (the fill level against maxSyncFlushRequestNum)."""
        return int(np.count_nonzero(self.column(STATE) == WAITING))


check_slot_layout("FlushRequestRing", SLOT_SIZE, FlushRequestRing.FIELDS, writers=FlushRequestRing.WRITERS)
