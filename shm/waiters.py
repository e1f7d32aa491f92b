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

import struct

from shm.segment import SharedSegment

SLOT_SIZE = 32
DEFAULT_CAPACITY = 64
PID, WAITING, QUEUE_SLOT, OFFSET = 0, 8, 16, 24
_Q = struct.Struct("=q")


class WaiterTable:
    def __init__(self, segment: SharedSegment) -> None:
        self.segment = segment
        self.capacity = segment.size // SLOT_SIZE
        self._buf = segment.mm

    @classmethod
    def create(cls, name: str, capacity: int = DEFAULT_CAPACITY) -> WaiterTable:
        return cls(SharedSegment.create(name, capacity * SLOT_SIZE))

    @classmethod
    def attach(cls, name: str) -> WaiterTable:
        return cls(SharedSegment.attach(name))

    def get(self, slot: int, field: int) -> int:
        return int(_Q.unpack_from(self._buf, slot * SLOT_SIZE + field)[0])

    def set(self, slot: int, field: int, value: int) -> None:
        _Q.pack_into(self._buf, slot * SLOT_SIZE + field, value)

    def close(self) -> None:
        self.segment.close()
