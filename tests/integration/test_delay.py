"""Delayed messages on a real store: the put-time rewrite, the scheduler's delivery, its progress.

Levels are scaled down by configuration (``messageDelayLevel=1s 2s 3s``). Timing bound: a
message of level L stored at ``t`` is delivered (stored again on its real topic) not before
``t + delay(L)`` (asserted strictly, on the store timestamps the store itself wrote) and, on
this loaded 2-core machine under ``pytest -n auto``, within ``LATE_BOUND_MS`` after it
(generous: the scheduler wakes at the due time, so a few ms are typical, see bench/NOTES.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import loads
from rmq_mp.format import message as m
from rmq_mp.format.message import MessageExt
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from rmq_mp.store.schedule import SCHEDULE_TOPIC
from shm import schedule_offsets as so
from shm.layout import Role
from shm.schedule_offsets import ScheduleOffsetTable
from tests.service import ROOT, RunningService, running_service, wait_until

LEVELS = "1s 2s 3s"
LEVEL_MS = (1000, 2000, 3000)
LATE_BOUND_MS = 5000
"""How late a delivery may be on a loaded test machine (typical: a few ms)."""
TOPIC = "DelayTopic"


def _read_all(
    consumer: Consumer, topic: str, queue_id: int, expected: int, timeout_s: float
) -> list[MessageExt]:
    """``expected`` messages of one queue from offset 0, waiting (long polling) for them."""
    got: list[MessageExt] = []

    def more() -> bool:
        result = consumer.pull(topic, queue_id, len(got), 32, timeout_s=0.5)
        if result.status is GetMessageStatus.FOUND:
            got.extend(result.messages)
        return len(got) >= expected

    wait_until(more, timeout_s, f"{expected} messages on {topic}/{queue_id}")
    return got


def _schedule_table(service: RunningService) -> ScheduleOffsetTable:
    return ScheduleOffsetTable.attach(service.names.schedule_offsets, Role.CONSUMER)  # reads it


def test_a_delayed_send_is_stored_on_the_schedule_topic_as_rocketmq(tmp_path: Path) -> None:
    """The compiled core hands a send with properties to the reference, which rewrites it:
    SCHEDULE_TOPIC_XXXX queue level-1, REAL_TOPIC/REAL_QID appended, a level above the last
    clamped (DELAY then says the clamped level), the queue entry's tags code the delivery time.
    A non-integer DELAY and a delayed batch are MESSAGE_ILLEGAL with the reason."""
    with (
        running_service(tmp_path, messageDelayLevel="1h 2h 3h") as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        assert (producer._native is not None) == (native.core is not None)
        sent = producer.send(TOPIC, b"later", tags="TagA", keys="k1", properties={"DELAY": "2"}, queue_id=1)
        assert sent.status is PutMessageStatus.PUT_OK
        assert sent.queue_id == 1  # the sender's queue, as RocketMQ's broker answers
        clamped = producer.send(TOPIC, b"much later", properties={"DELAY": "7", "a": "b"}, queue_id=0)
        assert clamped.status is PutMessageStatus.PUT_OK
        not_delayed = producer.send(TOPIC, b"now", properties={"DELAY": "0"}, queue_id=0)
        assert not_delayed.status is PutMessageStatus.PUT_OK
        bad = producer.send(TOPIC, b"x", properties={"DELAY": "soon"}, queue_id=0)
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "DELAY" in bad.reason
        batch = MessageBatch(TOPIC, [b"a"], queue_id=0)
        object.__setattr__(batch, "properties", {"DELAY": "1"})  # set after MessageBatch refused it
        refused = producer.send_batch(batch)
        assert refused[0].status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "batch" in refused[0].reason
        items = producer.send_batch([dict(topic=TOPIC, body=b"item", properties={"DELAY": "1"}, queue_id=3)])
        assert items[0].status is PutMessageStatus.PUT_OK
        assert items[0].queue_id == 3, "send_batch answers the sender's queue, as send does"

        level2 = _read_all(consumer, SCHEDULE_TOPIC, 1, 1, 10)[0]
        assert level2.topic == SCHEDULE_TOPIC
        assert level2.queue_id == 1
        assert level2.body == b"later"
        keys = list(level2.properties)
        assert keys[-2:] == ["REAL_TOPIC", "REAL_QID"]
        assert level2.properties["REAL_TOPIC"] == TOPIC
        assert level2.properties["REAL_QID"] == "1"
        assert level2.properties["DELAY"] == "2"
        assert level2.properties["TAGS"] == "TagA"
        level3 = _read_all(consumer, SCHEDULE_TOPIC, 2, 1, 10)[0]
        assert level3.properties["DELAY"] == "3"
        assert level3.properties["REAL_QID"] == "0"
        assert list(level3.properties)[:2] == ["DELAY", "a"]
        level1 = _read_all(consumer, SCHEDULE_TOPIC, 0, 1, 10)[0]
        assert level1.properties["REAL_QID"] == "3"
        now_topic = _read_all(consumer, TOPIC, 0, 1, 10)
        assert [x.body for x in now_topic] == [b"now"]

        for ext, hours in ((level2, 2), (level3, 3), (level1, 1)):
            [(_phy, _size, tags_code)] = consumer.entries(SCHEDULE_TOPIC, ext.queue_id, 0, 1)
            assert tags_code == ext.store_timestamp + hours * 3_600_000
        table = _schedule_table(service)
        try:
            assert [table.get(i, so.DELAY_MS) for i in range(3)] == [3_600_000, 7_200_000, 10_800_000]
            assert [table.get(i, so.OFFSET) for i in range(3)] == [0, 0, 0]
        finally:
            table.close()
    topics = loads((service.root / "config" / "topics.json").read_text())["topicConfigTable"]
    assert topics[SCHEDULE_TOPIC]["readQueueNums"] == topics[SCHEDULE_TOPIC]["writeQueueNums"] == 18


def test_send_batch_answers_a_delayed_message_with_its_queue_as_send_does(tmp_path: Path) -> None:
    """A delayed message is stored on the schedule queue of its level; `send` answers the
    sender's queue id (as RocketMQ's broker), and so does each result of `send_batch`, for keyword
    dicts and `Message`s, alone or joined with others of the same level (issue 29, point 7)."""
    with (
        running_service(tmp_path, messageDelayLevel="1h 2h 3h") as service,
        Producer.attach(service.root) as producer,
    ):
        sent = producer.send(TOPIC, b"one", properties={"DELAY": "1"}, queue_id=2)
        batch = producer.send_batch(
            [
                dict(topic=TOPIC, body=b"a", properties={"DELAY": "1"}, queue_id=2),
                dict(topic=TOPIC, body=b"b", properties={"DELAY": "1"}, queue_id=3),  # same schedule queue
                dict(topic=TOPIC, body=b"c", properties={"DELAY": "2"}, queue_id=1),
                m.Message(topic=TOPIC, body=b"d", properties={"DELAY": "3"}, queue_id=3),
                dict(topic=TOPIC, body=b"now", queue_id=2),
            ]
        )
        assert batch.ok, list(batch)
        assert sent.queue_id == 2
        assert [r.queue_id for r in batch] == [2, 3, 1, 3, 2]
        assert [batch[i].queue_id for i in range(5)] == [2, 3, 1, 3, 2]
        with Consumer.attach(service.root, "g") as consumer:
            level1 = _read_all(consumer, SCHEDULE_TOPIC, 0, 3, 10)
            assert [(x.body, x.properties["REAL_QID"]) for x in level1] == [
                (b"one", "2"),
                (b"a", "2"),
                (b"b", "3"),
            ]


def test_every_level_is_delivered_on_time_as_rocketmq_delivers_it(tmp_path: Path) -> None:
    """Each level's messages reach their real topic and queue not before their due time and
    within LATE_BOUND_MS after; the delivered record is RocketMQ's messageTimeup: body, flag,
    born time, UNIQ_KEY kept, the stored properties string the schedule record's (DELAY,
    REAL_TOPIC, REAL_QID still in it, as 4.9.8 stores it); not delayed a second time. The
    progress reaches delayOffset.json at stop."""
    per_level = 3
    with (
        running_service(tmp_path, messageDelayLevel=LEVELS) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        sent = {}
        for level in (1, 2, 3):
            for i in range(per_level):
                queue_id = (level + i) % 4
                body = f"L{level}-{i}".encode()
                r = producer.send(
                    TOPIC, body, tags=f"T{level}", properties={"DELAY": str(level)}, queue_id=queue_id, flag=7
                )
                assert r.status is PutMessageStatus.PUT_OK
                sent[body] = (level, queue_id, r.uniq_key)
        delivered: list[MessageExt] = []
        for queue_id in range(4):
            count = sum(1 for level, q, _u in sent.values() if q == queue_id)
            delivered += _read_all(consumer, TOPIC, queue_id, count, 30)
        scheduled = {
            x.body: x for q in range(3) for x in _read_all(consumer, SCHEDULE_TOPIC, q, per_level, 5)
        }
        assert sorted(x.body for x in delivered) == sorted(sent)
        for x in delivered:
            level, queue_id, uniq = sent[x.body]
            origin = scheduled[x.body]
            due = origin.store_timestamp + LEVEL_MS[level - 1]
            assert x.store_timestamp >= due, f"{x.body!r} delivered {due - x.store_timestamp} ms early"
            assert x.store_timestamp <= due + LATE_BOUND_MS, f"{x.body!r} {x.store_timestamp - due} ms late"
            assert (x.topic, x.queue_id, x.flag) == (TOPIC, queue_id, 7)
            assert x.born_timestamp == origin.born_timestamp
            assert x.born_host == origin.born_host
            assert x.reconsume_times == origin.reconsume_times
            assert x.sys_flag == origin.sys_flag
            assert x.properties == origin.properties  # 4.9.8 stores the schedule record's string
            assert x.uniq_key == uniq
            assert x.properties["REAL_TOPIC"] == TOPIC
            assert x.properties["DELAY"] == str(level)
        table = _schedule_table(service)
        try:
            wait_until(lambda: [table.get(i, so.OFFSET) for i in range(3)] == [per_level] * 3, 10, "progress")
            assert [table.get(i, so.DELIVERED) for i in range(3)] == [per_level] * 3
            assert [table.get(i, so.NEXT_DUE_MS) for i in range(3)] == [so.NONE_DUE] * 3
        finally:
            table.close()
        # Delivered once: nothing more arrives on the real topic (each queue's end is its count).
        for queue_id in range(4):
            count = sum(1 for level, q, _u in sent.values() if q == queue_id)
            assert consumer.pull(TOPIC, queue_id, count, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    text = (service.root / "config" / "delayOffset.json").read_text()
    assert text == '{\n\t"offsetTable":{1:3,2:3,3:3\n\t}\n}'


def test_progress_survives_a_restart_and_a_scheduler_kill(tmp_path: Path) -> None:
    """A stopped store starts from delayOffset.json (nothing delivered twice); a scheduler killed
    with -9 is restarted by the supervisor and goes on from the shared table."""
    with running_service(tmp_path, messageDelayLevel=LEVELS) as service, Producer.attach(service.root) as p:
        assert (
            p.send(TOPIC, b"first", properties={"DELAY": "1"}, queue_id=0).status is PutMessageStatus.PUT_OK
        )
        with Consumer.attach(service.root, "g") as consumer:
            _read_all(consumer, TOPIC, 0, 1, 20)
    assert "{1:1" in (service.root / "config" / "delayOffset.json").read_text()
    with running_service(tmp_path, messageDelayLevel=LEVELS) as service, Producer.attach(service.root) as p:
        table = _schedule_table(service)
        try:
            assert table.get(0, so.OFFSET) == 1
            old = service.worker_pid("scheduler")
            os.kill(old, signal.SIGKILL)
            wait_until(lambda: service.worker_pid("scheduler") not in (0, old), 20, "the scheduler's restart")
            assert (
                p.send(TOPIC, b"second", properties={"DELAY": "1"}, queue_id=0).status
                is PutMessageStatus.PUT_OK
            )
            with Consumer.attach(service.root, "g") as consumer:
                got = _read_all(consumer, TOPIC, 0, 2, 20)
                assert [x.body for x in got] == [b"first", b"second"]
                assert consumer.pull(TOPIC, 0, 2, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            wait_until(lambda: table.get(0, so.OFFSET) == 2, 10, "progress")
        finally:
            table.close()


def test_a_rocketmq_written_delay_offset_file_loads(clean_store_copy: Path, tmp_path: Path) -> None:
    """RocketMQ's fixture store (its empty delayOffset.json) starts; a fastjson file with bare
    integer keys gives the levels' offsets, clamped to their queues (empty here: 0)."""
    config = clean_store_copy / "config" / "delayOffset.json"
    assert json.loads(config.read_text()) == {"offsetTable": {}}
    with running_service(tmp_path, storePathRootDir=str(clean_store_copy), messageDelayLevel=LEVELS):
        pass
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    (store / "config" / "delayOffset.json").write_text('{\n\t"offsetTable":{1:0,2:0\n\t}\n}')
    with running_service(tmp_path, messageDelayLevel=LEVELS) as service:
        table = _schedule_table(service)
        try:
            assert [table.get(i, so.OFFSET) for i in range(3)] == [0, 0, 0]
        finally:
            table.close()
    assert loads((store / "config" / "delayOffset.json").read_text()) == {"offsetTable": {1: 0, 2: 0}}


def test_a_damaged_delay_offset_file_is_salvaged_and_said(tmp_path: Path) -> None:
    """A delayOffset.json cut short: the store starts, uses what it can read (the lower offset
    where copies disagree: delivered again, never lost), reports the loss in its log, and keeps
    the damaged file aside."""
    with running_service(tmp_path, messageDelayLevel=LEVELS) as service, Producer.attach(service.root) as p:
        for _ in range(2):
            assert (
                p.send(TOPIC, b"x", properties={"DELAY": "1"}, queue_id=0).status is PutMessageStatus.PUT_OK
            )
        with Consumer.attach(service.root, "g") as consumer:
            _read_all(consumer, TOPIC, 0, 2, 20)
    path = service.root / "config" / "delayOffset.json"
    assert path.read_text() == '{\n\t"offsetTable":{1:2\n\t}\n}'
    path.write_text('{\n\t"offsetTable":{1:2,')
    path.with_name("delayOffset.json.bak").write_text("garbage")
    with running_service(tmp_path, messageDelayLevel=LEVELS) as service:
        table = _schedule_table(service)
        try:
            assert table.get(0, so.OFFSET) == 2
        finally:
            table.close()
    assert "delay-offsets-lost" in service.log.read_text() or "delay-offsets-lost" in "".join(
        p.read_text() for p in (service.root / "logs").glob("*.log")
    )
    assert list((service.root / "config").glob("delayOffset.json.damaged-*"))


@pytest.mark.parametrize("level", [1])
def test_a_delivered_message_is_not_delayed_again(tmp_path: Path, level: int) -> None:
    """The delivered record keeps DELAY in its properties string (4.9.8), and the put path looks
    at the map messageTimeup cleared: one delivery, on the real topic, never a second schedule
    record."""
    with running_service(tmp_path, messageDelayLevel=LEVELS) as service, Producer.attach(service.root) as p:
        assert (
            p.send(TOPIC, b"once", properties={"DELAY": str(level)}, queue_id=2).status
            is PutMessageStatus.PUT_OK
        )
        with Consumer.attach(service.root, "g") as consumer:
            [x] = _read_all(consumer, TOPIC, 2, 1, 20)
            assert x.properties[m.PROPERTY_DELAY_TIME_LEVEL] == str(level)
            assert consumer.pull(SCHEDULE_TOPIC, 0, 1, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE


def test_status_metrics_and_admin_show_backlog_and_lag(tmp_path: Path) -> None:
    """With the scheduler stopped (SIGSTOP) a due message is backlog with a growing lag in
    `run.py status --json`, the metrics and `rmq-admin scheduleStatus` (which lists the level's
    queue: due time, real topic and queue); once it runs again the backlog and lag go to 0."""
    from tests.integration.test_ops import free_port, scrape

    port = free_port()
    with (
        running_service(tmp_path, messageDelayLevel=LEVELS, metricsPort=str(port)) as service,
        Producer.attach(service.root) as producer,
    ):
        scheduler = service.worker_pid("scheduler")
        os.kill(scheduler, signal.SIGSTOP)
        try:
            sent = producer.send(TOPIC, b"held", properties={"DELAY": "1"}, queue_id=2)
            assert sent.status is PutMessageStatus.PUT_OK

            def level1() -> dict[str, int]:
                out = subprocess.run(
                    [sys.executable, "run.py", "status", "--conf", str(service.conf), "--json"],
                    cwd=ROOT, capture_output=True, text=True, check=True,
                )  # fmt: skip
                levels: list[dict[str, int]] = json.loads(out.stdout)["delay_levels"]
                return levels[0]

            wait_until(lambda: level1()["backlog"] == 1, 20, "the backlog")
            with Consumer.attach(service.root, "g") as consumer:
                [(_phy, _size, due_ms)] = consumer.entries(SCHEDULE_TOPIC, 0, 0, 1)
            wait_until(lambda: time.time() * 1000 > due_ms + 200, 10, "the due time to pass")
            status = level1()
            assert status["backlog"] == 1
            assert status["lag_ms"] >= 200  # from the due time in its queue entry
            text = subprocess.run(
                [sys.executable, "run.py", "status", "--conf", str(service.conf)],
                cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert "delay    level 1 (1 s): backlog 1  lag " in text
            metrics = scrape(port)
            assert metrics['rmq_delay_level_backlog_messages{level="1"}'] == 1
            assert metrics['rmq_delay_level_lag_ms{level="1"}'] >= 200
            assert metrics['rmq_delay_level_backlog_messages{level="2"}'] == 0
            admin = subprocess.run(
                [sys.executable, "-m", "rmq_mp.tools.admin", "scheduleStatus", "--name", service.names.base,
                 "--level", "1", "--json"],
                cwd=ROOT, capture_output=True, text=True, check=True,
            )  # fmt: skip
            level_row, entry = (json.loads(line) for line in admin.stdout.splitlines())
            assert level_row["level"] == 1
            assert level_row["backlog"] == 1
            assert entry["realTopic"] == TOPIC
            assert entry["realQueueId"] == "2"
            assert entry["dueTimestamp"] == due_ms
            assert entry["queueOffset"] == 0
        finally:
            os.kill(scheduler, signal.SIGCONT)
        with Consumer.attach(service.root, "g") as consumer:
            _read_all(consumer, TOPIC, 2, 1, 20)
        wait_until(lambda: level1()["backlog"] == 0, 20, "the delivery")
        assert level1()["lag_ms"] == 0
        assert scrape(port)['rmq_delay_level_delivered_total{level="1"}'] == 1
