"""ConsumeQueue and index damage: both are derived from the commit log, so a damaged, cut or
deleted queue or index file is rebuilt from it at start, reported, and costs no record.

Each test writes a real store with small files (many queue and index files), damages one kind
of derived file the way a bad disk or a careless operator would, reopens it (after a clean
exit and after a crash), and checks through `tests.damage_check` that every acknowledged record
is served exactly once by its queue with its bytes, and found by each of its unique keys."""

from __future__ import annotations

import itertools
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.outcomes import PutMessageResult
from rmq_mp.store.message_store import MessageStore
from tests.damage_check import assert_intact_served, write_store

COUNT = 700
SEED = 11


def write(config: MessageStoreConfig, *, crash: bool) -> tuple[list[m.Message], list[PutMessageResult]]:
    return write_store(config, COUNT, SEED, crash=crash)


def queue_dir(root: Path) -> Path:
    """The busiest queue's directory (several files)."""
    return max((root / "consumequeue").glob("*/*"), key=lambda d: len(list(d.iterdir())))


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_entry_phy(root: Path) -> None:
    """A high byte of one entry's phy offset in the queue's oldest file, mid-file."""
    first = sorted(queue_dir(root).iterdir())[0]
    overwrite(first, 20 * 40 + 2, bytes([first.read_bytes()[20 * 40 + 2] ^ 0x40]))


def flip_entry_low_byte(root: Path) -> None:
    """The lowest byte of one entry's phy offset: it still lies in order, inside another record."""
    first = sorted(queue_dir(root).iterdir())[0]
    overwrite(first, 20 * 40 + 7, bytes([first.read_bytes()[20 * 40 + 7] ^ 0x01]))


def zero_entries(root: Path) -> None:
    middle = sorted(queue_dir(root).iterdir())[1]
    overwrite(middle, 20 * 10, bytes(20 * 5))


def random_entries(root: Path) -> None:
    middle = sorted(queue_dir(root).iterdir())[1]
    overwrite(middle, 20 * 30, random.Random(3).randbytes(20 * 3))


def delete_queue_dir(root: Path) -> None:
    shutil.rmtree(queue_dir(root))


def delete_first_queue_file(root: Path) -> None:
    sorted(queue_dir(root).iterdir())[0].unlink()


def delete_every_queue(root: Path) -> None:
    shutil.rmtree(root / "consumequeue")


QUEUE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "entry-phy-flipped": flip_entry_phy,
    "entry-low-byte-flipped": flip_entry_low_byte,
    "entries-zeroed": zero_entries,
    "entries-random": random_entries,
    "queue-dir-deleted": delete_queue_dir,
    "first-queue-file-deleted": delete_first_queue_file,
    "consumequeue-deleted": delete_every_queue,
}


@pytest.mark.parametrize("crash", [False, True], ids=["clean-exit", "crash"])
@pytest.mark.parametrize("damage", list(QUEUE_DAMAGE))
def test_damaged_queue_is_rebuilt_from_the_commit_log(
    small_config: MessageStoreConfig, damage: str, crash: bool
) -> None:
    messages, results = write(small_config, crash=crash)
    root = Path(small_config.store_path_root_dir)
    busiest = queue_dir(root)
    QUEUE_DAMAGE[damage](root)
    with MessageStore.open(config=small_config) as store:
        reported = [d for d in store.reporter.findings if d.kind in ("cq-entries-dropped", "cq-rebuilt")]
        # after a crash, recovery re-dispatches from the checkpoint's file: a queue gone whole is
        # simply rebuilt by that replay when it starts at the log's beginning, as here
        if damage != "consumequeue-deleted" and not (crash and damage == "queue-dir-deleted"):
            assert any(d.path == str(busiest) for d in reported), store.reporter.findings
        assert_intact_served(store, messages, results)
        # the next put continues each queue where its acknowledged offsets end
        topic, queue_id = busiest.parent.name, int(busiest.name)
        last = max(
            r.queue_offset
            for msg, r in zip(messages, results, strict=True)
            if (msg.topic, msg.queue_id) == (topic, queue_id) and m.is_dispatchable(msg.sys_flag)
        )
        nxt = store.put_message(m.Message(topic=topic, queue_id=queue_id, body=b"after"))
        assert nxt.queue_offset == last + 1
    with MessageStore.open(config=small_config) as again:  # the repair holds: nothing more to do
        assert not [d for d in again.reporter.findings if d.kind.startswith("cq-")]


def index_files(root: Path) -> list[Path]:
    return sorted((root / "index").iterdir())


def flip_index_entry(root: Path) -> None:
    """A low bit of an entry's key hash in the oldest index file. (With a power-of-two slot count
    a flip above its bits keeps the slot and goes unseen; RocketMQ's default, 5,000,000 slots,
    is not one.)"""
    path = index_files(root)[0]
    at = 40 + 64 * 4 + 20 * 50 + 3
    overwrite(path, at, bytes([path.read_bytes()[at] ^ 0x04]))


def flip_index_slot(root: Path) -> None:
    path = index_files(root)[0]
    slots = path.read_bytes()[40 : 40 + 64 * 4]
    used = next(i for i in range(64) if slots[i * 4 : i * 4 + 4] != bytes(4))
    overwrite(path, 40 + used * 4 + 3, bytes([slots[used * 4 + 3] ^ 0x05]))


def zero_index_entries(root: Path) -> None:
    overwrite(index_files(root)[1], 40 + 64 * 4 + 20 * 20, bytes(20 * 10))


def delete_middle_index_file(root: Path) -> None:
    index_files(root)[1].unlink()


def delete_first_index_file(root: Path) -> None:
    index_files(root)[0].unlink()


def delete_last_index_file(root: Path) -> None:
    index_files(root)[-1].unlink()


def delete_index_dir(root: Path) -> None:
    shutil.rmtree(root / "index")


def cut_middle_index_file(root: Path) -> None:
    os.truncate(index_files(root)[1], 40 + 64 * 4 + 20 * 30 + 9)


def garble_index_header(root: Path) -> None:
    """The second-newest file's header from its begin offset on randomised (seed 382 of
    tests/crash/test_compound_damage): a negative entry count once read as an empty file, its
    slots 'repaired' and the garbage written back, and its end offset below every record let a
    replay from the log's start key each record again (a query then found it twice)."""
    overwrite(
        index_files(root)[-2],
        16,
        (2870273606827404837).to_bytes(8, "big")
        + (-2623269484710014432).to_bytes(8, "big", signed=True)
        + (-1888140082).to_bytes(4, "big", signed=True)
        + (-944340405).to_bytes(4, "big", signed=True),
    )


INDEX_DAMAGE: dict[str, Callable[[Path], None]] = {
    "header-garbled": garble_index_header,
    "entry-hash-flipped": flip_index_entry,
    "slot-flipped": flip_index_slot,
    "entries-zeroed": zero_index_entries,
    "middle-file-deleted": delete_middle_index_file,
    "first-file-deleted": delete_first_index_file,
    "last-file-deleted": delete_last_index_file,
    "index-dir-deleted": delete_index_dir,
    "middle-file-cut": cut_middle_index_file,
}


@pytest.mark.parametrize("crash", [False, True], ids=["clean-exit", "crash"])
@pytest.mark.parametrize("damage", list(INDEX_DAMAGE))
def test_damaged_index_is_rekeyed_from_the_commit_log(
    small_config: MessageStoreConfig, damage: str, crash: bool
) -> None:
    messages, results = write(small_config, crash=crash)
    root = Path(small_config.store_path_root_dir)
    assert len(index_files(root)) >= 4
    INDEX_DAMAGE[damage](root)
    with MessageStore.open(config=small_config) as store:
        found = store.reporter.count("index-file-removed") + store.reporter.count("index-keys-missing")
        # after a crash, the replay from the checkpoint's file (here the log's first) re-keys a
        # lost newest file or directory as part of recovery, without telling it from lag
        assert found >= 1 or (crash and damage in ("last-file-deleted", "index-dir-deleted"))
        assert_intact_served(store, messages, results)
    with MessageStore.open(config=small_config) as again:
        assert not [d for d in again.reporter.findings if d.kind.startswith("index-")]


def split_records(root: Path, max_hash_slot_num: int) -> list[int]:
    """Phy offsets of records whose keys an index-file roll split: the older file ends with some
    of them, the newer one starts with the rest."""
    files = [path.read_bytes() for path in index_files(root)]
    first_entry = 40 + max_hash_slot_num * 4 + 20
    return [
        int.from_bytes(older[24:32], "big")  # the header's endPhyOffset
        for older, newer in itertools.pairwise(files)
        if int.from_bytes(newer[first_entry + 4 : first_entry + 12], "big")
        == int.from_bytes(older[24:32], "big")
    ]


@pytest.mark.parametrize("crash", [False, True], ids=["clean-exit", "crash"])
def test_a_record_keyed_across_two_index_files_is_keyed_once_after_a_cut_behind_it(
    small_config: MessageStoreConfig, crash: bool
) -> None:
    """The commit log cut right behind a record whose keys span two index files: the index is cut
    to that record and re-keyed from it, and its keys already in the older file are not put again
    (a query would return the message twice). Every record from there on loses its magic code (a
    damaged tail: no sound record after the first bad one), so a clean exit's recovery cuts there
    too, not only a crash's."""
    messages, results = write_store(small_config, 760, SEED, crash=crash)  # a roll in the last 3 files
    root = Path(small_config.store_path_root_dir)
    log_files = sorted((root / "commitlog").iterdir())
    scanned_from = int(log_files[-3].name)  # a clean exit's recovery checks the last three files
    by_phy = {r.phy_offset: i for i, r in enumerate(results)}
    splits = [phy for phy in split_records(root, small_config.max_hash_slot_num) if phy >= scanned_from]
    assert splits, "small index files roll inside some record"
    split = by_phy[splits[-1]]
    cut = results[split + 1].phy_offset
    size = small_config.mapped_file_size_commit_log
    for r in results[split + 1 :]:  # their magic codes
        overwrite(
            root / "commitlog" / f"{r.phy_offset - r.phy_offset % size:020d}",
            r.phy_offset % size + 4,
            bytes(4),
        )
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        assert store.recovery.recovered_end_offset == cut
        end = results[-1].phy_offset + results[-1].wrote_bytes
        assert [(d.start, d.end) for d in store.reporter.findings if d.kind == "commitlog-truncated"] == [
            (cut, end)
        ]
        assert_intact_served(store, messages, results, {r.phy_offset for r in results if r.phy_offset < cut})


@pytest.mark.parametrize("crash", [False, True], ids=["clean-exit", "crash"])
@pytest.mark.parametrize("byte", [2, 7], ids=["high-byte", "low-byte"])
def test_a_damaged_physicaloffset_field_costs_no_other_record(
    small_config: MessageStoreConfig, crash: bool, byte: int
) -> None:
    """A record's PHYSICALOFFSET field flipped in the files recovery scans, in records without
    the whole-record CRC (4.9.8's format, `enabledAppendPropCRC=false`): its queue entry is
    rebuilt at the record's place (not where the field points: past the log's end, which once cut
    the queue's later entries and hid them from the rebuild, or inside another record), a read
    skips it and reports it by its offset, and every other record is served."""
    small_config = small_config.replace(enabled_append_prop_crc=False)
    messages, results = write(small_config, crash=crash)
    root = Path(small_config.store_path_root_dir)
    scanned_from = int(sorted((root / "commitlog").iterdir())[-3].name)
    by_queue: dict[tuple[str, int], list[int]] = {}
    for i, msg in enumerate(messages):
        if m.is_dispatchable(msg.sys_flag):
            by_queue.setdefault((msg.topic, msg.queue_id), []).append(i)
    # a record in the scanned files with later records in its queue
    victim = next(i for rows in by_queue.values() for i in rows[:-1] if results[i].phy_offset >= scanned_from)
    phy = results[victim].phy_offset
    path = root / "commitlog" / f"{phy - phy % small_config.mapped_file_size_commit_log:020d}"
    at = phy % small_config.mapped_file_size_commit_log + 28 + byte  # PHYSICALOFFSET
    overwrite(path, at, bytes([path.read_bytes()[at] ^ 0x01]))
    with MessageStore.open(config=small_config) as store:
        surviving = {r.phy_offset for r in results} - {phy}
        assert_intact_served(store, messages, results, surviving)
        skipped = [d for d in store.reporter.findings if d.kind == "queue-entry-invalid"]
        assert [f"(commit-log offset {phy}," in d.reason for d in skipped] == [True], store.reporter.findings
        msg = messages[victim]
        last = max(r.queue_offset for i, r in enumerate(results) if i in by_queue[(msg.topic, msg.queue_id)])
        nxt = store.put_message(m.Message(topic=msg.topic, queue_id=msg.queue_id, body=b"after"))
        assert nxt.queue_offset == last + 1


@pytest.mark.parametrize("crash", [False, True], ids=["clean-exit", "crash"])
def test_with_the_record_crc_a_damaged_physicaloffset_is_a_crc_failure(
    small_config: MessageStoreConfig, crash: bool
) -> None:
    """The same flip in a record with the whole-record CRC (the default) fails its CRC, as a
    damaged body does: after a crash recovery cuts the log there (RocketMQ's rule: a torn write
    looks the same), reporting the range, and serves every record before it; after a clean exit
    (the record has sound ones after it) it steps over the record, reporting it, and serves every
    other record."""
    assert small_config.enabled_append_prop_crc
    messages, results = write(small_config, crash=crash)
    root = Path(small_config.store_path_root_dir)
    scanned_from = int(sorted((root / "commitlog").iterdir())[-3].name)
    victim = next(r for r in results if r.phy_offset >= scanned_from)
    phy = victim.phy_offset
    path = root / "commitlog" / f"{phy - phy % small_config.mapped_file_size_commit_log:020d}"
    at = phy % small_config.mapped_file_size_commit_log + 28 + 7  # PHYSICALOFFSET's low byte
    overwrite(path, at, bytes([path.read_bytes()[at] ^ 0x01]))
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        cut = [d for d in store.reporter.findings if d.kind == "commitlog-truncated"]
        skipped = [d for d in store.reporter.findings if d.kind == "record-invalid"]
        if crash:
            assert store.recovery.recovered_end_offset == phy
            assert [(d.start, "__CRC32#" in d.reason) for d in cut] == [(phy, True)]
            assert_intact_served(
                store, messages, results, {r.phy_offset for r in results if r.phy_offset < phy}
            )
        else:
            assert store.recovery.recovered_end_offset == results[-1].phy_offset + results[-1].wrote_bytes
            assert (cut, [(d.start, "__CRC32#" in d.reason) for d in skipped]) == ([], [(phy, True)])
            assert_intact_served(store, messages, results, {r.phy_offset for r in results} - {phy})
