"""SlotTable: a shared segment of fixed-size slots of native int64 fields.

The shape the flush-request ring, the waiter table and the queue-offset table share; each
subclass documents its slot layout and field writers and sets ``SLOT_SIZE``.
"""

from __future__ import annotations

from typing import ClassVar, Self

from shm.segment import SharedSegment


class SlotTable:
    SLOT_SIZE: ClassVar[int]
    DEFAULT_CAPACITY: ClassVar[int]

    def __init__(self, segment: SharedSegment) -> None:
        self.segment = segment
        self.capacity = segment.size // self.SLOT_SIZE
        self._buf = segment.mm
        self._words = segment.words
        assert self.SLOT_SIZE % 8 == 0, "slots are whole int64 words"

    @classmethod
    def create(cls, name: str, capacity: int | None = None) -> Self:
        """Supervisor only."""
        return cls(SharedSegment.create(name, (capacity or cls.DEFAULT_CAPACITY) * cls.SLOT_SIZE))

    @classmethod
    def attach(cls, name: str) -> Self:
        return cls(SharedSegment.attach(name))

    @property
    def words(self) -> memoryview:
        """The segment as native int64 words (`word_index` finds a field's)."""
        return self._words

    def word_index(self, slot: int, field: int) -> int:
        return (slot * self.SLOT_SIZE + field) >> 3

    def get(self, slot: int, field: int) -> int:
        return self._words[(slot * self.SLOT_SIZE + field) >> 3]

    def set(self, slot: int, field: int, value: int) -> None:
        self._words[(slot * self.SLOT_SIZE + field) >> 3] = value

    def close(self) -> None:
        self.segment.close()
