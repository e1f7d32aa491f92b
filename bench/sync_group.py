"""`python -m bench.sync_group`: issue 33's SYNC row alone, with the group commit's figures.

bench.shapes' `rocketmq` SYNC row (SYNC_FLUSH, ``--producers`` processes of ``--messages`` sends
after 500 each, tags TagA, one key as a list, 8 queues, 1 GiB files, pool off), ``--runs`` times
on fresh stores, each printed with its msgs/s, the send latency (p99 of the worst producer, as
bench.shapes prints it, and p50/p99 over every send) and what a group commit holds over the timed window: sends and
bytes per fsync (the store's put and flush counters), the wall time per fsync, and the CPU each
process used (flusher, reput, the producers together; the allocator's is counted, not printed), of
it the system time, and the voluntary + involuntary context switches, each a send, and reput's sends
and CPU a pass. ``--gather-us`` sets `syncFlushGatherMaxUs` (repeated: the values alternate run by
run, for a same-machine A/B; 0 is RocketMQ's flush-at-once). ``--settle`` starts timing
only once the allocator is idle (its files warmed: steady state); without it the window may
overlap the warming of the first 3 GiB, as bench.shapes' row does. With two ``--gather-us``
values it ends with the pairs side by side (run 1 against 2, 3 against 4, ...): each one's
msgs/s ratio and whether the second's p99 is no worse. The RocketMQ figure beside
it is the issue's (17.8k msgs/s, 4 Java threads, another day): not same-run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.service import RunningService, running_service, wait_until
from bench.shapes import ROCKETMQ_SYNC_MSGS_S, rocketmq_sends
from bench.store import CTX
from shm import layout

ROLES = ("flusher", "reput", "allocator")
REPUT_PASSES = layout.worker_field("reput", "work_count")
"""Reput's passes (`ServiceLoop`'s work count): sends a pass and CPU a pass beside CPU a send."""


def _cpu_s(pids: dict[str, list[int]]) -> dict[str, tuple[float, float, int, int]]:
    """Each role's (user s, system s, voluntary, involuntary context switches), its processes
    summed: a SYNC put's CPU is mostly its sleeps and wakes, which show as system time and
    voluntary switches."""
    used: dict[str, tuple[float, float, int, int]] = {}
    for role, group in pids.items():
        user = system = 0.0
        vol = invol = 0
        for pid in group:
            try:
                proc = psutil.Process(pid)
                t = proc.cpu_times()
                switches = proc.num_ctx_switches()
            except psutil.NoSuchProcess:
                continue
            user += t.user
            system += t.system
            vol += switches.voluntary
            invol += switches.involuntary
        used[role] = (user, system, vol, invol)
    return used


def sync_worker(name: str, messages: int, warmup: int, start: Any, out: Any) -> None:
    """bench.shapes' `rocketmq_sends`, handing back every send's latency (us), so the run's
    percentiles pool all producers."""
    failures, elapsed, latencies_us = rocketmq_sends(name, messages, warmup, start)
    out.put((messages, failures, elapsed, latencies_us))


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
            CTX.Process(target=sync_worker, args=(service.names.base, messages, 500, start, out))
            for _ in range(producers)
        ]
        for p in procs:
            p.start()
        pids = {role: [service.worker_pid(role)] for role in ROLES}
        pids["producers"] = [p.pid for p in procs if p.pid is not None]
        start.wait()
        table = service.table()
        try:
            counted = (layout.PUT_COUNT, layout.FLUSH_COUNT, layout.FLUSHED_POSITION, REPUT_PASSES)
            before = [table.get(f) for f in counted]
            cpu_before = _cpu_s(pids)
            results = [out.get(timeout=600) for _ in procs]
            after = [table.get(f) for f in counted]
            cpu_after = _cpu_s(pids)
        finally:
            table.close()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, f"producer exited {p.exitcode}"
    wall_s = max(r[2] for r in results)
    sends, fsyncs, flushed_bytes, passes = (a - b for a, b in zip(after, before, strict=True))
    delta = {r: [a - b for a, b in zip(cpu_after[r], cpu_before[r], strict=True)] for r in pids}
    reput_cpu_s = delta["reput"][0] + delta["reput"][1]
    pooled = np.concatenate([r[3] for r in results])
    return {
        "msgs_s": sum(r[0] for r in results) / wall_s,
        "p99_us": max(float(np.percentile(r[3], 99)) for r in results),
        "pooled_p50_us": float(np.percentile(pooled, 50)),
        "pooled_p99_us": float(np.percentile(pooled, 99)),
        "failures": sum(r[1] for r in results),
        "sends_per_fsync": sends / max(fsyncs, 1),
        "bytes_per_fsync": flushed_bytes / max(fsyncs, 1),
        "us_per_fsync": wall_s * 1e6 / max(fsyncs, 1),
        "cpu_us_per_send": {r: (d[0] + d[1]) * 1e6 / max(sends, 1) for r, d in delta.items()},
        "sys_us_per_send": {r: d[1] * 1e6 / max(sends, 1) for r, d in delta.items()},
        "switches_per_send": {r: (d[2] / max(sends, 1), d[3] / max(sends, 1)) for r, d in delta.items()},
        "cpu_cores": {r: (d[0] + d[1]) / wall_s for r, d in delta.items()},
        "sends_per_pass": sends / max(passes, 1),
        "reput_us_per_pass": reput_cpu_s * 1e6 / max(passes, 1),
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
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-group-") as tmp:
        for run in range(args.runs):
            gather_us = gathers[run % len(gathers)]
            r = one_run(Path(tmp), run, args.producers, args.messages, args.file_mib, args.settle, gather_us)
            runs.append(r)
            cpu = " ".join(
                f"{role} {r['cpu_us_per_send'][role]:.0f} us (sys {r['sys_us_per_send'][role]:.0f}, "
                f"{r['cpu_cores'][role]:.2f} cores, {r['switches_per_send'][role][0]:.2f} + "
                f"{r['switches_per_send'][role][1]:.2f} switches)"
                for role in r["cpu_cores"]
                if role != "allocator"
            )
            print(
                f"gather {gather_us:>3} us, SYNC {args.producers} producers: {r['msgs_s'] / 1e3:.1f}k msgs/s "
                f"({r['msgs_s'] / ROCKETMQ_SYNC_MSGS_S:.2f}x the issue's RocketMQ 17.8k, NOT same-run), "
                f"p99 {r['p99_us']:.0f} us (the worst producer's; all sends: p50 {r['pooled_p50_us']:.0f}, "
                f"p99 {r['pooled_p99_us']:.0f}), failures {r['failures']}; "
                f"{r['sends_per_fsync']:.2f} sends / {r['bytes_per_fsync']:.0f} B per fsync, "
                f"{r['us_per_fsync']:.0f} us per fsync; CPU per send: {cpu}; reput: "
                f"{r['sends_per_pass']:.1f} sends and {r['reput_us_per_pass']:.0f} us of CPU a pass",
                flush=True,
            )
    if len(gathers) == 2:
        _pairs(gathers, runs)
    return 0


def _pairs(gathers: list[int], runs: list[dict[str, Any]]) -> None:
    """The A/B side by side: each pair's msgs/s ratio, p99s (the worst producer's, and over all
    sends) and whether the second setting's is no worse; medians of msgs/s."""
    pairs = list(zip(runs[0::2], runs[1::2], strict=False))
    held = held_pooled = 0
    for i, (a, b) in enumerate(pairs, 1):
        held += b["p99_us"] <= a["p99_us"]
        held_pooled += b["pooled_p99_us"] <= a["pooled_p99_us"]
        print(
            f"pair {i}: {a['msgs_s'] / 1e3:.1f}k / {b['msgs_s'] / 1e3:.1f}k msgs/s ({b['msgs_s'] / a['msgs_s']:.2f}x), "
            f"p99 {a['p99_us']:.0f} / {b['p99_us']:.0f} us (all sends {a['pooled_p99_us']:.0f} / "
            f"{b['pooled_p99_us']:.0f}), p50 {a['pooled_p50_us']:.0f} / {b['pooled_p50_us']:.0f}, "
            f"{a['sends_per_fsync']:.2f} / {b['sends_per_fsync']:.2f} puts per fsync"
        )
    if pairs:
        medians = [float(np.median([p[k]["msgs_s"] for p in pairs])) / 1e3 for k in (0, 1)]
        print(
            f"gather {gathers[0]} / {gathers[1]} us: median {medians[0]:.1f}k / {medians[1]:.1f}k msgs/s; "
            f"{gathers[1]} us's p99 no worse in {held} of {len(pairs)} pairs ({held_pooled} over all sends)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
