"""The scripted failover on real processes (issue 32 point 4), seeded.

A SYNC_MASTER and its SLAVE (with the metadata channel). Producer processes (tests.load) send
to the master while a consumer group consumes and commits, and delayed messages are due before
and during the outage. At a seeded point kill -9 of the master's whole process tree; promote
the slave (refused first when it holds less than the master last said, then --force, as the
runbook says); new producer processes and the group carry on against it. Checked on the new
master: every message acknowledged PUT_OK is served exactly where it was (phy and queue
offsets, bytes); the group resumes at or behind what it committed (never ahead) and not behind
what it committed well before the kill; no queue offset holds two acknowledged messages; each
acknowledged delayed message is delivered once.

Then the old master rejoins as a slave of the new one (issue 32 point 3): it finds where its
log and the new master's part, sets aside what only it had, and after the restart it makes by
itself converges byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.format.message import PROPERTY_DELAY_TIME_LEVEL
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store import schedule
from shm import layout
from shm import queue_offsets as qo
from shm import schedule_offsets as so
from tests.ha.pair import assert_same_log, start_master, start_slave, wait_caught_up
from tests.ha.test_meta import META, follow
from tests.ha.test_promote import promote
from tests.load import TOPICS, message_for
from tests.service import acknowledged, kill_tree, start_producers, wait_until

GROUP = "failover_group"
DELAY_TOPIC = "Delayed"
SETTINGS = {
    "haSendHeartbeatInterval": "1000",
    "flushConsumerOffsetInterval": "500",
    "messageDelayLevel": "1s 2s",
}


class GroupMember(threading.Thread):
    """A member of GROUP on one store: polls, then commits what it read, writing each commit's
    offsets before it commits (so what it committed is never more than the file says) and
    again, marked done, after."""

    def __init__(self, name: str, out: Path) -> None:
        super().__init__(daemon=True)
        self.name_, self.out = name, out
        self.stopping = threading.Event()
        self.read: list[tuple[str, int, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Consumer.attach(self.name_, GROUP) as consumer, self.out.open("a") as f:
                for topic in TOPICS:
                    consumer.subscribe(topic)
                while not self.stopping.is_set():
                    messages = consumer.poll(0.1)
                    ends: dict[tuple[str, int], int] = {}
                    for m in messages:
                        self.read.append((m.topic, m.queue_id, m.queue_offset))
                        ends[(m.topic, m.queue_id)] = m.queue_offset + 1
                    if ends:
                        line = {"t": time.monotonic(), "offsets": [[t, q, o] for (t, q), o in ends.items()]}
                        f.write(json.dumps({**line, "done": False}) + "\n")
                        f.flush()
                        consumer.commit(ends)
                        f.write(json.dumps({**line, "done": True}) + "\n")
                        f.flush()
        except Exception as exc:  # the store was killed under it
            self.error = exc


def commits(out: Path) -> list[dict[str, Any]]:
    lines = []
    for line in out.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return lines


def send_delayed(store: str, level: int, count: int, tag: str) -> list[bytes]:
    """``count`` delayed messages; the bodies of those acknowledged PUT_OK."""
    acked = []
    with Producer.attach(store) as producer:
        for i in range(count):
            body = f"{tag}-{i}".encode()
            result = producer.send(DELAY_TOPIC, body, properties={PROPERTY_DELAY_TIME_LEVEL: str(level)})
            if result.status is PutMessageStatus.PUT_OK:
                acked.append(body)
    return acked


def served_at(consumer: Consumer, topic: str, queue_id: int, offset: int) -> Any:
    got = consumer.pull(topic, queue_id, offset, 1)
    assert got.status is GetMessageStatus.FOUND, (topic, queue_id, offset, got.status)
    return got.messages[0]


SEEDS = [11, 12, 13, *range(100, 100 + int(os.environ.get("RMQ_FAILOVER_EXTRA_SEEDS", "0")))]
"""Three seeds in the default run; RMQ_FAILOVER_EXTRA_SEEDS=N adds N more (seeds 100...)."""


@pytest.mark.parametrize("seed", SEEDS)
def test_failover_under_load(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    master = start_master(tmp_path, brokerRole="SYNC_MASTER", **{**META, **SETTINGS})
    wait_until(lambda: master.read(layout.HA_META_LISTEN_PORT) > 0, 20, "the metadata listener")
    slave = follow(tmp_path, master, haListenPort="0", **SETTINGS)
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    early = send_delayed(master.names.base, 1, 20, "early")  # due before the kill
    member = GroupMember(master.names.base, tmp_path / "commits.jsonl")
    member.start()
    procs, outs = start_producers(master, tmp_path, [100_000, 100_000], batch=[1, 4])
    target = rng.randrange(400, 2500)
    try:
        wait_until(
            lambda: sum(len(acknowledged(o)) for o in outs) >= target, 60, f"{target} acknowledged sends"
        )
        wait_until(lambda: len(member.read) >= 100, 30, "the group to consume")
        # What the group committed so far must reach the slave: a snapshot applied after it.
        followed = len(commits(tmp_path / "commits.jsonl"))
        applied = slave.read(layout.HA_META_APPLIED)
        wait_until(
            lambda: slave.read(layout.HA_META_APPLIED) >= applied + 2, 20, "snapshots after the commits"
        )
        late = send_delayed(master.names.base, 2, 20, "late")  # due during the outage
        kill_tree(master)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        member.stopping.set()
        member.join(10)

    # Promote: refused while behind what the master last said (never acknowledged), or at once.
    wait_until(lambda: slave.read(layout.HA_SLAVE_STATE) != layout.SLAVE_CONNECTED, 20, "the slave to notice")
    if promote(slave, "--role", "ASYNC_MASTER") != 0:
        assert slave.read(layout.HA_SLAVE_RECEIVED_END) < slave.read(layout.HA_META_MASTER_END)
        assert promote(slave, "--role", "ASYNC_MASTER", "--force") == 0
    promoted = slave

    # The group resumes at or behind what it committed, and not behind what it had committed
    # (done) before two later snapshots reached the slave.
    lines = commits(tmp_path / "commits.jsonl")
    ceiling: dict[tuple[str, int], int] = {}
    floor: dict[tuple[str, int], int] = {}
    for index, line in enumerate(lines):
        for topic, queue_id, offset in line["offsets"]:
            ceiling[(topic, queue_id)] = max(ceiling.get((topic, queue_id), 0), offset)
            if line["done"] and index < followed:
                floor[(topic, queue_id)] = max(floor.get((topic, queue_id), 0), offset)
    with Consumer.attach(promoted.names.base, f"checker{seed}") as checker:
        groups = checker.store.shm.groups
        resumed = {}
        for (topic, queue_id), top in ceiling.items():
            slot = groups.find(f"{topic}@{GROUP}", queue_id)
            offset = groups.get(slot, qo.COMMITTED) if slot >= 0 else 0
            assert offset <= top, f"{topic}/{queue_id} resumes at {offset}, ahead of {top} committed"
            assert offset >= floor.get((topic, queue_id), 0), f"{topic}/{queue_id} lost its progress"
            resumed[(topic, queue_id)] = offset
        assert floor, "no commit early enough to check the followed offsets"

        # Every PUT_OK of the old master is served where it was, byte for byte.
        acked: dict[tuple[str, int, int], tuple[int, int]] = {}
        for producer, out in enumerate(outs):
            for ack in acknowledged(out):
                if ack["status"] != "PUT_OK":
                    continue
                topic, queue_id, body = message_for(producer, ack["seq"])
                m = served_at(checker, topic, queue_id, ack["queue_offset"])
                assert m.commit_log_offset == ack["phy"]
                assert m.body == body
                assert (m.properties["producer"], m.properties["seq"]) == (str(producer), str(ack["seq"]))
                key = (topic, queue_id, ack["queue_offset"])
                assert key not in acked, f"queue offset {key} acknowledged twice"
                acked[key] = (producer, ack["seq"])
        assert len(acked) >= target // 2

    # Producers and the group carry on against the new master.
    (tmp_path / "after").mkdir()
    procs, outs2 = start_producers(promoted, tmp_path / "after", [300, 300], batch=[1, 3])
    member = GroupMember(promoted.names.base, tmp_path / "commits-after.jsonl")
    member.start()
    try:
        for proc in procs:
            assert proc.wait(60) == 0
    finally:
        member.stopping.set()
        member.join(10)
    first: dict[tuple[str, int], int] = {}
    for topic, queue_id, offset in member.read:
        first.setdefault((topic, queue_id), offset)
    for queue, offset in first.items():
        assert offset == resumed.get(queue, 0), (
            f"{queue} resumed at {offset}, committed {resumed.get(queue, 0)}"
        )
    with Consumer.attach(promoted.names.base, f"checker{seed}") as checker:
        for producer, out in enumerate(outs2):  # tests.load numbers them 0 and 1 again
            for ack in acknowledged(out):
                assert ack["status"] == "PUT_OK", ack
                topic, queue_id, body = message_for(producer, ack["seq"])
                key = (topic, queue_id, ack["queue_offset"])
                assert key not in acked, f"queue offset {key} reused"
                m = served_at(checker, topic, queue_id, ack["queue_offset"])
                assert m.body == body
                assert m.commit_log_offset == ack["phy"]
                acked[key] = (producer + 2, ack["seq"])

        # Delays: every acknowledged one delivered once, the late ones by the new master.
        queues = checker.store.shm.queues

        def delivered_all() -> bool:
            for level in (1, 2):
                slot = queues.find(schedule.SCHEDULE_TOPIC, level - 1)
                end = queues.get(slot, qo.DISPATCHED) if slot >= 0 else 0
                if checker.store.shm.schedule.get(level - 1, so.OFFSET) < end:
                    return False
            return True

        wait_until(delivered_all, 30, "every delay level to be delivered")
        promoted_end = promoted.read(layout.WROTE_POSITION)
        wait_until(lambda: promoted.read(layout.REPUT_FROM_OFFSET) >= promoted_end, 20, "dispatch")
        bodies: list[bytes] = []
        for queue_id in sorted(q for t, q, _slot in queues.queues() if t == DELAY_TOPIC):
            offset = 0
            while (got := checker.pull(DELAY_TOPIC, queue_id, offset, 32)).status is GetMessageStatus.FOUND:
                bodies += [m.body for m in got.messages]
                offset = got.next_begin_offset
        for body in early + late:
            assert bodies.count(body) == 1, f"{body!r} delivered {bodies.count(body)} times"
    assert len(early) == len(late) == 20

    # The old master rejoins as a slave of the new one: it compares its log with the new
    # master's, sets aside what only it had (a fork: what it wrote that never reached the slave),
    # and after the restart it makes by itself to cut there, converges byte for byte.
    wait_until(lambda: promoted.read(layout.HA_LISTEN_PORT) > 0, 20, "the new master's HA listener")
    port = promoted.read(layout.HA_LISTEN_PORT)
    end = promoted.read(layout.WROTE_POSITION)
    old = start_slave(tmp_path, port, name="master", **SETTINGS)
    old_end = old.read(layout.WROTE_POSITION)  # recovered; the new master wrote on past it since
    assert end > old_end, (end, old_end)

    def now(field: layout.Field) -> int:  # -1 while the store restarts itself (no table)
        try:
            return old.read(field)
        except ShmAttachError:
            return -1

    def compared() -> bool:  # restarted to cut a fork, refused, or appending the new master's bytes
        return (
            now(layout.FORK_RESTARTS) > 0
            or now(layout.HA_SLAVE_STATE) == layout.SLAVE_REFUSED
            or now(layout.HA_SLAVE_RECEIVED_END) > old_end
        )

    wait_until(compared, 60, "the old master to compare its log with the new master's")
    forked = (old.root / "diverged").exists()
    if forked:
        [folder] = (old.root / "diverged").iterdir()  # what only the old master had, set aside
        fork_offset = json.loads((folder / "fork.json").read_text())["fork_offset"]
        wait_until(lambda: now(layout.FORK_RESTARTS) == 1, 60, "the old master to restart itself")
    assert now(layout.HA_SLAVE_STATE) != layout.SLAVE_REFUSED, old.root / "logs" / "ha.log"
    wait_caught_up(old, end)
    assert old.stop() == 0
    assert promoted.stop() == 0
    assert_same_log(promoted, old, end)
    print(
        f"seed {seed}: killed after {target} acks; {len(acked)} PUT_OK checked at their offsets, "
        f"{len(ceiling)} queues resumed at or behind their commits, {len(bodies)} delays delivered once; "
        + (
            f"the old master forked at {fork_offset}, set aside, and rejoined"
            if forked
            else "the old master rejoined"
        )
    )
