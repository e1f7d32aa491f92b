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

from dataclasses import dataclass
from typing import ClassVar, Self

import numpy as np

from shm.layout import Lock, Role
from shm.segment import SharedSegment

HEADER_BYTES = 64
H_CAPACITY, H_USED = 0, 1
"""Header word indexes."""


@dataclass(frozen=True, slots=True)
class Writers:
    """Who writes a slot-table field: its roles, and the lock they hold (None: one writer at a
    time by the protocol the table's docstring gives). As `shm.layout.Field` for the pointer table."""

    roles: frozenset[Role]
    lock: Lock | None

    def __init__(self, *roles: Role, lock: Lock | None = None) -> None:
        object.__setattr__(self, "roles", frozenset(roles))
        object.__setattr__(self, "lock", lock)


def check_slot_layout(
    name: str,
    slot_size: int,
    fields: dict[str, int],
    *,
    writers: dict[str, Writers],
    tail_from: int = -1,
) -> None:
    """Refuse a slot layout whose fields are misaligned, overlap, or leave the slot, or whose
    fields do not each name their writers; ``tail_from`` is where a variable-length tail (a key)
    starts, after every word field. Runs at import, so a wrong table never reaches shared memory."""
    if set(writers) != set(fields):
        raise AssertionError(f"{name}: writers declared for {sorted(writers)}, fields are {sorted(fields)}")
    for field, declared in writers.items():
        if not declared.roles:
            raise AssertionError(f"{name}.{field} names no writer")
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
    one aligned word (`get`/`set`, or `words` with `word_index` on hot paths). Each process opens
    a table in its `Role`; `set` refuses a field whose ``WRITERS`` do not name that role, as
    `PointerTable.set` does, and `words` checks the fields its caller will store up front."""

    SLOT_SIZE: ClassVar[int]
    FIELDS: ClassVar[dict[str, int]]
    WRITERS: ClassVar[dict[str, Writers]]
    """Field name (as in FIELDS) -> who writes it."""
    HEADER_WRITERS: ClassVar[dict[int, Writers]] = {}
    """Header word index (after capacity, which the creator writes) -> who writes it."""
    DIRECTORY: ClassVar[bool] = False

    def __init__(self, segment: SharedSegment, role: Role) -> None:
        self.segment = segment
        self.role = role
        self._allowed: set[int] = set()
        """Field offsets (header words as ``-1 - index``) this role was found allowed to write:
        after the first store of each, the check costs one set lookup."""
        self._names = {offset: name for name, offset in self.FIELDS.items()}
        self._buf = segment.mm
        self._views: dict[int, np.ndarray] = {}
        """`column_view`'s arrays by field, released before the segment closes."""
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
        """Supervisor only (the table it returns writes as the supervisor)."""
        if capacity < 1:
            raise ValueError(f"{cls.__name__} capacity must be at least 1 (got {capacity})")
        segment = SharedSegment.create(name, cls.segment_bytes(capacity))
        segment.words[H_CAPACITY] = capacity
        return cls(segment, Role.SUPERVISOR)

    @classmethod
    def attach(cls, name: str, role: Role) -> Self:
        return cls(SharedSegment.attach(name), role)

    def check_writes(self, *fields: int) -> None:
        """Refuse, with PermissionError, a role that would store a field it is not declared to
        write (header words by ``-1 - index``). Cached per field: the put path pays it once."""
        for field in fields:
            if field in self._allowed:
                continue
            if field < 0:
                declared = self.HEADER_WRITERS.get(-1 - field)
                what = f"header word {-1 - field}"
            else:
                what = self._names.get(field, f"offset {field}")
                declared = self.WRITERS.get(what)
            if declared is None or self.role not in declared.roles:
                writers = sorted(r.value for r in declared.roles) if declared else []
                raise PermissionError(
                    f"{self.role.value} may not write {type(self).__name__}.{what} (writers: {writers})"
                )
            self._allowed.add(field)

    @property
    def words(self) -> memoryview:
        """The segment as native int64 words (`word_index` finds a field's), for reading. A
        caller that stores into it takes it from `writable_words` instead, which checks."""
        return self._words

    def writable_words(self, *written: int) -> memoryview:
        """`words`, for a hot path that stores the ``written`` fields itself (a word store costs
        a tenth of a `set`): the writer check runs here, once, for those fields."""
        self.check_writes(*written)
        return self._words

    def set_header(self, index: int, value: int) -> None:
        """Store header word ``index`` (its writers are in HEADER_WRITERS)."""
        if -1 - index not in self._allowed:
            self.check_writes(-1 - index)
        self._words[index] = value

    def word_index(self, slot: int, field: int) -> int:
        return (self._base + slot * self.SLOT_SIZE + field) >> 3

    def byte_offset(self, slot: int, field: int) -> int:
        return self._base + slot * self.SLOT_SIZE + field

    def get(self, slot: int, field: int) -> int:
        return self._words[(self._base + slot * self.SLOT_SIZE + field) >> 3]

    def set(self, slot: int, field: int, value: int) -> None:
        if field not in self._allowed:
            self.check_writes(field)
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

    def column_view(self, field: int) -> np.ndarray:
        """``field`` of every slot as a live int64 view of the segment, made once: for a scan
        on a latency path (reput's look for parked consumers after each pass), where
        `column`'s new view and copy are most of its cost (7.4 -> 3.1 us for 1,024 slots). Values
        may change under the caller; use it at once and keep no reference past `close`."""
        view = self._views.get(field)
        if view is None:
            words = np.frombuffer(self._words, dtype=np.int64)
            stride = self.SLOT_SIZE // 8
            start = (self._base + field) // 8
            view = words[start : start + self.slots * stride : stride]
            view.flags.writeable = False  # a reader's view: stores go through `set`
            self._views[field] = view
        return view

    def close(self) -> None:
        self._views.clear()  # each pins the segment's words
        self.segment.close()
