"""MessageStore behaviour at the edges: lock, abort, statuses, collisions, time lookups."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import (
    ConfigError,
    InvalidMessageIdError,
    MessageNotFoundError,
    StoreLockedError,
    StoreReadOnlyError,
)
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.reporter import Reporter
from tests.service import wait_until


def put(store: MessageStore, topic: str = "T", body: bytes = b"x", queue_id: int = 0, **props: str):
    result = store.put_message(m.Message(topic=topic, body=body, queue_id=queue_id, properties=dict(props)))
    assert result.status is PutMessageStatus.PUT_OK, result
    return result


def test_second_writer_is_refused_but_readers_are_welcome(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        put(store)
        with pytest.raises(StoreLockedError, match="already open in another process"):
            MessageStore.open(config=small_config)
        with MessageStore.open(config=small_config, read_only=True) as reader:
            assert reader.max_phy_offset() == store.max_phy_offset()
    with MessageStore.open(config=small_config) as store:
        assert (Path(small_config.store_path_root_dir) / "lock").read_bytes() == b"lock"


def test_abort_file_marks_an_open_store_and_drives_abnormal_recovery(
    small_config: MessageStoreConfig,
) -> None:
    root = Path(small_config.store_path_root_dir)
    store = MessageStore.open(config=small_config)
    assert (root / "abort").exists()
    put(store)
    store.flush()
    store._release()  # what a killed process leaves
    assert (root / "abort").exists()
    with MessageStore.open(config=small_config) as store:
        assert store.recovery is not None
        assert store.recovery.abnormal
        assert store.get_message("T", 0, 0).status is GetMessageStatus.FOUND
    assert not (root / "abort").exists()


def test_read_only_store_refuses_writes(small_config: MessageStoreConfig) -> None:
    MessageStore.open(config=small_config).close()
    with MessageStore.open(config=small_config, read_only=True) as store, pytest.raises(StoreReadOnlyError):
        store.put_message(m.Message(topic="T", body=b"x"))


def test_get_message_statuses_and_next_offsets(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        assert store.get_message("T", 0, 0).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
        for i in range(5):
            put(store, body=str(i).encode())
        found = store.get_message("T", 0, 1, 2)
        assert found.status is GetMessageStatus.FOUND
        assert [x.body for x in found.messages] == [b"1", b"2"]
        assert (found.next_begin_offset, found.min_offset, found.max_offset) == (3, 0, 5)
        one = store.get_message("T", 0, 5)
        assert (one.status, one.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 5)
        badly = store.get_message("T", 0, 9)
        assert (badly.status, badly.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 0)


def test_queue_starting_above_zero_is_pre_blank_filled(tmp_path: Path) -> None:
    """`fillPreBlank`: a queue whose first entry is offset 5 pads the file; min offset is 5."""
    cq = ConsumeQueue("T", 0, tmp_path, 20 * 10, writable=True, reporter=Reporter())
    assert cq.put_message_position_info(phy_offset=1000, size=100, tags_code=7, queue_offset=5)
    raw = (tmp_path / "T" / "0" / f"{0:020d}").read_bytes()
    for i in range(5):
        assert raw[i * CQ_STORE_UNIT_SIZE : (i + 1) * CQ_STORE_UNIT_SIZE] == bytes(
            8
        ) + PRE_BLANK_SIZE.to_bytes(4, "big") + bytes(8)
    assert (cq.min_offset_in_queue(), cq.max_offset_in_queue()) == (5, 6)
    assert cq.get_entry(5) == (1000, 100, 7)
    assert cq.get_entry(4) is None
    assert cq.put_message_position_info(phy_offset=1000, size=100, tags_code=7, queue_offset=5)  # duplicate
    assert cq.max_offset_in_queue() == 6
    cq.close()


def test_a_gap_in_a_queue_is_filled_with_pre_blanks_across_files_when_the_log_span_can_hold_it(
    tmp_path: Path,
) -> None:
    """Dispatch stepping over records (a damaged one) leaves queue offsets without entries: the
    next entry lands at its own offset, the holes pre-blanks, across a file boundary; a jump the
    log span between cannot hold (a wrong queue offset) is appended as RocketMQ does."""
    cq = ConsumeQueue("T", 0, tmp_path, 20 * 10, writable=True, reporter=Reporter())
    assert cq.put_message_position_info(phy_offset=0, size=100, tags_code=1, queue_offset=0)
    assert cq.put_message_position_info(phy_offset=100, size=100, tags_code=2, queue_offset=1)
    span = 20 * record.MIN_RECORD_SIZE  # room for the 12 missing records and more
    assert cq.put_message_position_info(phy_offset=200 + span, size=100, tags_code=3, queue_offset=14)
    assert cq.max_offset_in_queue() == 15
    assert cq.get_entry(14) == (200 + span, 100, 3)
    assert [cq.get_entry(q) for q in range(2, 14)] == [(0, PRE_BLANK_SIZE, 0)] * 12  # files 0 and 1
    assert cq.gap_seen
    end = 300 + span
    assert cq.max_physic_offset == end
    assert cq.put_message_position_info(phy_offset=end, size=100, tags_code=4, queue_offset=10**9)
    assert cq.max_offset_in_queue() == 16, "no record span holds a billion records: appended"
    assert cq.get_entry(15) == (end, 100, 4)
    cq.close()

    again = ConsumeQueue("T", 0, tmp_path, 20 * 10, writable=True, reporter=Reporter())
    again.load()
    again.recover()
    assert again.max_physic_offset == end + 100
    assert again.truncate_dirty_logic_files(end) == 1  # the last entry: its record is past the end
    assert again.max_physic_offset == 300 + span
    assert again.truncate_dirty_logic_files(end - 1) == 1  # now file 1 ends in pre-blanks
    assert again.max_physic_offset < PRE_BLANK_SIZE, "no pre-blank's end as the duplicate floor"
    assert again.max_offset_in_queue() == 14
    again.close()


def test_hash_collision_never_returns_another_keys_message(small_config: MessageStoreConfig) -> None:
    """ "Aa" and "BB" share a Java hash code, so their index entries share a chain (RocketMQ #3613)."""
    assert m.java_string_hash("T#Aa") == m.java_string_hash("T#BB")
    with MessageStore.open(config=small_config) as store:
        aa = put(store, body=b"aa", KEYS="Aa")
        bb = put(store, body=b"bb", KEYS="BB")
        assert [x.commit_log_offset for x in store.query_message("T", "Aa")] == [aa.phy_offset]
        assert [x.commit_log_offset for x in store.query_message("T", "BB")] == [bb.phy_offset]
        assert store.query_message("Other", "Aa") == []


def test_query_by_key_is_newest_first_and_time_bounded(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        results = [put(store, body=str(i).encode(), KEYS="same other") for i in range(5)]
        found = store.query_message("T", "same")
        assert [x.commit_log_offset for x in found] == [r.phy_offset for r in reversed(results)]
        assert store.query_message("T", "same", max_num=2) == found[:2]
        future = int(time.time() * 1000) + 10_000_000
        assert store.query_message("T", "same", begin=future, end=future + 1) == []


def test_message_by_id_and_bad_ids(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        result = put(store, body=b"by id")
        assert store.view_message_by_id(result.msg_id).body == b"by id"
        with pytest.raises(InvalidMessageIdError):
            store.view_message_by_id("XYZ")
        with pytest.raises(MessageNotFoundError):
            store.view_message_by_id(m.create_message_id(bytes(4), 1, 10**9))


def test_offset_in_queue_by_time(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        times = []
        for i in range(6):
            times.append(put(store, body=str(i).encode()).store_timestamp)
            # Each message its own store time: the next put waits for the store's clock to tick.
            wait_until(lambda: int(time.time() * 1000) > times[-1], 5, "the next millisecond")
        for i, ts in enumerate(times):
            assert store.get_offset_in_queue_by_time("T", 0, ts) == i
        assert store.get_offset_in_queue_by_time("T", 0, times[0] - 60_000) == 0
        assert store.get_offset_in_queue_by_time("T", 0, times[-1] + 60_000) == 5
        assert store.get_offset_in_queue_by_time("Nope", 0, times[0]) == 0


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (m.Message(topic="x" * 128, body=b""), PutMessageStatus.MESSAGE_ILLEGAL),
        (m.Message(topic="主" * 43, body=b""), PutMessageStatus.MESSAGE_ILLEGAL),  # 129 UTF-8 bytes
        (m.Message(topic="a/b", body=b""), PutMessageStatus.MESSAGE_ILLEGAL),
        (m.Message(topic="T", body=b"", queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL),
        (m.Message(topic="T", properties={"k": "é" * 20000}), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED),
        (m.Message(topic="T", properties={"k": "v" * 40000}), PutMessageStatus.MESSAGE_ILLEGAL),
        (m.Message(topic="T", body=bytes(4096 + 1)), PutMessageStatus.MESSAGE_ILLEGAL),
    ],
)
def test_illegal_messages_are_refused_with_a_reason_and_store_nothing(
    small_config: MessageStoreConfig, message: m.Message, status: PutMessageStatus
) -> None:
    with MessageStore.open(config=small_config.replace(max_message_size=4096)) as store:
        result = store.put_message(message)
        assert result.status is status
        assert result.reason
        assert store.max_phy_offset() == 0


def test_message_larger_than_a_file_is_refused(small_config: MessageStoreConfig) -> None:
    with MessageStore.open(config=small_config) as store:
        result = store.put_message(m.Message(topic="T", body=bytes(70_000)))
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL


def test_multi_path_commit_log_is_refused_clearly(small_config: MessageStoreConfig, tmp_path: Path) -> None:
    cfg = small_config.replace(store_path_commit_log=f"{tmp_path / 'a'},{tmp_path / 'b'}")
    with pytest.raises(ConfigError, match="not supported yet"):
        MessageStore.open(config=cfg)


def test_store_without_commit_log_drops_its_queues(small_config: MessageStoreConfig) -> None:
    root = Path(small_config.store_path_root_dir)
    with MessageStore.open(config=small_config) as store:
        put(store)
    for path in (root / "commitlog").iterdir():
        path.unlink()
    with MessageStore.open(config=small_config) as store:
        assert store.topics() == []
        assert put(store).queue_offset == 0


def test_query_by_key_returns_default_query_max_num_unless_told(small_config: MessageStoreConfig) -> None:
    """defaultQueryMaxNum is the cap when the caller names none (RocketMQ's broker cap for
    uniq-key queries); an explicit max_num wins."""
    config = small_config.replace(default_query_max_num=3)
    with MessageStore.open(config=config) as store:
        for i in range(5):
            put(store, body=str(i).encode(), KEYS="k")
        assert [x.body for x in store.query_message("T", "k")] == [b"4", b"3", b"2"]
        assert len(store.query_message("T", "k", max_num=5)) == 5


@pytest.mark.parametrize(("ratio", "expected"), [(40, 20), (0, 8)])
def test_a_pull_of_records_on_disk_returns_fewer(
    small_config: MessageStoreConfig, ratio: int, expected: int
) -> None:
    """RocketMQ's isTheBatchFull: records further behind the log's end than
    accessMessageInMemoryMaxRatio percent of RAM count as on disk, and a pull returns at most
    maxTransferCountOnMessageInDisk (8) of them instead of ...InMemory (32); at 0 percent
    every record but the newest is on disk."""
    config = small_config.replace(access_message_in_memory_max_ratio=ratio)
    with MessageStore.open(config=config) as store:
        for i in range(20):
            put(store, body=b"%d" % i)
        got = store.get_message("T", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND
        assert len(got.messages) == expected
        assert got.next_begin_offset == expected


def test_a_pull_on_disk_is_bounded_by_max_transfer_bytes_on_message_in_disk(
    small_config: MessageStoreConfig,
) -> None:
    config = small_config.replace(
        access_message_in_memory_max_ratio=0, max_transfer_bytes_on_message_in_disk=1000
    )
    with MessageStore.open(config=config) as store:
        sizes = [put(store, body=bytes(300)).wrote_bytes for _ in range(6)]
        got = store.get_message("T", 0, 0, 32)
        assert len(got.messages) == 1000 // sizes[0]
