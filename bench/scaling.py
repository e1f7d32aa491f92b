"""`send` against the number of producer processes on one store: how the one commit log's put
lock scales on a machine with cores to spare (bench/device.sh runs it on 16).

    python -m bench.scaling [--producers 1,2,4,8,16] [--seconds S] [--tag NAME]

One ASYNC store with the put matrix's settings (`bench.__main__.STORE_SETTINGS`); per producer
count, 128 B `send`s in blocks of `ASYNC_SEND_BLOCK` for S seconds: msgs/s in all, p50/p99 of a
1% sample, and the dispatch lag (write position minus reput's, sampled every 10 ms): a lag at
`maxDispatchLagBytes` means reput, not the lock, held the producers back. Prints a table and
writes bench/results/scaling[-TAG].json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.__main__ import ASYNC_SEND_BLOCK, MODES, RESULTS, STORE_SETTINGS
from bench.baselines import percentiles
from bench.service import RunningService, running_service
from bench.store import run_producers
from shm import layout


def lag_sampler(service: RunningService) -> Any:
    """`during` for run_producers: the dispatch lag every 10 ms for the window; its maximum."""

    def sample(seconds: float) -> int:
        table = service.table()
        try:
            worst, deadline = 0, time.monotonic() + seconds
            while time.monotonic() < deadline:
                worst = max(worst, table.get(layout.WROTE_POSITION) - table.get(layout.REPUT_FROM_OFFSET))
                time.sleep(0.01)
            return worst
        finally:
            table.close()

    return sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--producers", default="1,2,4,8,16")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'prod':>5}{'msgs/s':>11}{'p50us':>8}{'p99us':>9}{'max lag MiB':>13}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rmq-scaling-") as tmp:
        settings = {**STORE_SETTINGS, **MODES["ASYNC"]}
        with running_service(Path(tmp), "s", **settings) as service:
            for producers in (int(n) for n in args.producers.split(",")):
                got = run_producers(
                    service.names.base,
                    producers=producers,
                    body_size=128,
                    batch=1,
                    duration_s=args.seconds,
                    block=ASYNC_SEND_BLOCK,
                    during=lag_sampler(service),
                )
                lat = percentiles(got.pop("latencies_us"))
                row = {"producers": producers, "msgs_per_s": got["msgs_per_s"], "latency_us": lat,
                       "max_lag_bytes": got["during"], "failures": got["failures"]}  # fmt: skip
                rows.append(row)
                print(f"{producers:>5}{got['msgs_per_s']:>11.0f}{lat['p50']:>8.1f}{lat['p99']:>9.1f}"
                      f"{got['during'] / (1 << 20):>13.1f}", flush=True)  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    name = f"scaling-{args.tag}.json" if args.tag else "scaling.json"
    (RESULTS / name).write_text(json.dumps({"tag": args.tag, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
