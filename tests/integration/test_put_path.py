"""The tuned put path (issue 6) writes exactly the bytes the reference encoder writes.

A one-queue ASYNC batch takes the one-put path (joined outside the lock, patched with numpy,
one copy); single sends and mixed batches go record by record. Every stored record must equal
`record.encode_record` + `record.patch_record` of the same message with the offsets and store
time the store assigned, and its file bytes must decode back to the message sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_mp import record
from rmq_mp.consumer import Consumer
from rmq_mp.message import Message
from rmq_mp.producer import Producer
from shm import layout
from tests.service import running_service, wait_until


@pytest.mark.parametrize("pool", [False, True])
def test_batch_and_single_puts_are_byte_identical_to_the_reference_encoder(
    tmp_path: Path, pool: bool
) -> None:
    settings = {"transientStorePoolEnable": "true", "transientStorePoolSize": "2"} if pool else {}
    with running_service(tmp_path, mappedFileSizeCommitLog=str(64 << 10), **settings) as service:
        sent = []
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
                expected = record.encode_record(message, stored.store_host)
                record.patch_record(
                    expected,
                    0,
                    queue_offset=result.queue_offset,
                    phy_offset=result.commit_log_offset,
                    store_timestamp=stored.store_timestamp,
                    sys_flag=stored.sys_flag,
                )
                mf = log.mfq.find_mapped_file_by_offset(result.commit_log_offset)
                assert mf is not None
                start = result.commit_log_offset - mf.file_from_offset
                assert bytes(mf.buf[start : start + len(expected)]) == bytes(expected)
