"""Keyed offset tables: topic/queue -> offsets (RocketMQ's topicQueueTable) and
topic@group/queue -> committed offset (ConsumerOffsetManager's table), at a configured capacity.

Both are open-addressing hash tables (linear probing on crc32 of ``key#queueId``) over slots
that never move and are never freed, so a slot number found once stays valid and readers need
no lock: an inserter writes a slot's key and values first and its ``used`` word last. There are
a third more slots than the capacity, so a probe stays short at a full table; an insert beyond
the capacity raises `OffsetTableFullError` naming the setting to raise.

Queue-offset table slot (`QueueOffsetTable`, ``maxConsumeQueueNum`` entries):

    off  field                 writer
      0  used (0/1)            producer under the put lock (written last when inserting)
      8  queue_id              producer under the put lock (before ``used``)
     16  next_queue_offset     producer under the put lock
     24  dispatched_offset     reput (and the supervisor at start): the ConsumeQueue's max
                               offset (next to be dispatched)
     32  min_offset            the cleaner, as it deletes ConsumeQueue files (and the supervisor
                               at start): first offset still served; on a SLAVE whose log begins
                               above 0, the ha worker as it inserts the queue (its first offset);
                               reput sets it to 0 as it removes a deleted topic's queue
     40  last_store_timestamp  reput: store time of the last dispatched message
     48  key_length            producer under the put lock (before ``used``)
     56  dispatch_error        reput: 0, or why the queue is quarantined (errno > 0, or a FAULT_*
                               code of shm.layout); its entries wait for reput's retry
     64  topic                 UTF-8, <= 127 bytes (validators.TOPIC_MAX_BYTES), KEY_BYTES reserved

Group-offset table slot (`GroupOffsetTable`, ``maxConsumerOffsetNum`` entries):

    off  field                 writer
      0  used, 8 queue_id      consumer (or rmq-admin, or the supervisor at start; on a SLAVE the ha
                               worker's metadata channel) under the flags lock
     16  committed_offset      the consumer that commits (any writer of the group's queue; on a
                               SLAVE the ha worker, raising it to the master's); -1 set
                               by a clustering member that claimed a queue the group never
                               committed (the entry then holds only its owner: not persisted);
                               `DELETED` (-2) set by rmq-admin deleteSubGroup under the flags lock
                               (not persisted, not shown; a later commit revives it)
     24  key_length            as ``used``
     32  owner                 clustering members of the group, under the flags lock: 0 free, else
                               `owner_word` (pid, member slot) of the one member reading the queue
                               (rmq_mp/client/rebalance.py); a claimer takes it only when free or when its
                               owner's pid is dead; the supervisor's fresh table starts it at 0;
                               rmq-admin deleteSubGroup clears it with the entry
     40  topic@group           UTF-8, <= 127 + 1 + 255 bytes (test_shared_tables checks the longest fits)
Before the slots, the header (capacity; entries used, by the inserter under the table's lock)
and the directory of used slots in insertion order (the same writer, before it counts the
entry): scans read the directory, so untouched slots never take /dev/shm pages.
The supervisor fills both from recovery and consumerOffset.json before any worker or client runs.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from rmq_mp.errors import OffsetTableFullError
from shm.layout import Lock, Role
from shm.segment import SharedSegment
from shm.slot_table import H_USED, HEADER_BYTES, SlotTable, Writers, check_slot_layout

USED, QUEUE_ID = 0, 8
NEXT_OFFSET, DISPATCHED, MIN_OFFSET, LAST_STORE_TS = 16, 24, 32, 40
DISPATCH_ERROR = 56
COMMITTED = 16
"""In the group-offset table, the field holding the group's committed (next) offset."""
DELETED = -2
"""A committed offset rmq-admin deleted (deleteSubGroup): no offset, and no entry
to persist or report; the slot is freed at the store's next start."""
OWNER = 32
"""In the group-offset table, the clustering owner of the queue (0: none): `owner_word`."""


def owner_word(pid: int, member_slot: int) -> int:
    """The OWNER value of a member: its pid and member-table slot (one process may hold several
    members, one per Consumer object), never 0."""
    return (pid << 32) | (member_slot + 1)


def owner_of(word: int) -> tuple[int, int]:
    """(pid, member slot) of an OWNER value; (0, -1) when free."""
    return word >> 32, (word & 0xFFFFFFFF) - 1


class KeyedOffsetTable(SlotTable):
    """One process's view. Lookups cache slot numbers; slots never move once used."""

    DIRECTORY = True

    SETTING: ClassVar[str]
    """The broker.conf key that sets the capacity (named when the table is full)."""
    WHAT: ClassVar[str]
    KEY_LENGTH: ClassVar[int]
    """FIELDS["key_length"]; the key's bytes follow the last field (KEY_OFFSET, KEY_BYTES)."""
    KEY_OFFSET: ClassVar[int]
    KEY_BYTES: ClassVar[int]

    def __init_subclass__(cls) -> None:
        """Key geometry derived from the slot layout, which is checked here (at import)."""
        super().__init_subclass__()
        cls.KEY_LENGTH = cls.FIELDS["key_length"]
        cls.KEY_OFFSET = max(cls.FIELDS.values()) + 8
        cls.KEY_BYTES = cls.SLOT_SIZE - cls.KEY_OFFSET
        check_slot_layout(
            cls.__name__, cls.SLOT_SIZE, cls.FIELDS, writers=cls.WRITERS, tail_from=cls.KEY_OFFSET
        )
        inserter = cls.WRITERS["used"]
        if cls.HEADER_WRITERS.get(H_USED) != inserter:
            raise AssertionError(f"{cls.__name__}: the entry count is written by its inserter, {inserter}")

    def __init__(self, segment: SharedSegment, role: Role) -> None:
        super().__init__(segment, role)
        self._cache: dict[tuple[str, int], int] = {}
        self._keys: dict[int, tuple[str, int]] = {}
        """Slot -> (key, queue id) decoded once: a used slot's key never changes."""
        self._index: dict[str, list[tuple[int, int]]] = {}
        self._indexed_used = -1

    @classmethod
    def slots_for(cls, capacity: int) -> int:
        return capacity + (capacity + 2) // 3  # load factor <= 3/4 when full

    @property
    def used(self) -> int:
        """Entries inserted (the fill level is ``used / capacity``)."""
        return int(self._words[H_USED])

    def _home(self, key: bytes, queue_id: int) -> int:
        return zlib.crc32(key + b"#" + str(queue_id).encode()) % self.slots

    def find(self, key: str, queue_id: int) -> int:
        """Slot of the queue, or -1 if it has none yet."""
        cached = self._cache.get((key, queue_id))
        if cached is not None:
            return cached
        raw = key.encode("utf-8")
        if len(raw) > self.KEY_BYTES:
            return -1
        slot = self._home(raw, queue_id)
        for _ in range(self.slots):
            if not self.get(slot, USED):
                return -1
            if self._matches(slot, raw, queue_id):
                self._cache[(key, queue_id)] = slot
                return slot
            slot = (slot + 1) % self.slots
        return -1

    def _matches(self, slot: int, raw: bytes, queue_id: int) -> bool:
        if self.get(slot, QUEUE_ID) != queue_id or self.get(slot, self.KEY_LENGTH) != len(raw):
            return False
        start = self.byte_offset(slot, self.KEY_OFFSET)
        return self._buf[start : start + len(raw)] == raw

    def find_or_insert(self, key: str, queue_id: int) -> int:
        """Slot of the queue, inserting it (caller holds the table's lock, or is the supervisor).
        `OffsetTableFullError` once the table holds its capacity; ValueError for a key longer
        than a slot holds (callers validate names first)."""
        slot = self.find(key, queue_id)
        if slot >= 0:
            return slot
        raw = key.encode("utf-8")
        if len(raw) > self.KEY_BYTES:
            raise ValueError(f"{self.WHAT} key of {len(raw)} bytes is longer than {self.KEY_BYTES}")
        if self.used >= self.capacity:
            raise OffsetTableFullError(
                f"{self.WHAT} table is full ({self.capacity:,} entries): raise {self.SETTING} in broker.conf"
            )
        self.check_writes(-1 - H_USED)  # the directory entry and the count, stored as words below
        slot = self._home(raw, queue_id)
        while self.get(slot, USED):  # ends: used < capacity < slots
            slot = (slot + 1) % self.slots
        self.set(slot, QUEUE_ID, queue_id)
        self.set(slot, self.KEY_LENGTH, len(raw))
        start = self.byte_offset(slot, self.KEY_OFFSET)
        self._buf[start : start + len(raw)] = raw
        used = self.used
        self._words[HEADER_BYTES // 8 + used] = slot  # the directory entry, before it is counted
        self.set(slot, USED, 1)  # a lock-free reader sees the key whole or not at all
        self.set_header(H_USED, used + 1)
        self._cache[(key, queue_id)] = slot
        return slot

    def find_or_insert_all(self, entries: list[tuple[str, int]]) -> list[int]:
        """`find_or_insert` for every (key, queue id), all or nothing (caller holds the table's
        lock): `OffsetTableFullError` before any insert when the new ones do not all fit."""
        slots = [self.find(key, queue_id) for key, queue_id in entries]
        new = {entry for entry, slot in zip(entries, slots, strict=True) if slot < 0}
        if self.used + len(new) > self.capacity:
            raise OffsetTableFullError(
                f"{len(new):,} new entries do not fit the {self.WHAT} table: it holds {self.used:,} of "
                f"{self.SETTING} = {self.capacity:,}; raise {self.SETTING} in broker.conf"
            )
        return [
            slot if slot >= 0 else self.find_or_insert(*entry)
            for entry, slot in zip(entries, slots, strict=True)
        ]

    def used_slots(self) -> np.ndarray:
        """Slot numbers in use, in insertion order, from the directory (``used`` words read)."""
        used = self.used
        view = np.frombuffer(self.segment.mm, dtype=np.int64, count=used, offset=HEADER_BYTES)
        try:
            return view.copy()
        finally:
            del view

    def queues_of(self, key: str) -> list[tuple[int, int]]:
        """(queue id, slot) of every queue of ``key`` (a topic, or topic@group), by queue id.
        From a per-process index that rescans only when an entry was added anywhere, so a
        consumer's poll over its topics costs the same with 10 queues in the store or 10,000."""
        if self._indexed_used != self.used:
            self._indexed_used = self.used  # read first: an insert meanwhile shows next time
            index: dict[str, list[tuple[int, int]]] = {}
            for name, queue_id, slot in self.queues():
                index.setdefault(name, []).append((queue_id, slot))
            for entries in index.values():
                entries.sort()
            self._index = index
        return self._index.get(key, [])

    def queues(self) -> Iterator[tuple[str, int, int]]:
        """(key, queue id, slot) of every used slot."""
        keys = self._keys
        for slot in self.used_slots().tolist():
            found = keys.get(slot)
            if found is None:
                start = self.byte_offset(slot, self.KEY_OFFSET)
                length = self.get(slot, self.KEY_LENGTH)
                raw = bytes(self._buf[start : start + length])
                found = keys[slot] = (raw.decode("utf-8", errors="replace"), self.get(slot, QUEUE_ID))
            yield found[0], found[1], slot


class QueueOffsetTable(KeyedOffsetTable):
    SLOT_SIZE = 192
    FIELDS: ClassVar[dict[str, int]] = {
        "used": USED,
        "queue_id": QUEUE_ID,
        "next_queue_offset": NEXT_OFFSET,
        "dispatched_offset": DISPATCHED,
        "min_offset": MIN_OFFSET,
        "last_store_timestamp": LAST_STORE_TS,
        "key_length": 48,
        "dispatch_error": DISPATCH_ERROR,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        # Producers under the put lock; on a SLAVE (producers refused) the ha worker, as it
        # appends the master's records (workers/ha.py).
        "used": Writers(Role.PRODUCER, Role.SUPERVISOR, Role.HA, lock=Lock.PUT),
        "queue_id": Writers(Role.PRODUCER, Role.SUPERVISOR, Role.HA, lock=Lock.PUT),
        "next_queue_offset": Writers(Role.PRODUCER, Role.SUPERVISOR, Role.HA, lock=Lock.PUT),
        "dispatched_offset": Writers(Role.REPUT, Role.SUPERVISOR),
        # Reput too, to 0 with the dispatched offset, as it removes a deleted topic's old queue.
        "min_offset": Writers(Role.CLEANER, Role.SUPERVISOR, Role.HA, Role.REPUT),
        "last_store_timestamp": Writers(Role.REPUT),
        "key_length": Writers(Role.PRODUCER, Role.SUPERVISOR, Role.HA, lock=Lock.PUT),
        "dispatch_error": Writers(Role.REPUT),
    }
    HEADER_WRITERS: ClassVar[dict[int, Writers]] = {H_USED: WRITERS["used"]}
    SETTING = "maxConsumeQueueNum"
    WHAT = "queue-offset (topic/queue)"


class GroupOffsetTable(KeyedOffsetTable):
    SLOT_SIZE = 424
    FIELDS: ClassVar[dict[str, int]] = {
        "used": USED,
        "queue_id": QUEUE_ID,
        "committed_offset": COMMITTED,
        "key_length": 24,
        "owner": OWNER,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        # On a SLAVE also the ha worker's metadata channel (workers/ha_meta.py), under the
        # flags lock, as it applies the master's offsets.
        "used": Writers(Role.CONSUMER, Role.SUPERVISOR, Role.HA, lock=Lock.FLAGS),
        "queue_id": Writers(Role.CONSUMER, Role.SUPERVISOR, Role.HA, lock=Lock.FLAGS),
        "committed_offset": Writers(Role.CONSUMER, Role.SUPERVISOR, Role.HA),
        "key_length": Writers(Role.CONSUMER, Role.SUPERVISOR, Role.HA, lock=Lock.FLAGS),
        "owner": Writers(Role.CONSUMER, lock=Lock.FLAGS),
    }
    HEADER_WRITERS: ClassVar[dict[int, Writers]] = {H_USED: WRITERS["used"]}
    SETTING = "maxConsumerOffsetNum"
    WHAT = "consumer-offset (topic@group/queue)"
