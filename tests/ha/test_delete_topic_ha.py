"""Issue 32's last gap: a topic deleted on the master is deleted on its slaves, in log order.

`rmq-admin deleteTopic` on the master appends a marker record (rmq_mp/format/topic_marker.py) at
the tombstone's offset; a slave's ha worker (next queue offsets), reput (tombstone, queue files,
queue table), supervisor (group offsets, topics.json) and recovery apply it where they meet it.
One scenario on real processes: a master and slave A replicating with the metadata channel; topic
T sent to, configured and committed; A's reput stopped (SIGSTOP) so the marker is still ahead of
its dispatch; T deleted on the master and sent to again (the new T, from queue offset 0, committed
too); A killed -9 whole with the marker received and not applied, and restarted: its recovery
applies it. A slave B started empty after the delete catches up from offset 0 through the marker,
killed -9 at a seeded point of applying it (its reput once the tombstone is written, its reput once
the old queues are gone, its supervisor once the offsets and config are dropped, or the whole tree
once the tombstone is there) and restarted where that killed the whole store. Both serve only the
new T at queue offsets 0.., hold the master's tombstone, the new T's config and group offset and
none of the old's; then the master is killed, A promoted, and it serves and takes T the same.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import psutil
import pytest

from rmq_mp.config.deleted_topics import DONE, DeletedTopics
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.format.message import DELETE_TOPIC_MARKER
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.tools import admin
from shm import layout
from tests.ha.pair import assert_same_log, wait_caught_up
from tests.ha.test_meta import commit, committed, follow, start_pair
from tests.ha.test_promote import promote
from tests.integration.test_delete_topic import persisted_offsets, read_all, send
from tests.service import RunningService, kill_tree, wait_until

T = "Gone"
CRASH_POINTS = ("reput-marker", "reput", "finish", "whole")
SEED = int(os.environ.get("RMQ_TEST_SEED", "32"))


def tombstone(service: RunningService) -> tuple[int, str] | None:
    stones = DeletedTopics(service.root / "config" / "deletedTopics.json")
    stones.load()
    stone = stones.table.get(T)
    return None if stone is None else (stone.phy_offset, stone.state)


def write_queues(service: RunningService) -> int | None:
    manager = TopicConfigManager(service.root / "config" / "topics.json")
    manager.load()
    config = manager.get(T)
    return None if config is None else config.write_queue_nums


def assert_new_topic_only(service: RunningService, marker: int, new: list[tuple[int, int, str]]) -> None:
    """``service`` serves only the new T, holds the master's tombstone (done), the new T's
    config (not the old one's 3 queues) and group offset, none of the old's."""
    wait_until(
        lambda: read_all(service.names.base, T) == new, 30, f"{service.root.name} to serve the new {T}"
    )
    wait_until(lambda: tombstone(service) == (marker, DONE), 30, f"{service.root.name}'s tombstone")
    wait_until(lambda: committed(service, "g", T, 0) == 1, 30, f"{service.root.name}: the new group offset")
    assert committed(service, "g", T, 1) < 0, "the old topic's offset came back"
    wait_until(
        lambda: write_queues(service) not in (None, 3), 30, f"{service.root.name}: the new {T}'s config"
    )
    wait_until(
        lambda: persisted_offsets(service.root).get(f"{T}@g") == {0: 1},
        30,
        f"{service.root.name}'s consumerOffset.json to hold the new offset alone",
    )
    assert DELETE_TOPIC_MARKER not in TopicConfigManager(service.root / "config" / "topics.json").table


def test_a_topic_deleted_on_the_master_is_deleted_on_its_slaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    master, a = start_pair(tmp_path)
    assert admin.main(["updateTopic", "-n", master.names.base, "-t", T, "-r", "3", "-w", "3"]) == 0
    assert send(master.names.base, T, [f"old{i}" for i in range(6)]) == [0, 0, 1, 1, 2, 2]
    send(master.names.base, "Keep", ["k0", "k1"])
    commit(master, "g", {(T, 0): 3, (T, 1): 3})
    wait_until(lambda: committed(a, "g", T, 1) == 3, 30, "the old offsets to follow")
    with Producer.attach(master.names.base) as producer:  # only the store writes the marker topic
        for _ in range(2):
            refused = producer.send(DELETE_TOPIC_MARKER, T.encode(), queue_id=0)
            assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL, refused
    wait_caught_up(a, master.read(layout.WROTE_POSITION))

    reput = psutil.Process(a.worker_pid("reput"))
    reput.send_signal(signal.SIGSTOP)  # the marker reaches A's log, not its dispatch
    assert admin.main(["deleteTopic", "-n", master.names.base, "-t", T]) == 0
    marker, state = tombstone(master) or (-1, "")
    assert state == DONE
    assert send(master.names.base, T, ["new0", "new1"]) == [0, 0]
    commit(master, "g", {(T, 0): 1})
    end = master.read(layout.WROTE_POSITION)
    wait_until(lambda: a.read(layout.WROTE_POSITION) >= end, 30, "A to receive the delete and the new T")
    assert tombstone(a) is None  # its reput has not met the marker
    kill_tree(a)  # (the stopped reput too)

    a = follow(tmp_path, master, "slave")  # recovery from the checkpoint meets the marker
    new = [(0, 0, "new0"), (1, 0, "new1")]
    assert_new_topic_only(a, marker, new)

    point = random.Random(SEED).choice(CRASH_POINTS)
    once = tmp_path / "crashed-once"
    if point != "whole":
        monkeypatch.setenv("RMQ_CRASH_AT", f"deleteTopic:{point}")
        monkeypatch.setenv("RMQ_CRASH_ONCE", str(once))
    b = follow(tmp_path, master, "late")  # empty: from offset 0 (one file) through the marker
    monkeypatch.delenv("RMQ_CRASH_AT", raising=False)
    if point == "whole":
        wait_until(lambda: tombstone(b) is not None, 30, "B to write the tombstone")
        kill_tree(b)
    elif point == "finish":
        assert b.process.wait(30) == -9, "B's supervisor killed inside the delete"
        assert once.exists()
    if point in ("finish", "whole"):
        b = follow(tmp_path, master, "late")  # its start ends what the killed one left
    else:
        wait_until(once.exists, 30, f"B's reput killed at {point}")
    wait_caught_up(b, end)
    assert_new_topic_only(b, marker, new)
    assert_same_log(master, b, end)
    capsys.readouterr()

    kill_tree(master)
    wait_until(lambda: a.read(layout.HA_SLAVE_STATE) != layout.SLAVE_CONNECTED, 20, "A to notice")
    assert promote(a) == 0
    assert read_all(a.names.base, T) == new
    assert send(a.names.base, T, ["after0", "after1"]) == [1, 1]  # the new T's next offsets
    wait_until(lambda: len(read_all(a.names.base, T)) == 4, 30, "the promoted store to serve them")
    assert committed(a, "g", T, 0) == 1
    assert b.stop() == 0
    assert a.stop() == 0
