"""The deleteTopic marker record (rmq_mp/format/topic_marker.py): its bytes, a hostile body, the
refusal of a send to its topic, a store that meets one in its log with no tombstone (what a
slave's log holds after its master's delete) deleting the topic at that offset when it opens,
and the metadata channel's filter of what a snapshot read before the delete holds of it."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from rmq_mp.config.deleted_topics import DONE
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.config.topics import TopicConfig
from rmq_mp.errors import CorruptRecordError
from rmq_mp.format import ha_meta, record, topic_marker
from rmq_mp.format import message as m
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.store import fork
from rmq_mp.store.message_store import MessageStore
from workers.ha_meta import without_deleted

HOST = ("127.0.0.1", 10911)


def test_a_marker_is_a_plain_record_of_the_system_topic_naming_the_topics() -> None:
    data = topic_marker.encode(record.RecordEncoder(HOST), ["A", "B_2"], 1234)
    message = record.decode_message(data, 0, len(data))
    assert (message.topic, message.queue_id, message.born_timestamp) == (m.DELETE_TOPIC_MARKER, 0, 1234)
    assert topic_marker.decode(message.body) == ["A", "B_2"]
    assert message.properties[m.PROPERTY_KEYS] == "A B_2"
    with pytest.raises(ValueError, match="consume-queue directory"):
        topic_marker.encode(record.RecordEncoder(HOST), ["a/b"], 0)
    with pytest.raises(ValueError, match="at least one"):
        topic_marker.encode(record.RecordEncoder(HOST), [], 0)


@pytest.mark.parametrize("body", [b"", b"A\n\nB", b"\xff\xfe", b"a/b", b"x" * 200])
def test_a_body_naming_no_topic_is_a_typed_error(body: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="deleteTopic marker"):
        topic_marker.decode(body)


def test_a_send_to_the_marker_topic_is_refused(small_config: MessageStoreConfig) -> None:
    with pytest.raises(RecordRejected, match="own system topic"):
        record.RecordEncoder(HOST).topic_field(m.DELETE_TOPIC_MARKER)
    with MessageStore.open(config=small_config) as store:
        put = store.put_message(m.Message(topic=m.DELETE_TOPIC_MARKER, body=b"Keep", queue_id=0))
        assert put.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.commit_log.max_offset() == 0


def _append(store: MessageStore, data: bytearray, queue_offset: int) -> None:
    """Bytes into the log as a slave's ha worker puts them: not dispatched."""
    result = store.commit_log.append(
        data, sys_flag=0, queue_offset=queue_offset, store_timestamp=int(time.time() * 1000)
    )
    assert result.phy_offset >= 0


def test_a_store_meeting_a_marker_in_its_log_deletes_the_topic_there(
    small_config: MessageStoreConfig,
) -> None:
    with MessageStore.open(config=small_config) as store:
        for i in range(3):
            assert store.put_message(m.Message(topic="T", body=b"old%d" % i, queue_id=0)).ok
        assert store.put_message(m.Message(topic="Keep", body=b"k", queue_id=0)).ok
        marker = store.commit_log.max_offset()
        _append(store, topic_marker.encode(record.RecordEncoder(HOST), ["T"], 1), 0)
        _append(store, record.encode_record(m.Message(topic="T", body=b"new0", queue_id=0), HOST), 0)
    with MessageStore.open(config=small_config) as store:  # recovery dispatches past the queues' ends
        stone = store.deleted_topics.table["T"]
        assert (stone.phy_offset, stone.state) == (marker, DONE)
        got = store.get_message("T", 0, 0, 10)
        assert got.status is GetMessageStatus.FOUND
        assert [msg.body for msg in got.messages] == [b"new0"]
        assert store.get_message("Keep", 0, 0, 10).messages[0].body == b"k"
    with MessageStore.open(config=small_config) as store:  # met again, nothing changes
        assert [msg.body for msg in store.get_message("T", 0, 0, 10).messages] == [b"new0"]
        assert store.deleted_topics.table["T"].phy_offset == marker


def test_a_snapshot_read_before_a_delete_brings_nothing_of_the_topic_back() -> None:
    """A slave that deleted T at its marker (offset 500) leaves T's offsets and config out of a
    full snapshot the master read at or below that end, and takes them from one read after."""
    topics = {t: TopicConfig(t, 3, 3).to_json() for t in ("T", "K")}
    before = ha_meta.Snapshot(1, 900, 0, offsets={"T@g": {0: 5}, "K@g": {0: 1}}, topics=topics, built_end=500)
    wire = ha_meta.decode_snapshot(json.loads(ha_meta.encode_snapshot(before)[ha_meta.HEADER_BYTES :]))
    assert wire.built_end == 500
    kept = without_deleted(wire, {"T": 500, "Other": 10_000})
    assert (kept.offsets, set(kept.topics)) == ({"K@g": {0: 1}}, {"K"})
    after = dataclasses.replace(wire, built_end=501)
    assert without_deleted(after, {"T": 500}) == after  # the new T's: kept


def test_a_delete_cut_with_a_forked_log_is_forgotten(small_config: MessageStoreConfig) -> None:
    """A slave that applied its old master's delete, then finds its log forks from the new
    master's below the marker: the cut takes the delete with it, the topic is served again."""
    with MessageStore.open(config=small_config) as store:
        for i in range(3):
            assert store.put_message(m.Message(topic="T", body=b"old%d" % i, queue_id=0)).ok
        marker = store.commit_log.max_offset()
        _append(store, topic_marker.encode(record.RecordEncoder(HOST), ["T"], 1), 0)
        _append(store, record.encode_record(m.Message(topic="T", body=b"new0", queue_id=0), HOST), 0)
        end = store.commit_log.max_offset()
    with MessageStore.open(config=small_config) as store:
        assert [msg.body for msg in store.get_message("T", 0, 0, 10).messages] == [b"new0"]
        fork.set_aside(store.paths, marker, end, small_config.mapped_file_size_commit_log, "the new master")
    with MessageStore.open(config=small_config) as store:
        assert "T" not in store.deleted_topics.table
        assert store.commit_log.max_offset() == marker
        assert [msg.body for msg in store.get_message("T", 0, 0, 10).messages] == [b"old0", b"old1", b"old2"]
