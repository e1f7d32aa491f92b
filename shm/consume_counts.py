"""Messages consumers received, per queue: the per-topic consume counter of the metrics.

One native int64 word per slot of the queue-offset table (`shm.queue_offsets.QueueOffsetTable`,
``maxConsumeQueueNum`` entries plus its headroom): word ``i`` counts the messages every consumer
process has received from the queue in slot ``i`` since the store started. Slots never move, so
the supervisor's scrape sums the words of a topic's slots; the memory is bounded by the queue
table's capacity (8 bytes a queue: 10,000 topics of 8 queues is 0.9 MiB, and /dev/shm gives
pages only to words written). The per-topic put counter needs no segment of its own: reput's
dispatch already writes each queue's ConsumeQueue max offset there, once per record.

Header (native int64):

    off field     writer
      0 magic     supervisor (create)
      8 slots     supervisor (create)

Word ``HEADER_WORDS + i``: consumers (any process), under the flags lock: a pull that returns
messages adds how many (read-modify-write; several consumer processes read the same queue, and
Python has no atomic add on shared memory). The lock is taken once per non-empty pull.
"""

from __future__ import annotations

from shm.layout import Lock, Role
from shm.segment import SharedSegment
from shm.slot_table import Writers

MAGIC = 0x524D51434F4E5331  # "RMQCONS1"
HEADER_WORDS = 2
H_MAGIC, H_SLOTS = 0, 1

WRITERS: dict[str, Writers] = {
    "header": Writers(Role.SUPERVISOR),
    "counts": Writers(Role.CONSUMER, lock=Lock.FLAGS),
}


class ConsumeCounts:
    """One process's view: `add` for consumers, `count` for the scrape."""

    def __init__(self, segment: SharedSegment, role: Role) -> None:
        self.segment = segment
        self.role = role
        self._words = segment.words
        self.slots = int(self._words[H_SLOTS])

    @classmethod
    def create(cls, name: str, slots: int) -> ConsumeCounts:
        """Supervisor only: one word per queue-offset-table slot (``QueueOffsetTable.slots``)."""
        segment = SharedSegment.create(name, (HEADER_WORDS + slots) * 8)
        segment.words[H_SLOTS] = slots
        segment.words[H_MAGIC] = MAGIC
        return cls(segment, Role.SUPERVISOR)

    @classmethod
    def attach(cls, name: str, role: Role) -> ConsumeCounts:
        from rmq_mp.errors import ShmAttachError

        segment = SharedSegment.attach(name)
        if segment.words[H_MAGIC] != MAGIC:
            segment.close()
            raise ShmAttachError(f"{name} is not an rmq-mp consume-count segment")
        return cls(segment, role)

    def add(self, slot: int, messages: int) -> None:
        """Caller holds the flags lock (`WRITERS`)."""
        if self.role not in WRITERS["counts"].roles:
            raise PermissionError(f"{self.role.value} may not write consume counts")
        assert 0 <= slot < self.slots, slot
        self._words[HEADER_WORDS + slot] += messages

    def count(self, slot: int) -> int:
        return int(self._words[HEADER_WORDS + slot])

    def close(self) -> None:
        self.segment.close()
