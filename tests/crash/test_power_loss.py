"""Simulated power loss: every byte the store had not made durable is gone after the crash.

A SYNC_FLUSH store under load is killed whole (SIGKILL of every process). Then, as a lost page
cache would, the test discards: every commit-log byte at or above the flushed offset the store
recorded; and every ConsumeQueue and index entry from the file abnormal recovery will restart
from (chosen by the checkpoint, whose timestamps are written only after the queues are flushed).
The store is restarted with `run.py start`; every send acknowledged PUT_OK must be back, in
contiguous queues, findable by key.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.index_file import IndexFile
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.recovery import _choose_abnormal_start
from rmq_mp.store.reporter import Reporter
from shm import layout
from tests.integration.test_round_trip import independent_records
from tests.service import (
    acknowledged,
    drain_every_queue,
    running_service,
    start_producers,
    start_service,
    wait_until,
)


def discard_unflushed(root: Path, flushed: int, file_size: int, config: object) -> tuple[int, int]:
    """Zero what a power loss would lose; returns (replay start recovery will use, queue entries wiped)."""
    for path in sorted(p for p in (root / "commitlog").iterdir() if p.name.isdigit()):
        start = int(path.name)
        if start >= flushed:
            path.write_bytes(bytes(file_size))
        elif start + file_size > flushed:
            with path.open("r+b") as f:
                f.seek(flushed - start)
                f.write(bytes(start + file_size - flushed))
    with MessageStore.open(config=config, read_only=True) as store:  # type: ignore[arg-type]
        files = store.commit_log.mfq.files
        replay_from = files[_choose_abnormal_start(store)].file_from_offset if files else 0
    wiped = 0
    for qfile in (p for p in (root / "consumequeue").rglob("*") if p.is_file()):
        data = bytearray(qfile.read_bytes())
        for pos in range(0, len(data), CQ_STORE_UNIT_SIZE):
            if int.from_bytes(data[pos : pos + 8], "big") >= replay_from:
                wiped += len(data[pos:].rstrip(b"\0")) // CQ_STORE_UNIT_SIZE
                data[pos:] = bytes(len(data) - pos)
                break
        qfile.write_bytes(bytes(data))
    checkpoint = StoreCheckpoint(root / "checkpoint", writable=False)
    for path in sorted((root / "index").iterdir()):
        index = IndexFile(path, 1000, 4000, writable=True, reporter=Reporter())
        index.truncate(replay_from, lambda _phy: checkpoint.index_msg_timestamp)
        index.close()
    return replay_from, wiped


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_power_loss_keeps_every_acknowledged_sync_put(tmp_path: Path, seed: int) -> None:
    settings = {
        "flushDiskType": "SYNC_FLUSH",
        "flushConsumeQueueThoroughInterval": "300",
        "flushIntervalConsumeQueue": "100",
    }
    service = start_service(tmp_path, **settings)
    loaders, outs = start_producers(service, tmp_path, [3000, 3000], 4)
    wait_until(lambda: service.read(layout.PUT_COUNT) > 1500 + seed * 100, 120, "load under way")
    flushed_before_kill = service.read(layout.FLUSHED_POSITION)
    pids = [
        service.process.pid,
        *(p.pid for p in psutil.Process(service.process.pid).children(recursive=True)),
        *(p.pid for p in loaders),
    ]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in [service.process, *loaders]:
        proc.wait(30)
    flushed = service.read(layout.FLUSHED_POSITION)  # the last durable point the store recorded
    assert flushed >= flushed_before_kill
    replay_from, wiped = discard_unflushed(
        service.root, flushed, service.config.mapped_file_size_commit_log, service.config
    )
    assert wiped > 0, "the simulated loss took queue entries that recovery must rebuild"
    acked = {}
    for i, out in enumerate(outs):
        for ack in acknowledged(out):
            if ack["status"] == "PUT_OK":
                acked[(i, ack["seq"])] = ack
                assert ack["phy"] < flushed, "a PUT_OK under SYNC_FLUSH is below the flushed offset"
    with running_service(tmp_path, **settings) as again, Consumer.attach(again.root, "verify") as consumer:
        seen = drain_every_queue(consumer)
    records = independent_records(again.root / "commitlog", again.config.mapped_file_size_commit_log)
    stored = {}
    for rec in records:
        props = dict(kv.split("\x01", 1) for kv in rec["props"].split("\x02"))
        stored[(int(props["producer"]), int(props["seq"]))] = rec
    assert seen == len(stored)
    missing = [key for key in acked if key not in stored]
    assert not missing, f"seed {seed}: acknowledged puts lost: {missing[:5]} (replay from {replay_from})"
