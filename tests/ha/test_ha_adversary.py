"""Replication attacked on real processes over loopback, every choice drawn from a seed (issue 31:
"Under SYNC_MASTER, after kill -9 of the master's whole process tree, every message answered
PUT_OK is on the slave").

A SYNC_MASTER, its SLAVE behind the fault relay (tests/ha/relay.py), and 2-4 producer processes
(tests/ha/ha_producer.py) sending at full rate. The seed draws the commit-log file size (64 KiB to
1 MiB with small messages, or 5-8 MiB with 1-3.75 MiB messages in the mix: a roll every few
puts), then up to two faults under load, each followed by PUT_OK answers again: kill -9 of the
slave's ha worker, of its supervisor alone, of its whole tree (restarted), of the master's ha
worker, or the link stalled or half-open while puts wait. Then the master dies by kill -9 (its
whole tree in either order, its supervisor alone, or its ha worker then the tree) at a drawn
moment: just as its write position enters a new file, after a drawn amount of acknowledged
bytes, or while its link is stalled or half-open and puts wait for the slave.

Checked: every answer is PUT_OK, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE until the kill;
every PUT_OK message is on the slave, byte for byte, in its queue at its queue offset and its
commit-log offset; the slave's log is the master's byte for byte. Then the slave is promoted
(the seed draws SYNC_MASTER or ASYNC_MASTER), new producer processes send to it, and the killed
master returns as its slave: it sets aside what only it had (a fork) and converges byte for
byte; no queue offset of a PUT_OK message is given to another message, and both stores serve
every message acknowledged on either master where it was acknowledged.

RMQ_HA_ADVERSARY_RUNS=N runs N seeds (default 3) from RMQ_HA_ADVERSARY_SEED (default 1); a
failure names its seed and scenario.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm.layout import Role
from tests.ha.ha_producer import keys_for, message_for
from tests.ha.pair import assert_same_log, put, start_master, start_slave, wait_caught_up
from tests.ha.relay import Relay
from tests.ha.test_promote import promote
from tests.service import (
    ROOT,
    RunningService,
    acknowledged,
    leftover_processes,
    wait_processes_gone,
    wait_until,
)

RUNS = int(os.environ.get("RMQ_HA_ADVERSARY_RUNS", "3"))
FIRST_SEED = int(os.environ.get("RMQ_HA_ADVERSARY_SEED", "1"))
LINK = {"haSendHeartbeatInterval": "200", "haHousekeepingInterval": "1500"}
"""Heartbeats every 200 ms; a link silent for 1.5 s is dropped (tests/ha/test_faults.py's)."""
SYNC = {"brokerRole": "SYNC_MASTER", "slaveTimeout": "500"}
STORED = {"PUT_OK", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}
"""What a SYNC_MASTER answers while its slave comes and goes: each means the message is stored."""
FAULTS = (
    "slave_ha",
    "slave_supervisor",
    "slave_tree",
    "master_ha",
    "stall",
    "half_open_up",
    "half_open_down",
)
LINK_FAULTS = ("stall", "half_open_up", "half_open_down")


@dataclass(frozen=True)
class Scenario:
    seed: int
    file_bytes: int
    big_permille: int
    small_max: int
    producers: int
    faults: tuple[str, ...]
    moment: str
    """"roll" (the write position just entered a new file), "acked" (after a drawn amount of
    acknowledged bytes) or a link fault in force with puts waiting."""
    kill: str
    promoted_role: str

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        rng = random.Random(seed)
        big = rng.random() < 0.35
        return cls(
            seed=seed,
            file_bytes=rng.choice([5 << 20, 8 << 20])
            if big
            else rng.choice([64 << 10, 128 << 10, 256 << 10, 1 << 20]),
            big_permille=rng.choice([15, 40]) if big else 0,
            small_max=rng.choice([300, 3000, 12000]),
            producers=rng.choice([2, 3, 4]),
            faults=tuple(rng.sample(FAULTS, rng.choice([0, 1, 1, 2]))),
            moment=rng.choice(["roll", "roll", "acked", *LINK_FAULTS]),
            kill=rng.choice(["tree", "workers_first", "supervisor", "ha_then_tree"]),
            promoted_role=rng.choice(["SYNC_MASTER", "ASYNC_MASTER"]),
        )


class Producers:
    """ha_producer processes against one store; their answers read back from their files."""

    def __init__(
        self,
        store: RunningService,
        out: Path,
        scenario: Scenario,
        first: int,
        count: int,
        n: int,
        hold: bool = False,
    ):
        self.scenario, self.first = scenario, first
        self.outs = [out / f"producer{first + i}.jsonl" for i in range(n)]
        big, small = str(scenario.big_permille), str(scenario.small_max)
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.ha.ha_producer",
                    store.names.base,
                    str(first + i),
                    str(scenario.seed),
                    str(count),
                    str(path),
                    big,
                    small,
                    "1" if hold else "0",
                ],
                cwd=ROOT,
            )
            for i, path in enumerate(self.outs)
        ]

    def answers(self) -> list[tuple[int, dict[str, Any]]]:
        return [(self.first + i, ack) for i, out in enumerate(self.outs) for ack in acknowledged(out)]

    def kill(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)

    def wait(self, timeout_s: float = 60) -> None:
        for proc in self.procs:
            assert proc.wait(timeout_s) == 0


def _tree(service: RunningService) -> list[psutil.Process]:
    return psutil.Process(service.process.pid).children(recursive=True)


def _kill_slave(
    tmp_path: Path, slave: RunningService, how: str, port: int, settings: dict[str, str]
) -> RunningService:
    if how == "slave_ha":
        pid = slave.worker_pid("ha")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: slave.worker_pid("ha") not in (0, pid), 30, "the slave's ha worker restarted")
        return slave
    workers = _tree(slave)
    os.kill(slave.process.pid, signal.SIGKILL)
    if how == "slave_tree":
        for proc in workers:
            proc.kill()
    slave.process.wait(10)
    wait_processes_gone([p.pid for p in workers])
    return start_slave(tmp_path, port, **settings)


def _kill_master(master: RunningService, how: str) -> None:
    """kill -9 of the master's supervisor and, unless ``how`` is "supervisor", of every worker;
    its workers are gone on return."""
    workers = _tree(master)
    supervisor = psutil.Process(master.process.pid)
    if how == "ha_then_tree":
        os.kill(master.worker_pid("ha"), signal.SIGKILL)
    order = [*workers, supervisor] if how == "workers_first" else [supervisor, *workers]
    for proc in order if how != "supervisor" else [supervisor]:
        proc.send_signal(signal.SIGKILL)
    master.process.wait(10)
    wait_processes_gone([p.pid for p in workers])


def _link_fault(relay: Relay, fault: str, master: RunningService, store: RunningStore) -> None:
    """The fault in force and a put proven waiting for the slave through it."""
    if fault == "stall":
        relay.stall()
    else:
        relay.half_open(fault.removeprefix("half_open_"))
    ring = store.shm.replicas
    assert ring is not None
    wait_until(lambda: ring.waiting() > 0, 30, f"a put waiting for the slave through {fault}")


def _fault(
    tmp_path: Path,
    fault: str,
    master: RunningService,
    slave: RunningService,
    relay: Relay,
    store: RunningStore,
    settings: dict[str, str],
) -> RunningService:
    """One fault under load, lifted (a link fault once a waiting put timed out); the slave now."""
    if fault in LINK_FAULTS:
        timeouts = master.read(layout.HA_FLUSH_SLAVE_TIMEOUT)
        _link_fault(relay, fault, master, store)
        wait_until(lambda: master.read(layout.HA_FLUSH_SLAVE_TIMEOUT) > timeouts, 30, "a put to time out")
        relay.heal()
    elif fault == "master_ha":
        pid = master.worker_pid("ha")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: master.worker_pid("ha") not in (0, pid), 30, "the master's ha worker restarted")
    else:
        slave = _kill_slave(tmp_path, slave, fault, relay.port, {**settings, "haListenPort": "0"})
    return slave


def _acked_grows(master: RunningService, by_bytes: int, what: str) -> None:
    start = master.read(layout.HA_ACKED_OFFSET)
    wait_until(
        lambda: master.read(layout.HA_ACKED_OFFSET) >= start + by_bytes, 60, f"{by_bytes} bytes acked {what}"
    )


def _wait_roll(master: RunningService, file_bytes: int, rolls: int) -> None:
    """Return as soon as the master's write position enters a new file ``rolls`` times over."""
    table = master.table()
    try:
        target = table.get(layout.WROTE_POSITION) // file_bytes + rolls
        wait_until(lambda: table.get(layout.WROTE_POSITION) // file_bytes >= target, 60, "a file roll")
    finally:
        table.close()


def _check_served(
    service: RunningService, acks: list[tuple[int, dict[str, Any]]], scenario: Scenario
) -> None:
    """Every ack's message is served by ``service`` at its queue offset, byte for byte."""
    with Consumer.attach(service.names.base, f"checker_{os.getpid()}") as consumer:
        for producer, ack in acks:
            topic, queue_id, body = message_for(
                scenario.seed, producer, ack["seq"], scenario.big_permille, scenario.small_max
            )
            got = consumer.pull(topic, queue_id, ack["queue_offset"], 1)
            where = f"{service.root.name}: producer {producer} seq {ack['seq']} ({ack['status']}) at {topic}/{queue_id}/{ack['queue_offset']}"
            assert got.status is GetMessageStatus.FOUND, f"{where}: {got.status}"
            [m] = got.messages
            assert (m.topic, m.queue_id, m.queue_offset) == (topic, queue_id, ack["queue_offset"]), where
            assert m.commit_log_offset == ack["phy"], (
                f"{where}: at {m.commit_log_offset}, acknowledged at {ack['phy']}"
            )
            assert m.keys == keys_for(producer, ack["seq"]), where
            assert m.uniq_key == ack["uniq_key"], where
            assert m.body == body, f"{where}: another body"


def _positions(acks: list[tuple[int, dict[str, Any]]]) -> dict[tuple[str, int, int], tuple[int, int]]:
    """(topic, queue, queue offset) -> (producer, seq); no position twice."""
    held: dict[tuple[str, int, int], tuple[int, int]] = {}
    for producer, ack in acks:
        key = (ack["topic"], ack["queue_id"], ack["queue_offset"])
        assert key not in held, f"queue offset {key} acknowledged to {held[key]} and {(producer, ack['seq'])}"
        held[key] = (producer, ack["seq"])
    return held


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + RUNS))
def test_sync_master_killed_then_failover_and_return(tmp_path: Path, seed: int) -> None:
    scenario = Scenario.draw(seed)
    print(f"seed {seed}: {scenario}")
    rng = random.Random(f"moments-{seed}")
    settings = {**LINK, "mappedFileSizeCommitLog": str(scenario.file_bytes)}
    unit = max(scenario.file_bytes // 2, 32 << 10) if not scenario.big_permille else 1 << 20
    master = start_master(tmp_path, **settings, **SYNC)
    relay = Relay(master.read(layout.HA_LISTEN_PORT))
    try:
        slave = start_slave(tmp_path, relay.port, **settings, haListenPort="0")  # a master once promoted
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
        store = RunningStore.attach(master.names.base, Role.CONSUMER)
        load = Producers(master, tmp_path, scenario, 0, 1_000_000, scenario.producers, hold=True)
        try:
            _acked_grows(master, unit * rng.randint(2, 10), "at first")
            for fault in scenario.faults:
                slave = _fault(tmp_path, fault, master, slave, relay, store, settings)
                _acked_grows(master, unit * rng.randint(1, 3), f"after {fault}")
            if scenario.moment == "roll":
                _wait_roll(master, scenario.file_bytes, rng.randint(1, 3))
            elif scenario.moment == "acked":
                _acked_grows(master, unit * rng.randint(2, 10), "before the kill")
            else:
                _link_fault(relay, scenario.moment, master, store)
            alive = load.answers()  # answered while the master lived: RocketMQ's SYNC_MASTER answers
            _kill_master(master, scenario.kill)
        finally:
            load.kill()
            store.close()
        wait_until(lambda: not leftover_processes(master.names), 30, "the master's processes to exit")
        old_answers = load.answers()  # after the death a put may also be refused, or fail
    finally:
        relay.close()

    assert {ack["status"] for _, ack in alive} <= STORED, Counter(ack["status"] for _, ack in alive)
    statuses = Counter(ack["status"] for _, ack in old_answers)
    put_ok = [(p, ack) for p, ack in old_answers if ack["status"] == "PUT_OK"]
    assert put_ok, statuses
    wait_until(
        lambda: slave.read(layout.HA_SLAVE_STATE) != layout.SLAVE_CONNECTED,
        30,
        "the slave to lose its master",
    )
    slave_end = slave.read(layout.WROTE_POSITION)
    wait_until(lambda: slave.read(layout.REPUT_FROM_OFFSET) >= slave_end, 30, "the slave's dispatch")
    _check_served(slave, put_ok, scenario)
    assert_same_log(master, slave, slave_end)
    old_ok = _positions(put_ok)
    master_end = max(ack["phy"] for _, ack in old_answers if ack["status"] in STORED)
    big_ok = sum(1 for _, ack in put_ok if ack["body_bytes"] >= 1 << 20)

    # Failover: the slave promoted, producers move to it.
    assert promote(slave, "--role", scenario.promoted_role) == 0
    promoted = slave
    (tmp_path / "after").mkdir()
    after = Producers(promoted, tmp_path / "after", scenario, 100, rng.choice([50, 200]), 2)
    after.wait()
    new_answers = after.answers()
    new_statuses = {ack["status"] for _, ack in new_answers}
    assert new_statuses <= (STORED if scenario.promoted_role == "SYNC_MASTER" else {"PUT_OK"}), new_statuses

    # The old master returns as the new master's slave: a fork is set aside, never merged.
    wait_until(lambda: promoted.read(layout.HA_LISTEN_PORT) > 0, 20, "the new master's HA listener")
    old = start_slave(
        tmp_path, promoted.read(layout.HA_LISTEN_PORT), name="master", **{**settings, "haListenPort": "-1"}
    )
    old_end = old.read(layout.WROTE_POSITION)

    def now(field: layout.Field) -> int:  # -1 while the store restarts itself (no table)
        try:
            return old.read(field)
        except ShmAttachError:
            return -1

    def compared() -> bool:
        return (
            now(layout.FORK_RESTARTS) > 0
            or now(layout.HA_SLAVE_STATE) == layout.SLAVE_REFUSED
            or now(layout.HA_SLAVE_RECEIVED_END) > old_end
            or (
                now(layout.HA_SLAVE_STATE) == layout.SLAVE_CONNECTED and now(layout.HA_UNCONFIRMED_FROM) == -1
            )
        )

    wait_until(compared, 60, "the old master to compare its log with the new master's")
    forked = (old.root / "diverged").exists()
    if forked:
        wait_until(lambda: now(layout.FORK_RESTARTS) == 1, 60, "the old master to restart itself")
    assert now(layout.HA_SLAVE_STATE) != layout.SLAVE_REFUSED, (old.root / "logs" / "ha.log").read_text()
    (tmp_path / "rejoined").mkdir()
    last = Producers(promoted, tmp_path / "rejoined", scenario, 200, 50, 1)
    last.wait()
    last_answers = last.answers()
    assert {ack["status"] for _, ack in last_answers} <= STORED

    end = promoted.read(layout.WROTE_POSITION)
    wait_caught_up(old, end)
    stored_after = [(p, ack) for p, ack in new_answers + last_answers if ack["status"] in STORED]
    for key, who in _positions(stored_after).items():
        assert key not in old_ok, f"queue offset {key} of PUT_OK {old_ok[key]} given again to {who}"
    for service in (promoted, old):
        _check_served(service, put_ok + stored_after, scenario)
    assert old.stop() == 0
    assert promoted.stop() == 0
    assert_same_log(promoted, old, end)
    print(
        f"seed {seed}: answers {dict(statuses)}; all {len(put_ok)} PUT_OK ({big_ok} of 1 MiB or more) on the "
        f"slave at their offsets, killed in file {master_end // scenario.file_bytes}; "
        f"promoted {scenario.promoted_role}, {len(stored_after)} stored after; "
        + ("the old master forked, set aside and rejoined" if forked else "the old master rejoined")
    )


def test_a_slave_files_ahead_of_its_master_finds_the_fork(tmp_path: Path) -> None:
    """A returning old master files ahead of the new master's end (it wrote on while its slave
    lagged): its first report, the start of its last record, is beyond the master's end, so it
    must not report again before the master's answer. Its repeated report was closed by the
    master as a report beyond the end (#3015) before the master's heartbeat told it "nothing
    there", and it asked from the same record forever (found by seed 2 of the test above)."""
    hb = {"haSendHeartbeatInterval": "200", "mappedFileSizeCommitLog": str(64 << 10)}
    a = start_master(tmp_path, "a", **hb)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **hb)
    shared = put(a, 100)
    wait_caught_up(b, shared)
    assert b.stop() == 0
    b = start_master(tmp_path, "b", **hb)
    b_end = put(b, 1000, body_bytes=300)  # five files past a's end
    assert b.stop() == 0
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **hb)
    wait_until(lambda: _now(b, layout.FORK_RESTARTS) == 1, 60, "b to find the fork and restart itself")
    ha_log = (b.root / "logs" / "ha.log").read_text()
    assert f"its bytes [{shared}, {b_end}) are not the master's" in ha_log
    # One connection for the probe of its last record, one to locate a's end (a report of 0,
    # answered from a's last file), one from a record there: not one a file of the five ahead.
    [walker] = re.findall(r"ha\[(\d+)\][^\n]*forks from its master's", ha_log)
    reports = re.findall(rf"ha\[{walker}\][^\n]*connected to master [^\n]*, reporting (\d+)", ha_log)
    assert "0" in reports, reports
    assert len(reports) <= 4, reports
    end = put(a, 50)
    wait_caught_up(b, end)
    assert b.stop() == 0
    assert a.stop() == 0
    assert_same_log(a, b, end)


def _now(service: RunningService, field: layout.Field) -> int:
    """-1 while the store restarts itself (no table to attach to)."""
    try:
        return service.read(field)
    except ShmAttachError:
        return -1
