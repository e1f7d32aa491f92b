"""Message values and the small encodings RocketMQ hangs off them.

Mirrors `Message`, `MessageExt`, `MessageDecoder` (properties string, msgId),
`MessageClientIDSetter` (UNIQ_KEY) and `MessageExtBrokerInner.tagsString2tagsCode`
(docs/format.md §2.5-§2.7). Nothing here knows the record layout: that is `record.py`.
"""

from __future__ import annotations

import array
import functools
import ipaddress
import operator
import os
import random
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, TypeAlias

from rmq_mp.errors import InvalidMessageIdError

if TYPE_CHECKING:
    from typing import Any

    import numpy as np
    from typing_extensions import Buffer

    Body: TypeAlias = Buffer | np.ndarray[Any, Any]
    """What a send takes as a body: any buffer (bytes, bytearray, memoryview, a numpy array), as
    the compiled core and the reference both do (`rmq_mp.validators.body_bytes`). For type
    checkers only: with strict bytes (mypy 2's default) a bytearray is not `bytes`, and before
    Python 3.12 numpy's stubs give an array no ``__buffer__``."""

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

# MessageConst property names used by the store.
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DELETE_TOPIC_MARKER = "rmq_sys_DELETE_TOPIC"
"""rmq-mp's own system topic (TopicValidator's ``rmq_sys_`` prefix): a deleteTopic's marker record
(`rmq_mp/format/topic_marker.py`); the store writes it, a send to it is refused."""


def retry_topic(group: str) -> str:
    """MixAll.getRetryTopic: where a clustering group's failed messages wait for their retry."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """MixAll.getDLQTopic: where a group's messages go after their last retry failed."""
    return DLQ_GROUP_TOPIC_PREFIX + group


# MessageSysFlag (docs/format.md §2.3).
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20

Host = tuple[str, int]
"""An address as (ip text, port). IPv6 text is accepted in any form and produced in Java's
uncompressed form (``2001:db8:0:1:0:0:0:5``), as ``InetAddress.getHostAddress`` prints it."""


def transaction_type(sys_flag: int) -> int:
    """`MessageSysFlag.getTransactionValue`: the two transaction bits."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE


def is_dispatchable(sys_flag: int) -> bool:
    """Only NOT and COMMIT transaction types get a ConsumeQueue entry and a queue offset."""
    return transaction_type(sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


def properties_to_string(properties: Mapping[str, str]) -> str:
    """`messageProperties2String`: ``name\\x01value\\x02`` per entry, last separator dropped."""
    return PROPERTY_SEPARATOR.join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}" for name, value in properties.items() if value is not None
    )


def stray_separators(text: str, entries: int) -> bool:
    """Whether the properties string of ``entries`` properties holds separators beyond its own
    (one ``\\x01`` each, ``\\x02`` between): a name, value, tag or key brought some, and reading
    the record back would set other properties (``x\\x02KEYS\\x01k`` sets KEYS). Two scans in C
    over the joined string, paid by every message with properties."""
    return bool(text) and (
        text.count(NAME_VALUE_SEPARATOR) != entries or text.count(PROPERTY_SEPARATOR) != entries - 1
    )


def string_to_properties(text: str) -> dict[str, str]:
    """`string2messageProperties`: keep chunks with a non-empty name and a non-empty value."""
    result: dict[str, str] = {}
    for chunk in text.split(PROPERTY_SEPARATOR):
        sep = chunk.find(NAME_VALUE_SEPARATOR)
        if len(chunk) >= 3 and 0 < sep < len(chunk) - 1:
            result[chunk[:sep]] = chunk[sep + 1 :]
    return result


def java_string_hash(text: str) -> int:
    """Java `String.hashCode()`: ``31*h + c`` over UTF-16 code units, signed 32-bit. Computed as
    the sum of each unit times its power of 31, in C (`map`): twice as fast as a Python loop,
    and reput hashes every index key of every record it dispatches one by one."""
    if text.isascii():
        units: bytes | tuple[int, ...] = text.encode("ascii")
    else:
        raw = text.encode("utf-16-be")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    n = len(units)
    powers = _POWERS_OF_31 if n <= len(_POWERS_OF_31) else _powers_of_31(n)
    h = sum(map(operator.mul, units, powers[len(powers) - n :])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def _powers_of_31(n: int) -> list[int]:
    """31^(n-1) ... 31^0 modulo 2^32 (highest power first)."""
    return [pow(31, i, 1 << 32) for i in range(n - 1, -1, -1)]


_POWERS_OF_31 = _powers_of_31(1024)


def tags_code(tags: str | None) -> int:
    """`tagsString2tagsCode`: 0 for no tags, else the tags' Java hash code."""
    return java_string_hash(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """`IndexFile.indexKeyHashMethod`: abs(hashCode), and 0 for Integer.MIN_VALUE."""
    h = abs(java_string_hash(key))
    return 0 if h > 0x7FFFFFFF else h


@functools.lru_cache(maxsize=1024)
def parse_host(host: Host | str) -> tuple[bytes, int]:
    """(ip bytes, port) of an address given as a tuple or ``ip:port`` / ``[ip6]:port`` text.
    Cached: producers encode the same few hosts millions of times."""
    if isinstance(host, str):
        text, _, port_text = host.rpartition(":")
        host = (text.strip("[]"), int(port_text))
    ip_text, port = host
    return ipaddress.ip_address(ip_text).packed, port


def format_ip(ip: bytes) -> str:
    """Java's `getHostAddress`: dotted quad, or eight lower-case hex groups, no `::`."""
    if len(ip) == 4:
        return ".".join(str(b) for b in ip)
    return ":".join(f"{g:x}" for g in struct.unpack(">8H", ip))


def format_host(host: Host) -> str:
    """``a.b.c.d:port`` or ``[h:h:h:h:h:h:h:h]:port`` as RocketMQ's tools print hosts."""
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def create_message_id(store_ip: bytes, store_port: int, phy_offset: int) -> str:
    """`MessageDecoder.createMessageId`: hex of store ip, port (int), commit-log offset (long)."""
    return (store_ip + struct.pack(">iq", store_port, phy_offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[Host, int]:
    """`MessageDecoder.decodeMessageId`: ((store ip, port), commit-log offset)."""
    if len(msg_id) not in (32, 56) or not all(c in "0123456789abcdefABCDEF" for c in msg_id):
        raise InvalidMessageIdError(f"msgId must be 32 or 56 hexadecimal characters: {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise InvalidMessageIdError(f"msgId is not hexadecimal: {msg_id!r}") from exc
    ip_len = 4 if len(raw) == 16 else 16
    port, phy_offset = struct.unpack_from(">iq", raw, ip_len)
    return (format_ip(raw[:ip_len]), port), phy_offset


class UniqueIdGenerator:
    """`MessageClientIDSetter`: UNIQ_KEY = hex(ip ‖ pid:short ‖ seed:int ‖ ms since month start:int
    ‖ counter:short), 32 upper-case hex characters for an IPv4 client. Increasing per process.

    The month offset is Java's ``(int)`` cast of a long: past 24.8 days into a month it exceeds
    2^31 - 1 and wraps, so it is formatted as 32 bits, never range-checked."""

    def __init__(self, ip: str = "127.0.0.1") -> None:
        prefix = ipaddress.ip_address(ip).packed + struct.pack(
            ">Hi", os.getpid() & 0xFFFF, random.getrandbits(31)
        )
        self.prefix_hex = prefix.hex().upper()
        """The fixed part of every id this generator makes (ip, pid, seed)."""
        self.state = array.array("q", [0, 0, 0])
        """[counter, month start ms, next month ms]: one array, so the compiled send
        (rmq_mp/put/_core.c) takes ids from the same counter as this generator."""
        self._prefix_ms = -1
        self._prefix_at = ""
        self._roll_month(time.time_ns() // 1_000_000)

    def _roll_month(self, now_ms: int) -> None:
        now = datetime.fromtimestamp(now_ms / 1000)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
        self.state[1] = int(start.timestamp() * 1000)
        self.state[2] = int(nxt.timestamp() * 1000)
        self._prefix_ms = -1

    def time_hex(self, now_ms: int) -> str:
        """The 8 hex characters of ``now_ms`` as milliseconds since the month began."""
        if now_ms >= self.state[2]:
            self._roll_month(now_ms)
        return f"{(now_ms - self.state[1]) & 0xFFFFFFFF:08X}"

    def prefix_at(self, now_ms: int) -> str:
        """The first 28 of an id's 32 characters at ``now_ms`` (all but the counter)."""
        if now_ms != self._prefix_ms:
            self._prefix_ms = now_ms
            self._prefix_at = f"{self.prefix_hex}{self.time_hex(now_ms)}"
        return self._prefix_at

    def take(self, count: int) -> int:
        """Reserve ``count`` consecutive counter values; returns the first (mod 2^16 per id)."""
        state = self.state
        first = state[0]
        state[0] = first + count
        return first

    def next_id(self, now_ms: int | None = None) -> str:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        state = self.state
        counter = state[0]
        state[0] = counter + 1
        return f"{self.prefix_at(now_ms)}{counter & 0xFFFF:04X}"


@dataclass(slots=True, kw_only=True)
class Message:
    """What a producer hands to the store (RocketMQ's MessageExtBrokerInner, minus what the
    store assigns: queue offset, commit-log offset, store timestamp)."""

    topic: str
    body: bytes = b""
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    store_host: Host | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties_string: str | None = None
    """What is stored as the properties when it differs from `properties` (RocketMQ's separate
    `propertiesString`): a delayed message's delivery keeps DELAY in the stored string and not in
    the map (`rmq_mp.store.schedule.message_timeup`). None: `properties` encoded."""

    def stored_properties(self) -> str:
        """The properties string the store writes for this message: `properties_string`, or
        `properties` encoded."""
        text = self.properties_string
        return properties_to_string(self.properties) if text is None else text

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(PROPERTY_KEYS))


def split_keys(keys: str | None) -> list[str]:
    """Index keys of a KEYS property: split on single spaces, empty words skipped."""
    return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []


INDEX_KEY_WHOLE = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
"""The property indexed as one key (first, when present)."""
INDEX_KEY_WORDS = PROPERTY_KEYS
"""The property indexed word by word (`split_keys`), after it."""


def index_keys(topic: str, uniq_key: str | None, keys: str | None) -> list[str]:
    """`IndexService.buildIndex`'s keys for one record, in its order: ``topic#<UNIQ_KEY>``, then
    ``topic#<word>`` for each word of KEYS. The one statement of the rule: the index service and
    the numpy decoder call it, and the compiled scan is configured with INDEX_KEY_WHOLE,
    INDEX_KEY_WORDS and KEY_SEPARATOR (format/native.py)."""
    found = [f"{topic}#{uniq_key}"] if uniq_key else []
    found.extend(f"{topic}#{k}" for k in split_keys(keys))
    return found


@dataclass(slots=True, kw_only=True)
class MessageExt:
    """A stored record, every field as decoded (RocketMQ's MessageExt)."""

    store_size: int
    magic_code: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]
    msg_id: str
    file_position: int = -1

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
