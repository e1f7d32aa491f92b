"""`python -m bench.reput_cpu`: reput's CPU a SYNC send with one producer, and a pass.

One SYNC_FLUSH store (bench.service's, 64 MiB commit-log files), one producer in this process
sending ``--sends`` 128 B messages (tags TagA, one key, 8 queues in turn) after 300: reput's CPU
(psutil, user + system) and passes (its work count) over the timed sends, printed as CPU a send,
sends a pass and CPU a pass. Light (one process sending), so a tree against another can
alternate quickly; run it under the heavy lock all the same.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import psutil

from bench.service import running_service
from rmq_mp.put.producer import Producer
from shm import layout

WARMUP_SENDS = 300


def one_run(sends: int) -> str:
    with (
        tempfile.TemporaryDirectory(prefix="bench-reput-cpu-") as tmp,
        running_service(
            Path(tmp), "reputcpu", flushDiskType="SYNC_FLUSH", mappedFileSizeCommitLog=str(64 << 20)
        ) as svc,
    ):
        reput = psutil.Process(svc.worker_pid("reput"))
        passes_field = layout.worker_field("reput", "work_count")
        table = svc.table()
        body = os.urandom(128)
        try:
            with Producer.attach(svc.names.base) as producer:
                for i in range(WARMUP_SENDS):
                    producer.send("T", body, tags="TagA", keys=[f"k{i}"], queue_id=i & 7)
                cpu_before, passes_before = sum(reput.cpu_times()[:2]), table.get(passes_field)
                began = time.perf_counter()
                for i in range(sends):
                    producer.send("T", body, tags="TagA", keys=[f"key-{i}"], queue_id=i & 7)
                elapsed = time.perf_counter() - began
                time.sleep(0.05)  # the last pass
                cpu_s = sum(reput.cpu_times()[:2]) - cpu_before
                passes = max(table.get(passes_field) - passes_before, 1)
        finally:
            table.close()
    return (
        f"{sends / elapsed:.0f} sends/s; reput {cpu_s * 1e6 / sends:.1f} us CPU a send, {passes} passes, "
        f"{sends / passes:.2f} sends a pass, {cpu_s * 1e6 / passes:.0f} us a pass"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reput_cpu", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--sends", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    for _ in range(args.runs):
        print(one_run(args.sends), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
