"""The CommitLog record codec against docs/format.md §2, and its round trip (Hypothesis)."""

from __future__ import annotations

import random
import struct
import zlib
from datetime import datetime

import crcmod.predefined
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_mp.errors import CorruptRecordError, InvalidMessageIdError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.outcomes import PutMessageStatus


def test_java_string_hash_code() -> None:
    assert m.java_string_hash("TAG1") == 2567159
    assert m.java_string_hash("") == 0
    assert m.java_string_hash("Aa") == m.java_string_hash("BB") == 2112
    # "tag-😀": the emoji is the surrogate pair D83D DE00 in UTF-16
    h = 0
    for unit in [ord(c) for c in "tag-"] + [0xD83D, 0xDE00]:
        h = (31 * h + unit) % 2**32
    assert m.java_string_hash("tag-😀") == (h - 2**32 if h >= 2**31 else h)
    assert m.tags_code(None) == m.tags_code("") == 0


def test_index_key_hash_of_integer_min_value_is_zero() -> None:
    assert m.java_string_hash("polygenelubricants") == -(2**31)
    assert m.index_key_hash("polygenelubricants") == 0
    assert m.index_key_hash("T#Aa") == abs(m.java_string_hash("T#Aa"))


def test_body_crc_matches_the_spec_and_crcmod() -> None:
    assert record.body_crc(b"Once, there was a chance for me!") == 151131488
    assert record.body_crc(b"") == 0
    crc32 = crcmod.predefined.mkCrcFun("crc-32")
    rnd = random.Random(1)
    for size in (1, 100, 4096, 65536):
        body = rnd.randbytes(size)
        assert record.body_crc(body) == crc32(body) & 0x7FFFFFFF == zlib.crc32(body) & 0x7FFFFFFF


def test_properties_string_rules() -> None:
    assert m.properties_to_string({"a": "1", "b": "2"}) == "a\x011\x02b\x012"
    assert m.properties_to_string({}) == ""
    assert m.string_to_properties("a\x011\x02b\x012\x02") == {"a": "1", "b": "2"}
    assert m.string_to_properties("\x01x\x02a\x01\x02k\x01v") == {"k": "v"}, (
        "empty names and values are dropped"
    )
    assert m.string_to_properties("") == {}
    assert m.string_to_properties("\x02\x02k\x01v\x02\x02\x02") == {"k": "v"}, "stray separators"
    assert m.string_to_properties("ab\x02k\x01v") == {"k": "v"}, "a chunk without \\x01 is dropped"
    assert m.string_to_properties("k\x01v\x01w") == {"k": "v\x01w"}, "the value keeps later \\x01s"
    assert m.string_to_properties("k\x011\x02k\x012") == {"k": "2"}, "a later duplicate wins"
    assert m.string_to_properties("😀\x01\x02x\x01😀") == {"x": "😀"}


def _java_string2message_properties(text: str) -> dict[str, str]:
    """A line-by-line port of 4.9.8 `MessageDecoder.string2messageProperties`, on UTF-16 units."""
    units = list(struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H", text.encode("utf-16-be")))

    def index_of(ch: str, start: int) -> int:
        return next((i for i in range(start, len(units)) if units[i] == ord(ch)), -1)

    def substring(a: int, b: int) -> str:
        return struct.pack(f">{b - a}H", *units[a:b]).decode("utf-16-be")

    result: dict[str, str] = {}
    index = 0
    while index < len(units):
        new_index = index_of("\x02", index)
        if new_index < 0:
            new_index = len(units)
        if new_index - index >= 3:
            kv = index_of("\x01", index)
            if index < kv < new_index - 1:
                result[substring(index, kv)] = substring(kv + 1, new_index)
        index = new_index + 1
    return result


@settings(max_examples=500, deadline=None)
@given(st.text(st.sampled_from(["a", "é", "😀", "\x01", "\x02"]), max_size=16))
def test_properties_parser_agrees_with_rocketmqs(text: str) -> None:
    assert m.string_to_properties(text) == _java_string2message_properties(text)


def test_msg_id_round_trip_and_errors() -> None:
    v4 = m.create_message_id(bytes([10, 0, 0, 5]), 10911, 245)
    assert v4 == "0A00000500002A9F00000000000000F5"
    assert len(v4) == 32
    assert m.decode_message_id(v4) == (("10.0.0.5", 10911), 245)
    assert m.decode_message_id(v4.lower()) == (("10.0.0.5", 10911), 245)
    v6 = m.create_message_id(m.parse_host("[2001:db8:0:1::5]:10911")[0], 10911, 245)
    assert v6 == "20010DB8000000010000000000000005" + "00002A9F" + "00000000000000F5"
    assert len(v6) == 56
    assert m.decode_message_id(v6) == (("2001:db8:0:1:0:0:0:5", 10911), 245)
    big = m.create_message_id(bytes([192, 168, 0, 1]), 65535, 2**63 - 1)
    assert m.decode_message_id(big) == (("192.168.0.1", 65535), 2**63 - 1)
    for bad in ("", "XYZ", "G" * 32, "0" * 31, "0" * 33, "0" * 55, "0" * 64, "é" * 32):
        with pytest.raises(InvalidMessageIdError):
            m.decode_message_id(bad)


def test_msg_id_with_spaces_is_invalid() -> None:
    with pytest.raises(InvalidMessageIdError):
        m.decode_message_id("0A000005 00002A9F00000000000000 ")


def test_ipv4_record_layout_field_by_field() -> None:
    msg = m.Message(
        topic="TopicA",
        body=b"hello",
        flag=-7,
        properties={"TAGS": "TagA"},
        queue_id=3,
        born_timestamp=1111,
        born_host=("10.1.2.3", 4567),
        reconsume_times=2,
        prepared_transaction_offset=99,
    )
    buf = record.encode_record(msg, ("10.0.0.5", 10911))
    record.patch_record(buf, 0, queue_offset=42, phy_offset=4096, store_timestamp=2222, sys_flag=0)
    props = b"TAGS\x01TagA"
    assert len(buf) == 91 + 5 + 6 + len(props)
    total, magic, crc, qid, flag, qoff, phy, sysflag, born = struct.unpack_from(">iIiiiqqiq", buf, 0)
    assert (total, magic, crc, qid, flag) == (len(buf), 0xDAA320A7, zlib.crc32(b"hello") & 0x7FFFFFFF, 3, -7)
    assert (qoff, phy, sysflag, born) == (42, 4096, 0, 1111)
    assert buf[48:52] == bytes([10, 1, 2, 3])
    assert struct.unpack_from(">i", buf, 52)[0] == 4567
    assert struct.unpack_from(">q", buf, 56)[0] == 2222
    assert buf[64:68] == bytes([10, 0, 0, 5])
    assert struct.unpack_from(">i", buf, 68)[0] == 10911
    assert struct.unpack_from(">iqi", buf, 72) == (2, 99, 5)
    assert buf[88:93] == b"hello"
    assert buf[93] == 6
    assert buf[94:100] == b"TopicA"
    assert struct.unpack_from(">h", buf, 100)[0] == len(props)
    assert buf[102:] == props


def test_ipv6_record_layout_field_by_field() -> None:
    msg = m.Message(topic="T6", body=b"abc", sys_flag=0x8, born_host=("2001:db8::1", 4567), born_timestamp=7)
    buf = record.encode_record(msg, ("2001:db8:0:1::5", 10911))
    sys_flag = 0x8 | 0x10 | 0x20
    record.patch_record(buf, 0, queue_offset=1, phy_offset=2, store_timestamp=3, sys_flag=sys_flag)
    assert len(buf) == 91 + 24 + 3 + 2
    assert struct.unpack_from(">i", buf, 0)[0] == len(buf)
    assert struct.unpack_from(">i", buf, 36)[0] == sys_flag
    assert buf[48:64] == bytes.fromhex("20010db8000000000000000000000001")
    assert struct.unpack_from(">i", buf, 64)[0] == 4567
    assert struct.unpack_from(">q", buf, 68)[0] == 3, "STORETIMESTAMP after a 20-byte born host"
    assert buf[76:92] == bytes.fromhex("20010db8000000010000000000000005")
    assert struct.unpack_from(">i", buf, 92)[0] == 10911
    assert struct.unpack_from(">iqi", buf, 96) == (0, 0, 3)
    assert buf[112:115] == b"abc"
    assert buf[115] == 2
    assert buf[116:118] == b"T6"
    assert struct.unpack_from(">h", buf, 118)[0] == 0
    req = record.check_record(buf, 0, len(buf), check_crc=True)
    assert (req.success, req.store_timestamp, req.queue_offset, req.phy_offset) == (True, 3, 1, 2)
    assert record.decode_message(buf, 0, len(buf)).msg_id == m.create_message_id(bytes(buf[76:92]), 10911, 2)


def test_ipv6_hosts_add_twelve_bytes_each_and_set_sys_flag() -> None:
    msg = m.Message(topic="T", body=b"x", born_host=("2001:db8::1", 1))
    v4 = record.encode_record(m.Message(topic="T", body=b"x"), ("10.0.0.5", 1))
    v6 = record.encode_record(msg, ("2001:db8:0:1::5", 10911))
    assert len(v6) == len(v4) + 24
    assert struct.unpack_from(">i", v6, 36)[0] & 0x30 == 0x30
    assert record.store_timestamp_position(0x10) == 68
    decoded = record.decode_message(v6, 0, len(v6))
    assert decoded.born_host == ("2001:db8:0:0:0:0:0:1", 1)
    assert decoded.store_host == ("2001:db8:0:1:0:0:0:5", 10911)


def test_v2_record_with_two_byte_topic_length_is_read() -> None:
    topic = ("%RETRY%" + "x" * 200).encode()
    body = b"v2 body"
    total = 91 + 1 + len(body) + len(topic)
    buf = struct.pack(">iIiiiqqiq", total, 0xDAA320AB, record.body_crc(body), 0, 0, 7, 0, 0, 1)
    buf += bytes(4) + struct.pack(">i", 1) + struct.pack(">q", 2) + bytes(4) + struct.pack(">i", 1)
    buf += (
        struct.pack(">iqi", 0, 0, len(body))
        + body
        + struct.pack(">H", len(topic))
        + topic
        + struct.pack(">h", 0)
    )
    assert len(buf) == total
    req = record.check_record(buf, 0, len(buf), check_crc=True)
    assert req.success
    assert req.size == total
    assert req.topic == topic.decode()
    assert total == record.calc_msg_length(0, len(body), len(topic), 0) + 1, "v2 is v1 + 1 byte"
    decoded = record.decode_message(buf, 0, len(buf))
    assert (decoded.body, decoded.topic, decoded.queue_offset, decoded.magic_code) == (
        body,
        topic.decode(),
        7,
        record.MESSAGE_MAGIC_CODE_V2,
    )
    assert record.check_record(buf, 0, len(buf) - 1, check_crc=True).size == -1, "torn v2"


def test_blank_record() -> None:
    blank = record.encode_blank(1000)
    assert blank == struct.pack(">iI", 1000, 0xCBD43194)
    assert record.check_record(blank + bytes(992), 0, 1000, check_crc=True) is record.BLANK


def _one(**kw: object) -> bytearray:
    buf = record.encode_record(m.Message(topic="T", body=b"some body bytes", **kw), ("10.0.0.5", 10911))  # type: ignore[arg-type]
    record.patch_record(buf, 0, queue_offset=0, phy_offset=0, store_timestamp=5, sys_flag=0)
    return buf


def test_damaged_records_are_invalid_never_an_exception() -> None:
    buf = _one(properties={"KEYS": "a b"})
    assert record.check_record(buf, 0, len(buf), check_crc=True).success
    assert record.check_record(buf, 0, len(buf) - 1, check_crc=True).size == -1, "torn"
    assert record.check_record(bytes(64), 0, 64, check_crc=True).size == -1, "zeros"
    assert record.check_record(random.Random(3).randbytes(300), 0, 300, check_crc=True).size == -1, "garbage"
    flipped = bytearray(buf)
    flipped[90] ^= 0x01  # inside the body
    assert record.check_record(flipped, 0, len(buf), check_crc=True).size == -1
    assert record.check_record(flipped, 0, len(buf), check_crc=False).success, (
        "CRC is only checked when asked"
    )
    longer = bytearray(buf) + bytes(10)
    struct.pack_into(">i", longer, 0, len(buf) + 10)
    mismatch = record.check_record(longer, 0, len(longer), check_crc=True)
    assert (mismatch.size, mismatch.success) == (len(buf) + 10, False), "length mismatch keeps the size"
    with pytest.raises(CorruptRecordError):
        record.decode_message(bytes(64), 0, 64)


def test_validate_message_statuses() -> None:
    ok = m.Message(topic="T", body=b"x")
    assert record.validate_message(ok, max_message_size=10) is None
    too_long = record.validate_message(m.Message(topic="t" * 128), max_message_size=10)
    assert too_long is not None
    assert too_long[0] is PutMessageStatus.MESSAGE_ILLEGAL
    assert record.validate_message(m.Message(topic="t" * 127), max_message_size=10) is None
    # the limit is on UTF-8 bytes (TOPICLEN is one byte): 64 characters, 128 bytes
    wide = record.validate_message(m.Message(topic="é" * 64), max_message_size=10)
    assert wide is not None
    assert wide[0] is PutMessageStatus.MESSAGE_ILLEGAL
    assert record.validate_message(m.Message(topic="é" * 63 + "x"), max_message_size=10) is None
    chars = record.validate_message(m.Message(topic="T", properties={"k": "v" * 32766}), max_message_size=10)
    assert chars is not None
    assert chars[0] is PutMessageStatus.MESSAGE_ILLEGAL, "over 32767 chars: checkMessage"
    fits = m.Message(topic="T", properties={"k": "v" * 32765})  # "k\x01" + 32765 = 32767 bytes
    assert record.validate_message(fits, max_message_size=10) is None
    props = record.validate_message(m.Message(topic="T", properties={"k": "é" * 17000}), max_message_size=10)
    assert props is not None
    assert props[0] is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    body = record.validate_message(m.Message(topic="T", body=bytes(11)), max_message_size=10)
    assert body is not None
    assert body[0] is PutMessageStatus.MESSAGE_ILLEGAL
    assert record.validate_message(m.Message(topic="T", body=bytes(10)), max_message_size=10) is None


names = st.text(
    st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), min_size=1, max_size=20
)


def _cut_to_127_bytes(text: str) -> str:
    return text.encode("utf-8")[:127].decode("utf-8", errors="ignore")


topics = (
    st.text(st.characters(exclude_characters="/\x00", exclude_categories=["Cs"]), min_size=1, max_size=127)
    .map(_cut_to_127_bytes)
    .filter(lambda t: t not in ("", ".", ".."))
)
ipv4 = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535))
ipv6 = st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535))


@settings(max_examples=300, deadline=None)
@given(
    topic=topics,
    body=st.binary(max_size=4096),
    flag=st.integers(-(2**31), 2**31 - 1),
    properties=st.dictionaries(names, names, max_size=5),
    born=st.one_of(ipv4, ipv6),
    store=st.one_of(ipv4, ipv6),
    tran=st.sampled_from([0, 4, 8, 12]),
    reconsume=st.integers(0, 2**31 - 1),
    prepared=st.integers(0, 2**62),
    queue_id=st.integers(0, 2**31 - 1),
    offsets=st.tuples(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62)),
)
def test_encode_decode_round_trip(
    topic, body, flag, properties, born, store, tran, reconsume, prepared, queue_id, offsets
) -> None:
    msg = m.Message(
        topic=topic,
        body=body,
        flag=flag,
        properties=properties,
        queue_id=queue_id,
        sys_flag=tran,
        born_timestamp=123,
        born_host=born,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
    )
    buf = record.encode_record(msg, store)
    (sys_flag,) = struct.unpack_from(">i", buf, 36)
    queue_offset, phy, store_ts = offsets
    record.patch_record(
        buf, 0, queue_offset=queue_offset, phy_offset=phy, store_timestamp=store_ts, sys_flag=sys_flag
    )
    ext = record.decode_message(buf, 0, len(buf))
    assert (ext.topic, ext.body, ext.flag, ext.properties, ext.queue_id) == (
        topic,
        body,
        flag,
        properties,
        queue_id,
    )
    assert (ext.queue_offset, ext.commit_log_offset, ext.store_timestamp) == offsets
    assert ext.sys_flag & 0xC == tran
    assert ext.reconsume_times == reconsume
    assert ext.prepared_transaction_offset == prepared
    assert m.parse_host(ext.born_host) == m.parse_host(born)
    assert m.parse_host(ext.store_host) == m.parse_host(store)
    assert ext.msg_id == m.create_message_id(m.parse_host(store)[0], store[1], phy)
    req = record.check_record(buf, 0, len(buf), check_crc=True)
    assert req.success
    assert req.size == len(buf)
    assert req.tags_code == m.tags_code(properties.get("TAGS"))
    assert req.keys == properties.get("KEYS", "")
    assert req.uniq_key == properties.get("UNIQ_KEY")


def test_schedule_topic_tags_code_is_the_delivery_time() -> None:
    props = {"DELAY": "3", "TAGS": "TagA"}
    assert record.cq_tags_code(m.SCHEDULE_TOPIC, props, 1000, record.DEFAULT_DELAY_LEVEL_MS) == 1000 + 10_000
    assert record.cq_tags_code(
        m.SCHEDULE_TOPIC, {**props, "DELAY": "99"}, 0, record.DEFAULT_DELAY_LEVEL_MS
    ) == (2 * 3_600_000), "clamped to the last level"
    assert record.cq_tags_code("Other", props, 1000, record.DEFAULT_DELAY_LEVEL_MS) == m.java_string_hash(
        "TagA"
    )


def test_schedule_topic_with_delay_level_zero_keeps_the_tags_hash() -> None:
    props = {"DELAY": "0", "TAGS": "TagA"}
    assert record.cq_tags_code(m.SCHEDULE_TOPIC, props, 1000, record.DEFAULT_DELAY_LEVEL_MS) == (
        m.java_string_hash("TagA")
    )


def test_uniq_key_layout_and_late_month_wrap() -> None:
    """UNIQ_KEY is MessageClientIDSetter's 32 hex characters; the month offset wraps as Java's
    (int) cast does instead of failing every send from the 25th day of a month on."""
    gen = m.UniqueIdGenerator("10.0.0.5")
    month_start = datetime(2026, 12, 1).timestamp() * 1000
    first = gen.next_id(int(month_start) + 5)
    assert len(first) == 32
    assert first == first.upper()
    assert first.startswith(bytes([10, 0, 0, 5]).hex().upper())
    raw = bytes.fromhex(first)
    assert struct.unpack(">iH", raw[10:16]) == (5, 0)
    late = int(month_start) + 30 * 86_400_000  # Dec 31st: 2.59e9 ms, beyond a signed int
    wrapped = bytes.fromhex(gen.next_id(late))
    assert struct.unpack(">iH", wrapped[10:16]) == (30 * 86_400_000 - 2**32, 1)
