"""Issue 35's private files on a replicated pair: what replication, the metadata channel and a
promotion create (the slave's commit log written by its ha worker, the offsets, topics and delay
progress it follows, the master's files, the role a promotion records) is 0700/0600 on both
stores, and so is every shared object, while running and after a stop; the ha worker's umask
is 077 as every other worker's (tests/integration/test_file_modes.py)."""

from __future__ import annotations

import os
from pathlib import Path

from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import put, wait_caught_up
from tests.ha.test_meta import commit, start_pair
from tests.ha.test_promote import promote
from tests.integration.test_file_modes import shm_modes, wrong_modes
from tests.service import kill_tree, wait_until


def test_a_replicated_and_promoted_pair_is_owner_only(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # the test's own (a usual shell's): the stores must not depend on it
    try:
        master, slave = start_pair(tmp_path, messageDelayLevel="1s")
        with Producer.attach(master.names.base) as producer:
            assert producer.send("Late", b"later", properties={"DELAY": "1"}, queue_id=0).ok
        end = put(master, 300)
        commit(master, "g1", {("HaTopic", 0): 120})
        wait_until(lambda: master.read(layout.WROTE_POSITION) > end, 30, "the delayed message delivered")
        end = master.read(layout.WROTE_POSITION)
        wait_caught_up(slave, end)
        wait_until(lambda: slave.read(layout.HA_META_MASTER_END) >= end, 20, "the master's end heard")
        with Consumer.attach(slave.names.base, "g1") as consumer:
            wait_until(lambda: consumer.committed_offset("HaTopic", 0) == 120, 20, "the offsets followed")
        for service in (master, slave):
            shared = shm_modes(service)
            assert shared, "no shared objects found"
            assert set(shared.values()) == {0o600}, shared
            assert wrong_modes(service.root, 0o700, 0o600) == {}, service.root
            status = Path(f"/proc/{service.worker_pid('ha')}/status").read_text()
            assert "Umask:\t0077" in status, "the ha worker writes with the store's umask"
        kill_tree(master)
        assert promote(slave, "--role", "ASYNC_MASTER") == 0
        with Producer.attach(slave.names.base) as producer:
            assert producer.send("HaTopic", b"after", queue_id=0).status is PutMessageStatus.PUT_OK
        assert set(shm_modes(slave).values()) == {0o600}, shm_modes(slave)
        assert wrong_modes(slave.root, 0o700, 0o600) == {}
        assert slave.stop() == 0
        kinds = {str(p.relative_to(slave.root)) for p in slave.root.rglob("*")}
        for expected in ("commitlog", "consumequeue", "index", "config", "logs", "checkpoint", "lock"):
            assert expected in kinds, sorted(kinds)
        assert any(k.startswith("consumequeue/SCHEDULE_TOPIC_XXXX/") for k in kinds), sorted(kinds)
        assert any(k.startswith("config/consumerOffset.json") for k in kinds), sorted(kinds)
        for root in (master.root, slave.root):
            assert wrong_modes(root, 0o700, 0o600) == {}, root
    finally:
        os.umask(old_umask)
