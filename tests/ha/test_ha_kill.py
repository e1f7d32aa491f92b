"""kill -9 at seeded points under SYNC_MASTER load, of the master's ha worker (the supervisor
restarts it, the slave connects again; in ``master_ha_waiting`` the slave's link is stalled by
the fault relay first, so puts are proven waiting when it dies), the slave's ha worker, and the
slave's supervisor (its workers exit by themselves; `run.py start` again). Every put is answered with a RocketMQ status
(none hangs), no PUT_OK comes before the slave acknowledged it, every PUT_OK message is on the
slave, and the two commit logs are byte-identical after each."""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from pathlib import Path

import psutil
import pytest

from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm.layout import Role
from tests.ha.pair import assert_same_log, commit_log, start_master, start_slave, wait_caught_up
from tests.ha.relay import Relay
from tests.ha.sync_load import SyncLoad
from tests.service import RunningService, wait_processes_gone, wait_until

SYNC = {"brokerRole": "SYNC_MASTER", "slaveTimeout": "1000", "haSendHeartbeatInterval": "200"}
SLAVE = {"haSendHeartbeatInterval": "200"}
SEEDS = [41, 42]


def _restarted(service: RunningService, pid: int) -> None:
    wait_until(lambda: service.worker_pid("ha") not in (0, pid), 30, "the ha worker to be restarted")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", ["master_ha", "master_ha_waiting", "slave_ha", "slave_supervisor"])
def test_kill_under_sync_master_load(tmp_path: Path, target: str, seed: int) -> None:
    rng = random.Random(f"{target}-{seed}")
    master = start_master(tmp_path, **SYNC)
    with Relay(master.read(layout.HA_LISTEN_PORT)) as relay:
        _kill_under_load(tmp_path, master, relay, target, seed, rng)


def _kill_under_load(
    tmp_path: Path, master: RunningService, relay: Relay, target: str, seed: int, rng: random.Random
) -> None:
    port = relay.port
    slave = start_slave(tmp_path, port, **SLAVE)
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    load = SyncLoad(master, threads=rng.choice([1, 2, 3]))
    store = RunningStore.attach(master.names.base, Role.CONSUMER)
    try:
        for _ in range(rng.choice([1, 2])):  # one or two kills a run
            load.wait_put_ok(len(load.put_ok()) + rng.randrange(50, 400))
            if target == "master_ha_waiting":
                relay.stall()
                ring = store.shm.replicas
                assert ring is not None
                wait_until(lambda: ring.waiting() > 0, 20, "a put waiting for the slave")  # noqa: B023
                answered = len(load.answers)
                pid = master.worker_pid("ha")
                os.kill(pid, signal.SIGKILL)
                _restarted(master, pid)

                def timed_out(answered: int = answered) -> bool:  # waiting across the kill, then answered
                    return any(s is PutMessageStatus.FLUSH_SLAVE_TIMEOUT for s, _ in load.answers[answered:])

                wait_until(timed_out, 30, "a put waiting at the kill to be answered FLUSH_SLAVE_TIMEOUT")
                relay.heal()
            elif target == "master_ha":
                pid = master.worker_pid("ha")
                os.kill(pid, signal.SIGKILL)
                _restarted(master, pid)
            elif target == "slave_ha":
                pid = slave.worker_pid("ha")
                os.kill(pid, signal.SIGKILL)
                _restarted(slave, pid)
            else:
                workers = [p.pid for p in psutil.Process(slave.process.pid).children()]
                os.kill(slave.process.pid, signal.SIGKILL)
                slave.process.wait(10)
                wait_processes_gone(workers)
                slave = start_slave(tmp_path, port, **SLAVE)
            at_kill = len(load.put_ok())
            load.wait_put_ok(at_kill + 100)  # SYNC_MASTER answers PUT_OK again
    finally:
        store.close()
        load.stop()
    end = master.read(layout.WROTE_POSITION)
    wait_caught_up(slave, end)
    wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 30, "the master to see the ack")
    assert_same_log(master, slave, end)
    assert slave.stop() == 0
    missing = load.missing_on(b"".join(commit_log(slave).values()))
    ok = load.put_ok()
    assert not missing, f"{len(missing)} of {len(ok)} PUT_OK messages not on the slave"
    statuses = Counter(status.name for status, _ in load.answers)
    print(f"{target} seed {seed}: {dict(statuses)}; all {len(ok)} PUT_OK on the slave")
    if target.startswith("master_ha"):
        assert master.read(layout.worker_field("ha", "restarts")) >= 1
