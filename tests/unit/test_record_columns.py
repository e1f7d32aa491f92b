"""The column-locating core (`record_columns.RecordColumns`) against the reference per-record
decoder (`record._parse`, `record.decode_message`) on random records: every fixed field and
every position agrees, for batches of one host layout and of mixed ones, v1 and v2 records,
heads running past the buffer's end; and the Spark decoder built on the core yields what
`decode_message` yields."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.record_columns import HEAD_BYTES, LAYOUT_OFFSETS, RecordColumns

FIELDS = {
    "TOTALSIZE": "total_size",
    "MAGICCODE": "magic",
    "BODYCRC": "crc",
    "QUEUEID": "queue_id",
    "FLAG": "flag",
    "QUEUEOFFSET": "queue_offset",
    "PHYSICALOFFSET": "phy_offset",
    "SYSFLAG": "sys_flag",
    "BORNTIMESTAMP": "born_timestamp",
    "BORNPORT": "born_port",
    "STORETIMESTAMP": "store_timestamp",
    "STOREPORT": "store_port",
    "RECONSUMETIMES": "reconsume_times",
    "PREPAREDTRANSACTIONOFFSET": "prepared_transaction_offset",
    "BODYLEN": "body_length",
}
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


def to_v2(encoded: bytes) -> bytes:
    """The same record with RocketMQ 5's magic: TOPICLEN of 2 bytes, TOTALSIZE one more."""
    sys_flag = record.peek_sys_flag(encoded, 0)
    body_at = record.field_offsets(bool(sys_flag & 0x10), bool(sys_flag & 0x20))["BODY"]
    (body_len,) = struct.unpack_from(">i", encoded, body_at - 4)
    topic_at = body_at + body_len
    out = bytearray(encoded[:topic_at]) + struct.pack(">H", encoded[topic_at]) + encoded[topic_at + 1 :]
    struct.pack_into(">ii", out, 0, len(out), record.MESSAGE_MAGIC_CODE_V2)
    return bytes(out)


@st.composite
def records(draw: st.DrawFn, timestamps: st.SearchStrategy[int] = I64) -> bytes:
    ip = st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16))
    store_ip, born_ip = draw(ip), draw(ip)
    encoder = record.RecordEncoder((m.format_ip(store_ip), draw(st.integers(0, 65535))))
    properties = m.properties_to_string(
        draw(
            st.dictionaries(st.sampled_from(["TAGS", "KEYS", "a", "UNIQ_KEY"]), st.text("xyz é", min_size=1))
        )
    )
    encoded = encoder.encode(
        encoder.topic_field(draw(st.sampled_from(["T", "Orders", "主题"]))),
        draw(st.binary(max_size=300)),
        queue_id=draw(I32),
        flag=draw(I32),
        sys_flag=draw(st.sampled_from([0, 0x4, 0x8, 0xC])),
        born_timestamp=draw(timestamps),
        born_ip=born_ip,
        born_port=draw(I32),
        properties=properties.encode(),
        reconsume_times=draw(I32),
        prepared_transaction_offset=draw(I64),
    )
    record.patch_record(
        encoded,
        0,
        queue_offset=draw(I64),
        phy_offset=draw(I64),
        store_timestamp=draw(timestamps),
        sys_flag=record.peek_sys_flag(encoded, 0),
    )
    return to_v2(bytes(encoded)) if draw(st.booleans()) else bytes(encoded)


def layout(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8)


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), min_size=1, max_size=8), st.integers(1, 4), st.booleans())
def test_columns_agree_with_the_reference_decoder(recs: list[bytes], repeat: int, pad: bool) -> None:
    """Each column is what `record._parse` reads; positions are where it found the fields.
    Without padding the last heads run past the buffer's end (they read zeros there)."""
    recs = recs * repeat
    buf = b"".join(recs) + (bytes(HEAD_BYTES) if pad else b"")
    starts = np.cumsum([0] + [len(r) for r in recs[:-1]]).astype(np.int64)
    cols = RecordColumns(layout(buf), starts)
    for i, start in enumerate(starts.tolist()):
        ref = record._parse(buf, start, len(buf))
        for name, attr in FIELDS.items():
            assert int(cols.field(name)[i]) == getattr(ref, attr), (i, name)
        assert int(cols.position("BODY")[i]) == ref.body_start
        assert int(cols.tail_position(cols.field("BODYLEN"))[i]) == ref.body_start + ref.body_length
        born_at, store_at = int(cols.position("BORNHOST")[i]), int(cols.position("STOREHOST")[i])
        assert buf[born_at : born_at + int(cols.ip_length("BORNHOST")[i])] == ref.born_ip
        assert buf[store_at : store_at + int(cols.ip_length("STOREHOST")[i])] == ref.store_ip
        assert bool(cols.inside[i]) == (start + HEAD_BYTES <= len(buf))


def test_layout_table_is_the_encoder_and_java_lengths() -> None:
    """The one table gives the encoder's struct, `calMsgLength` and the POS_ constants."""
    for born_v6, store_v6 in record.HOST_LAYOUTS:
        offsets = record.field_offsets(born_v6, store_v6)
        host_bytes = (20 if born_v6 else 8) + (20 if store_v6 else 8)
        assert offsets["BODY"] == record.fixed_struct(born_v6, store_v6).size == 72 + host_bytes
        flag = (m.BORNHOST_V6_FLAG if born_v6 else 0) | (m.STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
        # calMsgLength as RocketMQ writes it out: 4+4+4+4+4+8+8+4+8+born+8+store+4+8+4+body+1+topic+2+props
        assert record.calc_msg_length(flag, 10, 3, 5) == 72 + host_bytes + 10 + 1 + 3 + 2 + 5
        assert record.store_timestamp_position(flag) == 48 + (20 if born_v6 else 8)
    assert (record.POS_QUEUE_OFFSET, record.POS_PHY_OFFSET, record.POS_SYS_FLAG, record.POS_BORN_HOST) == (
        20,
        28,
        36,
        48,
    )
    assert HEAD_BYTES == 112
    assert LAYOUT_OFFSETS["BODYLEN"] == (84, 96, 96, 108)


@settings(max_examples=100, deadline=None)
@given(st.lists(records(st.integers(0, 2**42)), min_size=1, max_size=10))
def test_spark_decode_batch_is_decode_message(recs: list[bytes]) -> None:
    """Timestamps within Arrow's and datetime's range (a Spark read maps them to timestamps)."""
    pytest.importorskip("pyarrow")
    from rmq_mp.spark.columns import decode_batch

    buf = b"".join(recs) + bytes(256)
    starts = np.cumsum([0] + [len(r) for r in recs[:-1]]).astype(np.int64)
    rows = decode_batch(layout(buf), starts, broker="b").to_pylist()
    for start, row in zip(starts.tolist(), rows, strict=True):
        ref = record._parse(buf, start, len(buf))
        msg = record.decode_message(buf, start, start + ref.total_size)
        assert row["topic"] == msg.topic
        assert (row["queue_id"], row["queue_offset"], row["commit_log_offset"]) == (
            msg.queue_id,
            msg.queue_offset,
            msg.commit_log_offset,
        )
        assert (row["sys_flag"], row["reconsume_times"], row["body"]) == (
            msg.sys_flag,
            msg.reconsume_times,
            msg.body,
        )
        assert row["msg_id"] == msg.msg_id
        assert row["born_timestamp"].timestamp() * 1000 == pytest.approx(msg.born_timestamp, abs=1)
        assert row["store_timestamp"].timestamp() * 1000 == pytest.approx(msg.store_timestamp, abs=1)
        assert dict(row["properties"]) == msg.properties
        assert row["born_host"] == m.format_host(msg.born_host)
        assert row["store_host"] == m.format_host(msg.store_host)
