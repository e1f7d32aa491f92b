"""The metadata channel's bytes (rmq_mp/format/ha_meta.py): round trips from any chunking, and
every kind of malformed message refused with HaMetaError before anything of it is used."""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from rmq_mp.format import ha_meta

GOOD = ha_meta.Snapshot(
    7, 123456, 99, {"T@g": {0: 5, 3: 9}, "%RETRY%g@g": {0: 1}}, {1: 4, 18: 2},
    {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}, delay_from=100,
)  # fmt: skip


def test_round_trip_from_any_chunking() -> None:
    data = ha_meta.encode_snapshot(GOOD) + ha_meta.encode_snapshot(ha_meta.Snapshot(8, 5, 0, full=False))
    rng = random.Random(1)
    for _ in range(20):
        reader, got, pos = ha_meta.MessageReader(ha_meta.SNAPSHOT), [], 0
        while pos < len(data):
            step = rng.randint(1, 64)
            got += reader.feed(data[pos : pos + step])
            pos += step
        first, second = (ha_meta.decode_snapshot(p) for p in got)
        assert first.offsets == GOOD.offsets
        assert first.delay == GOOD.delay
        assert first.topics["T"]["writeQueueNums"] == 4
        assert (first.seq, first.master_end, first.reset_ms, first.delay_from, first.full) == (
            7,
            123456,
            99,
            100,
            True,
        )
        assert (second.seq, second.full, second.offsets) == (8, False, {})


def _message(payload: bytes, kind: int = ha_meta.SNAPSHOT) -> bytes:
    return struct.pack(">4sBBHII", b"RMQM", 1, kind, 0, len(payload), zlib.crc32(payload)) + payload


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"XXXX" + bytes(12), "magic"),
        (struct.pack(">4sBBHII", b"RMQM", 2, 2, 0, 0, 0), "version"),
        (struct.pack(">4sBBHII", b"RMQM", 1, 9, 0, 0, 0), "kind"),
        (struct.pack(">4sBBHII", b"RMQM", 1, 2, 0, ha_meta.MAX_SNAPSHOT_BYTES + 1, 0), "bound"),
        (_message(b"{}")[:-2] + b"[]", "checksum"),
        (_message(b"\xff\xfe"), "UTF-8 JSON"),
        (_message(b"[" * 100_000 + b"]" * 100_000), "JSON"),
        (_message(b"[1]"), "not an object"),
        (
            _message(
                b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{"T@g":{"0":-1}},"delay":{},"topics":{}}'
            ),
            "offset",
        ),
        (
            _message(
                b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{"T@g":{"1e9":1}},"delay":{},"topics":{}}'
            ),
            "queue id",
        ),
        (
            _message(
                b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{"T@g":{"'
                + b"9" * 5000
                + b'":1}},"delay":{},"topics":{}}'
            ),
            "queue id",
        ),
        (
            _message(b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{"Tg":{"0":1}},"delay":{},"topics":{}}'),
            "topic@group",
        ),
        (
            _message(b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{},"delay":{"0":1},"topics":{}}'),
            "delay level",
        ),
        (
            _message(b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{},"delay":{"1":1.5},"topics":{}}'),
            "delay level 1",
        ),
        (
            _message(
                b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{},"delay":{},"topics":{"T":{"topicName":"U"}}}'
            ),
            "topic",
        ),
        (
            _message(
                b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{},"delay":{},"topics":{"T":{"perm":-1}}}'
            ),
            "perm",
        ),
        (_message(b'{"seq":true,"masterEnd":1,"resetMs":0,"offsets":{},"delay":{},"topics":{}}'), "seq"),
        (_message(b'{"seq":1,"masterEnd":1,"resetMs":0,"full":1}'), "full"),
        (_message(b'{"seq":1,"masterEnd":99999999999999999999,"resetMs":0,"full":false}'), "masterEnd"),
        (_message(b'{"seq":1,"masterEnd":1,"resetMs":0,"offsets":{}}'), "delay"),
    ],
)
def test_malformed_snapshots_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(ha_meta.HaMetaError, match=why):
        _decode_all(data)


def _decode_all(data: bytes) -> list[ha_meta.Snapshot]:
    return [ha_meta.decode_snapshot(p) for p in ha_meta.MessageReader(ha_meta.SNAPSHOT).feed(data)]


def test_a_hello_is_a_name() -> None:
    reader = ha_meta.MessageReader(ha_meta.HELLO)
    assert ha_meta.decode_hello(reader.feed(ha_meta.encode_hello("broker-a"))[0]) == "broker-a"
    with pytest.raises(ha_meta.HaMetaError, match="bound"):
        reader.feed(struct.pack(">4sBBHII", b"RMQM", 1, 1, 0, ha_meta.MAX_HELLO_BYTES + 1, 0))
    with pytest.raises(ha_meta.HaMetaError, match="not a name"):
        ha_meta.decode_hello({"brokerName": ""})
