"""Stress (issue 6): N producer processes and M consumer processes on one real store for a
bounded time, every message checked: each PUT_OK is read exactly once, byte for byte, with
contiguous queue offsets, by consumers reading concurrently with the producers.

Sized for the default ``pytest -n auto`` run on 2 cores: each case runs its load for
``RMQ_STRESS_SECONDS`` (4 s by default; about 15 s a case with start and drain). Set
``RMQ_STRESS_SECONDS``, ``RMQ_STRESS_PRODUCERS`` (3) and ``RMQ_STRESS_CONSUMERS`` (2) higher on
bigger machines. The seed is printed; ``RMQ_STRESS_SEED`` replays one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
from pathlib import Path

import pytest

from shm import layout
from tests.load import QUEUES, TOPICS
from tests.service import running_service, wait_until
from tests.stress.workers import consume, produce

pytestmark = [pytest.mark.slow, pytest.mark.stress]

MODES = {
    "ASYNC": {"flushDiskType": "ASYNC_FLUSH"},
    "ASYNC+pool": {
        "flushDiskType": "ASYNC_FLUSH",
        "transientStorePoolEnable": "true",
        "transientStorePoolSize": "3",
    },
    "SYNC": {"flushDiskType": "SYNC_FLUSH"},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_producers_and_consumers_every_message_once(tmp_path: Path, mode: str) -> None:
    seconds = float(os.environ.get("RMQ_STRESS_SECONDS", "4"))
    n_producers = int(os.environ.get("RMQ_STRESS_PRODUCERS", "3"))
    n_consumers = int(os.environ.get("RMQ_STRESS_CONSUMERS", "2"))
    seed = int(os.environ.get("RMQ_STRESS_SEED", random.randrange(1 << 30)))
    print(f"stress seed {seed} (RMQ_STRESS_SEED={seed} replays it)")
    ctx = mp.get_context("spawn")
    # 256 KiB files: the load rolls many files, so appends meet file ends and pool buffers turn over.
    with running_service(tmp_path, mappedFileSizeCommitLog=str(256 << 10), **MODES[mode]) as service:
        out = ctx.Queue()
        stop = ctx.Event()
        all_queues = [(t, q) for t in TOPICS for q in range(QUEUES)]
        consumers = [
            ctx.Process(target=consume, args=(service.names.base, i, all_queues[i::n_consumers], stop, out))
            for i in range(n_consumers)
        ]
        producers = [
            ctx.Process(target=produce, args=(service.names.base, i, seconds, seed, out))
            for i in range(n_producers)
        ]
        for proc in consumers + producers:
            proc.start()
        try:
            reports = [out.get(timeout=seconds + 120) for _ in producers]
            for proc in producers:
                proc.join(30)
                assert proc.exitcode == 0
            # Everything acknowledged is written; consumers stop once reput has dispatched all of it.
            wait_until(
                lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
                60,
                "reput to dispatch every acknowledged message",
            )
            stop.set()
            reports += [out.get(timeout=120) for _ in consumers]
            for proc in consumers:
                proc.join(30)
                assert proc.exitcode == 0
        finally:  # a failed wait must not leave workers running after the test
            for proc in consumers + producers:
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
    acked = {(p, s) for kind, p, seqs, _o in reports if kind == "producer" for s in seqs}
    statuses = [name for kind, _p, _s, other in reports if kind == "producer" for name in other]
    seen = [pair for kind, _c, pairs, _p in reports if kind == "consumer" for pair in pairs]
    problems = [text for kind, _c, _s, found in reports if kind == "consumer" for text in found]
    assert statuses == [], f"seed {seed}: sends not PUT_OK: {sorted(set(statuses))}"
    assert problems == [], f"seed {seed}: {problems[:10]}"
    assert len(acked) > 100, f"seed {seed}: only {len(acked)} messages in {seconds} s"
    assert len(seen) == len(set(seen)), f"seed {seed}: a message was read twice"
    assert set(seen) == acked, f"seed {seed}: {len(acked - set(seen))} acknowledged messages never read"
