"""Consumer table: every attached consumer has a slot, for long polling and for file holds.

Consumers blocked in `pull` register here and reput wakes them; a consumer reading commit-log
files publishes the lowest physical offset it reads in ``hold`` (RocketMQ's `MappedFile.hold()`
across processes), and the cleaner waits for it before deleting a file, up to
`destroyMapedFileIntervalForcibly`. A dead consumer's slot is ignored (its pid is checked), so a
crash never pins a file.

Slot layout (native int64), one semaphore per slot (``ShmNames.waiter``):

    off field        writer
      0 pid          consumer (claims a slot whose pid is 0 or dead, under the flags lock)
      8 waiting      consumer: 1 before blocking, 0 after; reput reads it
     16 queue_slot   consumer: queue-offset-table slot it waits on (-1: any)
     24 offset       consumer: wakes once dispatched_offset > offset
     32 hold         consumer: lowest commit-log offset it is reading, -1 none (set before pid)
Reput posts the semaphore of every waiting slot whose queue advanced (RocketMQ's
PullRequestHoldService notified by `arriving`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shm.slot_table import SlotTable

SLOT_SIZE = 40
DEFAULT_CAPACITY = 64
PID, WAITING, QUEUE_SLOT, OFFSET, HOLD = 0, 8, 16, 24, 32
NO_HOLD = -1


class WaiterTable(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    DEFAULT_CAPACITY = DEFAULT_CAPACITY

    def waiting_slots(self) -> list[int]:
        """Slots whose consumer is parked (WAITING = 1), found in one vectorised comparison:
        reput asks after every pass that dispatched, and most of the 64 slots are idle."""
        column = np.frombuffer(self.segment.mm, dtype=np.int64, count=self.capacity * SLOT_SIZE // 8)
        return np.flatnonzero(column[WAITING // 8 :: SLOT_SIZE // 8] == 1).tolist()

    def holders_below(self, end_offset: int, alive: Callable[[int], bool]) -> list[int]:
        """Pids of live consumers holding a commit-log offset below ``end_offset``."""
        found = []
        for slot in range(self.capacity):
            pid = self.get(slot, PID)
            hold = self.get(slot, HOLD)
            if pid and 0 <= hold < end_offset and alive(pid):
                found.append(pid)
        return found
