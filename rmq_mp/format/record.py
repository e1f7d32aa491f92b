"""CommitLog record codec: RocketMQ's MESSAGE_MAGIC_CODE v1 (written) and v2 (read only).

Byte layout, big-endian (docs/format.md §2.1; B body, T topic and P properties byte
lengths; hosts are 4+4 bytes for IPv4 or 16+4 for IPv6, chosen by SYSFLAG bits 0x10/0x20):

    off  size  field
      0     4  TOTALSIZE            whole record, this field included
      4     4  MAGICCODE            v1 0xDAA320A7, v2 0xDAA320AB (2-byte TOPICLEN), blank 0xCBD43194
      8     4  BODYCRC              crc32(body) & 0x7FFFFFFF
     12     4  QUEUEID
     16     4  FLAG
     20     8  QUEUEOFFSET          patched under the put lock
     28     8  PHYSICALOFFSET       patched under the put lock
     36     4  SYSFLAG
     40     8  BORNTIMESTAMP
     48   8|20 BORNHOST             ip, port:int
  56|68     8  STORETIMESTAMP       patched under the put lock
  64|76   8|20 STOREHOST
      .     4  RECONSUMETIMES
      .     8  PREPARED TRANSACTION OFFSET
      .   4+B  BODYLEN + BODY
      . 1|2+T  TOPICLEN (byte v1, short v2) + TOPIC (UTF-8)
      .   2+P  PROPLEN (short) + PROPERTIES (UTF-8, §2.5)

A file that cannot take the next record ends with a BLANK record: TOTALSIZE = bytes left in the
file, then the blank magic; only those 8 bytes are written (§2.8).

Validation on read follows `CommitLog.checkMessageAndReturnSize` (§2.10), plus the 5.x rule that
a record running past the readable end is torn (invalid), never read beyond. Because the body CRC
covers only the body, a record whose tail was zeroed by a torn write can pass RocketMQ's checks;
rmq-mp also rejects an empty or NUL-containing topic and an all-zero properties area, which no
producer writes and which a zeroed tail always produces. A record decoded for a reader
(`decode_message`) has its body CRC checked every time, not only on recovery.

With `enabledAppendPropCRC` (RocketMQ 5.x) a record also carries a CRC over all of itself in its
last property, ``__CRC32#`` (docs/format.md §2.11): checked wherever the body CRC is, so a damaged
topic, queue id, flag, offset, host, time or property is caught as a damaged body is.

CRC: `zlib.crc32` is used, not crcmod. Measured with `python -m bench.crc` on this 2-core machine
over several runs: crcmod's C extension takes 2.5-2.8x zlib's time on a 100-byte body, 6-8x on
1 KiB, 6-11x on 4 KiB and 9-12x on 64 KiB. Both agree bit for bit with Java's
`java.util.zip.CRC32` (tests/unit/test_record.py checks crcmod against zlib).
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import numpy as np

from rmq_mp import validators
from rmq_mp.errors import BodyCrcError, CorruptRecordError
from rmq_mp.format import message as m
from rmq_mp.outcomes import PutMessageStatus

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB, RocketMQ 5.x, read only
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8


def fixed_fields(born_v6: bool, store_v6: bool) -> tuple[tuple[str, str], ...]:
    """The layout table: every fixed field of a record, TOTALSIZE to BODYLEN, in order, as
    (name, big-endian `struct` code); the hosts' ip is 4 or 16 bytes. The one definition of
    where a field lies: the encoder's `fixed_struct`, the per-record decoder, the column
    locator (`record_columns`) and the POS_ constants below are all computed from it."""
    return (
        ("TOTALSIZE", "i"),
        ("MAGICCODE", "i"),
        ("BODYCRC", "i"),
        ("QUEUEID", "i"),
        ("FLAG", "i"),
        ("QUEUEOFFSET", "q"),
        ("PHYSICALOFFSET", "q"),
        ("SYSFLAG", "i"),
        ("BORNTIMESTAMP", "q"),
        ("BORNHOST", "16s" if born_v6 else "4s"),
        ("BORNPORT", "i"),
        ("STORETIMESTAMP", "q"),
        ("STOREHOST", "16s" if store_v6 else "4s"),
        ("STOREPORT", "i"),
        ("RECONSUMETIMES", "i"),
        ("PREPAREDTRANSACTIONOFFSET", "q"),
        ("BODYLEN", "i"),
    )


@functools.lru_cache(maxsize=4)
def field_offsets(born_v6: bool, store_v6: bool) -> dict[str, int]:
    """Each fixed field's offset in a record of this host layout, and BODY's (the fixed part's
    size), from `fixed_fields`."""
    offsets: dict[str, int] = {}
    position = 0
    for name, code in fixed_fields(born_v6, store_v6):
        offsets[name] = position
        position += struct.calcsize(">" + code)
    offsets["BODY"] = position
    return offsets


HOST_LAYOUTS = ((False, False), (False, True), (True, False), (True, True))
"""(born host IPv6, store host IPv6): SYSFLAG bits 0x10 and 0x20 choose a record's layout."""

_V4 = field_offsets(False, False)
POS_TOTAL_SIZE = _V4["TOTALSIZE"]
POS_MAGIC = _V4["MAGICCODE"]
POS_BODY_CRC = _V4["BODYCRC"]
POS_QUEUE_ID = _V4["QUEUEID"]
POS_FLAG = _V4["FLAG"]
POS_QUEUE_OFFSET = _V4["QUEUEOFFSET"]
POS_PHY_OFFSET = _V4["PHYSICALOFFSET"]
POS_SYS_FLAG = _V4["SYSFLAG"]
POS_BORN_TIMESTAMP = _V4["BORNTIMESTAMP"]
POS_BORN_HOST = _V4["BORNHOST"]
"""Fields up to BORNHOST lie at these offsets in every layout; later ones depend on the hosts."""

MAX_PROPERTIES_BYTES = 32767
RECORD_SIZE_SLACK = 64 * 1024  # total record may exceed maxMessageSize by this much

# The whole-record CRC (RocketMQ 5.x `enabledAppendPropCRC`, docs/format.md §2.11): the last
# CRC32_RESERVED_LEN bytes of PROPERTIES are ``__CRC32#`` \x01, ten decimal digits of
# `body_crc` over every byte of the record before them, least significant digit first and
# padded with '0' (`MessageDecoder.createCrc32`), \x02. QUEUEOFFSET, PHYSICALOFFSET and
# STORETIMESTAMP are inside what it covers, so it is written under the put lock, after them
# (`fill_record_crc`). Properties that do not end in \x02 get one before it, as 5.x does; the
# record is then one property longer for a 4.9.8 reader and nothing else.
PROPERTY_CRC32 = "__CRC32#"
CRC32_RESERVED_LEN = len(PROPERTY_CRC32) + 1 + 10 + 1
_CRC_NAME = (PROPERTY_CRC32 + m.NAME_VALUE_SEPARATOR).encode()
CRC_PLACEHOLDER = _CRC_NAME + b"0" * 10 + m.PROPERTY_SEPARATOR.encode()
"""The reserved tail as encoded outside the lock; `fill_record_crc` writes the digits."""
_PROPERTY_SEPARATOR_BYTE = ord(m.PROPERTY_SEPARATOR)
_NAME_VALUE_SEPARATOR_BYTE = ord(m.NAME_VALUE_SEPARATOR)


def crc_suffix(properties: bytes) -> bytes:
    """What the encoder appends to a record's ``properties`` for the whole-record CRC: a \x02
    when they are not empty and do not end in one, then `CRC_PLACEHOLDER`."""
    if properties and properties[-1] != _PROPERTY_SEPARATOR_BYTE:
        return b"\x02" + CRC_PLACEHOLDER
    return CRC_PLACEHOLDER


def crc_digits(crc: int) -> bytes:
    """`createCrc32`'s ten digits of ``crc`` (0 <= crc < 2^31): least significant first."""
    return f"{crc:010d}"[::-1].encode("ascii")


def fill_record_crc(buf: Any, pos: int, total: int) -> None:
    """Write the CRC digits of the record at ``buf[pos:pos + total]``, whose reserved tail the
    encoder left: after the put lock's fields, as `DefaultAppendMessageCallback.doAppend`."""
    crc = zlib.crc32(memoryview(buf)[pos : pos + total - CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    end = pos + total - 1
    buf[end - 10 : end] = crc_digits(crc)


def fill_record_crcs(rows: np.ndarray) -> None:
    """`fill_record_crc` for each row of a (count, record size) array (a uniform batch)."""
    size = rows.shape[1]
    crcs = np.fromiter(
        (zlib.crc32(row[: size - CRC32_RESERVED_LEN]) & 0x7FFFFFFF for row in rows), np.int64, len(rows)
    )
    digits = (crcs[:, None] // (10 ** np.arange(10, dtype=np.int64))) % 10 + ord("0")
    rows[:, size - 11 : size - 1] = digits.astype(np.uint8)


def record_crc_problem(buf: Any, pos: int, total: int, tail: bytes) -> str:
    """Why the record at ``buf[pos:pos + total]``, whose PROPERTIES hold at least
    CRC32_RESERVED_LEN bytes and end in ``tail`` (that many), fails its whole-record CRC, or ''
    (it passes, or has none: written by 4.9.8 or with the setting off). A record has one when
    its properties end in the ``__CRC32#`` name, or in ten digits between \x01 and \x02 that
    are the CRC of what precedes them, or in a name at most two bytes off ``__CRC32#`` (a damaged
    name); NUL bytes there are a zeroed tail. The digits are read as `checkMessageAndReturnSize`
    reads them."""
    named = tail[:8] == _CRC_NAME[:8]
    digits = tail[9:19]
    shaped = (
        tail[8] == _NAME_VALUE_SEPARATOR_BYTE and tail[19] == _PROPERTY_SEPARATOR_BYTE and digits.isdigit()
    )
    # A name at most two bytes off ``__CRC32#`` is that name damaged (no producer's property is
    # named so), whatever else the damage reached: the digits, or the bytes they cover.
    near = not named and sum(a != b for a, b in zip(tail[:8], _CRC_NAME[:8], strict=True)) <= 2
    if not named and not shaped and not near:
        # Zeroed in part: properties end in \x02 only in 5.x's records, whose CRC tail this was;
        # or zeroed from somewhere in the tail (or before it) to the record's end.
        kept = tail.rstrip(b"\0")
        zeroed = b"\0" in tail and (tail[19] == _PROPERTY_SEPARATOR_BYTE or CRC_PLACEHOLDER.startswith(kept))
        return "NUL bytes where the record CRC belongs (a zeroed tail)" if zeroed else ""
    stored = int(digits[::-1]) if digits.isdigit() else -1
    actual = zlib.crc32(memoryview(buf)[pos : pos + total - CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    if named and (
        stored != actual or tail[19] != _PROPERTY_SEPARATOR_BYTE or tail[8] != _NAME_VALUE_SEPARATOR_BYTE
    ):
        return f"record CRC ({PROPERTY_CRC32}) {actual:#010x} is not the stored {tail[9:19]!r}"
    if not named and (stored == actual or b"\0" in tail or near):
        return f"record CRC's property name is damaged: {tail[:8]!r}"
    return ""


_HEAD = struct.Struct(">" + "".join(code for _name, code in fixed_fields(False, False)[:9]))
"""TOTALSIZE .. BORNTIMESTAMP, 48 bytes: the part of every layout before the hosts."""
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
_SIZE_MAGIC = struct.Struct(">ii")
_BLANK = _SIZE_MAGIC


def body_crc(body: bytes) -> int:
    """`UtilAll.crc32` as the store uses it: IEEE CRC-32 with the top bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF if body else 0


def host_length(v6: bool) -> int:
    return 20 if v6 else 8


_STORE_TIMESTAMP_POSITIONS = (
    field_offsets(False, False)["STORETIMESTAMP"],
    field_offsets(True, False)["STORETIMESTAMP"],
)


def store_timestamp_position(sys_flag: int) -> int:
    """`CommitLog.pickupStoreTimestamp`'s position: after the born host (precomputed: every put
    and every record recovery reads asks)."""
    return _STORE_TIMESTAMP_POSITIONS[1 if sys_flag & m.BORNHOST_V6_FLAG else 0]


_FIXED_BYTES = {
    (m.BORNHOST_V6_FLAG if born_v6 else 0) | (m.STOREHOSTADDRESS_V6_FLAG if store_v6 else 0): field_offsets(
        born_v6, store_v6
    )["BODY"]
    for born_v6, store_v6 in HOST_LAYOUTS
}
"""TOTALSIZE to BODYLEN, by SYSFLAG's host bits: 88, 100 or 112 bytes."""


def calc_msg_length(
    sys_flag: int, body_length: int, topic_length: int, properties_length: int, *, v2: bool = False
) -> int:
    """`CommitLog.calMsgLength` (v2 has a 2-byte topic length): the fixed fields of the layout
    table, then BODY, TOPICLEN + TOPIC and PROPLEN + PROPERTIES."""
    fixed = _FIXED_BYTES[sys_flag & (m.BORNHOST_V6_FLAG | m.STOREHOSTADDRESS_V6_FLAG)]
    return fixed + max(body_length, 0) + (2 if v2 else 1) + topic_length + 2 + max(properties_length, 0)


MIN_RECORD_SIZE: Final = calc_msg_length(0, 0, 1, 0)
"""The smallest record (IPv4 hosts, no body, a one-byte topic, no properties): how many records
at most a span of the log can hold."""


def parse_delay_levels(text: str) -> list[int]:
    """`messageDelayLevel` ("1s 5s 10s 30s 1m ... 2h") as milliseconds, level 1 first."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    return [int(word[:-1]) * units[word[-1]] for word in text.split()]


DEFAULT_DELAY_LEVEL_MS = parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")


def cq_tags_code(
    topic: str, properties: dict[str, str], store_timestamp: int, delay_level_ms: Sequence[int]
) -> int:
    """The ConsumeQueue tags slot: tags hash, or the delivery time for delayed messages (§2.6).

    As 4.9.8's `checkMessageAndReturnSize`: the level is clamped to the last one and replaces the
    tags hash only when above 0. A DELAY that is not a number keeps the tags hash (RocketMQ's
    parseInt would make the whole record unreadable)."""
    delay = properties.get(m.PROPERTY_DELAY_TIME_LEVEL)
    if topic == m.SCHEDULE_TOPIC and delay:
        try:
            level = min(int(delay), len(delay_level_ms))
        except ValueError:
            level = 0
        if level > 0:
            return store_timestamp + delay_level_ms[level - 1]
    return m.tags_code(properties.get(m.PROPERTY_TAGS))


# --------------------------------------------------------------------------------------- encode


def topic_problem(topic: str) -> str:
    """Why the store refuses ``topic`` (MESSAGE_ILLEGAL), or '': `validators.topic_problem`."""
    return validators.topic_problem(topic)


def properties_problem(properties_text: str) -> tuple[PutMessageStatus, str] | None:
    """The properties-length checks (§3.2 step 4): the string, then its UTF-8 bytes."""
    if len(properties_text) > MAX_PROPERTIES_BYTES:
        return (
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"properties string is longer than {MAX_PROPERTIES_BYTES} chars",
        )
    if len(properties_text.encode("utf-8")) > MAX_PROPERTIES_BYTES:
        return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, f"properties exceed {MAX_PROPERTIES_BYTES} bytes"
    return None


def body_problem(body_length: int, max_message_size: int) -> str:
    if body_length > max_message_size:
        return f"body of {body_length} bytes exceeds maxMessageSize"
    return ""


def validate_message(
    message: m.Message, *, max_message_size: int, properties_text: str | None = None
) -> tuple[PutMessageStatus, str] | None:
    """The store's put checks (§3.2 steps 2 and 4), and no property separator inside a property
    name or value (`validators.PROPERTY_SEPARATORS`). None when the message can be encoded.
    ``properties_text``: the message's properties string when the caller already built it."""
    if problem := topic_problem(message.topic):
        return PutMessageStatus.MESSAGE_ILLEGAL, problem
    if problem := validators.queue_id_problem(message.queue_id):
        return PutMessageStatus.MESSAGE_ILLEGAL, problem
    props = message.stored_properties() if properties_text is None else properties_text
    if m.stray_separators(props, len(message.properties)) and (
        problem := validators.separator_problem(None, None, message.properties)
    ):
        return PutMessageStatus.MESSAGE_ILLEGAL, problem
    if found := properties_problem(props):
        return found
    if problem := body_problem(len(message.body), max_message_size):
        return PutMessageStatus.MESSAGE_ILLEGAL, problem
    return None


class RecordRejected(Exception):
    """Raised by `RecordEncoder` for a message the store refuses; the put path turns it into a
    result with this status and reason (the caller never sees it)."""

    def __init__(self, status: PutMessageStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@functools.lru_cache(maxsize=4)
def fixed_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    """Every fixed field of a record, TOTALSIZE to BODYLEN, as one format: 88 bytes with IPv4
    hosts, 100 or 112 with IPv6 ones."""
    return struct.Struct(">" + "".join(code for _name, code in fixed_fields(born_v6, store_v6)))


class RecordEncoder:
    """Encodes v1 records for one writer: the store host, born hosts and topics become bytes once
    and the fixed fields are one `struct.pack` (profiled: parsing hosts and re-encoding topics
    were half of a record's encode time). QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP are left
    0 for `patch_record`/`patch_run` to fill under the put lock."""

    def __init__(
        self, store_host: m.Host, born_host: m.Host = ("127.0.0.1", 0), *, append_crc: bool = False
    ) -> None:
        self.append_crc = append_crc
        """`enabledAppendPropCRC`: every record gets the reserved CRC tail (`crc_suffix`)."""
        self.store_ip, self.store_port = m.parse_host(store_host)
        self._born_ip, self._born_port = m.parse_host(born_host)
        if len(self._born_ip) != 4:
            raise ValueError(f"a writer's own born host is IPv4, not {born_host}")
        self._own_fixed = fixed_struct(False, len(self.store_ip) == 16)
        self._own_sys_flag = m.STOREHOSTADDRESS_V6_FLAG if len(self.store_ip) == 16 else 0
        self._topics: dict[str, bytes] = {}

    def topic_field(self, topic: str) -> bytes:
        """TOPICLEN + TOPIC; `RecordRejected` for a topic the store refuses."""
        field_ = self._topics.get(topic)
        if field_ is None:
            if problem := topic_problem(topic):
                raise RecordRejected(PutMessageStatus.MESSAGE_ILLEGAL, problem)
            if topic == m.DELETE_TOPIC_MARKER:  # only the store writes it (topic_marker.py)
                raise RecordRejected(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    f"topic {topic!r} is rmq-mp's own system topic (deleteTopic's marker): a send to it is refused",
                )
            raw = topic.encode("utf-8")
            field_ = self._topics[topic] = bytes((len(raw),)) + raw
        return field_

    def encode(
        self,
        topic_field: bytes,
        body: bytes,
        *,
        queue_id: int,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_ip: bytes,
        born_port: int,
        properties: bytes,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
    ) -> bytearray:
        """One record; SYSFLAG's host bits follow the hosts."""
        if self.append_crc:
            properties = self.with_crc_tail(properties)
        born_v6, store_v6 = len(born_ip) == 16, len(self.store_ip) == 16
        sys_flag &= ~(m.BORNHOST_V6_FLAG | m.STOREHOSTADDRESS_V6_FLAG)
        if born_v6:
            sys_flag |= m.BORNHOST_V6_FLAG
        if store_v6:
            sys_flag |= m.STOREHOSTADDRESS_V6_FLAG
        fixed = fixed_struct(born_v6, store_v6)
        total = fixed.size + len(body) + len(topic_field) + 2 + len(properties)
        head = fixed.pack(
            total,
            MESSAGE_MAGIC_CODE,
            zlib.crc32(body) & 0x7FFFFFFF,
            queue_id,
            flag,
            0,
            0,
            sys_flag,
            born_timestamp,
            born_ip,
            born_port,
            0,
            self.store_ip,
            self.store_port,
            reconsume_times,
            prepared_transaction_offset,
            len(body),
        )
        return bytearray().join((head, body, topic_field, _SHORT.pack(len(properties)), properties))

    def encode_own(
        self,
        topic_field: bytes,
        body: bytes,
        queue_id: int,
        flag: int,
        born_timestamp: int,
        properties: bytes,
    ) -> bytearray:
        """`encode` of a plain message born at this encoder's ``born_host`` (IPv4): the put
        path's common case, in one `struct.pack` with no keyword handling."""
        if self.append_crc:
            properties = self.with_crc_tail(properties)
        return bytearray().join(
            (
                self._own_fixed.pack(
                    self._own_fixed.size + len(body) + len(topic_field) + 2 + len(properties),
                    MESSAGE_MAGIC_CODE,
                    zlib.crc32(body) & 0x7FFFFFFF,
                    queue_id,
                    flag,
                    0,
                    0,
                    self._own_sys_flag,
                    born_timestamp,
                    self._born_ip,
                    self._born_port,
                    0,
                    self.store_ip,
                    self.store_port,
                    0,
                    0,
                    len(body),
                ),
                body,
                topic_field,
                _SHORT.pack(len(properties)),
                properties,
            )
        )

    @staticmethod
    def with_crc_tail(properties: bytes) -> bytes:
        """``properties`` and the reserved CRC tail; PROPERTIES_SIZE_EXCEEDED when the two are
        longer than a record's properties may be (5.x's check, with the tail counted)."""
        properties += crc_suffix(properties)
        if len(properties) > MAX_PROPERTIES_BYTES:
            raise RecordRejected(
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                f"properties with the record CRC exceed {MAX_PROPERTIES_BYTES} bytes",
            )
        return properties

    def encode_message(self, message: m.Message, properties_text: str | None = None) -> bytearray:
        """`encode` of a `Message` as given (its born host, time, flags and properties)."""
        if properties_text is None:
            properties_text = message.stored_properties()
        born_ip, born_port = m.parse_host(message.born_host)
        return self.encode(
            self.topic_field(message.topic),
            message.body,
            queue_id=message.queue_id,
            flag=message.flag,
            sys_flag=message.sys_flag,
            born_timestamp=message.born_timestamp,
            born_ip=born_ip,
            born_port=born_port,
            properties=properties_text.encode("utf-8"),
            reconsume_times=message.reconsume_times,
            prepared_transaction_offset=message.prepared_transaction_offset,
        )


def encode_record(message: m.Message, store_host: m.Host, *, append_crc: bool = False) -> bytearray:
    """Encode a v1 record with QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP left 0 for
    `patch_record` to fill under the put lock (and then, with ``append_crc``, `fill_record_crc`).
    The host bits of SYSFLAG follow the hosts."""
    encoded = RecordEncoder(store_host, append_crc=append_crc).encode_message(message)
    assert _INT.unpack_from(encoded, 0)[0] == len(encoded), "encoded length must equal TOTALSIZE"
    return encoded


# A peek at one field of a record at ``pos`` of ``buf``, for readers that need only that field
# (a walk from record to record, recovery choosing its first file, a timestamp lookup): no check
# is made that a record is there; `check_record` and `decode_message` are the checked reads.

MAGIC_CODE_BYTES = _INT.pack(MESSAGE_MAGIC_CODE)
"""MAGICCODE of a v1 record as it lies in the file (a walk searches for it)."""


SIZE_MAGIC_LENGTH = _SIZE_MAGIC.size
"""Bytes of TOTALSIZE and MAGICCODE, the head every record and blank begins with."""


def peek_size_magic(buf: Any, pos: int) -> tuple[int, int]:
    """(TOTALSIZE, MAGICCODE): all a walk needs to step over a record or a file's blank."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return int(total), int(magic)


def peek_total_size(buf: Any, pos: int) -> int:
    return int(_INT.unpack_from(buf, pos + POS_TOTAL_SIZE)[0])


def peek_sys_flag(buf: Any, pos: int) -> int:
    return int(_INT.unpack_from(buf, pos + POS_SYS_FLAG)[0])


def peek_phy_offset(buf: Any, pos: int) -> int:
    return int(_LONG.unpack_from(buf, pos + POS_PHY_OFFSET)[0])


def peek_store_timestamp(buf: Any, pos: int) -> int:
    """STORETIMESTAMP, wherever the born host's length puts it (`pickupStoreTimestamp`)."""
    return int(_LONG.unpack_from(buf, pos + store_timestamp_position(peek_sys_flag(buf, pos)))[0])


OFFSETS = struct.Struct(">qq")
"""QUEUEOFFSET and PHYSICALOFFSET, adjacent in every record (the put lock patches them)."""
TIMESTAMP = struct.Struct(">q")
"""STORETIMESTAMP (at `store_timestamp_position`)."""


# The fields the put lock decides (QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP) are written by
# these three patchers only, one per shape of what is appended: one record (`patch_record`),
# records of one size as rows of a matrix (`patch_rows`), records of any sizes (`patch_run`).
# The compiled core writes the same fields in C, tested to give the same bytes.


def patch_record(
    buf: Any,
    pos: int,
    queue_offset: int,
    phy_offset: int,
    store_timestamp: int,
    sys_flag: int,
    *,
    crc: bool = False,
) -> None:
    """Write the three fields the put lock decides into an encoded record at ``buf[pos:]``;
    with ``crc`` (a record encoded with its CRC tail) then its whole-record CRC."""
    OFFSETS.pack_into(buf, pos + POS_QUEUE_OFFSET, queue_offset, phy_offset)
    TIMESTAMP.pack_into(buf, pos + store_timestamp_position(sys_flag), store_timestamp)
    if crc:
        fill_record_crc(buf, pos, _INT.unpack_from(buf, pos)[0])


_COLUMNS_8 = np.arange(8, dtype=np.int64)


def patch_run(
    data: Any,
    starts: np.ndarray,
    *,
    queue_offset: int,
    phy_offset: int,
    store_timestamp: int,
    store_timestamp_position: int,
    crc: bool = False,
) -> None:
    """`patch_record` for consecutive records of one queue whose born hosts are of one family, in
    three numpy stores instead of three `pack_into` calls a record: record i (starting at
    ``starts[i]`` of ``data``) gets queue offset ``queue_offset + i`` (or 0 throughout when
    ``queue_offset`` < 0: records without a queue) and physical offset ``phy_offset + starts[i]``."""
    n = len(starts)
    view = np.frombuffer(data, dtype=np.uint8)
    queue_offsets = (
        np.arange(queue_offset, queue_offset + n, dtype=np.int64)
        if queue_offset >= 0
        else np.zeros(n, np.int64)
    )
    for position, values in (
        (POS_QUEUE_OFFSET, queue_offsets),
        (POS_PHY_OFFSET, phy_offset + starts),
        (store_timestamp_position, np.full(n, store_timestamp, dtype=np.int64)),
    ):
        view[(starts + position)[:, None] + _COLUMNS_8] = values.astype(">i8").view(np.uint8).reshape(n, 8)
    if crc:
        for start in starts.tolist():
            fill_record_crc(data, start, _INT.unpack_from(data, start)[0])


def patch_rows(
    rows: np.ndarray,
    steps: np.ndarray,
    *,
    queue_offset: int,
    phy_offset: int,
    store_timestamp: int,
    store_timestamp_position: int,
    crc: bool = False,
) -> None:
    """`patch_run` for records of one size, one a row of ``rows``: row i gets queue offset
    ``queue_offset + i`` (0 throughout when < 0) and physical offset ``phy_offset`` + the row's
    byte distance from the first. ``steps``: (count, 2) int64 of (i, i * record size), cached by
    the caller. QUEUEOFFSET and PHYSICALOFFSET are adjacent: one (count, 2) big-endian view, one add."""
    offsets = rows[:, POS_QUEUE_OFFSET : POS_QUEUE_OFFSET + 16].view(">i8")
    np.add(steps, np.array((max(queue_offset, 0), phy_offset)), out=offsets)
    if queue_offset < 0:
        offsets[:, 0] = 0
    rows[:, store_timestamp_position : store_timestamp_position + 8].view(">i8")[:] = store_timestamp
    if crc:
        fill_record_crcs(rows)


def encode_blank(max_blank: int) -> bytes:
    """The end-of-file record: TOTALSIZE = bytes left in the file, then the blank magic."""
    return _BLANK.pack(max_blank, BLANK_MAGIC_CODE)


# --------------------------------------------------------------------------------------- decode


@dataclass(slots=True)
class DispatchRequest:
    """What reading one record yields (RocketMQ's DispatchRequest). ``size`` is the record's
    TOTALSIZE when valid, 0 for a blank (go to the next file), -1 when invalid; a failure with a
    positive size is a length mismatch that a reader may skip (§7.7)."""

    size: int
    success: bool
    topic: str = ""
    queue_id: int = 0
    phy_offset: int = 0
    tags_code: int = 0
    store_timestamp: int = 0
    queue_offset: int = 0
    keys: str = ""
    uniq_key: str | None = None
    sys_flag: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    ends_in_nul: bool = False
    """The properties end in a NUL byte: what a torn, zero-filled record tail looks like. Only
    meaningful for the last record of the log (recovery drops it there)."""


BLANK = DispatchRequest(0, True)


class _Invalid(Exception):
    """Internal: the bytes are not a whole valid record."""


@dataclass(slots=True)
class _Fields:
    total_size: int
    magic: int
    crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy_offset: int
    sys_flag: int
    born_timestamp: int
    born_ip: bytes
    born_port: int
    store_timestamp: int
    store_ip: bytes
    store_port: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_start: int
    body_length: int
    topic: str
    properties_text: str
    ends_in_nul: bool
    topic_length: int
    """UTF-8 bytes, as stored (TOTALSIZE is checked against these, not re-encoded text)."""
    properties_length: int


_FixedFields = tuple[int, int, int, int, int, int, int, int, int, bytes, int, int, bytes, int, int, int, int]
"""What `fixed_struct` unpacks: TOTALSIZE to BODYLEN."""


def _parse(buf: Any, pos: int, limit: int) -> _Fields:
    """Read every field of the record at ``pos``; `_Invalid` if it is not whole and well-formed.
    The fixed fields are one `fixed_struct` unpack (the encoder's format): this runs for every
    record a consumer reads and reput dispatches."""
    if limit - pos < _HEAD.size:
        raise _Invalid("fewer bytes left than a record header")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise _Invalid(f"unknown magic code {magic & 0xFFFFFFFF:#010x}")
    end = pos + total
    if total < _HEAD.size or end > limit:
        raise _Invalid(f"TOTALSIZE {total} runs past the readable end")
    try:
        (sys_flag,) = _INT.unpack_from(buf, pos + POS_SYS_FLAG)
        fixed = fixed_struct(bool(sys_flag & m.BORNHOST_V6_FLAG), bool(sys_flag & m.STOREHOSTADDRESS_V6_FLAG))
        fields = cast(_FixedFields, fixed.unpack_from(buf, pos))
        body_len = fields[16]
        p = pos + fixed.size
        if body_len < 0 or p + body_len > end:
            raise _Invalid(f"BODYLEN {body_len} does not fit in the record")
        body_start = p
        p += body_len
        if magic == MESSAGE_MAGIC_CODE:
            topic_len = buf[p]
            p += 1
        else:
            (topic_len,) = struct.unpack_from(">H", buf, p)
            p += 2
        topic_bytes = bytes(buf[p : p + topic_len])
        if not topic_bytes or b"\0" in topic_bytes:
            raise _Invalid("empty topic or NUL in topic: a zeroed (torn) record tail")
        topic = topic_bytes.decode("utf-8")
        p += topic_len
        (props_len,) = _SHORT.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise _Invalid(f"PROPLEN {props_len} does not fit in the record")
        props_bytes = bytes(buf[p : p + props_len])
        if props_bytes and not props_bytes.strip(b"\0"):
            raise _Invalid("properties are all zero bytes: a zeroed (torn) record tail")
        props = props_bytes.decode("utf-8")
        ends_in_nul = props_bytes.endswith(b"\0")
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise _Invalid(f"malformed record: {exc}") from exc
    # The fixed fields, TOTALSIZE to PREPAREDTRANSACTIONOFFSET, are `_Fields`' first 16.
    return _Fields(
        *fields[:16], body_start, body_len, topic, props, ends_in_nul, len(topic_bytes), len(props_bytes)
    )


def _expected_length(f: _Fields) -> int:
    return calc_msg_length(
        f.sys_flag, f.body_length, f.topic_length, f.properties_length, v2=f.magic == MESSAGE_MAGIC_CODE_V2
    )


def check_record(
    buf: Any,
    pos: int,
    limit: int,
    *,
    check_crc: bool,
    delay_level_ms: Sequence[int] = DEFAULT_DELAY_LEVEL_MS,
) -> DispatchRequest:
    """`checkMessageAndReturnSize`: validate the record at ``buf[pos:limit]`` and describe it.

    Never raises for bad bytes: a torn, garbage or CRC-failing record is ``size=-1``.
    """
    if limit - pos >= END_FILE_MIN_BLANK_LENGTH:
        _size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic == BLANK_MAGIC_CODE:
            return BLANK
    try:
        f = _parse(buf, pos, limit)
    except _Invalid as exc:
        return DispatchRequest(-1, False, reason=str(exc))
    if check_crc:
        body = bytes(buf[f.body_start : f.body_start + f.body_length])
        if body_crc(body) != f.crc:
            return DispatchRequest(-1, False, reason=f"body CRC mismatch at record of {f.total_size} bytes")
    if _expected_length(f) != f.total_size:
        return DispatchRequest(f.total_size, False, reason="TOTALSIZE does not match the fields")
    if check_crc and (problem := _record_crc_problem(buf, pos, f)):
        return DispatchRequest(-1, False, reason=f"{problem} at record of {f.total_size} bytes")
    properties = m.string_to_properties(f.properties_text)
    return DispatchRequest(
        size=f.total_size,
        success=True,
        topic=f.topic,
        queue_id=f.queue_id,
        phy_offset=f.phy_offset,
        tags_code=cq_tags_code(f.topic, properties, f.store_timestamp, delay_level_ms),
        store_timestamp=f.store_timestamp,
        queue_offset=f.queue_offset,
        keys=properties.get(m.PROPERTY_KEYS, ""),
        uniq_key=properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        sys_flag=f.sys_flag,
        prepared_transaction_offset=f.prepared_transaction_offset,
        properties=properties,
        ends_in_nul=f.ends_in_nul,
    )


def decode_message(buf: Any, pos: int, limit: int, *, file_position: int = -1) -> m.MessageExt:
    """`MessageDecoder.decode` of a whole record, checked as it is served.

    `CorruptRecordError` when the bytes are not a whole record (magic, sizes, TOTALSIZE against
    its fields, as `checkMessageAndReturnSize`) or, given ``file_position`` (its commit-log
    offset), when its PHYSICALOFFSET field names another offset; `BodyCrcError` when the CRC-32
    of the stored body is not BODYCRC. RocketMQ's decoder checks neither and its store checks the
    CRC only on recovery (`checkCRCOnRecover`), which after a clean stop reads the last three
    files: a body flipped on disk in an older file would be served as intact. The CRC runs on
    the body bytes the message gets anyway (`zlib.crc32`, C): no further copy.
    """
    try:
        f = _parse(buf, pos, limit)
    except _Invalid as exc:
        raise CorruptRecordError(f"no valid record at {_where(pos, file_position)}: {exc}") from exc
    if _expected_length(f) != f.total_size:
        raise CorruptRecordError(
            f"record at {_where(pos, file_position)}: TOTALSIZE {f.total_size} does not match its fields"
        )
    if file_position >= 0 and f.phy_offset != file_position:
        raise CorruptRecordError(
            f"record at {_where(pos, file_position)}: its PHYSICALOFFSET field says {f.phy_offset}"
        )
    body = bytes(buf[f.body_start : f.body_start + f.body_length])
    if zlib.crc32(body) & 0x7FFFFFFF != f.crc:
        raise BodyCrcError(
            f"record at {_where(pos, file_position)} ({f.total_size} bytes, {f.topic} queue {f.queue_id} "
            f"offset {f.queue_offset}): body CRC {zlib.crc32(body) & 0x7FFFFFFF:#010x} is not BODYCRC "
            f"{f.crc:#010x}"
        )
    if problem := _record_crc_problem(buf, pos, f):
        raise BodyCrcError(
            f"record at {_where(pos, file_position)} ({f.total_size} bytes, {f.topic} queue {f.queue_id} "
            f"offset {f.queue_offset}): {problem}"
        )
    born = (_format_ip(f.born_ip), f.born_port)
    store = (_format_ip(f.store_ip), f.store_port)
    return m.MessageExt(
        store_size=f.total_size,
        magic_code=f.magic,
        body_crc=f.crc,
        queue_id=f.queue_id,
        flag=f.flag,
        queue_offset=f.queue_offset,
        commit_log_offset=f.phy_offset,
        sys_flag=f.sys_flag,
        born_timestamp=f.born_timestamp,
        born_host=born,
        store_timestamp=f.store_timestamp,
        store_host=store,
        reconsume_times=f.reconsume_times,
        prepared_transaction_offset=f.prepared_transaction_offset,
        body=body,
        topic=f.topic,
        properties=_without_crc(m.string_to_properties(f.properties_text)),
        msg_id=f"{_msg_id_prefix(f.store_ip, f.store_port)}{f.phy_offset & 0xFFFFFFFFFFFFFFFF:016X}",
        file_position=file_position,
    )


def _without_crc(properties: dict[str, str]) -> dict[str, str]:
    """A message's properties as its producer gave them: the store's ``__CRC32#`` is checked,
    not served (a delivered delayed message or a retry would otherwise carry it into a record
    of its own; RocketMQ 5.x's put deletes it for the same reason)."""
    properties.pop(PROPERTY_CRC32, None)
    return properties


def _record_crc_problem(buf: Any, pos: int, f: _Fields) -> str:
    """`record_crc_problem` of a parsed record whose lengths agree with TOTALSIZE."""
    if f.properties_length < CRC32_RESERVED_LEN:
        return ""
    end = pos + f.total_size
    return record_crc_problem(buf, pos, f.total_size, bytes(buf[end - CRC32_RESERVED_LEN : end]))


def _where(pos: int, file_position: int) -> str:
    return f"commit-log offset {file_position}" if file_position >= 0 else f"position {pos}"


@functools.lru_cache(maxsize=64)
def _format_ip(ip: bytes) -> str:
    return m.format_ip(ip)


@functools.lru_cache(maxsize=64)
def _msg_id_prefix(store_ip: bytes, store_port: int) -> str:
    """`create_message_id` without the offset: records of one store share it."""
    return m.create_message_id(store_ip, store_port, 0)[:-16]
