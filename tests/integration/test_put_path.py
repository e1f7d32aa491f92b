"""The tuned put path (issue 6) writes exactly the bytes the reference encoder writes.

Single sends, mixed `send_batch` lists (runs of one queue joined and patched with numpy) and
`MessageBatch`es (encoded column-wise when bodies have one length) all meet file ends here.
Every stored record must equal `record.encode_record` + `record.patch_record` of the same
message with the offsets and store time the store assigned, and its file bytes must decode
back to the message sent. A batch is stored whole in one file, as RocketMQ stores it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import InvalidBatchError
from rmq_mp.format import record
from rmq_mp.format.message import Message
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendBatchResult, SendResult
from shm import layout
from tests.integration.test_round_trip import independent_records
from tests.service import RunningService, running_service, wait_until

FILE_SIZE = 64 << 10


def assert_stored_as_encoded(
    service: RunningService, sent: Sequence[tuple[Mapping[str, Any], SendResult]]
) -> None:
    """Each (item, result) is in the log at its offset, byte for byte the reference encoding."""
    wait_until(
        lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
        30,
        "reput to dispatch everything",
    )
    with Consumer.attach(service.root, "check") as consumer:
        log = consumer.store.commit_log
        consumer.store.sync_log()
        for item, result in sent:
            stored = log.look_message_by_offset(result.commit_log_offset)
            assert stored.body == item["body"]
            assert stored.queue_offset == result.queue_offset
            assert stored.msg_id == result.msg_id
            assert stored.uniq_key == result.uniq_key
            message = Message(
                topic=stored.topic,
                body=stored.body,
                flag=stored.flag,
                properties=stored.properties,
                queue_id=stored.queue_id,
                born_timestamp=stored.born_timestamp,
                born_host=stored.born_host,
                sys_flag=stored.sys_flag,
            )
            crc = service.config.enabled_append_prop_crc  # the whole-record CRC tail, on by default
            expected = record.encode_record(message, stored.store_host, append_crc=crc)
            record.patch_record(
                expected,
                0,
                queue_offset=result.queue_offset,
                phy_offset=result.commit_log_offset,
                store_timestamp=stored.store_timestamp,
                sys_flag=stored.sys_flag,
                crc=crc,
            )
            mf = log.mfq.find_mapped_file_by_offset(result.commit_log_offset)
            assert mf is not None
            start = result.commit_log_offset - mf.file_from_offset
            assert bytes(mf.buf[start : start + len(expected)]) == bytes(expected)


@pytest.mark.parametrize("pool", [False, True])
def test_batch_and_single_puts_are_byte_identical_to_the_reference_encoder(
    tmp_path: Path, pool: bool
) -> None:
    settings = {"transientStorePoolEnable": "true", "transientStorePoolSize": "2"} if pool else {}
    with running_service(tmp_path, mappedFileSizeCommitLog=str(FILE_SIZE), **settings) as service:
        sent: list[tuple[dict[str, Any], SendResult]] = []
        with Producer.attach(service.names.base) as producer:
            for round_ in range(12):  # 64 KiB files: batches meet file ends and roll
                same_queue = [
                    dict(
                        topic="Fast", body=bytes([round_, i]) * (i * 37), queue_id=2, tags="T", keys=[f"k{i}"]
                    )
                    for i in range(20)
                ]
                mixed = [dict(topic=f"Mixed{i % 3}", body=b"m" * i, queue_id=i % 4) for i in range(7)]
                for items in (same_queue, mixed):
                    results = producer.send_batch(items)
                    assert all(r.ok for r in results), results
                    sent += list(zip(items, results, strict=True))
                result = producer.send("Single", b"s" * round_, queue_id=1)
                assert result.ok
                sent.append((dict(topic="Single", body=b"s" * round_, queue_id=1), result))
        assert_stored_as_encoded(service, sent)


def batch_items(batch: MessageBatch) -> list[dict]:
    keys = batch.keys or [None] * len(batch.bodies)
    return [dict(topic=batch.topic, body=body, keys=k) for body, k in zip(batch.bodies, keys, strict=True)]


@pytest.mark.parametrize("pool", [False, True])
def test_message_batches_are_byte_identical_whole_in_one_file_and_numbered(
    tmp_path: Path, pool: bool
) -> None:
    """Column-encoded batches (one body length) and record-joined ones (unequal lengths, keys of
    their own, given UNIQ_KEY) are the reference bytes; each lands whole in one file (a BLANK
    closes the previous one), with consecutive queue offsets and distinct UNIQ_KEYs."""
    settings = {"transientStorePoolEnable": "true", "transientStorePoolSize": "2"} if pool else {}
    with running_service(tmp_path, mappedFileSizeCommitLog=str(FILE_SIZE), **settings) as service:
        sent: list[tuple[dict[str, Any], SendResult]] = []
        placed: list[tuple[int, int]] = []
        with Producer.attach(service.names.base) as producer:
            producer.uniq.take(0xFFFF - 50)  # the counter's 4 hex digits wrap inside a batch
            batches = [
                MessageBatch("Uniform", [bytes([i]) * 300 for i in range(40)], queue_id=1, tags="T"),
                # lengths summing to 3 x 128: one length check must not be fooled by the total
                MessageBatch("Unequal", [b"a" * 128, b"b" * 127, b"c" * 129], queue_id=2),
                MessageBatch("Keyed", [b"k" * 50] * 5, queue_id=3, keys=[f"order-{i}" for i in range(5)]),
                MessageBatch("Given", [b"g"] * 3, queue_id=3, properties={"UNIQ_KEY": "MY-KEY", "p": "v"}),
                MessageBatch("Uniform", [b"e" * 10] * 7, properties={"a": "1"}, flag=3),
            ]
            for round_ in range(10):
                for batch in batches:
                    result = producer.send_batch(batch)
                    assert isinstance(result, SendBatchResult)
                    assert result.ok, list(result)
                    assert len(result) == len(batch.bodies)
                    offsets = result.commit_log_offsets()
                    assert list(offsets) == [r.commit_log_offset for r in result]
                    assert list(result.queue_offsets()) == [r.queue_offset for r in result]
                    queue_offsets = [r.queue_offset for r in result]
                    assert queue_offsets == list(
                        range(queue_offsets[0], queue_offsets[0] + len(batch.bodies))
                    )
                    first, last = int(offsets[0]), int(offsets[-1])
                    assert first // FILE_SIZE == last // FILE_SIZE, (
                        f"batch split across files in round {round_}"
                    )
                    placed.append((first, last))
                    items = batch_items(batch)
                    sent += list(zip(items, result, strict=True))
                    uniq = [r.uniq_key for r in result]
                    if batch.topic == "Given":
                        assert uniq == ["MY-KEY"] * 3
                    else:
                        assert len(set(uniq)) == len(uniq)
                        assert [r.uniq_key for r in result] == [
                            result[i].uniq_key for i in range(len(result))
                        ]
        assert_stored_as_encoded(service, sent)
    records = independent_records(service.root / "commitlog", FILE_SIZE)
    assert len(records) == len(sent)
    assert max(last for _first, last in placed) > 2 * FILE_SIZE, "batches met several file ends"


def test_batch_results_and_refusals(tmp_path: Path) -> None:
    """A refused batch refuses every message (RocketMQ stores a batch whole or not at all);
    misuse is a typed error before anything is stored; results index, slice and iterate alike."""
    with pytest.raises(InvalidBatchError, match="2 keys for 3 bodies"):
        MessageBatch("T", [b"a", b"b", b"c"], keys=["x", "y"])
    with pytest.raises(InvalidBatchError, match="delay level"):
        MessageBatch("T", [b"a"], properties={"DELAY": "3"})
    with pytest.raises(InvalidBatchError, match="one topic"):
        MessageBatch.of([dict(topic="A", body=b"1"), dict(topic="B", body=b"2")])
    with (
        running_service(tmp_path, maxMessageSize="1000") as service,
        Producer.attach(service.root) as producer,
    ):
        bad_topic = producer.send_batch(MessageBatch("a/b", [b"x"] * 4))
        assert bad_topic.failures == 4
        assert {r.status for r in bad_topic} == {PutMessageStatus.MESSAGE_ILLEGAL}
        assert all(r.commit_log_offset == -1 and r.msg_id == "" for r in bad_topic)
        too_big = producer.send_batch(MessageBatch("T", [b"x", bytes(1001), b"y"], queue_id=0))
        assert not too_big.ok
        assert "maxMessageSize" in too_big[1].reason
        assert service.read(layout.WROTE_POSITION) == 0, "nothing of a refused batch is stored"
        assert len(producer.send_batch(MessageBatch("T", []))) == 0
        from_items = MessageBatch.of(
            [dict(topic="T", body=b"p", queue_id=5), dict(topic="T", body=b"q", queue_id=5)]
        )
        good = producer.send_batch(from_items)
        assert good.ok
        assert [r.queue_id for r in good] == [5, 5]
        assert good[-1] == good[1] == list(good)[1] == good[0:2][1]
        with pytest.raises(IndexError):
            good[2]
        stored = producer.send_batch([dict(topic="T", body=b"r", queue_id=5), dict(topic="a/b", body=b"s")])
        assert [r.status for r in stored] == [PutMessageStatus.PUT_OK, PutMessageStatus.MESSAGE_ILLEGAL]
        assert stored[0].queue_offset == 2
        with pytest.raises(TypeError, match="bodies"):
            producer.send_batch([dict(topic="T", body=b"r", bodies=[b"x"])])


def test_the_library_and_a_producer_store_a_message_alike(tmp_path: Path) -> None:
    """`MessageStore.put_message` and a producer's `send_batch` of `Message`s share one put
    sequence (`store.put_rules`): the same checks, refusals, delay rewrite, encoding and queue
    offsets; only the lock-decided fields (offsets, store time, CRC) may differ."""
    from rmq_mp.store.message_store import MessageStore

    ipv6 = ("::1", 9876)
    messages = [
        Message(topic="Lib", body=b"plain", queue_id=1, born_timestamp=1_700_000_000_000),
        Message(
            topic="Lib",
            body=b"keyed",
            queue_id=1,
            properties={"TAGS": "A", "KEYS": "k1 k2", "user": "v"},
            born_timestamp=1_700_000_000_001,
            flag=7,
        ),
        Message(
            topic="Lib",
            body=b"delayed",
            queue_id=2,
            properties={"DELAY": "3"},
            born_timestamp=1_700_000_000_002,
        ),
        Message(topic="Lib", body=b"six", queue_id=0, born_host=ipv6, born_timestamp=1_700_000_000_003),
        Message(  # a transaction's prepared half: stored with queue offset 0, its queue not moved
            topic="Lib", body=b"prepared", queue_id=1, sys_flag=4, born_timestamp=1_700_000_000_004
        ),
        Message(topic="Lib", body=b"after", queue_id=1, born_timestamp=1_700_000_000_005),
        Message(topic="x" * 200, body=b"refused: topic", queue_id=0),
        Message(topic="Lib", body=b"refused: level", queue_id=0, properties={"DELAY": "soon"}),
        Message(topic="Lib", body=b"refused: separator", queue_id=0, properties={"a\x01b": "v"}),
    ]
    (tmp_path / "service").mkdir()
    with running_service(tmp_path / "service") as service:
        with Producer.attach(service.names.base) as producer:
            sent = producer.send_batch([dataclasses.replace(message) for message in messages])
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
            30,
            "reput to dispatch everything",
        )
        with Consumer.attach(service.root, "check") as consumer:
            consumer.store.sync_log()
            produced = [
                _normalised(consumer.store.commit_log, r.commit_log_offset) if r.ok else None for r in sent
            ]
    with MessageStore.open(tmp_path / "library") as store:
        put = [store.put_message(dataclasses.replace(message)) for message in messages]
        library = [_normalised(store.commit_log, r.phy_offset) if r.ok else None for r in put]
    assert (
        [r.ok for r in sent] == [r.status is PutMessageStatus.PUT_OK for r in put] == [True] * 6 + [False] * 3
    )
    assert [r.reason for r in sent[6:]] == [r.reason for r in put[6:]]
    assert [r.queue_offset for r in sent[:6]] == [r.queue_offset for r in put[:6]] == [0, 1, 0, 0, 0, 2]
    assert library == produced


def _normalised(log: Any, phy_offset: int) -> bytes:
    """The record at ``phy_offset`` with its lock-decided fields and store host set alike."""
    stored = log.look_message_by_offset(phy_offset)
    mf = log.mfq.find_mapped_file_by_offset(phy_offset)
    start = phy_offset - mf.file_from_offset
    raw = bytearray(mf.buf[start : start + stored.store_size])
    record.patch_record(
        raw, 0, queue_offset=0, phy_offset=0, store_timestamp=0, sys_flag=stored.sys_flag, crc=True
    )
    return bytes(raw)
