"""SYNC_MASTER request ring: GroupTransferService's request list across processes.

The flush-request ring's slots, states and moves (shm/flush_requests.py describes them all),
with the ha worker in the flusher's place: a SYNC_MASTER put that waits for the store takes a
ticket under the put lock (its end offset, its deadline = the put's time + slaveTimeout), and
waits on its slot's semaphore; the master's ha worker completes every waiting request whose
end a slave has acknowledged (HA_ACKED_OFFSET) as DONE_OK and every one past its deadline as
DONE_TIMEOUT, and posts the slot. No one polls: the waiter sleeps until posted or its own
deadline (then it abandons the slot, as a flush waiter does). Created only for a SYNC_MASTER
(``maxSyncFlushRequestNum`` slots; tickets in HA_REQUEST_SEQ).
"""

from __future__ import annotations

from typing import ClassVar

from shm.flush_requests import FlushRequestRing
from shm.layout import Lock, Role
from shm.slot_table import Writers, check_slot_layout


class ReplicaRequestRing(FlushRequestRing):
    WRITERS: ClassVar[dict[str, Writers]] = {
        "state": Writers(Role.PRODUCER, Role.HA),
        "next_offset": Writers(Role.PRODUCER, lock=Lock.PUT),
        "deadline_ms": Writers(Role.PRODUCER, lock=Lock.PUT),
        "pid": Writers(Role.PRODUCER, lock=Lock.PUT),
        "started_ns": Writers(Role.PRODUCER, lock=Lock.PUT),  # unread here (the flusher's gather)
    }


check_slot_layout(
    "ReplicaRequestRing",
    FlushRequestRing.SLOT_SIZE,
    FlushRequestRing.FIELDS,
    writers=ReplicaRequestRing.WRITERS,
)
