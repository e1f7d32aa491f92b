"""rmq-admin deleteTopic on a real store: the topic's queues, topics.json entry, queue offsets
and group offsets go; refused while a member of a group consuming it is attached (unless
--force), for a system topic and on an unknown one; a send to the same name starts a new topic
at queue offset 0; and the deleted topic does not come back after a clean restart or a kill -9
of everything, although its records are still in the commit log (they are its last records, the
case where RocketMQ 4.9.8's reput brings a deleted topic back). The crash points of the delete
itself are tests/crash/test_delete_topic_crash.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.deleted_topics import DONE, DeletedTopics
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.format import record, topic_marker
from rmq_mp.format.message import DELETE_TOPIC_MARKER
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.put.producer import Producer
from rmq_mp.store.consume_queue import plan_expired_files
from rmq_mp.store.running_store import RunningStore
from rmq_mp.tools.admin import main
from shm import layout
from shm.roles import Role
from tests.service import RunningService, running_service, start_service, wait_processes_gone, wait_until
from workers.cleaner import CleanerService

DEL, KEEP = "Del", "Keep"
SETTINGS = {"flushConsumerOffsetInterval": "100"}


def admin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def send(name: str, topic: str, bodies: list[str]) -> list[int]:
    """Queue offsets the sends got (queue i % 2)."""
    with Producer.attach(name) as producer:
        return [
            producer.send(topic, body.encode(), queue_id=i % 2).raise_for_status().queue_offset
            for i, body in enumerate(bodies)
        ]


def read_all(name: str, topic: str) -> list[tuple[int, int, str]]:
    """(queue, queue offset, body) of every message a pull from offset 0 serves, once dispatched."""
    found = []
    with Consumer.attach(name, "probe") as probe:
        for queue_id in (0, 1):
            offset = 0
            while True:
                result = probe.pull(topic, queue_id, offset, 32)
                found += [(queue_id, m.queue_offset, m.body.decode()) for m in result.messages]
                if not result.messages:
                    break
                offset = result.next_begin_offset
    return sorted(found)


def dispatched(service: RunningService, topic: str, count: int) -> None:
    with Consumer.attach(service.names.base, "probe") as probe:
        wait_until(lambda: probe.max_offset(topic, 0) + probe.max_offset(topic, 1) >= count, 60, "dispatch")


def consume_commit(name: str, group: str, topic: str) -> int:
    with Consumer.attach(name, group) as consumer:
        consumer.subscribe(topic)
        got = 0
        while batch := consumer.poll(0.3, max_msgs=100):
            got += len(batch)
        consumer.commit()
        return got


def persisted_offsets(root: Path) -> dict[str, dict[int, int]]:
    offsets = ConsumerOffsetManager(root / "config" / "consumerOffset.json")
    offsets.load()
    return offsets.table


def topics_json(root: Path) -> dict:
    topics = TopicConfigManager(root / "config" / "topics.json")
    topics.load()
    return topics.table


def tombstone_state(root: Path) -> str:
    tombstones = DeletedTopics(root / "config" / "deletedTopics.json")
    tombstones.load()
    return tombstones.table[DEL].state if DEL in tombstones.table else "none"


def fill(service: RunningService) -> None:
    """Keep first, Del last (its records end the log), both consumed by group G and persisted."""
    name = service.names.base
    send(name, KEEP, [f"k{i}" for i in range(10)])
    send(name, DEL, [f"old{i}" for i in range(20)])
    dispatched(service, KEEP, 10)
    dispatched(service, DEL, 20)
    assert consume_commit(name, "G", DEL) == 20
    assert consume_commit(name, "G", KEEP) == 10
    wait_until(
        lambda: {f"{DEL}@G", f"{KEEP}@G"} <= set(persisted_offsets(service.root)), 30, "offsets persisted"
    )
    wait_until(lambda: DEL in topics_json(service.root), 30, "topics.json persisted")


KEPT = sorted((i % 2, i // 2, f"k{i}") for i in range(10))


def assert_deleted(service: RunningService, new: tuple[str, ...] = ()) -> None:
    """Del holds only ``new`` (from queue offset 0), Keep all it had; no old Del offsets."""
    name = service.names.base
    assert read_all(name, DEL) == sorted((i % 2, i // 2, body) for i, body in enumerate(new))
    assert read_all(name, KEEP) == KEPT
    with Consumer.attach(name, "G") as group:
        if not new:
            assert group.committed_offset(DEL, 0) == -1
        assert group.committed_offset(KEEP, 0) == 5
        result = group.pull(DEL, 0, 7, 32)  # an old offset: nothing old is served there
        assert all(m.body.decode() in new for m in result.messages)
    assert not (service.root / "consumequeue" / DEL).exists() or new
    assert f"{DEL}@G" not in persisted_offsets(service.root) or new


def test_delete_topic_on_a_running_store_and_after_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_service(tmp_path, **SETTINGS) as service:
        name = service.names.base
        fill(service)
        with Consumer.attach(name, "G") as member:
            member.subscribe(DEL)
            member.poll(0)  # joins G, which consumes Del
            code, out, err = admin(capsys, "deleteTopic", "-n", name, "-t", DEL, "-c", "DefaultCluster")
            assert (code, out) == (2, "")
            assert "live member" in err
            assert "--force" in err
        code, _, err = admin(capsys, "deleteTopic", "-n", name, "-t", "SCHEDULE_TOPIC_XXXX")
        assert code == 2
        assert "system topic" in err
        code, _, err = admin(capsys, "deleteTopic", "-n", name, "-t", "Nope")
        assert code == 2
        assert "does not exist" in err
        with Producer.attach(name) as producer:
            producer.send(DEL, b"keyed", queue_id=1, keys="k-old").raise_for_status()
        dispatched(service, DEL, 21)
        code, out, _ = admin(capsys, "queryMsgByKey", "-n", name, "-t", DEL, "-k", "k-old", "--json")
        assert (code, len(out.splitlines())) == (0, 1)
        with Consumer.attach(name, "reader") as reader:  # a reader that keeps its queue views
            assert [m.body for m in reader.pull(DEL, 0, 0, 2).messages] == [b"old0", b"old2"]
            code, out, _ = admin(capsys, "DELETETOPIC", "-n", name, "-t", DEL, "--json")  # any case
            assert code == 0
            assert json.loads(out.splitlines()[0]) == {"topic": DEL, "queues": 2, "groups": "G"}
            assert reader.max_offset(DEL, 0) == 0
            assert reader.pull(DEL, 0, 0, 2).messages == []
            assert send(name, DEL, ["after0"]) == [0]
            wait_until(lambda: reader.max_offset(DEL, 0) == 1, 30, "the new message dispatched")
            assert [m.body for m in reader.pull(DEL, 0, 0, 2).messages] == [b"after0"]
        code, _, _ = admin(capsys, "deleteTopic", "-n", name, "-t", DEL)  # the new one, deleted again
        assert code == 0
        code, out, _ = admin(capsys, "queryMsgByKey", "-n", name, "-t", DEL, "-k", "k-old", "--json")
        assert (code, out) == (0, "")  # the index still holds the key; the tombstone hides it
        assert_deleted(service)
        assert DEL not in topics_json(service.root)
        assert tombstone_state(service.root) == DONE
        wait_until(lambda: f"{DEL}@G" not in persisted_offsets(service.root), 30, "offsets persisted")
        code, out, _ = admin(capsys, "consumerProgress", "-n", name, "--json")
        assert {json.loads(line)["topic"] for line in out.splitlines()} == {KEEP}
    # A clean restart: Del's records are the log's last, and still nothing brings it back.
    service = start_service(tmp_path, **SETTINGS)
    assert_deleted(service)
    assert DEL not in topics_json(service.root)
    name = service.names.base
    assert send(name, DEL, ["new0", "new1", "new2"]) == [0, 0, 1]  # a new topic, from 0
    dispatched(service, DEL, 3)
    assert_deleted(service, ("new0", "new1", "new2"))
    assert consume_commit(name, "G", DEL) == 3  # G reads the new topic from its start
    wait_until(lambda: DEL in topics_json(service.root), 30, "the new topic's config")
    kill_everything(service)  # the next start recovers from the checkpoint, the old records too
    with running_service(tmp_path, **SETTINGS) as service:
        assert_deleted(service, ("new0", "new1", "new2"))
        assert service.read(layout.TOPIC_DELETES_APPLIED) == 0
        with Consumer.attach(service.names.base, "G") as member:
            member.subscribe(DEL)
            member.poll(0)
            code, _, _ = admin(capsys, "deleteTopic", "-n", service.names.base, "-t", DEL, "--force")
            assert code == 0  # forced with a member of G attached
            assert read_all(service.names.base, DEL) == []


def kill_everything(service: RunningService) -> None:
    pids = [service.process.pid, *(p.pid for p in psutil.Process(service.process.pid).children(True))]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    service.process.wait(30)
    wait_processes_gone(pids[1:])


def test_delete_topic_on_a_stopped_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_service(tmp_path, **SETTINGS) as service:
        fill(service)
    root = str(service.root)
    code, out, _ = admin(capsys, "deleteTopic", "--store", root, "-t", DEL, "--json")
    assert code == 0
    assert json.loads(out.splitlines()[0]) == {"topic": DEL, "queues": 2, "groups": "G"}
    assert not (service.root / "consumequeue" / DEL).exists()
    assert DEL not in topics_json(service.root)
    assert f"{DEL}@G" not in persisted_offsets(service.root)
    assert tombstone_state(service.root) == DONE
    assert marker_at_tombstone(service.root) == [DEL]  # the start that finished it wrote one for slaves
    service = start_service(tmp_path, **SETTINGS)
    assert_deleted(service)
    assert send(service.names.base, DEL, ["new0"]) == [0]
    dispatched(service, DEL, 1)
    kill_everything(service)  # a crashed store: the delete waits for the start that fences it
    code, _, err = admin(capsys, "deleteTopic", "--store", root, "-t", DEL)
    assert code == 0
    assert "next start" in err
    assert tombstone_state(service.root) == "requested"
    with running_service(tmp_path, **SETTINGS) as service:
        assert_deleted(service)
        assert tombstone_state(service.root) == DONE
    assert marker_at_tombstone(service.root) == [DEL]


def marker_at_tombstone(root: Path) -> list[str]:
    """The topics the deleteTopic marker at DEL's tombstone names (rmq_mp/format/topic_marker.py)."""
    stones = DeletedTopics(root / "config" / "deletedTopics.json")
    stones.load()
    phy = stones.table[DEL].phy_offset
    data = (root / "commitlog" / f"{0:020d}").read_bytes()
    message = record.decode_message(data, phy, len(data))
    assert message.topic == DELETE_TOPIC_MARKER
    return topic_marker.decode(message.body)


def test_delete_topic_while_a_producer_sends_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sends race the delete: those stored below the tombstone's offset are the old topic's and
    gone; those above are the new topic's, at queue offsets from 0 with no gap, and served, also
    after a restart. A send never lands half in each (the offset is taken under the put lock)."""
    stop = threading.Event()
    results: list[tuple[str, int, int, int]] = []  # body, queue, queue offset, commit-log offset

    def sender(name: str) -> None:
        with Producer.attach(name) as producer:
            i = 0
            while not stop.is_set() or i < 50:
                r = producer.send(DEL, f"m{i}".encode(), queue_id=i % 2).raise_for_status()
                results.append((f"m{i}", i % 2, r.queue_offset, r.commit_log_offset))
                i += 1

    with running_service(tmp_path, **SETTINGS) as service:
        name = service.names.base
        thread = threading.Thread(target=sender, args=(name,))
        thread.start()
        try:
            wait_until(lambda: len(results) >= 50, 60, "sends under way")
            code, _, err = admin(capsys, "deleteTopic", "-n", name, "-t", DEL)
            assert code == 0, err
            count = len(results)
            wait_until(lambda: len(results) >= count + 50, 60, "sends after the delete")
        finally:
            stop.set()
            thread.join(60)
        tombstones = DeletedTopics(service.root / "config" / "deletedTopics.json")
        tombstones.load()
        bound = tombstones.table[DEL].phy_offset
        new = [r for r in results if r[3] >= bound]
        assert 0 < len(new) < len(results)
        for queue_id in (0, 1):
            offsets = [r[2] for r in new if r[1] == queue_id]
            assert offsets == list(range(len(offsets))), f"queue {queue_id}: {offsets[:10]}"
        expected = sorted((q, o, body) for body, q, o, _phy in new)
        dispatched(service, DEL, len(new))
        assert read_all(name, DEL) == expected
    with running_service(tmp_path, **SETTINGS) as service:
        assert read_all(service.names.base, DEL) == expected


def test_a_cleaner_plan_made_before_a_delete_touches_nothing_of_the_new_topic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cleaner plans a queue's expiry (a new minimum, files to delete) from the files, then
    publishes it. A delete whose reput removes and resets the queue in between makes that plan
    the old topic's: its minimum must not land on the new topic's queue, nor its file names
    delete the new queue's files (QUEUE_RESETS). Here the store's own cleaner code publishes a
    plan made before `deleteTopic` and a send to the new topic; without the check the new
    topic's queue 0 would start at 6 with its first file deleted."""
    with running_service(tmp_path, mappedFileSizeConsumeQueue=str(4 * CQ_STORE_UNIT_SIZE)) as service:
        name = service.names.base
        send(name, DEL, [f"old{i}" for i in range(20)])  # 10 a queue: 3 files of 4 entries
        dispatched(service, DEL, 20)
        with Consumer.attach(name, "probe") as probe:
            sixth = probe.pull(DEL, 0, 6, 1).messages[0].commit_log_offset
        queue_dir = service.root / "consumequeue" / DEL / "0"
        store = RunningStore.attach(name, Role.CLEANER)
        try:
            cleaner = CleanerService(store)
            resets = service.read(layout.QUEUE_RESETS)
            plan = plan_expired_files(queue_dir, 4 * CQ_STORE_UNIT_SIZE, sixth)
            assert (len(plan.paths), plan.min_queue_offset) == (1, 6)  # entries 0-3 gone, 4-5 below
            assert admin(capsys, "deleteTopic", "-n", name, "-t", DEL)[0] == 0
            assert send(name, DEL, [f"new{i}" for i in range(10)]) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
            dispatched(service, DEL, 10)
            assert plan.paths[0].exists()  # the same name, now the new queue's first file
            assert not cleaner._publish(plan, store.shm.queues.find(DEL, 0), resets)
        finally:
            store.close()
        assert plan.paths[0].exists()
        assert read_all(name, DEL) == sorted((i % 2, i // 2, f"new{i}") for i in range(10))
        after = service.read(layout.QUEUE_RESETS)  # the delete's reset, and the marker's (reput)
        assert after >= resets + 2, after
        assert after % 2 == 0, after
