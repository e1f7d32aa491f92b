"""Schedule table: each delay level's progress through SCHEDULE_TOPIC_XXXX, while the store runs.

RocketMQ's ScheduleMessageService keeps ``offsetTable`` (level -> next offset in queue
``level - 1``) in its heap and persists it to ``config/delayOffset.json``; here it lives in
shared memory so that the scheduler worker can be restarted without losing it and status,
metrics and rmq-admin read it. One slot per configured level (the capacity is the number of
``messageDelayLevel`` entries, fixed at start); slot ``i`` is level ``i + 1``.

Slot layout (native int64):

    off field        writer
      0 offset       scheduler (the supervisor at start, from delayOffset.json): next queue
                     offset to deliver, advanced only after that message's put succeeded; on
                     a SLAVE (whose scheduler delivers nothing) the ha worker's metadata
                     channel raises it to the master's
      8 next_due_ms  scheduler: delivery time of the entry at ``offset``, -1 when none is in view
     16 delivered    scheduler: messages delivered since the store started, counted before
                     ``offset`` moves past them (whoever sees the offset sees them counted)
     24 delay_ms     supervisor at start: the level's delay (messageDelayLevel)

The supervisor persists ``offset`` to delayOffset.json every ``flushDelayOffsetInterval`` and
at stop, after the scheduler stopped.
"""

from __future__ import annotations

from typing import ClassVar

from shm.layout import Role
from shm.slot_table import SlotTable, Writers, check_slot_layout

SLOT_SIZE = 32
OFFSET, NEXT_DUE_MS, DELIVERED, DELAY_MS = 0, 8, 16, 24
NONE_DUE = -1


class ScheduleOffsetTable(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    FIELDS: ClassVar[dict[str, int]] = {
        "offset": OFFSET,
        "next_due_ms": NEXT_DUE_MS,
        "delivered": DELIVERED,
        "delay_ms": DELAY_MS,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        "offset": Writers(Role.SCHEDULER, Role.SUPERVISOR, Role.HA),
        "next_due_ms": Writers(Role.SCHEDULER, Role.SUPERVISOR),
        "delivered": Writers(Role.SCHEDULER),
        "delay_ms": Writers(Role.SUPERVISOR),
    }

    @property
    def levels(self) -> int:
        """Configured delay levels (slot ``level - 1``)."""
        return self.capacity


check_slot_layout(
    "ScheduleOffsetTable", SLOT_SIZE, ScheduleOffsetTable.FIELDS, writers=ScheduleOffsetTable.WRITERS
)
