"""Consumer table: every attached consumer has a slot, for long polling and for file holds.

``maxConsumerNum`` slots (the setting), one per live `Consumer` object in any process: a slot
is claimed at attach and freed at close, and a dead process's slots are claimed again (their
pid and start time are checked: a pid the kernel gave a later process is not the consumer's),
so a crash never leaks one.

Consumers blocked in `pull` register here and reput wakes them; a consumer reading commit-log
files publishes the lowest physical offset it reads in ``hold`` (RocketMQ's `MappedFile.hold()`
across processes), and the cleaner waits for it before deleting a file, up to
`destroyMapedFileIntervalForcibly`. A dead consumer's slot is ignored (its pid and start time are
checked, as members' are), so a crash never pins a file.

Slot layout (native int64), one semaphore per slot (``ShmNames.waiter``):

    off field        writer
      0 pid          consumer (claims a slot whose pid is 0 or dead, under the flags lock)
      8 waiting      consumer: 1 before blocking, 0 after; reput reads it, and clears it
                     (1 -> 0) just before it posts the slot's semaphore
     16 queue_slot   consumer: queue-offset-table slot it waits on (-1: any)
     24 offset       consumer: wakes once dispatched_offset > offset
     32 hold         consumer: lowest commit-log offset it is reading, -1 none (set before pid)
     40 joined_ms    consumer: when it claimed the slot (set before pid, under the flags lock);
                     with pid, who holds it (`shm.pointer_table.pid_alive_since`)
Reput posts the semaphore of every waiting slot whose queue advanced (RocketMQ's
PullRequestHoldService notified by `arriving`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar

import numpy as np

from shm.layout import Lock, Role
from shm.slot_table import SlotTable, Writers

SLOT_SIZE = 48
PID, WAITING, QUEUE_SLOT, OFFSET, HOLD, JOINED_MS = 0, 8, 16, 24, 32, 40
NO_HOLD = -1


class WaiterTable(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    FIELDS: ClassVar[dict[str, int]] = {
        "pid": PID,
        "waiting": WAITING,
        "queue_slot": QUEUE_SLOT,
        "offset": OFFSET,
        "hold": HOLD,
        "joined_ms": JOINED_MS,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        "pid": Writers(Role.CONSUMER, lock=Lock.FLAGS),
        "waiting": Writers(Role.CONSUMER, Role.REPUT),
        "queue_slot": Writers(Role.CONSUMER),
        "offset": Writers(Role.CONSUMER),
        "hold": Writers(Role.CONSUMER),
        "joined_ms": Writers(Role.CONSUMER, lock=Lock.FLAGS),
    }

    def waiting_slots(self) -> list[int]:
        """Slots whose consumer is parked (WAITING = 1), found in one vectorised comparison:
        reput asks after every pass that dispatched, and most slots are idle."""
        return (self.column_view(WAITING) == 1).nonzero()[0].tolist()

    def claimable_slots(self, alive: Callable[[int, int], bool]) -> Iterator[int]:
        """Slots a new consumer may claim (flags lock held): free ones first, then those whose
        consumer died without closing. ``alive(pid, joined_ms)``: `pid_alive_since`."""
        pids, joined = self.column(PID), self.column(JOINED_MS)
        yield from np.flatnonzero(pids == 0).tolist()
        for slot in np.flatnonzero(pids != 0).tolist():
            if not alive(int(pids[slot]), int(joined[slot])):
                yield slot

    def live_slots(self) -> int:
        """Slots whose pid is set (a dead consumer's slot counts until it is claimed again)."""
        return int(np.count_nonzero(self.column(PID)))

    def holders_below(self, end_offset: int, alive: Callable[[int, int], bool]) -> list[int]:
        """Pids of live consumers holding a commit-log offset below ``end_offset`` (``alive(pid,
        joined_ms)``: a pid reused by a later process holds nothing)."""
        holds, pids, joined = self.column(HOLD), self.column(PID), self.column(JOINED_MS)
        candidates = np.flatnonzero((pids != 0) & (holds >= 0) & (holds < end_offset))
        return [int(pids[slot]) for slot in candidates.tolist() if alive(int(pids[slot]), int(joined[slot]))]
