"""A store written by rmq-mp reads back identically and its files follow the spec byte for byte.

The layout checks use their own struct-level reading of docs/format.md (not rmq-mp's
decoder), so a symmetric encode/decode bug cannot hide."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.outcomes import GetMessageStatus, PutMessageResult, PutMessageStatus
from rmq_mp.store.message_store import MessageStore
from tests.store_content import make_messages

V1_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194


def java_hash(s: str) -> int:
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    h = 0
    for u in units:
        h = (h * 31 + u) % 2**32
    return h - 2**32 if h >= 2**31 else h


def write_store(
    config: MessageStoreConfig, count: int, seed: int = 7
) -> list[tuple[m.Message, PutMessageResult]]:
    written: list[tuple[m.Message, PutMessageResult]] = []
    with MessageStore.open(config=config) as store:
        for msg in make_messages(count, seed):
            result = store.put_message(msg)
            assert result.status is PutMessageStatus.PUT_OK, result
            written.append((msg, result))
    return written


def _record_crc(raw: bytes, rec: dict) -> bool:
    """RocketMQ 5.x's whole-record CRC (enabledAppendPropCRC, on by default), by its spec: the
    properties end in ``__CRC32#`` \x01, the CRC-32 (top bit cleared) of every byte before
    those 20 as ten digits least significant first, \x02; after a \x02 ending the others.
    Cut from ``rec["props"]``; True when found."""
    if not rec["props"].endswith("\x02") or "__CRC32#\x01" not in rec["props"]:
        return False
    tail = raw[-20:]
    assert tail[:9] == b"__CRC32#\x01"
    crc = zlib.crc32(raw[:-20]) & 0x7FFFFFFF
    assert tail[9:19].decode()[::-1] == f"{crc:010d}"
    rec["props"] = rec["props"][:-20].removesuffix("\x02")
    return True


def independent_records(commitlog: Path, file_size: int) -> list[dict]:
    """Walk every commit-log file by the spec: records, then a blank at each file's end. The
    first file may start past 0 (the cleaner deleted the ones before it); none may be missing after it."""
    records = []
    files = sorted(commitlog.iterdir())
    first = int(files[0].name) if files else 0
    assert first % file_size == 0, f"first commit-log file {first} is not at a file boundary"
    for i, path in enumerate(files):
        data = path.read_bytes()
        if not data and i == len(files) - 1:
            break  # a last file created but never sized (its allocator killed): recovery's too
        assert len(data) == file_size
        assert int(path.name) == first + i * file_size
        assert len(path.name) == 20
        pos = 0
        while pos + 8 <= len(data):
            total, magic = struct.unpack_from(">iI", data, pos)
            if magic == BLANK_MAGIC:
                assert (
                    total == file_size - pos
                )  # the last file too, when the store stopped right after a roll
                assert data[pos + 8 :].strip(b"\0") == b""
                break
            if total == 0:
                assert data[pos:].strip(b"\0") == b""
                assert i == len(files) - 1
                break
            assert magic == V1_MAGIC
            rec = {"phy": int(path.name) + pos, "total": total}
            (
                rec["crc"],
                rec["queue_id"],
                rec["flag"],
                rec["queue_offset"],
                rec["phy_field"],
                rec["sys_flag"],
                rec["born_ts"],
            ) = struct.unpack_from(">iiiqqiq", data, pos + 8)
            p = pos + 48
            born_len = 16 if rec["sys_flag"] & 0x10 else 4
            rec["born_ip"] = data[p : p + born_len]
            p += born_len + 4
            (rec["store_ts"],) = struct.unpack_from(">q", data, p)
            p += 8
            store_len = 16 if rec["sys_flag"] & 0x20 else 4
            rec["store_ip"] = data[p : p + store_len]
            (rec["store_port"],) = struct.unpack_from(">i", data, p + store_len)
            p += store_len + 4
            rec["reconsume"], rec["prepared"], body_len = struct.unpack_from(">iqi", data, p)
            p += 16
            rec["body"] = data[p : p + body_len]
            p += body_len
            topic_len = data[p]
            rec["topic"] = data[p + 1 : p + 1 + topic_len].decode()
            p += 1 + topic_len
            (props_len,) = struct.unpack_from(">h", data, p)
            rec["props"] = data[p + 2 : p + 2 + props_len].decode()
            p += 2 + props_len
            rec["record_crc"] = _record_crc(data[pos:p], rec)
            assert (
                p - pos
                == total
                == 91
                + (12 if born_len == 16 else 0)
                + (12 if store_len == 16 else 0)
                + body_len
                + topic_len
                + props_len
            )
            records.append(rec)
            pos = p
    return records


def test_round_trip_content_mix_reads_back_identically(small_config: MessageStoreConfig) -> None:
    written = write_store(small_config, 1500)
    with MessageStore.open(config=small_config, read_only=True) as store:
        decoded = list(store.iter_messages())
        assert len(decoded) == len(written)
        for (msg, result), ext in zip(written, decoded, strict=True):
            assert ext.commit_log_offset == result.phy_offset
            assert ext.msg_id == result.msg_id
            assert (ext.topic, ext.queue_id, ext.body, ext.flag) == (
                msg.topic,
                msg.queue_id,
                msg.body,
                msg.flag,
            )
            assert ext.properties == msg.properties
            assert ext.born_timestamp == msg.born_timestamp
            assert ext.store_timestamp == result.store_timestamp
            assert ext.reconsume_times == msg.reconsume_times
            assert m.parse_host(ext.born_host) == m.parse_host(msg.born_host)
            assert ext.queue_offset == (result.queue_offset if m.is_dispatchable(msg.sys_flag) else 0)
            assert store.view_message_by_id(result.msg_id).body == msg.body
        # Every queue reads back contiguous and complete through get_message.
        per_queue: dict[tuple[str, int], list[bytes]] = {}
        for msg, _ in written:
            if m.is_dispatchable(msg.sys_flag):
                per_queue.setdefault((msg.topic, msg.queue_id), []).append(msg.body)
        for (topic, queue_id), bodies in per_queue.items():
            got: list[bytes] = []
            offset = 0
            while True:
                res = store.get_message(topic, queue_id, offset, 32)
                if res.status is not GetMessageStatus.FOUND:
                    assert res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
                    break
                assert [x.queue_offset for x in res.messages] == list(
                    range(offset, offset + len(res.messages))
                )
                got.extend(x.body for x in res.messages)
                offset = res.next_begin_offset
            assert got == bodies


def test_files_follow_the_spec_byte_for_byte(small_config: MessageStoreConfig) -> None:
    written = write_store(small_config, 1200, seed=3)
    root = Path(small_config.store_path_root_dir)
    records = independent_records(root / "commitlog", small_config.mapped_file_size_commit_log)
    assert len(records) == len(written)
    assert len(list((root / "commitlog").iterdir())) > 3, "several file rolls"
    cq_expected: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for rec, (msg, result) in zip(records, written, strict=True):
        assert rec["record_crc"], "every record carries the whole-record CRC"
        assert rec["phy"] == rec["phy_field"] == result.phy_offset
        assert rec["body"] == msg.body
        assert rec["topic"] == msg.topic
        import zlib

        assert rec["crc"] == (zlib.crc32(msg.body) & 0x7FFFFFFF if msg.body else 0)
        props = dict(kv.split("\x01", 1) for kv in rec["props"].split("\x02")) if rec["props"] else {}
        assert props == msg.properties
        v6_born = ":" in msg.born_host[0]
        assert bool(rec["sys_flag"] & 0x10) == v6_born
        assert rec["sys_flag"] & 0xC == msg.sys_flag & 0xC
        assert rec["store_port"] == 10911
        if msg.sys_flag & 0xC in (0, 8):
            tags = msg.properties.get("TAGS")
            cq_expected.setdefault((msg.topic, msg.queue_id), []).append(
                (rec["phy"], rec["total"], java_hash(tags) if tags else 0)
            )
        else:
            assert rec["queue_offset"] == 0
    cq_size = small_config.mapped_file_size_consume_queue
    for (topic, queue_id), entries in cq_expected.items():
        qdir = root / "consumequeue" / topic / str(queue_id)
        raw = b"".join(p.read_bytes() for p in sorted(qdir.iterdir()))
        assert all(p.stat().st_size == cq_size for p in qdir.iterdir())
        got = [struct.unpack_from(">qiq", raw, i * 20) for i in range(len(entries))]
        assert got == entries
        assert raw[len(entries) * 20 :].strip(b"\0") == b""
    # Index: header, slots and chains by the spec; every key of every non-ROLLBACK record present.
    slots, index_num = small_config.max_hash_slot_num, small_config.max_index_num
    want: dict[tuple[int, int], int] = {}
    for rec, (msg, _r) in zip(records, written, strict=True):
        if msg.sys_flag & 0xC == 0xC:
            continue
        uniq = msg.properties.get("UNIQ_KEY")
        for key in ([f"{msg.topic}#{uniq}"] if uniq else []) + [
            f"{msg.topic}#{k}" for k in m.split_keys(msg.properties.get("KEYS"))
        ]:
            h = abs(java_hash(key))
            want[(h if h < 2**31 else 0, rec["phy"])] = want.get((h, rec["phy"]), 0) + 1
    have: dict[tuple[int, int], int] = {}
    index_files = sorted((root / "index").iterdir())
    assert len(index_files) > 1, "index files rolled"
    for path in index_files:
        data = path.read_bytes()
        assert len(data) == 40 + slots * 4 + index_num * 20
        assert len(path.name) == 17
        _bt, _et, _bp, _end_phy, slot_count, count = struct.unpack_from(">qqqqii", data, 0)
        used = struct.unpack_from(f">{slots}i", data, 40)
        assert slot_count == sum(1 for s in used if s)
        for n in range(1, count):
            h, phy, diff, prev = struct.unpack_from(">iqii", data, 40 + slots * 4 + n * 20)
            assert 0 <= prev < n
            assert diff >= 0
            have[(h, phy)] = have.get((h, phy), 0) + 1
        for s, head in enumerate(used):  # every chain links entries of its own slot, newest first
            while head:
                h, _phy, _diff, prev = struct.unpack_from(">iqii", data, 40 + slots * 4 + head * 20)
                assert h % slots == s
                head = prev
    assert have == want


def test_store_reopens_and_appends_after_clean_shutdown(small_config: MessageStoreConfig) -> None:
    first = write_store(small_config, 300, seed=11)
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        assert not store.recovery.abnormal
        result = store.put_message(m.Message(topic="OrderTopic", body=b"after restart"))
        expected_offset = sum(
            1 for msg, _ in first if msg.topic == "OrderTopic" and m.is_dispatchable(msg.sys_flag)
        )
        assert result.queue_offset == expected_offset
        assert (
            result.phy_offset == first[-1][1].phy_offset + first[-1][1].wrote_bytes
            or result.phy_offset % (small_config.mapped_file_size_commit_log) == 0
        )
