"""Kill -9 matrix: nothing acknowledged is lost when any process dies (docs/durability.md §3).

Each case: a store in one flush mode takes a sustained load from producer processes; at a
seeded random moment one kind of process gets SIGKILL (or everything at once); the store is
then restarted the way a user would (`run.py start`) and a verifier that decodes the commit-log
files itself (tests.integration.test_round_trip.independent_records, not the store's read
path) checks that every acknowledged message is there, byte for byte. The seed is in the test
id; rerun a case with ``-k <id>``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from pathlib import Path

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.store.message_store import MessageStore
from shm import layout
from tests.integration.test_round_trip import independent_records
from tests.load import message_for
from tests.service import (
    acknowledged,
    drain_every_queue,
    running_service,
    start_producers,
    start_service,
    wait_processes_gone,
    wait_until,
)

MODES = {
    "sync": {"flushDiskType": "SYNC_FLUSH"},
    "async": {},
    "async-pool": {"transientStorePoolEnable": "true", "transientStorePoolSize": "3"},
}
VICTIMS = [
    "producer",
    "allocator",
    "committer",
    "flusher",
    "reput",
    "cleaner",
    "scheduler",
    "supervisor",
    "everything",
]
PRODUCERS = 3
COUNT = 4000


ITERATIONS = int(os.environ.get("RMQ_KILL_ITERATIONS", "3"))
"""Seeded kill iterations per process kind, rotating through the flush modes (the committer only
runs with the pool): 3 in the default suite, so every kind dies once in each mode; the slow run
is ``RMQ_KILL_ITERATIONS=20 .venv/bin/python -m pytest tests/crash -m slow -n auto``."""


def cases() -> list[tuple[str, str, int]]:
    modes = list(MODES)
    out = []
    for v, victim in enumerate(VICTIMS):
        for k in range(ITERATIONS):
            mode = "async-pool" if victim == "committer" else modes[k % len(modes)]
            out.append((mode, victim, 1000 + 100 * v + k))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "victim", "seed"), cases(), ids=lambda v: str(v))
def test_kill(tmp_path: Path, mode: str, victim: str, seed: int) -> None:
    rnd = random.Random(seed)
    print(f"seed {seed}: mode {mode}, SIGKILL {victim}")
    service = start_service(tmp_path, **MODES[mode])
    batches = [rnd.choice([1, 1, 8]) for _ in range(PRODUCERS)]
    loaders, outs = start_producers(service, tmp_path, [COUNT] * PRODUCERS, batches)
    wait_until(
        lambda: service.read(layout.PUT_COUNT) > rnd.randint(500, 3 * COUNT // 2), 120, "load under way"
    )
    store_pids = {p.pid for p in psutil.Process(service.process.pid).children(recursive=True)}
    if victim == "producer":
        os.kill(loaders[0].pid, signal.SIGKILL)
    elif victim == "supervisor":
        os.kill(service.process.pid, signal.SIGKILL)
    elif victim == "everything":
        for pid in [service.process.pid, *store_pids, *(p.pid for p in loaders)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    else:
        os.kill(service.worker_pid(victim), signal.SIGKILL)
    for loader in loaders:
        loader.wait(300)
    if victim in ("supervisor", "everything"):
        service.process.wait(30)
        wait_processes_gone(store_pids)
        service = start_service(tmp_path, **MODES[mode])  # the restart a user would do
    acked = {
        (i, a["seq"]): a for i, out in enumerate(outs) for a in acknowledged(out) if a["status"] == "PUT_OK"
    }
    assert acked, "some puts were acknowledged before the kill"
    # Stop cleanly and check the files with an independent decoder.
    code = service.stop()
    assert code == 0, service.log.read_text()
    records = independent_records(service.root / "commitlog", service.config.mapped_file_size_commit_log)
    stored = {}
    for rec in records:
        props = dict(kv.split("\x01", 1) for kv in rec["props"].split("\x02")) if rec["props"] else {}
        key = (int(props["producer"]), int(props["seq"]))
        assert key not in stored, f"{key} stored twice"
        stored[key] = rec
    missing = [key for key in acked if key not in stored]
    assert not missing, f"seed {seed}: {len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    for key, ack in acked.items():
        rec = stored[key]
        topic, queue_id, body = message_for(*key)
        assert (rec["topic"], rec["queue_id"], rec["body"]) == (topic, queue_id, body)
        assert rec["phy"] == ack["phy"]
        assert rec["queue_offset"] == ack["queue_offset"]
    # And the restarted store serves them: every queue contiguous from 0.
    with running_service(tmp_path, **MODES[mode]) as again, Consumer.attach(again.root, "verify") as consumer:
        seen = drain_every_queue(consumer)
        assert seen == len(stored)
    # The index is complete: every stored message is found by its UNIQ_KEY.
    with MessageStore.open(config=again.config, read_only=True) as store:
        for rec in records:
            props = dict(kv.split("\x01", 1) for kv in rec["props"].split("\x02"))
            found = store.query_message(rec["topic"], props["UNIQ_KEY"])
            assert [m.commit_log_offset for m in found] == [rec["phy"]], props["UNIQ_KEY"]
