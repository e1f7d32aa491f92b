"""`python -m bench.sync_group`: issue 33's SYNC row alone, with the group commit's figures.

bench.shapes' `rocketmq` SYNC row (SYNC_FLUSH, ``--producers`` processes of ``--messages`` sends
after 500 each, tags TagA, one key as a list, 8 queues, 1 GiB files, pool off), ``--runs`` times
on fresh stores, each printed with what a group commit holds over the timed window: sends and
bytes per fsync (the store's put and flush counters), the wall time per fsync, and the CPU each
process used (flusher, reput, allocator, the producers together). ``--gather-us`` sets `syncFlushGatherMaxUs` (repeated: the values alternate run by
run, for a same-machine A/B; 0 is RocketMQ's flush-at-once). ``--settle`` starts timing
only once the allocator is idle (its files warmed: steady state); without it the window may
overlap the warming of the first 3 GiB, as bench.shapes' row does. The RocketMQ figure beside
it is the issue's (17.8k msgs/s, 4 Java threads, another day): not same-run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.service import RunningService, running_service, wait_until
from bench.shapes import ROCKETMQ_SYNC_MSGS_S, rocketmq_worker
from bench.store import CTX
from shm import layout

ROLES = ("flusher", "reput", "allocator")


def _cpu_s(pids: dict[str, list[int]]) -> dict[str, float]:
    used: dict[str, float] = {}
    for role, group in pids.items():
        total = 0.0
        for pid in group:
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        used[role] = total
    return used


def _allocator_idle(service: RunningService) -> bool:
    """The allocator used under 2% of a core over the last 0.5 s (its files are warmed)."""
    proc = psutil.Process(service.worker_pid("allocator"))
    before = sum(proc.cpu_times()[:2])
    time.sleep(0.5)
    return sum(proc.cpu_times()[:2]) - before < 0.01


def one_run(
    tmp: Path, run: int, producers: int, messages: int, file_mib: int, settle: bool, gather_us: int
) -> dict[str, Any]:
    settings = {
        "flushDiskType": "SYNC_FLUSH",
        "syncFlushGatherMaxUs": str(gather_us),
        "mappedFileSizeCommitLog": str(file_mib << 20),
        "warmMapedFileEnable": "true",
    }
    with running_service(tmp, f"sync{run}", **settings) as service:
        if settle:
            wait_until(lambda: _allocator_idle(service), 300, "the allocator to warm its files")
        out = CTX.Queue()
        start = CTX.Barrier(producers + 1)
        procs = [
            CTX.Process(target=rocketmq_worker, args=(service.names.base, messages, 500, start, out))
            for _ in range(producers)
        ]
        for p in procs:
            p.start()
        pids = {role: [service.worker_pid(role)] for role in ROLES}
        pids["producers"] = [p.pid for p in procs if p.pid is not None]
        start.wait()
        table = service.table()
        try:
            before = [table.get(f) for f in (layout.PUT_COUNT, layout.FLUSH_COUNT, layout.FLUSHED_POSITION)]
            cpu_before = _cpu_s(pids)
            results = [out.get(timeout=600) for _ in procs]
            after = [table.get(f) for f in (layout.PUT_COUNT, layout.FLUSH_COUNT, layout.FLUSHED_POSITION)]
            cpu_after = _cpu_s(pids)
        finally:
            table.close()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, f"producer exited {p.exitcode}"
    wall_s = max(r[2] for r in results)
    sends, fsyncs, flushed_bytes = (a - b for a, b in zip(after, before, strict=True))
    return {
        "msgs_s": sum(r[0] for r in results) / wall_s,
        "p99_us": max(r[3] for r in results),
        "failures": sum(r[1] for r in results),
        "sends_per_fsync": sends / max(fsyncs, 1),
        "bytes_per_fsync": flushed_bytes / max(fsyncs, 1),
        "us_per_fsync": wall_s * 1e6 / max(fsyncs, 1),
        "cpu_us_per_send": {r: (cpu_after[r] - cpu_before[r]) * 1e6 / max(sends, 1) for r in pids},
        "cpu_cores": {r: (cpu_after[r] - cpu_before[r]) / wall_s for r in pids},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sync_group", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=5_000, help="timed sends per producer")
    parser.add_argument("--file-mib", type=int, default=1024, help="mappedFileSizeCommitLog in MiB")
    parser.add_argument("--settle", action="store_true", help="time only once the allocator is idle")
    parser.add_argument(
        "--gather-us",
        type=int,
        action="append",
        help="syncFlushGatherMaxUs (repeat to alternate values run by run; default 500; 0 = RocketMQ's way)",
    )
    args = parser.parse_args(argv)
    gathers = args.gather_us or [500]
    with tempfile.TemporaryDirectory(prefix="bench-sync-group-") as tmp:
        for run in range(args.runs):
            gather_us = gathers[run % len(gathers)]
            r = one_run(Path(tmp), run, args.producers, args.messages, args.file_mib, args.settle, gather_us)
            cpu = " ".join(
                f"{role} {r['cpu_us_per_send'][role]:.0f} us ({r['cpu_cores'][role]:.2f} cores)"
                for role in r["cpu_cores"]
            )
            print(
                f"gather {gather_us:>3} us, SYNC {args.producers} producers: {r['msgs_s'] / 1e3:.1f}k msgs/s "
                f"({r['msgs_s'] / ROCKETMQ_SYNC_MSGS_S:.2f}x the issue's RocketMQ 17.8k, NOT same-run), "
                f"p99 {r['p99_us']:.0f} us, failures {r['failures']}; "
                f"{r['sends_per_fsync']:.2f} sends / {r['bytes_per_fsync']:.0f} B per fsync, "
                f"{r['us_per_fsync']:.0f} us per fsync; CPU per send: {cpu}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
