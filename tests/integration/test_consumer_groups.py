"""Consumer groups with real processes (tests/group_member.py): clustering shares a topic's
queues among live members, exactly once while members join and leave cleanly, at least once
across kill -9, with no queue read by two members at once; broadcasting gives each member
everything and resumes it by client id. The time bounds are rmq_mp/client/rebalance.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.put.producer import Producer
from shm import members as mb
from shm import queue_offsets as qo
from shm.layout import Role
from shm.pointer_table import pid_alive, pid_alive_since
from shm.store_shm import StoreShm
from tests.service import (
    ROOT,
    RunningService,
    cleanup_started,
    json_lines,
    running_service,
    start_service,
    wait_processes_gone,
    wait_until,
)

TOPIC, GROUP, QUEUES = "GroupT", "G1", 16
INTERVAL_MS = 500
"""The members' rebalance interval: how often a parked member looks for dead pids."""
SLACK_S = 3.0
"""Scheduling on a loaded two-core machine: a bound is asserted as stated bound + this."""


def produce(service: RunningService, count: int, start: int = 0) -> None:
    """Send ``count`` messages round-robin over the 16 queues and wait until reput dispatched
    them all (a poll that must find them does not race the dispatch)."""
    with Producer.attach(service.names.base) as producer:
        for i in range(start, start + count):
            assert producer.send(TOPIC, str(i).encode(), queue_id=i % QUEUES).ok
    with shared(service) as shm:
        wait_until(
            lambda: (
                sum(shm.queues.get(slot, qo.DISPATCHED) for _q, slot in shm.queues.queues_of(TOPIC))
                >= start + count
            ),
            60,
            "reput to dispatch",
        )


class Members:
    """Member processes of one test; every one is killed and reaped at the end, also on failure."""

    def __init__(self, service: RunningService, tmp_path: Path) -> None:
        self.service = service
        self.tmp_path = tmp_path
        self.stop_file = tmp_path / "stop"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, client_id: str, *extra: str, poll_s: float = 0.2) -> subprocess.Popen[bytes]:
        args = [self.service.names.base, GROUP, client_id, str(self.out(client_id)), str(self.stop_file)]
        args += ["--poll-s", str(poll_s), "--interval-ms", str(INTERVAL_MS), "--max", "16", *extra]
        proc = subprocess.Popen([sys.executable, "-m", "tests.group_member", *args], cwd=ROOT)
        self.procs[client_id] = proc
        return proc

    def out(self, client_id: str) -> Path:
        return self.tmp_path / f"{client_id}.jsonl"

    def events(self, client_id: str) -> list[dict[str, Any]]:
        return json_lines(self.out(client_id))

    def reads(self, client_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events(client_id) if e["e"] == "read"]

    def finish(self, timeout_s: float = 60) -> None:
        self.stop_file.touch()
        for client_id, proc in self.procs.items():
            assert proc.wait(timeout_s) in (0, -signal.SIGKILL), (
                f"member {client_id} exited {proc.returncode}"
            )

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


@contextmanager
def group(tmp_path: Path) -> Iterator[tuple[RunningService, Members]]:
    with running_service(tmp_path, defaultTopicQueueNums=str(QUEUES)) as service:
        members = Members(service, tmp_path)
        try:
            yield service, members
        finally:
            members.kill_all()


@contextmanager
def shared(service: RunningService) -> Iterator[StoreShm]:
    shm = StoreShm.attach(service.names, Role.CONSUMER)
    try:
        yield shm
    finally:
        shm.close()


def wait_joined(shm: StoreShm, *procs: subprocess.Popen[bytes]) -> None:
    """Until each process is a live member of the group (it has subscribed and polled once)."""
    pids = {p.pid for p in procs}
    wait_until(
        lambda: pids <= {m.pid for m in shm.members.members(pid_alive_since, GROUP)}, 60, "members to join"
    )


def owners(shm: StoreShm) -> dict[int, int]:
    """Queue id -> pid of the live member whose owner word holds it (dead owners left out)."""
    key = ConsumerOffsetManager.key(GROUP, TOPIC)
    found = {}
    for queue_id, slot in shm.groups.queues_of(key):
        pid, member_slot = qo.owner_of(shm.groups.get(slot, qo.OWNER))
        if pid and pid_alive(pid) and shm.members.get(member_slot, mb.PID) == pid:
            found[queue_id] = pid
    return found


def split(shm: StoreShm, pids: set[int]) -> list[int] | None:
    """Queue counts per member, largest first, when exactly ``pids`` hold all 16 queues."""
    held = owners(shm)
    if len(held) != QUEUES or set(held.values()) != pids:
        return None
    return sorted(Counter(held.values()).values(), reverse=True)


def test_four_members_read_every_message_exactly_once(tmp_path: Path) -> None:
    with group(tmp_path) as (service, members):
        produce(service, 3200)
        names = [f"m{i}" for i in range(4)]
        procs = [members.start(name) for name in names]
        with shared(service) as shm:
            wait_until(lambda: split(shm, {p.pid for p in procs}) == [4, 4, 4, 4], 60, "4 queues each")
        wait_until(lambda: sum(len(members.reads(n)) for n in names) >= 3200, 120, "every message read")
        members.finish()
        bodies = Counter(e["b"] for n in names for e in members.reads(n))
        assert set(bodies) == {str(i) for i in range(3200)}
        assert max(bodies.values()) == 1, "a message read twice with no member dying"


def test_queues_move_on_join_leave_and_death_within_the_bound(tmp_path: Path) -> None:
    """Members parked in a 30 s long poll: a join and a clean leave move the queues at once (the
    parked members are posted), a death within one rebalance interval."""
    with group(tmp_path) as (service, members), shared(service) as shm:
        produce(service, QUEUES)  # the topic's 16 queues exist; members read them and park
        a, b = members.start("a", poll_s=30), members.start("b", poll_s=30)
        wait_until(lambda: split(shm, {a.pid, b.pid}) == [8, 8], 60, "a and b to hold 8 queues each")
        c = members.start("c", poll_s=30)
        wait_until(
            lambda: any(m.pid == c.pid for m in shm.members.members(pid_alive_since, GROUP)), 60, "c to join"
        )
        joined = time.monotonic()
        wait_until(lambda: split(shm, {a.pid, b.pid, c.pid}) == [6, 5, 5], 30, "a three-way split")
        assert time.monotonic() - joined < SLACK_S, "a join moves queues from parked members at once"

        os.kill(c.pid, signal.SIGKILL)
        c.wait(30)
        died = time.monotonic()
        wait_until(lambda: split(shm, {a.pid, b.pid}) == [8, 8], 30, "c's queues back to a and b")
        assert time.monotonic() - died < INTERVAL_MS / 1000 + SLACK_S, (
            "a death is noticed within the interval"
        )

        b.send_signal(signal.SIGTERM)
        # b leaves once its poll returns: a message on one of its queues ends the park at once,
        # where its 30 s timeout otherwise would (tests/group_member.py: it sees the signal, closes)
        wake = next(queue_id for queue_id, pid in owners(shm).items() if pid == b.pid)
        with Producer.attach(service.names.base) as producer:
            assert producer.send(TOPIC, b"wake b", queue_id=wake).ok
        assert b.wait(30) == 0
        left = time.monotonic()
        wait_until(lambda: split(shm, {a.pid}) == [16], 30, "every queue to a")
        assert time.monotonic() - left < SLACK_S, "a clean leave moves queues at once"
        assert [m.client_id for m in shm.members.members(pid_alive_since, GROUP)] == ["a"]


def test_kill_9_of_a_member_loses_nothing_and_repeats_only_uncommitted_reads(tmp_path: Path) -> None:
    with group(tmp_path) as (service, members), shared(service) as shm:
        produce(service, 4000)
        names = [f"k{i}" for i in range(4)]
        procs = [members.start(name) for name in names]
        wait_until(lambda: sum(len(members.reads(n)) for n in names) >= 1200, 120, "a third read")
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait(30)
        died = time.monotonic()
        survivors = {p.pid for p in procs[1:]}
        wait_until(lambda: split(shm, survivors) is not None, 30, "the dead member's queues to move")
        assert time.monotonic() - died < INTERVAL_MS / 1000 + SLACK_S
        wait_until(lambda: len({e["b"] for n in names for e in members.reads(n)}) == 4000, 120, "all read")
        members.finish()
        reads = Counter(e["b"] for n in names for e in members.reads(n))
        assert set(reads) == {str(i) for i in range(4000)}, "at least once across kill -9"
        dead_events = members.events("k0")
        last_commit = max((i for i, e in enumerate(dead_events) if e["e"] == "commit"), default=-1)
        uncommitted = {e["b"] for e in dead_events[last_commit + 1 :] if e["e"] == "read"}
        repeated = {body for body, n in reads.items() if n > 1}
        assert repeated <= uncommitted, "only reads the dead member never committed are read again"
        assert all(n <= 2 for n in reads.values())


def read_at_least(members: Members, names: list[str], count: int) -> Callable[[], bool]:
    """Whether the members ``names`` have read ``count`` messages between them (for `wait_until`)."""
    return lambda: sum(len(members.reads(n)) for n in names) >= count


def test_members_joining_and_leaving_never_read_one_queue_at_once(tmp_path: Path) -> None:
    """Churn while a backlog drains: every (queue, offset) is read exactly once, so no two members
    ever read one queue at the same time (both would read from the same next offset). The owner
    words are checked while they run: every held queue names a live member of the group."""
    with group(tmp_path) as (service, members), shared(service) as shm:
        produce(service, 4000)
        wait_joined(shm, members.start("c0"), members.start("c1"))
        names = ["c0", "c1"]
        for step in range(2, 8):
            wait_until(read_at_least(members, names, 400 * step), 120, "progress")
            live = {m.pid for m in shm.members.members(pid_alive_since, GROUP)}
            assert set(owners(shm).values()) <= live
            if step % 2:
                leaving = names[step - 2]
                members.procs[leaving].send_signal(signal.SIGTERM)
                assert members.procs[leaving].wait(30) == 0
            name = f"c{step}"
            wait_joined(shm, members.start(name))
            names.append(name)
        wait_until(lambda: sum(len(members.reads(n)) for n in names) >= 4000, 120, "every message read")
        members.finish()
        seen = Counter((e["q"], e["o"]) for n in names for e in members.reads(n))
        assert len(seen) == 4000
        assert max(seen.values()) == 1, "a queue offset read twice"


def test_broadcasting_members_each_read_everything_and_resume_by_client_id(tmp_path: Path) -> None:
    with group(tmp_path) as (service, members):
        produce(service, 500)
        members.stop_file.touch()  # each exits at its first poll that finds nothing
        for name in ("b1", "b2"):
            members.start(name, "--broadcasting")
        members.finish()
        for name in ("b1", "b2"):
            assert sorted(int(e["b"]) for e in members.reads(name)) == list(range(500))
        offsets = service.root / "broadcastOffsets" / "b1" / GROUP / "offsets.json"
        assert sum(json.loads(offsets.read_text())["offsetTable"][TOPIC].values()) == 500
        produce(service, 300, start=500)
        members.out("b1").unlink()
        members.start("b1", "--broadcasting")
        members.finish()
        assert sorted(int(e["b"]) for e in members.reads("b1")) == list(range(500, 800)), "resumed"


def admin(service: RunningService, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", *args, "-n", service.names.base, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_operator_view_shows_each_member_and_the_queues_it_holds(tmp_path: Path) -> None:
    """rmq-admin consumerConnection -g (members, model, queues held) and consumerProgress -g
    (the client holding each queue), as mqadmin's."""
    with group(tmp_path) as (service, members), shared(service) as shm:
        produce(service, QUEUES)
        a, b = members.start("a", poll_s=30), members.start("b", poll_s=30)
        wait_until(lambda: split(shm, {a.pid, b.pid}) == [8, 8], 60, "a and b to hold 8 queues each")
        rows = admin(service, "consumerConnection", "-g", GROUP)
        assert [(r["clientId"], r["pid"], r["messageModel"], r["queueCount"]) for r in rows] == [
            ("a", a.pid, "CLUSTERING", 8),
            ("b", b.pid, "CLUSTERING", 8),
        ]
        assert [q["queueId"] for q in rows[0]["queueList"]] == list(range(8)), "a sorts first: queues 0-7"
        progress = admin(service, "consumerProgress", "-g", GROUP)
        assert {r["queueId"]: r["clientId"] for r in progress} == {
            q: "a" if q < 8 else "b" for q in range(16)
        }


def test_a_member_learns_it_lost_a_queue_and_its_late_commit_is_ignored(tmp_path: Path) -> None:
    """The push consumer's contract: the queue listener reports the move inside `poll`, `owns`
    turns False, and a commit of the lost queue (a worker finishing late) does not set the new
    holder's progress back."""
    from rmq_mp.client.consumer import Consumer

    with group(tmp_path) as (service, _members):
        produce(service, 64)
        changes: list[tuple[str, list[int], list[int]]] = []
        with Consumer.attach(service.names.base, GROUP, client_id="a") as a:
            a.set_queue_listener(lambda topic, released, claimed: changes.append((topic, released, claimed)))
            a.subscribe(TOPIC)
            first = a.poll(0, 64)
            assert changes == [(TOPIC, [], list(range(QUEUES)))]
            assert {m.queue_id for m in first} == set(range(QUEUES))
            a.commit()
            with Consumer.attach(service.names.base, GROUP, client_id="b") as b:
                b.subscribe(TOPIC)
                assert b.poll(0) == [], "a still holds every queue: b waits for a's release"
                a.poll(0)  # a rebalances: releases 8..15 to b
                assert changes[-1] == (TOPIC, list(range(8, QUEUES)), [])
                assert not a.owns(TOPIC, 8)
                assert a.owns(TOPIC, 0)
                a.commit({(TOPIC, 8): 1})  # late: ignored
                assert a.committed_offset(TOPIC, 8) == 4, "the group's offset stays a's last commit"
                assert b.poll(0) == []
                assert b.assignment() == {TOPIC: list(range(8, QUEUES))}
                produce(service, 16, start=64)
                assert sorted(m.queue_id for m in b.poll(1, 64)) == list(range(8, QUEUES))
                b.commit()
            assert sorted(m.queue_id for m in a.poll(1, 64)) == list(range(8)), "8..15 committed by b"
            assert a.assignment() == {TOPIC: list(range(QUEUES))}, "b closed: a holds every queue again"
            assert changes[-1] == (TOPIC, [], list(range(8, QUEUES)))


def test_a_store_stopping_inside_a_poll_is_store_not_running(tmp_path: Path, monkeypatch: Any) -> None:
    """The store stops after a poll's running check and before its first rebalance (found by
    tests/integration/test_consumer_model.py: a member riding restarts died of it): joining posts
    the other members' waiter semaphores, gone with the store. The poll must say the store is not
    running, which a consumer riding restarts waits out, not raise a bare ShmAttachError."""
    from rmq_mp.client.consumer import Consumer
    from rmq_mp.client.rebalance import Rebalance
    from rmq_mp.errors import StoreNotRunningError

    with group(tmp_path) as (service, _members):
        produce(service, QUEUES)
        with (
            Consumer.attach(service.names.base, GROUP, client_id="a") as a,
            Consumer.attach(service.names.base, GROUP, client_id="b") as b,
        ):
            a.subscribe(TOPIC)
            a.poll(0)  # a is a member: b's join posts its waiter
            b.subscribe(TOPIC)
            join = Rebalance.join

            def stop_then_join(rebalance: Rebalance) -> None:
                assert service.stop() == 0  # every semaphore of the store unlinked
                join(rebalance)

            monkeypatch.setattr(Rebalance, "join", stop_then_join)
            with pytest.raises(StoreNotRunningError, match="stopped"):
                b.poll(0)


def test_a_commit_after_a_killed_store_started_again_goes_to_the_new_start(tmp_path: Path) -> None:
    """A consumer attached when the supervisor and workers were killed -9 and the store started
    again: its next commit is the new start's (found by tests/integration/test_consumer_model.py:
    the dead start's heartbeat looks fresh for SUPERVISOR_STALE_MS, so a commit made in those
    3 s, a clean leave's last one too, went into the dead start's memory and was lost). The new
    start fences the dead one first, and a consumer takes a fenced start for a stopped one."""
    from rmq_mp.client.consumer import Consumer

    service = start_service(tmp_path, defaultTopicQueueNums=str(QUEUES))
    try:
        produce(service, QUEUES)
        with Consumer.attach(service.names.base, GROUP, client_id="a") as a:
            a.subscribe(TOPIC)
            assert len(a.poll(0, 64)) == QUEUES
            pids = [service.process.pid, *(p.pid for p in psutil.Process(service.process.pid).children())]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            service.process.wait(30)
            wait_processes_gone(pids)
            service = start_service(tmp_path, defaultTopicQueueNums=str(QUEUES))
            a.commit({(TOPIC, 0): 1})
            with Consumer.attach(service.names.base, GROUP, client_id="reader") as reader:  # no join
                assert reader.committed_offset(TOPIC, 0) == 1, "the commit went to the dead start"
    finally:
        assert service.stop() == 0
        cleanup_started()
