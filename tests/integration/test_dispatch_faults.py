"""One queue (or the index) reput cannot write never stops dispatch for the others.

Each test runs a real store, puts a file where a queue's directory or the index directory must
go (or runs with maxIndexNum=1), and checks that the other queues' PUT_OK messages become
consumable, that status, rmq-admin storeStatus and the metrics name the fault and its reason,
that reput.log holds one line for it however many passes run, and, once the file is gone, that
the queue catches up with no restart: its consumer reads every message once, in order."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import StorePathError
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.message_store import MessageStore
from shm import layout
from tests.integration.test_ops import admin, free_port, scrape
from tests.service import ROOT, RunningService, running_service, wait_until

COUNT = 60


def read_queue(consumer: Consumer, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    """(queue offset, body) of every message of one queue from offset 0."""
    got: list[tuple[int, bytes]] = []
    while (result := consumer.pull(topic, queue_id, len(got), 32)).status is GetMessageStatus.FOUND:
        got.extend((m.queue_offset, m.body) for m in result.messages)
    return got


def dispatched_all(service: RunningService) -> bool:
    return service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION)


def reput_log(service: RunningService) -> str:
    return (service.root / "logs" / "reput.log").read_text()


def passes_run(service: RunningService, passes: int) -> None:
    """Wait until reput has run ``passes`` more passes (each retry due in them has run)."""
    count = layout.worker_field("reput", "work_count")
    start = service.read(count)
    wait_until(lambda: service.read(count) >= start + passes, 60, f"{passes} reput passes")


def status_json(service: RunningService) -> dict:
    out = subprocess.run(
        [sys.executable, "run.py", "status", "--conf", str(service.conf), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_queue_whose_directory_is_a_file_is_quarantined_then_catches_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    with (
        running_service(tmp_path, metricsPort=str(port)) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        blocked = service.root / "consumequeue" / "Blocked" / "0"
        blocked.parent.mkdir(parents=True)
        blocked.write_text("in the way")  # before the first put to Blocked/0
        for i in range(COUNT):
            assert producer.send("Blocked", b"b%d" % i, queue_id=0).status is PutMessageStatus.PUT_OK
            assert producer.send("Open", b"o%d" % i, queue_id=1).status is PutMessageStatus.PUT_OK
        wait_until(lambda: dispatched_all(service), 30, "dispatch past the quarantined queue")
        assert read_queue(consumer, "Open", 1) == [(i, b"o%d" % i) for i in range(COUNT)]
        assert read_queue(consumer, "Blocked", 0) == []
        assert service.read(layout.DISPATCH_FAILED_QUEUES) == 1

        info = status_json(service)["dispatch_faults"]
        assert info["failed_queues"] == 1
        assert info["queues"] == [
            {
                "topic": "Blocked",
                "queue_id": 0,
                "reason": "EEXIST (File exists)",
                "dispatched": 0,
                "stored": COUNT,
            }
        ]
        assert info["index"] is None
        human = subprocess.run(
            [sys.executable, "run.py", "status", "--conf", str(service.conf)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "queue Blocked/0 QUARANTINED: EEXIST (File exists); dispatched 0 of 60 message(s)" in human
        code, out, _ = admin(capsys, "storeStatus", "--name", service.names.base)
        assert code == 0
        assert "Blocked/0 QUARANTINED" in out
        metrics = scrape(port)
        assert metrics["rmq_dispatch_failed_queues"] == 1
        assert (
            metrics['rmq_dispatch_failed_queue{queue_id="0",reason="EEXIST (File exists)",topic="Blocked"}']
            == 1
        )

        # Many passes and retries later: one line for the fault, no traceback, no failed pass.
        for i in range(COUNT, 2 * COUNT):
            assert producer.send("Blocked", b"b%d" % i, queue_id=0).status is PutMessageStatus.PUT_OK
        wait_until(lambda: dispatched_all(service), 30, "dispatch")
        passes_run(service, 40)  # 4 s idle at least: retries at 0.1, 0.2, ... 2 s have run
        text = reput_log(service)
        assert text.count("queue-dispatch-failed") == 1, text
        assert "Traceback" not in text
        assert service.read(layout.worker_field("reput", "errors")) == 0

        blocked.unlink()
        wait_until(lambda: service.read(layout.DISPATCH_FAILED_QUEUES) == 0, 30, "the queue to catch up")
        assert read_queue(consumer, "Blocked", 0) == [(i, b"b%d" % i) for i in range(2 * COUNT)]
        assert status_json(service)["dispatch_faults"]["queues"] == []
        assert reput_log(service).count("queue Blocked/0 caught up") == 1
        assert producer.send("Blocked", b"after", queue_id=0).status is PutMessageStatus.PUT_OK
        result = consumer.pull("Blocked", 0, 2 * COUNT, timeout_s=30)
        assert [(m.queue_offset, m.body) for m in result.messages] == [(2 * COUNT, b"after")]
    assert service.process.returncode == 0
    assert not (service.root / "abort").exists()


def test_queue_still_quarantined_at_stop_keeps_abort_and_recovery_rebuilds_it(tmp_path: Path) -> None:
    """The checkpoint's logics time stays before the first record the queue lacks, so the
    abnormal recovery that the kept abort brings replays from its file, not from the last one."""
    settings = {
        "mappedFileSizeCommitLog": "65536",
        "flushIntervalConsumeQueue": "50",
        "flushConsumeQueueThoroughInterval": "100",
        "flushCommitLogThoroughInterval": "100",
    }
    checkpoint_path = tmp_path / "store" / "checkpoint"
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        blocked = service.root / "consumequeue" / "Blocked" / "3"
        blocked.parent.mkdir(parents=True)
        blocked.write_text("in the way")
        for i in range(COUNT):
            assert producer.send("Blocked", b"b%d" % i, queue_id=3).status is PutMessageStatus.PUT_OK
        blocked_by_ms = int(time.time() * 1000)
        wait_until(lambda: service.read(layout.DISPATCH_FAILED_QUEUES) == 1, 30, "the quarantine")
        # Past the checkpoint's 3 s of slack, three commit-log files later:
        wait_until(lambda: time.time() * 1000 > blocked_by_ms + 3500, 10, "the clock")
        body = b"o" * 1000
        for _ in range(COUNT * 3):
            assert producer.send("Open", body, queue_id=0).status is PutMessageStatus.PUT_OK
        last_by_ms = int(time.time() * 1000)
        wait_until(lambda: dispatched_all(service), 30, "dispatch")
        wait_until(
            lambda: (
                StoreCheckpoint(checkpoint_path, writable=False).physic_msg_timestamp >= last_by_ms - 1000
            ),
            30,
            "a checkpoint written after the last put",
        )
        assert StoreCheckpoint(checkpoint_path, writable=False).logics_msg_timestamp < blocked_by_ms
    assert service.process.returncode == 1, "stopped with abort kept"
    assert (service.root / "abort").exists()
    assert StoreCheckpoint(checkpoint_path, writable=False).logics_msg_timestamp < blocked_by_ms
    assert "still quarantined at stop" in reput_log(service)
    assert len(list((service.root / "commitlog").iterdir())) >= 3
    blocked.unlink()
    config = MessageStoreConfig.from_file(service.conf)
    with MessageStore.open(config=config) as store:  # abnormal recovery re-dispatches the range
        for topic, queue_id, expected in (
            ("Blocked", 3, [b"b%d" % i for i in range(COUNT)]),
            ("Open", 0, [body] * (COUNT * 3)),
        ):
            got: list[tuple[int, bytes]] = []
            while (result := store.get_message(topic, queue_id, len(got), 32)).messages:
                got.extend((m.queue_offset, m.body) for m in result.messages)
            assert got == list(enumerate(expected))


def test_index_directory_that_is_a_file_pauses_indexing_not_the_queues(tmp_path: Path) -> None:
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        assert not (service.root / "index").exists()
        (service.root / "index").write_text("in the way")
        for i in range(COUNT):
            result = producer.send("Keyed", b"k%d" % i, keys=f"key-{i}", queue_id=0)
            assert result.status is PutMessageStatus.PUT_OK
        wait_until(lambda: dispatched_all(service), 30, "dispatch past the paused index")
        assert read_queue(consumer, "Keyed", 0) == [(i, b"k%d" % i) for i in range(COUNT)]
        index = status_json(service)["dispatch_faults"]["index"]
        assert index["reason"] == "EEXIST (File exists)"
        assert service.read(layout.INDEX_DISPATCH_ERROR) == 17
        config = MessageStoreConfig.from_file(service.conf)
        with pytest.raises(StorePathError, match="index is a file"):  # a reader refuses, one line
            MessageStore.open(config=config, read_only=True)
        passes_run(service, 40)
        text = reput_log(service)
        assert text.count("index-dispatch-failed") == 1, text
        assert "Traceback" not in text

        (service.root / "index").unlink()
        wait_until(lambda: service.read(layout.INDEX_DISPATCH_ERROR) == 0, 30, "indexing to resume")
        assert reput_log(service).count("index caught up") == 1
        with MessageStore.open(config=config, read_only=True) as store:
            assert [m.body for m in store.query_message("Keyed", "key-7")] == [b"k7"]  # re-keyed
            assert [m.body for m in store.query_message("Keyed", f"key-{COUNT - 1}")] == [
                b"k%d" % (COUNT - 1)
            ]
    assert service.process.returncode == 0


def test_max_index_num_1_pauses_indexing_with_a_reason_and_no_index_files(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, maxIndexNum="1") as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        for i in range(COUNT):
            result = producer.send("Keyed", b"k%d" % i, keys=f"key-{i}", queue_id=i % 2)
            assert result.status is PutMessageStatus.PUT_OK
        wait_until(lambda: dispatched_all(service), 30, "dispatch")
        assert [len(read_queue(consumer, "Keyed", q)) for q in (0, 1)] == [COUNT // 2, COUNT // 2]
        assert status_json(service)["dispatch_faults"]["index"] == {
            "reason": "the configuration leaves no room (see reput.log)",
            "resume_offset": 0,
        }
        passes_run(service, 40)
        text = reput_log(service)
        assert text.count("index-dispatch-failed") == 1, text
        assert "maxIndexNum=1 leaves an index file no room for a key" in text
        assert not any((service.root / "index").glob("*")), "no file made that could hold no key"
        config = MessageStoreConfig.from_file(service.conf)
        with MessageStore.open(config=config, read_only=True) as store:
            assert store.query_message("Keyed", "key-1") == []
