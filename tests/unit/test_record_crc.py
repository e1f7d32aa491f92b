"""The whole-record CRC (RocketMQ 5.x `enabledAppendPropCRC`, issue 35): written as 5.3 writes it,
checked by every reader that checks the body CRC (the per-record decoder, the numpy and compiled
scans, a pull), a failure skipped, named and counted as a body-CRC failure is; records without
it read as before, and a 4.9.8 reader sees one more property."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import BodyCrcError, CorruptRecordError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.store.message_store import MessageStore
from tests.unit.test_record_batch import assert_same_as_per_record, scanner  # noqa: F401 (both scans)

STORE_HOST = ("10.0.0.5", 10911)


def crc_record(
    *,
    topic: str = "TopicA",
    body: bytes = b"payload",
    properties: dict[str, str] | None = None,
    born: m.Host = ("10.0.0.1", 40000),
    store: m.Host = STORE_HOST,
    phy: int = 0,
    append_crc: bool = True,
) -> bytearray:
    """A record as the put path writes it: encoded, the lock's fields patched, the CRC filled."""
    message = m.Message(
        topic=topic,
        body=body,
        flag=7,
        properties={"KEYS": "k1 k2", "TAGS": "TagA"} if properties is None else properties,
        queue_id=3,
        born_timestamp=1_700_000_000_123,
        born_host=born,
    )
    data = record.encode_record(message, store, append_crc=append_crc)
    sys_flag = record.peek_sys_flag(data, 0)
    record.patch_record(data, 0, 41, phy, 1_700_000_000_456, sys_flag, crc=append_crc)
    return data


SHAPES: list[dict[str, Any]] = [
    {},
    {"properties": {}},
    {"body": b""},
    {"born": ("2001:db8::1", 5), "store": ("2001:db8::5", 10911)},
    {"properties": {"UNIQ_KEY": "7F0000011F4018B4AAC27A2F5A230000", "WAIT": "true"}, "topic": "ünï"},
]


def test_the_tail_is_rocketmq_5s() -> None:
    """`createCrc32`: ``__CRC32#`` \\x01, ten digits least significant first ('0'-padded), \\x02,
    after a \\x02 that ends the other properties; the CRC is `UtilAll.crc32` of every byte
    before the tail (so of QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP as stored)."""
    assert record.crc_digits(123) == b"3210000000"
    assert record.crc_digits(2**31 - 1) == b"7463847412"
    data = crc_record()
    props_end = len(data)
    tail = bytes(data[-record.CRC32_RESERVED_LEN :])
    assert record.CRC32_RESERVED_LEN == 20
    assert tail[:9] == b"__CRC32#\x01"
    assert tail[19:] == b"\x02"
    assert data[props_end - 21] == 2, "the other properties end in a separator"
    crc = zlib.crc32(bytes(data[:-20])) & 0x7FFFFFFF
    expected = 0
    for digit in reversed(tail[9:19]):  # as checkMessageAndReturnSize reads them back
        expected = expected * 10 + digit - ord("0")
    assert expected == crc
    bare = crc_record(properties={})
    (props_len,) = record._SHORT.unpack_from(bare, len(bare) - 22)
    assert props_len == 20, "no properties: the tail alone, no separator"


@pytest.mark.parametrize("shape", SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_every_byte_of_the_record_is_covered(shape: dict) -> None:
    """Any byte changed anywhere (each bit flipped, zeroed, set to 0xFF or to a digit) and the
    record is refused: by `check_record` with the CRC checked, and by `decode_message`."""
    data = crc_record(**shape)
    assert record.check_record(data, 0, len(data), check_crc=True).success
    served = []
    for i in range(len(data)):
        for value in {data[i] ^ (1 << bit) for bit in range(8)} | {0, 0xFF, ord("5")}:
            if value == data[i]:
                continue
            damaged = bytearray(data)
            damaged[i] = value
            req = record.check_record(damaged, 0, len(damaged), check_crc=True)
            try:
                record.decode_message(damaged, 0, len(damaged))
                decoded = True
            except CorruptRecordError:
                decoded = False
            if req.success or decoded:
                served.append((i, value, req.success, decoded))
    assert served == []


@pytest.mark.parametrize("seed", range(8))
def test_seeded_range_damage_is_never_served(seed: int) -> None:
    """Ranges zeroed or randomised anywhere in a record (and on into the next): the damaged
    record is never read as intact, by the per-record reader or either scan."""
    rnd = random.Random(seed)
    for _ in range(150):
        shape = rnd.choice(SHAPES)
        first = crc_record(**shape)
        log = bytearray(first) + crc_record(**shape, phy=len(first))
        at = rnd.randrange(len(first))
        length = rnd.randint(1, 40)
        end = min(at + length, len(log))
        log[at:end] = bytes(end - at) if rnd.random() < 0.5 else rnd.randbytes(end - at)
        if log[: len(first)] == first:
            continue
        req = record.check_record(log, 0, len(log), check_crc=True)
        assert not (req.success and req.size == len(first)), (seed, at, length, shape)
        scan = assert_same_as_per_record(bytes(log))
        assert len(scan.batch) == 0


def test_a_failure_is_a_body_crc_failure_and_the_scans_stop_there() -> None:
    good = crc_record()
    bad = crc_record(phy=len(good))
    bad[12] ^= 1  # QUEUEID: the body CRC is fine
    log = bytes(good + bad + crc_record(phy=2 * len(good)))
    req = record.check_record(log, len(good), len(log), check_crc=True)
    assert (req.size, req.success) == (-1, False)
    assert "__CRC32#" in req.reason
    with pytest.raises(BodyCrcError, match="record CRC"):
        record.decode_message(log, len(good), len(log))
    assert record.check_record(log, len(good), len(log), check_crc=False).success, "unchecked as before"
    scan = assert_same_as_per_record(log)
    assert len(scan.batch) == 1
    assert scan.tail is not None
    assert len(assert_same_as_per_record(log, check_crc=False).batch) == 3


@pytest.mark.parametrize("name_damage", [(3, 0x40), (0, 0x01), (7, 0x02)], ids=["C", "first", "#"])
def test_a_damaged_name_over_damaged_properties_is_still_a_crc_failure(name_damage: tuple[int, int]) -> None:
    """Bits flipped in a property and in the ``__CRC32#`` name (one flip run of the seeded
    compound damage test, seed 59): the name is off by a byte, the digits no longer match, and
    the record is a CRC failure for the per-record reader and both scans, not a record without
    a CRC (served with its damaged property before); also with the \x01 after the name gone."""
    good = crc_record()
    name_at = len(good) - record.CRC32_RESERVED_LEN
    for separator_lost in (False, True):
        bad = crc_record(phy=len(good))
        bad[name_at - 5] ^= 0x08  # the TAGS value: unchecked by 4.9.8's format
        pos, bits = name_damage
        bad[name_at + pos] ^= bits
        if separator_lost:
            bad[name_at + 8] ^= 0x10
        log = bytes(good + bad + crc_record(phy=2 * len(good)))
        req = record.check_record(log, len(good), len(log), check_crc=True)
        assert (req.size, req.success) == (-1, False), req
        assert "property name is damaged" in req.reason
        with pytest.raises(BodyCrcError):
            record.decode_message(log, len(good), len(log))
        scan = assert_same_as_per_record(log)
        assert len(scan.batch) == 1


def test_records_without_it_read_as_before() -> None:
    """Written with the setting off (or by RocketMQ 4.9.8): no tail, nothing more checked,
    whatever their last property looks like, a 10-digit value with 4.9.8's layout included."""
    plain = crc_record(append_crc=False)
    assert b"__CRC32#" not in plain
    assert record.check_record(plain, 0, len(plain), check_crc=True).success
    digits = crc_record(properties={"TAGS": "a", "LAST": "1234567890"}, append_crc=False)
    assert record.check_record(digits, 0, len(digits), check_crc=True).success
    assert record.decode_message(digits, 0, len(digits)).properties == {"TAGS": "a", "LAST": "1234567890"}
    assert_same_as_per_record(bytes(plain + crc_record(append_crc=False, phy=len(plain))))


def test_the_property_is_checked_not_served() -> None:
    data = crc_record()
    assert record.decode_message(data, 0, len(data)).properties == {"KEYS": "k1 k2", "TAGS": "TagA"}
    req = record.check_record(data, 0, len(data), check_crc=True)
    assert req.keys == "k1 k2"
    assert req.tags_code == m.tags_code("TagA")


def _host(text: str) -> m.Host:
    ip, _, port = text.rpartition(":")
    return ip.strip("[]"), int(port)


def test_a_4_9_8_reader_sees_one_more_property(
    rocketmq_fixtures: Path, fixture_config: MessageStoreConfig, tmp_path: Path
) -> None:
    """The 4.9.8 fixture's messages stored again with the CRC: read as 4.9.8's
    `checkMessageAndReturnSize` and `string2messageProperties` read (no CRC knowledge), each is
    the message RocketMQ's decoder gave, with one property more and 21 bytes longer (the
    separator 4.9.8 leaves off its last property, and the tail; 20 without other properties);
    its index keys and tags code are the same, and rmq-mp serves it exactly as before."""
    lines = (rocketmq_fixtures / "clean-store.messages.jsonl").read_text(encoding="utf-8").splitlines()[:300]
    refs = [json.loads(line) for line in lines]
    config = fixture_config.replace(store_path_root_dir=str(tmp_path / "again"), enabled_append_prop_crc=True)
    with MessageStore.open(config=config) as store:
        for ref in refs:
            result = store.put_message(
                m.Message(
                    topic=ref["topic"],
                    body=bytes.fromhex(ref["body"]),
                    flag=ref["flag"],
                    properties=dict(ref["properties"]),
                    queue_id=ref["queueId"],
                    sys_flag=ref["sysFlag"],
                    born_timestamp=ref["bornTimestamp"],
                    born_host=_host(ref["bornHost"]),
                    reconsume_times=ref["reconsumeTimes"],
                    prepared_transaction_offset=ref["preparedTransactionOffset"],
                )
            )
            assert result.status.name == "PUT_OK", result
        records = list(store.commit_log.iter_dispatch(0, check_crc=False))
        for (_phy, req), ref in zip(records, refs, strict=True):
            assert req.success
            extra = set(req.properties) - set(ref["properties"])
            assert extra == {"__CRC32#"}
            assert {k: req.properties[k] for k in ref["properties"]} == ref["properties"]
            v6_store_host = 12 if ref["sysFlag"] & m.STOREHOSTADDRESS_V6_FLAG else 0  # ours is IPv4
            tail = 21 if ref["properties"] else 20  # a separator only after other properties
            assert req.size == ref["storeSize"] + tail - v6_store_host
            assert (req.tags_code, req.keys) == (m.tags_code(ref["tags"]), ref["properties"].get("KEYS", ""))
        served = list(store.iter_messages())
        assert [(x.topic, x.body.hex(), x.properties) for x in served] == [
            (ref["topic"], ref["body"], ref["properties"]) for ref in refs
        ]


def test_a_pull_skips_names_and_counts_it_as_a_body_crc_failure(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        for i in range(5):
            assert (
                store.put_message(m.Message(topic="T", body=f"m{i}".encode(), queue_id=0)).status.name
                == "PUT_OK"
            )
        second = store.get_message("T", 0, 1, 1).messages[0]
        path = Path(small_config.store_path_root_dir) / "commitlog" / f"{0:020d}"
        with path.open("r+b") as f:  # the topic's first byte: "T" -> "U", the body CRC still right
            at = second.commit_log_offset + second.store_size - 20 - 2 - 1  # tail, PROPLEN, "T"
            f.seek(at)
            assert f.read(1) == b"T"
            f.seek(at)
            f.write(b"U")
        result = store.get_message("T", 0, 0, 32)
        assert result.status is GetMessageStatus.FOUND
        assert [msg.body for msg in result.messages] == [b"m0", b"m2", b"m3", b"m4"]
        findings = [d for d in store.reporter.findings if d.kind == "record-crc-failed"]
        assert len(findings) == 1
        assert findings[0].start == second.commit_log_offset
        assert "__CRC32#" in findings[0].reason
        end = store.max_phy_offset()
    with MessageStore.open(config=small_config) as store:  # recovery checks it too, as a body CRC
        assert store.recovery is not None
        # after a clean exit, with sound records after it: stepped over, not cut at
        assert store.recovery.recovered_end_offset == end
        [skipped] = [d for d in store.reporter.findings if d.kind == "record-invalid"]
        assert (skipped.start, "__CRC32#" in skipped.reason) == (second.commit_log_offset, True)
        assert store.reporter.count("commitlog-truncated") == 0
        assert [msg.body for msg in store.get_message("T", 0, 0, 32).messages] == [b"m0", b"m2", b"m3", b"m4"]


def test_properties_that_leave_no_room_for_the_tail_are_refused(small_config: MessageStoreConfig) -> None:
    """5.x counts the tail in the properties' limit: PROPERTIES_SIZE_EXCEEDED, nothing written."""
    with MessageStore.open(config=small_config) as store:
        fits = store.put_message(m.Message(topic="T", body=b"x", properties={"P": "v" * (32767 - 21 - 2)}))
        assert fits.status.name == "PUT_OK"
        end = store.max_phy_offset()
        refused = store.put_message(m.Message(topic="T", body=b"x", properties={"P": "v" * (32767 - 20 - 2)}))
        assert refused.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        assert "record CRC" in refused.reason
        assert store.max_phy_offset() == end
