"""Thousands of queues, a bounded number of mapped ConsumeQueue files in every process.

Puts and reads go round-robin over every queue (the worst order for an LRU: each file is used
again only after every other one), with ``maxOpenConsumeQueueFiles`` at its minimum, 16, and
queue files of two entries, so each queue has several files and disk stays a few MB. Every
entry is compared with a plain model; the count is the process's lines in /proc/<pid>/maps
naming the store's queue files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.outcomes import GetMessageResult, GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store.message_store import MessageStore
from shm import queue_offsets as qo
from tests.service import running_service, wait_until

BOUND = 16
QUEUE_FILE_BYTES = 2 * CQ_STORE_UNIT_SIZE
TOPICS = 25
QUEUES_PER_TOPIC = 60  # 1,500 queues
ROUNDS = 5  # three files per queue, the last one half full


def queue_files(pid: int | str, root: Path) -> tuple[int, int]:
    """(mappings, open descriptors) of ``root/consumequeue`` files in process ``pid``."""
    prefix = str(root / "consumequeue") + "/"
    with open(f"/proc/{pid}/maps") as maps:
        mapped = sum(1 for line in maps if prefix in line)
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            fds += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix)
    return mapped, fds


def within_bound(pid: int | str, root: Path) -> None:
    mapped, fds = queue_files(pid, root)
    assert mapped <= BOUND, f"{mapped} queue files mapped in {pid}"
    assert fds <= 2 * BOUND + 1, f"{fds} queue files open in {pid}"  # mmap's, the writer's, a flush's


def every_queue() -> list[tuple[str, int]]:
    return [(f"T{t}", q) for q in range(QUEUES_PER_TOPIC) for t in range(TOPICS)]


def body(topic: str, queue_id: int, offset: int) -> bytes:
    return f"{topic}/{queue_id}/{offset}".encode()


def read_round_robin(
    pull: Callable[[str, int, int], GetMessageResult], model: dict[tuple[str, int], list[int]], root: Path
) -> None:
    """One message of each queue in turn, each checked against the model (offset, body, log offset)."""
    for offset in range(ROUNDS):
        for topic, queue_id in every_queue():
            result = pull(topic, queue_id, offset)
            assert result.status is GetMessageStatus.FOUND, (topic, queue_id, offset, result)
            (msg,) = result.messages
            assert (msg.queue_offset, msg.body) == (offset, body(topic, queue_id, offset))
            assert msg.commit_log_offset == model[(topic, queue_id)][offset]
        within_bound("self", root)


def test_message_store_keeps_queue_mappings_bounded_through_puts_reads_and_recovery(tmp_path: Path) -> None:
    root = tmp_path / "store"
    config = MessageStoreConfig().replace(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=1 << 20,
        mapped_file_size_consume_queue=QUEUE_FILE_BYTES,
        max_open_consume_queue_files=BOUND,
        message_index_enable=False,
    )
    model: dict[tuple[str, int], list[int]] = {key: [] for key in every_queue()}
    with MessageStore.open(config=config) as store:
        for offset in range(ROUNDS):
            for topic, queue_id in every_queue():
                result = store.put_message(
                    m.Message(topic=topic, body=body(topic, queue_id, offset), queue_id=queue_id)
                )
                assert result.status is PutMessageStatus.PUT_OK, result
                assert result.queue_offset == offset
                model[(topic, queue_id)].append(result.phy_offset)
            within_bound("self", root)

        def pull(topic: str, queue_id: int, offset: int) -> GetMessageResult:
            return store.get_message(topic, queue_id, offset, 1)

        read_round_robin(pull, model, root)
        assert store.cq_table.pool.reopens > len(model)
    assert queue_files("self", root) == (0, 0)
    for abnormal in (False, True):
        if abnormal:
            (root / "abort").touch()  # what a killed process leaves: every queue is checked
        with MessageStore.open(config=config) as store:
            assert store.recovery is not None
            assert store.recovery.abnormal is abnormal
            within_bound("self", root)
            assert len(store.cq_table.all()) == len(model)
            read_round_robin(lambda t, q, o: store.get_message(t, q, o, 1), model, root)
        assert queue_files("self", root) == (0, 0)


def test_reput_and_consumers_keep_queue_mappings_bounded(tmp_path: Path) -> None:
    with running_service(
        tmp_path,
        mappedFileSizeConsumeQueue=str(QUEUE_FILE_BYTES),
        maxOpenConsumeQueueFiles=str(BOUND),
        messageIndexEnable="false",
        defaultTopicQueueNums=str(QUEUES_PER_TOPIC),
    ) as service:
        reput = service.worker_pid("reput")
        cleaner = service.worker_pid("cleaner")
        model: dict[tuple[str, int], list[int]] = {key: [] for key in every_queue()}
        with Producer.attach(service.names.base) as producer:
            for offset in range(ROUNDS):
                for topic, queue_id in every_queue():
                    result = producer.send(topic, body(topic, queue_id, offset), queue_id=queue_id)
                    assert result.status is PutMessageStatus.PUT_OK, result
                    assert result.queue_offset == offset
                    model[(topic, queue_id)].append(result.commit_log_offset)
                within_bound(reput, service.root)  # reput dispatches while we send
        with Consumer.attach(service.names.base, "g") as consumer:

            def dispatched() -> bool:
                slot = consumer.queues.find("T0", QUEUES_PER_TOPIC - 1)
                return slot >= 0 and consumer.queues.get(slot, qo.DISPATCHED) == ROUNDS

            wait_until(dispatched, 60, "reput to dispatch the last message")
            within_bound(reput, service.root)
            read_round_robin(lambda t, q, o: consumer.pull(t, q, o, 1), model, service.root)
            assert consumer._pool.reopens > len(model)
        assert queue_files(cleaner, service.root) == (0, 0)  # it reads queue files by pread
        within_bound(reput, service.root)
