"""Long-polling waiter table: consumers blocked in `pull` register here; reput wakes them.

Slot layout (native int64), one semaphore per slot (``ShmNames.waiter``):

    off field        writer
      0 pid          consumer (claims a slot whose pid is 0 or dead, under the flags lock)
      8 waiting      consumer: 1 before blocking, 0 after; reput reads it
     16 queue_slot   consumer: queue-offset-table slot it waits on (-1: any)
     24 offset       consumer: wakes once dispatched_offset > offset
Reput posts the semaphore of every waiting slot whose queue advanced (RocketMQ's
PullRequestHoldService notified by `arriving`).
"""

from __future__ import annotations

from shm.slot_table import SlotTable

SLOT_SIZE = 32
DEFAULT_CAPACITY = 64
PID, WAITING, QUEUE_SLOT, OFFSET = 0, 8, 16, 24


class WaiterTable(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    DEFAULT_CAPACITY = DEFAULT_CAPACITY
