"""SlotTable: a shared segment of fixed-size slots of native int64 fields, after a header.

The shape the flush-request ring, the consumer (waiter) table and the keyed offset tables share.
Each subclass documents its slot layout and field writers, and declares ``SLOT_SIZE`` and
``FIELDS`` (name -> byte offset in a slot); `check_slot_layout` proves at import that the fields
are aligned words inside the slot and that no two overlap. The segment begins with a
``HEADER_BYTES`` header:

    off field     writer
      0 capacity  the supervisor, at creation: the configured number of entries (the setting)
      8 used      keyed tables: entries inserted, by the inserter under the table's lock
     16..63       reserved
so an attacher reads the capacity the store was started with, not one it derives. A table
with ``DIRECTORY`` keeps, after the header, one int64 per entry: the slot numbers in use, in
insertion order (written by the inserter before it counts the entry), so a scan reads ``used``
words, not every slot: /dev/shm pages are taken only where entries are, and a scan of a table
holding ten entries touches one page whatever its capacity.
"""

from __future__ import annotations

from typing import ClassVar, Self

import numpy as np

from shm.segment import SharedSegment

HEADER_BYTES = 64
H_CAPACITY, H_USED = 0, 1
"""Header word indexes."""


def check_slot_layout(name: str, slot_size: int, fields: dict[str, int], *, tail_from: int = -1) -> None:
    """Refuse a slot layout whose fields are misaligned, overlap, or leave the slot; ``tail_from``
    is where a variable-length tail (a key) starts, after every word field. Runs at import, so
    a wrong table never reaches shared memory."""
    if slot_size % 8:
        raise AssertionError(f"{name}: slot size {slot_size} is not whole int64 words")
    seen: dict[int, str] = {}
    for field, offset in fields.items():
        if offset % 8 or not 0 <= offset <= slot_size - 8:
            raise AssertionError(f"{name}.{field}: offset {offset} is not an aligned word inside the slot")
        if offset in seen:
            raise AssertionError(f"{name}.{field} overlaps {name}.{seen[offset]} at offset {offset}")
        if 0 <= tail_from < offset + 8:
            raise AssertionError(f"{name}.{field} overlaps the key that starts at {tail_from}")
        seen[offset] = field
    if tail_from >= slot_size:
        raise AssertionError(f"{name}: the key starts at {tail_from}, beyond the {slot_size}-byte slot")


class SlotTable:
    """``slots`` slots of ``SLOT_SIZE`` bytes after the header; a field is read and written as
    one aligned word (`get`/`set`, or `words` with `word_index` on hot paths)."""

    SLOT_SIZE: ClassVar[int]
    FIELDS: ClassVar[dict[str, int]]
    DIRECTORY: ClassVar[bool] = False

    def __init__(self, segment: SharedSegment) -> None:
        self.segment = segment
        self._buf = segment.mm
        self._words = segment.words
        self.capacity = self._words[H_CAPACITY]
        """Entries the store was configured for (the setting); `slots` may be more."""
        self._base = self.slots_offset(self.capacity)
        """Byte offset of slot 0: after the header and the directory."""
        self.slots = (segment.size - self._base) // self.SLOT_SIZE

    @classmethod
    def slots_offset(cls, capacity: int) -> int:
        return HEADER_BYTES + (capacity * 8 if cls.DIRECTORY else 0)

    @classmethod
    def slots_for(cls, capacity: int) -> int:
        """Slots a table of ``capacity`` entries needs: one each (keyed tables want more)."""
        return capacity

    @classmethod
    def segment_bytes(cls, capacity: int) -> int:
        """Shared memory a table of ``capacity`` entries takes (README: what a capacity costs)."""
        return cls.slots_offset(capacity) + cls.slots_for(capacity) * cls.SLOT_SIZE

    @classmethod
    def create(cls, name: str, capacity: int) -> Self:
        """Supervisor only."""
        if capacity < 1:
            raise ValueError(f"{cls.__name__} capacity must be at least 1 (got {capacity})")
        segment = SharedSegment.create(name, cls.segment_bytes(capacity))
        segment.words[H_CAPACITY] = capacity
        return cls(segment)

    @classmethod
    def attach(cls, name: str) -> Self:
        return cls(SharedSegment.attach(name))

    @property
    def words(self) -> memoryview:
        """The segment as native int64 words (`word_index` finds a field's)."""
        return self._words

    def word_index(self, slot: int, field: int) -> int:
        return (self._base + slot * self.SLOT_SIZE + field) >> 3

    def byte_offset(self, slot: int, field: int) -> int:
        return self._base + slot * self.SLOT_SIZE + field

    def get(self, slot: int, field: int) -> int:
        return self._words[(self._base + slot * self.SLOT_SIZE + field) >> 3]

    def set(self, slot: int, field: int, value: int) -> None:
        self._words[(self._base + slot * self.SLOT_SIZE + field) >> 3] = value

    def column(self, field: int) -> np.ndarray:
        """``field`` of every slot as one int64 array (a read-only copy): a scan of thousands of
        slots in one numpy step instead of a Python loop. It reads every slot's page, so keyed
        tables scan their directory instead."""
        view = np.frombuffer(self.segment.mm, dtype=np.int64, count=self.segment.size // 8)
        try:
            start = (self._base + field) // 8
            return view[start : start + self.slots * (self.SLOT_SIZE // 8) : self.SLOT_SIZE // 8].copy()
        finally:
            del view

    def close(self) -> None:
        self.segment.close()
