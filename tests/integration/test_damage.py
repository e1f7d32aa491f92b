"""Bad bytes on disk never crash the store and never cost good data.

Each test writes a real store, damages a real file the way a crash or a bad disk would, reopens
it, and checks: a typed error or a reported (logged + counted) truncation, and every record
before the damage still readable, queues and index included."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import CorruptFileError
from rmq_mp.format import message as m
from rmq_mp.outcomes import PutMessageResult, PutMessageStatus
from rmq_mp.store.message_store import MessageStore
from tests.store_content import make_messages


def write(
    config: MessageStoreConfig, count: int, *, crash: bool = False, seed: int = 5
) -> list[PutMessageResult]:
    """Write ``count`` messages; with ``crash`` leave the store as a killed process would (abort kept)."""
    store = MessageStore.open(config=config)
    results = [store.put_message(msg) for msg in make_messages(count, seed)]
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    if crash:
        store.flush()
        store._release()  # no clean shutdown: `abort` stays
    else:
        store.close()
    return results


def last_file(root: Path, sub: str = "commitlog") -> Path:
    return sorted((root / sub).iterdir())[-1]


def readable_offsets(config: MessageStoreConfig) -> list[int]:
    with MessageStore.open(config=config, read_only=True) as store:
        return [msg.commit_log_offset for msg in store.iter_messages()]


def assert_consistent(store: MessageStore, results: list[PutMessageResult], keep: int) -> None:
    """The first ``keep`` results are intact through every read path; nothing after them is."""
    kept = results[:keep]
    assert [msg.commit_log_offset for msg in store.iter_messages()] == [r.phy_offset for r in kept]
    end = kept[-1].phy_offset + kept[-1].wrote_bytes
    for cq in store.all_consume_queues():
        for queue_offset in range(cq.min_offset_in_queue(), cq.max_offset_in_queue()):
            entry = cq.get_entry(queue_offset)
            assert entry is not None
            assert entry[0] + entry[1] <= end
            assert store.look_message_by_offset(entry[0]).queue_offset == queue_offset
    assert store.index_service is not None
    for f in store.index_service.files:
        assert all(phy < end for _h, phy, _t, _p in f.entries())


@pytest.mark.parametrize("crash", [False, True], ids=["after-clean-shutdown", "after-crash"])
def test_a_deleted_newest_commit_log_file_is_reported_by_its_range(
    small_config: MessageStoreConfig, crash: bool
) -> None:
    """The newest commit-log file, holding records, deleted: the log ends at the file before it,
    its records' queue entries and keys go, and their range is reported in commit-log offsets
    (`commitlog-missing`, from what the queues held: seeds 612, 776 and 1496 of
    tests/crash/test_compound_damage named no finding for them); a restart reports nothing."""
    results = write(small_config, 400, crash=crash)
    end = results[-1].phy_offset + results[-1].wrote_bytes
    path = last_file(Path(small_config.store_path_root_dir))
    start = int(path.name)
    assert start < end, "the newest file holds records"
    path.unlink()
    keep = sum(1 for r in results if r.phy_offset < start)
    with MessageStore.open(config=small_config) as store:
        missing = [(d.start, d.end) for d in store.reporter.findings if d.kind == "commitlog-missing"]
        assert missing == [(start, end)]
        assert_consistent(store, results, keep)
    with MessageStore.open(config=small_config) as again:
        assert again.reporter.count("commitlog-missing") == 0
        assert_consistent(again, results, keep)


@pytest.mark.parametrize("crash", [False, True], ids=["after-clean-shutdown", "after-crash"])
def test_garbage_after_last_record_is_cut_and_reported(small_config: MessageStoreConfig, crash: bool) -> None:
    results = write(small_config, 400, crash=crash)
    end = results[-1].phy_offset + results[-1].wrote_bytes
    path = last_file(Path(small_config.store_path_root_dir))
    garbage = random.Random(1).randbytes(300)
    with path.open("r+b") as f:
        f.seek(end - int(path.name))
        f.write(garbage)
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        assert store.recovery.recovered_end_offset == end
        assert [(d.start, d.end) for d in store.reporter.findings if d.kind == "commitlog-truncated"] == [
            (end, end + len(garbage) - (len(garbage) - len(garbage.rstrip(b"\0"))))
        ]
        assert_consistent(store, results, len(results))
        nxt = store.put_message(m.Message(topic="OrderTopic", body=b"next"))
        assert nxt.phy_offset == end
    assert readable_offsets(small_config)[-1] == end


@pytest.mark.parametrize("crash", [False, True], ids=["after-clean-shutdown", "after-crash"])
def test_record_cut_in_half_is_dropped_with_its_queue_and_index_entries(
    small_config: MessageStoreConfig, crash: bool
) -> None:
    results = write(small_config, 400, crash=crash)
    victim = max(range(len(results)), key=lambda i: (results[i].phy_offset // 65536, i))
    last = results[victim]
    assert victim == len(results) - 1
    path = last_file(Path(small_config.store_path_root_dir))
    with path.open("r+b") as f:
        half = last.wrote_bytes // 2
        f.seek(last.phy_offset - int(path.name) + half)
        f.write(bytes(last.wrote_bytes - half))
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        assert store.recovery.recovered_end_offset == last.phy_offset
        assert store.reporter.count("commitlog-truncated") == 1
        assert_consistent(store, results, len(results) - 1)


@pytest.mark.parametrize("flipped_from_end", [1, 2, 5])
def test_bit_flip_in_last_records_truncates_at_first_bad_record(
    small_config: MessageStoreConfig, flipped_from_end: int
) -> None:
    results = write(small_config, 400, crash=True)
    # Choose a record with a body in the last file and flip one body bit.
    in_last = [r for r in results if r.phy_offset // 65536 == results[-1].phy_offset // 65536]
    target_index = len(results) - flipped_from_end
    bodies = [msg.body for msg in make_messages(400, 5)]
    while len(bodies[target_index]) < 101 or results[target_index] not in in_last:
        target_index -= 1
    target = results[target_index]
    path = last_file(Path(small_config.store_path_root_dir))
    with path.open("r+b") as f:
        start = target.phy_offset - int(path.name)
        f.seek(start + 36)
        sys_flag = int.from_bytes(f.read(4), "big")
        body_start = start + 48 + (20 if sys_flag & 0x10 else 8) + 8 + (20 if sys_flag & 0x20 else 8) + 16
        pos = body_start + 100  # inside the body: the CRC covers only the body
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0x10]))
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        assert store.recovery.recovered_end_offset == target.phy_offset
        finding = next(d for d in store.reporter.findings if d.kind == "commitlog-truncated")
        assert finding.start == target.phy_offset
        assert "CRC" in finding.reason
        assert_consistent(store, results, target_index)


@pytest.mark.parametrize("size", [0, 1000], ids=["zero-length", "short"])
def test_zero_length_or_short_last_file_is_repaired(small_config: MessageStoreConfig, size: int) -> None:
    """RocketMQ 4.9.8 refuses to start on these (#6904)."""
    results = write(small_config, 400, crash=True)
    root = Path(small_config.store_path_root_dir)
    file_size = small_config.mapped_file_size_commit_log
    next_offset = int(last_file(root).name) + file_size
    extra = root / "commitlog" / f"{next_offset:020d}"
    extra.write_bytes(random.Random(2).randbytes(size))
    with MessageStore.open(config=small_config) as store:
        assert store.reporter.count("short-file-extended") == 1
        assert not extra.exists(), "an empty file above the data is removed, as RocketMQ removes it"
        assert_consistent(store, results, len(results))
        assert store.put_message(m.Message(topic="Payments", body=b"x")).status is PutMessageStatus.PUT_OK


def test_short_last_file_with_data_keeps_what_survived(small_config: MessageStoreConfig) -> None:
    results = write(small_config, 400, crash=True)
    path = last_file(Path(small_config.store_path_root_dir))
    base = int(path.name)
    cut_at = (results[-1].phy_offset - base) // 2
    survivors = [i for i, r in enumerate(results) if r.phy_offset + r.wrote_bytes - base <= cut_at]
    os.truncate(path, cut_at)
    with MessageStore.open(config=small_config) as store:
        assert store.reporter.count("short-file-extended") == 1
        assert_consistent(store, results, survivors[-1] + 1)


def test_truncated_middle_file_is_a_typed_error_and_nothing_is_touched(
    small_config: MessageStoreConfig,
) -> None:
    write(small_config, 400)
    root = Path(small_config.store_path_root_dir)
    middle = sorted((root / "commitlog").iterdir())[1]
    os.truncate(middle, 1234)
    before = {p: p.read_bytes() for p in (root / "commitlog").iterdir()}
    with pytest.raises(CorruptFileError, match="length 1234 does not match"):
        MessageStore.open(config=small_config)
    assert {p: p.read_bytes() for p in (root / "commitlog").iterdir()} == before
    assert not (root / "abort").exists()
    with pytest.raises(CorruptFileError):
        MessageStore.open(config=small_config, read_only=True)


def test_index_file_cut_mid_entry_is_truncated_and_rebuilt(small_config: MessageStoreConfig) -> None:
    results = write(small_config, 400)
    root = Path(small_config.store_path_root_dir)
    index_path = last_file(root, "index")
    slots_end = 40 + small_config.max_hash_slot_num * 4
    os.truncate(index_path, slots_end + 20 * 10 + 7)  # entry 10 cut in the middle
    with MessageStore.open(config=small_config) as store:
        assert store.reporter.count("index-entries-truncated") == 1
        assert_consistent(store, results, len(results))
        for msg in make_messages(400, 5):
            uniq = msg.properties.get("UNIQ_KEY")
            if uniq and msg.sys_flag & 12 != 12:
                assert [x.uniq_key for x in store.query_message(msg.topic, uniq)] == [uniq]


def test_corrupt_consume_queue_file_is_rebuilt_from_the_commit_log(small_config: MessageStoreConfig) -> None:
    results = write(small_config, 600)
    root = Path(small_config.store_path_root_dir)
    qdir = root / "consumequeue" / "OrderTopic" / "0"
    files = sorted(qdir.iterdir())
    assert len(files) > 1
    os.truncate(files[0], 333)
    with MessageStore.open(config=small_config) as store:
        assert store.reporter.count("cq-file-discarded") == len(files)
        assert_consistent(store, results, len(results))
        assert store.find_consume_queue("OrderTopic", 0).max_offset_in_queue() == sum(
            1
            for msg in make_messages(600, 5)
            if msg.topic == "OrderTopic" and m.is_dispatchable(msg.sys_flag)
        )


def test_garbage_in_consume_queue_tail_is_cut(small_config: MessageStoreConfig) -> None:
    results = write(small_config, 300)
    root = Path(small_config.store_path_root_dir)
    qfile = last_file(root / "consumequeue" / "Payments", "1")
    data = bytearray(qfile.read_bytes())
    used = len(data.rstrip(b"\0")) // 20 * 20
    data[used : used + 20] = (-5).to_bytes(8, "big", signed=True) + bytes(12)  # an invalid entry
    data[used + 20 : used + 40] = random.Random(3).randbytes(20)
    qfile.write_bytes(bytes(data))
    with MessageStore.open(config=small_config) as store:
        assert store.reporter.count("cq-entries-dropped") == 1
        assert_consistent(store, results, len(results))


def test_temp_file_of_an_interrupted_segment_creation_is_removed(small_config: MessageStoreConfig) -> None:
    results = write(small_config, 100)
    commitlog = Path(small_config.store_path_root_dir) / "commitlog"
    stale = commitlog / f".{2**20:020d}.tmp4187"
    stale.write_bytes(bytes(1000))
    with MessageStore.open(config=small_config) as store:
        assert not stale.exists()
        assert store.reporter.count("stale-temp-file-removed") == 1
        assert_consistent(store, results, len(results))


def test_index_put_torn_between_slot_and_header_is_repaired(small_config: MessageStoreConfig) -> None:
    """putKey writes entry, slot, header. Killed between slot and header, the slot points at an
    uncounted entry; without repair the next put links to itself and older keys of that slot are
    lost (found by the kill matrix, reput SIGKILL, seed 1413)."""
    import struct

    from rmq_mp.store.index_file import IndexFile
    from rmq_mp.store.reporter import Reporter

    path = Path(small_config.store_path_root_dir) / "index" / "20260101000000000"
    path.parent.mkdir(parents=True)
    slots, entries = small_config.max_hash_slot_num, small_config.max_index_num
    index = IndexFile(path, slots, entries, writable=True, reporter=Reporter(), create=True)
    assert index.put_key("T#Aa", 100, 1_000_000)  # "T#Aa" and "T#BB" share a slot
    assert index.put_key("T#x", 200, 1_000_000)
    # A torn third put: entry and slot written, header count not.
    key_hash = m.index_key_hash("T#BB")
    entry_pos = 40 + slots * 4 + index.index_count * 20
    assert index._mm is not None  # opened writable: mapped
    index._mm[entry_pos : entry_pos + 20] = struct.pack(">iqii", key_hash, 300, 0, 1)
    index._mm[40 + key_hash % slots * 4 : 44 + key_hash % slots * 4] = struct.pack(">i", index.index_count)
    index.close()
    reporter = Reporter()
    reopened = IndexFile(path, slots, entries, writable=True, reporter=reporter)
    assert reporter.count("index-torn-put-repaired") == 1
    assert reopened.put_key("T#BB", 300, 1_000_000)
    # Same hash, one chain, newest first; without the repair the chain stops at 300.
    chain = reopened.select_phy_offsets("T#Aa", 10, 0, 2**62)
    assert chain == [300, 100], "the older entry of the slot is still reachable"
    reopened.close()
