"""Queue-offset table: topic/queue -> next queue offset (RocketMQ's topicQueueTable) and the
offset dispatch has reached, at fixed capacity in one segment.

Slot layout (SLOT_SIZE bytes, native-endian int64 unless noted), open addressing on
crc32(topic#queueId):

    off  field                 writer
      0  used (0/1)            producer under the put lock (written last when inserting)
      8  queue_id              producer under the put lock (before ``used``)
     16  next_queue_offset     producer under the put lock
     24  dispatched_offset     reput: the ConsumeQueue's max offset (next to be dispatched)
     32  min_offset            reput (and the supervisor at start): first offset still served
     40  last_store_timestamp  reput: store time of the last dispatched message
     48  topic_length          producer under the put lock (before ``used``)
     56  topic (UTF-8, <= 127 bytes, TOPIC_BYTES reserved)
The supervisor fills it from recovery before any worker or producer runs.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

from rmq_mp.errors import StoreError
from shm.segment import SharedSegment
from shm.slot_table import SlotTable

SLOT_SIZE = 192
TOPIC_BYTES = SLOT_SIZE - 56
DEFAULT_CAPACITY = 8192
_Q = struct.Struct("=q")
_HEAD = struct.Struct("=qqqqqqq")

USED, QUEUE_ID, NEXT_OFFSET, DISPATCHED, MIN_OFFSET, LAST_STORE_TS, TOPIC_LEN = (0, 8, 16, 24, 32, 40, 48)


class QueueTableFullError(StoreError):
    """More topic/queue pairs than the queue-offset table holds (capacity fixed at start)."""


class QueueOffsetTable(SlotTable):
    """One process's view. Lookups cache slot numbers; slots never move once used."""

    SLOT_SIZE = SLOT_SIZE
    DEFAULT_CAPACITY = DEFAULT_CAPACITY

    def __init__(self, segment: SharedSegment) -> None:
        super().__init__(segment)
        self._cache: dict[tuple[str, int], int] = {}

    def _home(self, topic: bytes, queue_id: int) -> int:
        return zlib.crc32(topic + b"#" + str(queue_id).encode()) % self.capacity

    def find(self, topic: str, queue_id: int) -> int:
        """Slot of the queue, or -1 if it has none yet."""
        key = (topic, queue_id)
        slot = self._cache.get(key)
        if slot is not None:
            return slot
        raw = topic.encode("utf-8")
        slot = self._home(raw, queue_id)
        for _ in range(self.capacity):
            base = slot * SLOT_SIZE
            if not _Q.unpack_from(self._buf, base + USED)[0]:
                return -1
            if self._matches(base, raw, queue_id):
                self._cache[key] = slot
                return slot
            slot = (slot + 1) % self.capacity
        return -1

    def _matches(self, base: int, raw: bytes, queue_id: int) -> bool:
        if _Q.unpack_from(self._buf, base + QUEUE_ID)[0] != queue_id:
            return False
        length = _Q.unpack_from(self._buf, base + TOPIC_LEN)[0]
        return length == len(raw) and self._buf[base + 56 : base + 56 + length] == raw

    def find_or_insert(self, topic: str, queue_id: int) -> int:
        """Slot of the queue, inserting it (caller holds the put lock, or is the supervisor)."""
        slot = self.find(topic, queue_id)
        if slot >= 0:
            return slot
        raw = topic.encode("utf-8")
        assert len(raw) <= self.SLOT_SIZE - 56
        slot = self._home(raw, queue_id)
        for _ in range(self.capacity):
            base = slot * SLOT_SIZE
            if not _Q.unpack_from(self._buf, base + USED)[0]:
                _HEAD.pack_into(self._buf, base, 0, queue_id, 0, 0, 0, 0, len(raw))
                self._buf[base + 56 : base + 56 + len(raw)] = raw
                _Q.pack_into(self._buf, base + USED, 1)
                self._cache[(topic, queue_id)] = slot
                return slot
            slot = (slot + 1) % self.capacity
        raise QueueTableFullError(f"queue-offset table is full ({self.capacity} queues)")

    def queues(self) -> Iterator[tuple[str, int, int]]:
        """(topic, queue id, slot) of every used slot."""
        for slot in range(self.capacity):
            base = slot * SLOT_SIZE
            if _Q.unpack_from(self._buf, base + USED)[0]:
                length = _Q.unpack_from(self._buf, base + TOPIC_LEN)[0]
                topic = bytes(self._buf[base + 56 : base + 56 + length]).decode("utf-8")
                yield topic, int(_Q.unpack_from(self._buf, base + QUEUE_ID)[0]), slot


GROUP_KEY_BYTES = 256
COMMITTED = NEXT_OFFSET
"""In the group-offset table, the field holding the group's committed (next) offset."""


class GroupOffsetTable(QueueOffsetTable):
    """Consumer-group offsets (RocketMQ's ConsumerOffsetManager table) in shared memory: the same
    keyed slots, keyed by ``topic@group`` and queue id, with the committed offset in COMMITTED.
    Consumers insert under the flags lock and write their own queues' offsets; the supervisor
    loads it from and persists it to `config/consumerOffset.json`."""

    SLOT_SIZE = 56 + GROUP_KEY_BYTES
    DEFAULT_CAPACITY = 4096
