"""MessageBatch: messages of one topic for one queue, stored by one put; and the encoded runs the
put lock places.

RocketMQ's client turns a collection of messages into one `MessageBatch` (same topic, no delay
level: `MessageBatch.generateFromList`), and the broker encodes it as consecutive records
(`MessageExtBatch`) that one lock hold appends whole in one file: a batch that does not fit the
current file leaves a BLANK record there and goes to the next (docs/format.md §2.8).

rmq-mp keeps that shape and encodes it column-wise: with equal body lengths every record has the
same size, so the batch is one numpy ``(count, record_size)`` array built from a header template,
the joined bodies, a CRC column and the only varying property, the last four hex digits of
UNIQ_KEY. Unequal bodies or per-message keys are encoded record by record and joined.

`EncodedRun` is what the put path works on, for a batch, a single `send` or a stretch of a mixed
`send_batch`: records of one topic and queue, encoded outside the lock. Under the lock the
producer places a run in chunks (`fit`), patches each chunk's QUEUEOFFSET, PHYSICALOFFSET and
STORETIMESTAMP (`patch`), copies it (`chunk`) and records the outcome (`place`).
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rmq_mp import validators
from rmq_mp.errors import InvalidBatchError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.outcomes import PutMessageStatus

_SHORT = struct.Struct(">h")
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_NIBBLE_SHIFTS = np.array([12, 8, 4, 0], dtype=np.uint32)
UNIQ_KEY_PREFIX = f"{m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}{m.NAME_VALUE_SEPARATOR}"


@dataclass(frozen=True, slots=True)
class MessageBatch:
    """Messages of ``topic`` for one queue (``queue_id`` None: the producer's round robin picks one
    for the whole batch). ``tags`` and ``properties`` are common; ``keys``, when given, has one
    entry (a key, a list of keys, or None) per body."""

    topic: str
    bodies: Sequence[m.Body]
    queue_id: int | None = None
    tags: str | None = None
    keys: Sequence[str | Sequence[str] | None] | None = None
    properties: Mapping[str, str] | None = None
    flag: int = 0

    def __post_init__(self) -> None:
        if self.keys is not None and len(self.keys) != len(self.bodies):
            raise InvalidBatchError(f"{len(self.keys)} keys for {len(self.bodies)} bodies")
        if self.properties and m.PROPERTY_DELAY_TIME_LEVEL in self.properties:
            raise InvalidBatchError("a batch cannot carry a delay level (RocketMQ refuses it too)")

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]]) -> MessageBatch:
        """`MessageBatch.generateFromList`: send_batch items of one topic, queue, tags and flag,
        with no properties of their own."""
        if not messages:
            raise InvalidBatchError("an empty batch")
        first = messages[0]
        topic, queue_id, tags, flag = (
            first["topic"],
            first.get("queue_id"),
            first.get("tags"),
            first.get("flag", 0),
        )
        for item in messages:
            if item["topic"] != topic:
                raise InvalidBatchError(f"one batch holds one topic: {topic!r} and {item['topic']!r}")
            if item.get("queue_id") != queue_id or item.get("tags") != tags or item.get("flag", 0) != flag:
                raise InvalidBatchError("one batch holds one queue, tags and flag")
            if item.get("properties"):
                raise InvalidBatchError("batch items carry no properties of their own")
        keys = [item.get("keys") for item in messages]
        return cls(
            topic,
            [item["body"] for item in messages],
            queue_id=queue_id,
            tags=tags,
            keys=keys if any(keys) else None,
            flag=flag,
        )


def keys_text(keys: str | Sequence[str]) -> str:
    return keys if isinstance(keys, str) else m.KEY_SEPARATOR.join(keys)


def properties_text(
    properties: Mapping[str, str] | None, tags: str | None, keys: str | Sequence[str] | None, uniq_key: str
) -> str:
    """The properties string a producer stores: ``properties``, then TAGS, KEYS and UNIQ_KEY
    (kept if ``properties`` has one), as RocketMQ's Message setters order them. `RecordRejected`
    (MESSAGE_ILLEGAL, naming the field) when a name, value, tag or key holds a separator, found
    in C and diagnosed only then: tags and keys by one ``isprintable`` scan each (the separators
    are control characters), properties by counting each separator over the joined string (one
    of each per property is its own). Nothing given, nothing to scan (UNIQ_KEY is ours)."""
    if not properties:
        if not tags and not keys:
            return f"{UNIQ_KEY_PREFIX}{uniq_key}"
        keys_string = keys_text(keys) if keys else ""
        if (tags and not tags.isprintable()) or not keys_string.isprintable():
            _refuse_separators(tags, keys, None)  # or a tab, say: no separator, stored
        text = f"TAGS\x01{tags}\x02" if tags else ""
        if keys:
            text += f"KEYS\x01{keys_string}\x02"
        return f"{text}{UNIQ_KEY_PREFIX}{uniq_key}"
    props = dict(properties)
    if tags:
        props[m.PROPERTY_TAGS] = tags
    if keys:
        props[m.PROPERTY_KEYS] = keys_text(keys)
    props.setdefault(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq_key)
    text = m.properties_to_string(props)
    entries = len(props)  # `message.stray_separators`, inlined: every send with properties pays it
    if text.count("\x01") != entries or text.count("\x02") != entries - 1:
        _refuse_separators(tags, keys, properties)
    return text


def _refuse_separators(tags: str | None, keys: str | Sequence[str] | None, properties: object) -> None:
    """`RecordRejected` naming the field that holds a property separator, if one does."""
    if problem := validators.separator_problem(tags, keys, properties):
        raise record.RecordRejected(PutMessageStatus.MESSAGE_ILLEGAL, problem)


class Placement(NamedTuple):
    """What the put lock did with records ``[first, first + records)`` of a run."""

    first: int
    records: int
    status: PutMessageStatus
    reason: str = ""
    phy_offset: int = -1
    """Of the chunk's first record; the others follow at their positions in the run."""
    queue_offset: int = -1
    """Of the chunk's first record (0 throughout for records without a queue)."""


class UniqKeys(Sequence[str]):
    """A batch's UNIQ_KEYs without building the strings: ``prefix`` + 4 hex digits of a counter."""

    __slots__ = ("first", "length", "prefix")

    def __init__(self, prefix: str, first: int, length: int) -> None:
        self.prefix, self.first, self.length = prefix, first, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.length))]
        if not -self.length <= index < self.length:
            raise IndexError(index)
        return f"{self.prefix}{(self.first + index % self.length) & 0xFFFF:04X}"


class EncodedRun:
    """Consecutive records of one topic and queue, encoded outside the put lock (RocketMQ's
    MessageExtBatch with its encoded buffer). ``data`` is either a bytearray of the records back
    to back (``ends``: each record's end in it) or, when all have one size, a numpy array of
    shape (count, ``record_size``)."""

    __slots__ = (
        "answer_queue_id",
        "count",
        "data",
        "dispatchable",
        "ends",
        "flush_slot",
        "placements",
        "queue_id",
        "record_size",
        "store_timestamp_position",
        "sys_flag",
        "topic",
        "uniq_keys",
        "wait_flush",
        "whole",
    )

    def __init__(
        self,
        topic: str,
        queue_id: int,
        data: Any,
        *,
        count: int,
        record_size: int = 0,
        ends: list[int] | None = None,
        sys_flag: int = 0,
        uniq_keys: Sequence[str] = (),
        whole: bool = False,
        wait_flush: bool = True,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.answer_queue_id = queue_id
        """The queue id its results answer: the sender's, where a delayed message is stored on
        the schedule queue of its level (as `send` and RocketMQ's broker answer)."""
        self.data = data
        self.count = count
        self.record_size = record_size
        self.ends = ends
        self.sys_flag = sys_flag
        """Of the run's records as far as the put path cares: transaction type, born-host family."""
        self.dispatchable = m.is_dispatchable(sys_flag)
        self.store_timestamp_position = record.store_timestamp_position(sys_flag)
        self.uniq_keys = uniq_keys
        self.whole = whole
        """RocketMQ's batch rule: all of it in one file, or a BLANK first and all in the next."""
        self.wait_flush = wait_flush
        """Under SYNC_FLUSH the put waits for disk (RocketMQ's WAIT property, default true)."""
        self.placements: list[Placement] = []
        self.flush_slot = -1
        """The SYNC_FLUSH request ring slot its put waits on (-1: none)."""

    @classmethod
    def refused(
        cls,
        topic: str,
        queue_id: int,
        count: int,
        status: PutMessageStatus,
        reason: str,
        *,
        uniq_keys: Sequence[str] = (),
    ) -> EncodedRun:
        """A run the put path must not append: its outcome is decided already."""
        run = cls(topic, queue_id, b"", count=count, uniq_keys=uniq_keys)
        run.placements.append(Placement(0, count, status, reason))
        return run

    @property
    def pending(self) -> bool:
        return not self.placements

    def start(self, index: int) -> int:
        """Position of record ``index`` in the run's bytes."""
        if self.ends is None:
            return index * self.record_size
        return self.ends[index - 1] if index else 0

    def end(self, index: int) -> int:
        return (index + 1) * self.record_size if self.ends is None else self.ends[index]

    def fit(self, first: int, space: int) -> int:
        """How many records from ``first`` take at most ``space`` bytes."""
        if self.ends is None:
            return min(self.count - first, space // self.record_size)
        limit = self.start(first) + space
        fitting = first
        while fitting < self.count and self.ends[fitting] <= limit:
            fitting += 1
        return fitting - first

    def chunk(self, first: int, count: int) -> Any:
        """The bytes of records ``[first, first + count)``, to be copied into the log."""
        if isinstance(self.data, np.ndarray):
            return self.data[first : first + count].reshape(-1)  # a flat view: len() is bytes
        if first == 0 and count == self.count:
            return self.data
        return memoryview(self.data)[self.start(first) : self.end(first + count - 1)]

    def patch(
        self,
        first: int,
        count: int,
        *,
        queue_offset: int,
        phy_offset: int,
        store_timestamp: int,
        crc: bool = False,
    ) -> None:
        """Fill the lock-decided fields of records ``[first, first + count)``: record ``first``
        lands at ``phy_offset``; ``queue_offset`` < 0 for records without a queue (stored 0);
        ``crc``: the records carry the CRC tail, filled last. Which of record.py's patchers fits
        this run's shape; they write the bytes."""
        if isinstance(self.data, np.ndarray):
            record.patch_rows(
                self.data[first : first + count],
                self._steps(count),
                queue_offset=queue_offset,
                phy_offset=phy_offset,
                store_timestamp=store_timestamp,
                store_timestamp_position=self.store_timestamp_position,
                crc=crc,
            )
            return
        base = self.start(first)
        if count == 1:
            record.patch_record(
                self.data,
                base,
                queue_offset=max(queue_offset, 0),
                phy_offset=phy_offset,
                store_timestamp=store_timestamp,
                sys_flag=self.sys_flag,
                crc=crc,
            )
            return
        starts = np.array([self.start(i) for i in range(first, first + count)], dtype=np.int64)
        record.patch_run(
            self.data,
            starts,
            queue_offset=queue_offset,
            phy_offset=phy_offset - base,
            store_timestamp=store_timestamp,
            store_timestamp_position=self.store_timestamp_position,
            crc=crc,
        )

    def _steps(self, count: int) -> np.ndarray:
        return _steps(count, self.record_size)

    def place(self, placement: Placement) -> None:
        self.placements.append(placement)

    def answer_stored(self, status: PutMessageStatus, reason: str) -> None:
        """Its stored chunks (PUT_OK) are answered ``status`` instead: in the log, but not as
        durable or replicated as the put asked (FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE)."""
        self.placements = [
            p._replace(status=status, reason=reason) if p.status is PutMessageStatus.PUT_OK else p
            for p in self.placements
        ]

    def phy_offsets(self, placement: Placement) -> np.ndarray:
        """Commit-log offset of each record of a placed chunk."""
        first, count = placement.first, placement.records
        if self.ends is None:
            return placement.phy_offset + np.arange(count, dtype=np.int64) * self.record_size
        base = self.start(first)
        return placement.phy_offset + np.array(
            [self.start(i) - base for i in range(first, first + count)], dtype=np.int64
        )


def encode_uniform(
    encoder: record.RecordEncoder,
    topic_field: bytes,
    bodies: Sequence[bytes],
    *,
    queue_id: int,
    flag: int,
    born_timestamp: int,
    born_ip: bytes,
    born_port: int,
    properties_head: bytes,
    uniq_counter: int,
    max_body_size: int,
) -> np.ndarray | None:
    """Records of equal-length ``bodies`` as one (count, size) array, or None when any two
    lengths differ. Each record's properties are ``properties_head`` followed by the 4 hex digits
    of ``uniq_counter + i``, the tail of its UNIQ_KEY (nothing when ``uniq_counter`` < 0).
    `RecordRejected` when a body exceeds ``max_body_size`` (the whole batch is refused)."""
    count = len(bodies)
    lengths = set(map(len, bodies))
    largest = max(lengths)
    if largest > max_body_size:
        raise record.RecordRejected(
            PutMessageStatus.MESSAGE_ILLEGAL, record.body_problem(largest, max_body_size)
        )
    if len(lengths) != 1:
        return None
    body_size = largest
    counter_digits = 4 if uniq_counter >= 0 else 0
    template = encoder.encode(
        topic_field,
        bodies[0],
        queue_id=queue_id,
        flag=flag,
        sys_flag=0,
        born_timestamp=born_timestamp,
        born_ip=born_ip,
        born_port=born_port,
        properties=properties_head + b"0" * counter_digits,
    )
    size = len(template)
    crc_tail = len(record.crc_suffix(properties_head + b"0" * counter_digits)) if encoder.append_crc else 0
    body_at = size - body_size - len(topic_field) - 2 - len(properties_head) - counter_digits - crc_tail
    out = np.empty((count, size), dtype=np.uint8)
    out[:] = np.frombuffer(template, dtype=np.uint8)
    if body_size:
        joined = np.frombuffer(b"".join(bodies), dtype=np.uint8)
        out[:, body_at : body_at + body_size] = joined.reshape(count, body_size)
        crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.uint32, count=count)
        crc_column = out[:, record.POS_BODY_CRC : record.POS_BODY_CRC + 4].view(">u4")[:, 0]
        np.bitwise_and(crcs, 0x7FFFFFFF, out=crc_column)
    if counter_digits:
        first = uniq_counter & 0xFFFF
        if first + count <= 1 << 16:  # a slice of the table; a wrapping batch takes it modulo
            digits = _hex4()[first : first + count]
        else:
            digits = _hex4()[np.arange(first, first + count) & 0xFFFF]
        out[:, size - crc_tail - 4 : size - crc_tail].view(">u4")[:, 0] = digits
    return out


@functools.lru_cache(maxsize=64)
def _steps(count: int, record_size: int) -> np.ndarray:
    """(i, i * record_size) for i < count: what record i adds to its chunk's first queue offset
    and physical offset. Cached: a producer's batches come in a few sizes."""
    steps = np.arange(count, dtype=np.int64)
    table = np.stack((steps, steps * record_size), axis=1)
    table.flags.writeable = False
    return table


@functools.cache
def _hex4() -> np.ndarray:
    """The 4 upper-case hex digits of every 16-bit counter, as big-endian 4-byte words."""
    digits = _HEX_DIGITS[(np.arange(1 << 16, dtype=np.uint32)[:, None] >> _NIBBLE_SHIFTS) & 15]
    return digits.view(">u4")[:, 0].copy()


def join_records(encoded: Sequence[bytearray]) -> tuple[bytearray, list[int]]:
    """Records back to back and each one's end, for an `EncodedRun` of unequal records."""
    ends = []
    total = 0
    for rec in encoded:
        total += len(rec)
        ends.append(total)
    return bytearray().join(encoded), ends
