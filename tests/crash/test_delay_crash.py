"""Kill -9 of the scheduler or the supervisor while delayed messages flow (the crash contract).

A producer process sends delayed messages (levels 1 and 2 of ``1s 2s``) and records each
acknowledgement; at a seeded moment the scheduler worker (restarted by the supervisor) or the
supervisor (the store is then started again, as a user would) gets SIGKILL. Afterwards every
acknowledged delayed message reaches its real topic at least once (exactly once unless a crash
fell between its delivery and the next persist of its progress, as RocketMQ), never before its
due time, and nothing reaches it that was not sent.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import loads
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.store.schedule import SCHEDULE_TOPIC
from shm import layout
from tests.service import ROOT, acknowledged, start_service, wait_processes_gone, wait_until

SETTINGS = {"messageDelayLevel": "1s 2s", "flushDelayOffsetInterval": "300"}
LEVEL_MS = (1000, 2000)
COUNT = 600
TOPIC = "Delayed"
LOADER = """
import json, sys, time
from rmq_mp.put.producer import Producer
store, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with Producer.attach(store) as p, open(out, "w", encoding="utf-8") as f:
    for seq in range(count):
        r = p.send("Delayed", str(seq).encode(), properties={"seq": str(seq), "DELAY": str(1 + seq % 2)},
                   queue_id=seq % 4)
        f.write(json.dumps({"seq": seq, "status": r.status.name}) + "\\n")
        f.flush()
        time.sleep(0.005)  # a steady rate: the kill falls while deliveries and sends both go on
"""


def _drain(consumer: Consumer, topic: str, queues: range) -> list[MessageExt]:
    got = []
    for queue_id in queues:
        offset = 0
        while (result := consumer.pull(topic, queue_id, offset, 64)).status is GetMessageStatus.FOUND:
            got.extend(result.messages)
            offset = result.next_begin_offset
    return got


@pytest.mark.parametrize(("victim", "seed"), [("scheduler", 7001), ("supervisor", 7002)])
def test_kill_while_delayed_messages_flow(tmp_path: Path, victim: str, seed: int) -> None:
    rnd = random.Random(seed)
    service = start_service(tmp_path, **SETTINGS)
    out = tmp_path / "acks.jsonl"
    loader = subprocess.Popen(
        [sys.executable, "-c", LOADER, service.names.base, str(COUNT), str(out)], cwd=ROOT
    )
    try:
        at = rnd.randint(COUNT // 3, COUNT // 2)
        wait_until(lambda: len(acknowledged(out)) >= at, 120, "delayed sends under way")
        assert service.read(layout.worker_field("scheduler", "work_count")) > 0, "deliveries under way"
        if victim == "scheduler":
            old = service.worker_pid("scheduler")
            os.kill(old, signal.SIGKILL)
            wait_until(lambda: service.worker_pid("scheduler") not in (0, old), 30, "the scheduler's restart")
            loader.wait(300)
        else:
            store_pids = [p.pid for p in psutil.Process(service.process.pid).children(recursive=True)]
            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait(30)
            loader.wait(300)  # its sends after the kill are refused (not acknowledged)
            wait_processes_gone(store_pids)
            service = start_service(tmp_path, **SETTINGS)
        acked = {a["seq"] for a in acknowledged(out) if a["status"] == "PUT_OK"}
        assert len(acked) >= at
        with Consumer.attach(service.root, "verify") as consumer:
            delivered: list[MessageExt] = []

            def all_delivered() -> bool:
                delivered[:] = _drain(consumer, TOPIC, range(4))
                return acked <= {int(x.properties["seq"]) for x in delivered}

            wait_until(all_delivered, 120, "every acknowledged delayed message delivered")
            scheduled = {int(x.properties["seq"]): x for x in _drain(consumer, SCHEDULE_TOPIC, range(2))}
        counts = Counter(int(x.properties["seq"]) for x in delivered)
        assert set(counts) <= set(scheduled), "a delivery that was never scheduled"
        for x in delivered:
            seq = int(x.properties["seq"])
            origin = scheduled[seq]
            due = origin.store_timestamp + LEVEL_MS[seq % 2]
            assert x.store_timestamp >= due, f"seq {seq} delivered {due - x.store_timestamp} ms early"
            assert (x.queue_id, x.body) == (seq % 4, str(seq).encode())
        twice = sorted(seq for seq, n in counts.items() if n > 1)
        print(f"seed {seed}: {len(acked)} acknowledged, {len(counts)} delivered, {len(twice)} twice")
        code = service.stop()
        assert code == 0, service.log.read_text()
        # Every level went through its whole queue, and that is what delayOffset.json says.
        per_level = Counter(x.queue_id for x in scheduled.values())
        offsets = loads((service.root / "config" / "delayOffset.json").read_text())["offsetTable"]
        assert offsets == {1: per_level[0], 2: per_level[1]}
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait(10)
