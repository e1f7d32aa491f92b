"""rmq-mp's metadata channel beside the HA port (docs/replication.md, "Metadata"): bytes only.

RocketMQ's broker copies consumerOffset.json, topics.json, delayOffset.json and
subscriptionGroup.json to its slaves every 10 s over its remoting port (SlaveSynchronize); rmq-mp
has no broker, so its own channel carries the same state, and the HA socket's bytes stay RocketMQ's.

Every message, either way, is a 16-byte header and a UTF-8 JSON object:

    off  size  field
      0     4  magic     b"RMQM"
      4     1  version   1
      5     1  kind      HELLO (slave -> master, once) or SNAPSHOT (master -> slave)
      6     2  reserved  0
      8     4  length    of the payload, big-endian; at most the kind's bound
     12     4  crc32     of the payload (zlib), big-endian

HELLO: ``{"brokerName": str}``. SNAPSHOT: ``{"seq": int, "masterEnd": int, "resetMs": int,
"delayFrom": int, "builtEnd": int, "full": true, "offsets": {"topic@group": {"<queueId>": offset}}, "delay": {"<level>": offset},
"topics": {"<topic>": <TopicConfig as in topics.json>}}``, or a heartbeat ``{"seq", "masterEnd",
"resetMs", "full": false}`` when nothing changed since the connection's last full one. A message that breaks any of this
(magic, version, kind, a length beyond its bound, the checksum, the JSON, a field's type or
range) raises `HaMetaError` before anything of it is used: the reader closes the connection.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from rmq_mp.config.topics import TopicConfig
from rmq_mp.errors import HaProtocolError

MAGIC = b"RMQM"
VERSION = 1
HELLO, SNAPSHOT = 1, 2
HEADER_BYTES = 16
MAX_HELLO_BYTES = 4096
"""A slave's greeting is a name: anything longer is not one."""
MAX_SNAPSHOT_BYTES = 64 << 20
"""Consumer offsets at maxConsumerOffsetNum (100,000 entries of up to 383-byte keys) and every
topic's config fit well within this; a peer announcing more is refused before it is read."""
JAVA_LONG_MAX = (1 << 63) - 1
_HEADER = struct.Struct(">4sBBHII")
_BOUNDS = {HELLO: MAX_HELLO_BYTES, SNAPSHOT: MAX_SNAPSHOT_BYTES}


class HaMetaError(HaProtocolError):
    """A metadata-channel peer sent a message this format does not allow: the connection is
    closed, and nothing of the message is applied."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a master's metadata is at one moment (`seq` counts them per connection)."""

    seq: int
    master_end: int
    reset_ms: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    delay: dict[int, int] = field(default_factory=dict)
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    delay_from: int = 0
    """The master's commit-log end a snapshot interval before it read the delay offsets: a
    delivery below it is counted in them; one above may not be (workers/promotion.py looks)."""
    built_end: int = 0
    """The master's commit-log end when it read this state (a full snapshot's; 0 unknown): a
    topic deleted at or above it (its marker in the log, rmq_mp/format/topic_marker.py) may
    still be in it, and a slave that deleted the topic leaves that topic's entries out."""
    full: bool = True
    """False: a heartbeat, the state unchanged since the last full snapshot on this connection
    (offsets, delay and topics left out): only ``master_end`` and ``reset_ms`` are news."""

    def to_json(self) -> dict[str, Any]:
        if not self.full:
            return {
                "seq": self.seq,
                "masterEnd": self.master_end,
                "resetMs": self.reset_ms,
                "delayFrom": self.delay_from,
                "full": False,
            }
        return {
            "seq": self.seq,
            "masterEnd": self.master_end,
            "resetMs": self.reset_ms,
            "delayFrom": self.delay_from,
            "builtEnd": self.built_end,
            "full": True,
            "offsets": {k: {str(q): o for q, o in v.items()} for k, v in self.offsets.items()},
            "delay": {str(level): o for level, o in self.delay.items()},
            "topics": self.topics,
        }


def encode(kind: int, payload: dict[str, Any]) -> bytes:
    """One message of ``kind`` carrying ``payload``."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > _BOUNDS[kind]:
        raise HaMetaError(f"a metadata message of kind {kind} is {len(body)} bytes, over {_BOUNDS[kind]}")
    return _HEADER.pack(MAGIC, VERSION, kind, 0, len(body), zlib.crc32(body)) + body


def encode_hello(broker_name: str) -> bytes:
    return encode(HELLO, {"brokerName": broker_name})


def encode_snapshot(snapshot: Snapshot) -> bytes:
    return encode(SNAPSHOT, snapshot.to_json())


def decode_header(data: bytes | bytearray | memoryview, expect: int) -> int:
    """The payload length a header announces for a message of kind ``expect``; `HaMetaError` for
    anything else (so an oversized length is refused before a byte of it is read)."""
    magic, version, kind, reserved, length, _crc = _HEADER.unpack(bytes(data[:HEADER_BYTES]))
    if magic != MAGIC:
        raise HaMetaError(f"not a metadata message (magic {magic!r})")
    if version != VERSION or reserved:
        raise HaMetaError(
            f"metadata message version {version} (reserved {reserved}); this side speaks {VERSION}"
        )
    if kind != expect:
        raise HaMetaError(f"metadata message of kind {kind} where kind {expect} was expected")
    if length > _BOUNDS[kind]:
        raise HaMetaError(
            f"metadata message of {length} bytes, over the {_BOUNDS[kind]}-byte bound of its kind"
        )
    return length


def _int(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= JAVA_LONG_MAX:
        raise HaMetaError(f"{what}: {value!r} is not an integer in [{low}, 2^63)")
    return value


def _key_int(key: str, what: str, low: int = 0) -> int:
    if not (key.isascii() and key.isdigit() and len(key) <= 19):
        raise HaMetaError(f"{what}: {key[:40]!r} is not a decimal number")
    return _int(int(key), what, low)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise HaMetaError(f"{what} is not an object")
    return value


def decode_payload(header: bytes | bytearray | memoryview, body: bytes) -> dict[str, Any]:
    """The JSON object of a whole message whose header `decode_header` accepted."""
    *_, crc = _HEADER.unpack(bytes(header[:HEADER_BYTES]))
    if zlib.crc32(body) != crc:
        raise HaMetaError("metadata message checksum mismatch")
    try:
        value = json.loads(body.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HaMetaError(f"metadata message is not UTF-8 JSON: {exc}") from None
    return _object(value, "metadata message")


def decode_hello(payload: dict[str, Any]) -> str:
    name = payload.get("brokerName")
    if not isinstance(name, str) or not 0 < len(name) <= 255:
        raise HaMetaError(f"HELLO's brokerName {name!r} is not a name")
    return name


def decode_snapshot(payload: dict[str, Any]) -> Snapshot:
    """A SNAPSHOT's payload, every field checked (keys as consumerOffset.json allows them)."""
    full = payload.get("full", True)
    if not isinstance(full, bool):
        raise HaMetaError(f"full: {full!r} is not a boolean")
    if not full:
        return Snapshot(
            seq=_int(payload.get("seq"), "seq"),
            master_end=_int(payload.get("masterEnd"), "masterEnd"),
            reset_ms=_int(payload.get("resetMs"), "resetMs"),
            delay_from=_int(payload.get("delayFrom", 0), "delayFrom"),
            full=False,
        )
    offsets: dict[str, dict[int, int]] = {}
    for key, queues in _object(payload.get("offsets"), "offsets").items():
        if "@" not in key or len(key.encode()) > 383:
            raise HaMetaError(f"offsets key {key[:80]!r} is not topic@group")
        offsets[key] = {
            _key_int(q, f"queue id of {key}"): _int(o, f"offset of {key}/{q}")
            for q, o in _object(queues, f"offsets of {key}").items()
        }
    delay = {
        _key_int(k, "delay level", 1): _int(v, f"delay level {k}")
        for k, v in _object(payload.get("delay"), "delay").items()
    }
    topics = {}
    for name, config in _object(payload.get("topics"), "topics").items():
        try:
            topics[name] = TopicConfig.from_json(_object(config, f"topic {name[:80]!r}"), name=name).to_json()
        except (TypeError, ValueError) as exc:
            raise HaMetaError(f"topic {name[:80]!r}: {exc}") from None
    return Snapshot(
        seq=_int(payload.get("seq"), "seq"),
        master_end=_int(payload.get("masterEnd"), "masterEnd"),
        reset_ms=_int(payload.get("resetMs"), "resetMs"),
        delay_from=_int(payload.get("delayFrom", 0), "delayFrom"),
        built_end=_int(payload.get("builtEnd", 0), "builtEnd"),
        offsets=offsets,
        delay=delay,
        topics=topics,
    )


class MessageReader:
    """Whole messages of one kind from chunks that mean nothing on their own, never holding more
    than one header and one bounded payload."""

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.buf = bytearray()
        self.length = -1

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buf += data
        out: list[dict[str, Any]] = []
        while True:
            if self.length < 0:
                if len(self.buf) < HEADER_BYTES:
                    return out
                self.length = decode_header(self.buf, self.kind)
            if len(self.buf) < HEADER_BYTES + self.length:
                return out
            header, body = self.buf[:HEADER_BYTES], bytes(self.buf[HEADER_BYTES : HEADER_BYTES + self.length])
            del self.buf[: HEADER_BYTES + self.length]
            self.length = -1
            out.append(decode_payload(header, body))

    def needed(self) -> int:
        """Bytes still missing from the message being read (a read need not take more)."""
        if self.length < 0:
            return HEADER_BYTES - len(self.buf)
        return HEADER_BYTES + self.length - len(self.buf)
