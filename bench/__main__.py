"""`python -m bench` (or `rmq-bench`): issue 6's figures on real stores, each beside its same-run
baseline (bench/baselines.py) and the ratio; prints a table, writes bench/results/bench-<time>.json
and, with matplotlib installed, PNG charts beside it.

Scenarios (``--scenario``, repeatable; default all):
  put       msgs/s and MB/s for producers x bodies x modes {SYNC, ASYNC, ASYNC+pool} x {send,
            send_batch}; SYNC rows also carry p50/p99/p99.9 latency (ASYNC `send` rows a 1% sample:
            ASYNC_SEND_BLOCK). Baselines: raw append (same producers and body) and, for SYNC, the
            plain-Python group commit.
  e2e       producer-to-consumer latency, ASYNC, one producer paced at 10% of its measured
            maximum `send` rate, a long-polling consumer in another process; baseline: one hop
            (a record in shared memory and a semaphore post between two processes, same pacing).
  reput     dispatch lag (wrote - reput offset) sampled under sustained maximum load (2 producers,
            send_batch, maxDispatchLagBytes as shipped), bounded when its slope over the run's
            last two thirds stays under 1 MiB/s, and the reput process's CPU time per dispatched
            record; then reput's catch-up rate: paused while one producer builds a backlog,
            resumed, timed until dispatch reaches the end (on a store without the lag limit).
  recovery  abnormal recovery (SIGKILL, checkpoint removed so the whole log is scanned with CRC
            and re-dispatched) per GiB vs reading + CRC-checking the same files.
  cleaner   put p99 while the cleaner deletes a batch of expired files vs without.
  realistic the shape the issue compared with RocketMQ's store: 1 producer, tags and a key,
            8 queues, 1 GiB files with the pool, 200,000 messages, beside raw append.
  scale     put rate and p99 over 8, 1,000 and 10,000 queues written round-robin (ratio to the
            8-queue row), disk and shared memory held, consumer catch-up over every queue,
            normal and abnormal recovery time (bench/scale.py).
  crc       the whole-record CRC's put cost: ASYNC send and send_batch, 1 producer, 128 B, with
            enabledAppendPropCRC off and on in alternating stores (off on on off); ratio on/off;
            then both settings on one store, alternating blocks of calls in one process beside a
            second CRC-off producer as the control (the median round ratio on/off printed beside
            the control's, with quartiles and range; per record wall, producer, store and reput
            CPU; the CRCs the lock corrected). That part alone: crc-same-store.
``--quick`` shrinks everything (fewer rows, shorter windows, 128 MiB recovery) to a few minutes.
Run it under ``flock /tmp/rmq-heavy.lock`` on shared machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench import baselines, charts, scale
from bench.baselines import percentiles
from bench.service import RunningService, running_service, start_service, wait_until
from bench.store import CTX, crc_pair_worker, e2e_consumer, realistic_worker, run_producers
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.store.message_store import MessageStore
from shm import layout
from shm.store_shm import StoreShm

RESULTS = Path(__file__).resolve().parent / "results"
MODES: dict[str, dict[str, str]] = {
    "SYNC": {"flushDiskType": "SYNC_FLUSH"},
    "ASYNC": {"flushDiskType": "ASYNC_FLUSH"},
    "ASYNC+pool": {
        "flushDiskType": "ASYNC_FLUSH",
        "transientStorePoolEnable": "true",
        "transientStorePoolSize": "3",
    },
}
STORE_SETTINGS = {
    # Pre-faulted files, as issue 6 asks: on this VM a fresh page of a file mapping costs 60-90 us
    # at first touch, so past the recently freed pages the put path's pwrite spends a third of its
    # time in the kernel; with the allocator warming files ahead, send_batch with 2-4 producers
    # went from 650-820k to 850-860k msgs/s (bench/NOTES.md, `python -m bench.first_touch`).
    # `--set warmMapedFileEnable=false` measures without.
    "warmMapedFileEnable": "true",
    "mappedFileSizeCommitLog": str(64 << 20),
    "mappedFileSizeConsumeQueue": "6000000",
    "maxHashSlotNum": "500000",
    "maxIndexNum": "2000000",
}
ASYNC_SEND_BLOCK = 100
"""ASYNC `send` rows send in blocks of this many between clock looks, as the raw-append baseline
writes; their latency columns are a 1% sample (SYNC rows time every call)."""
ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))
MIN_FREE_GIB = 16
"""Disk a full run needs at once: one store (a put-matrix api's rows, at most ~12 GB) at a time."""
LAG_SLOPE_BOUND_BYTES_PER_S = 1 << 20
"""Reput keeps up when the dispatch lag grows by less than this over the run's last two thirds."""


def _ratio(value: float, base: float) -> float:
    return value / base if base else float("nan")


def _crc_rounds(got: dict[str, Any], calls: int, rounds: int) -> dict[str, Any]:
    """`crc_pair_worker`'s blocks summed: per round the on/off and ctl/off throughput ratios (the
    second setting's summed block times over the first's), their spread, and ns per record."""

    def per_round(a: str, b: str, key: str = "wall") -> list[float]:
        xs, ys = got[a][key], got[b][key]
        return [(ys[2 * r] + ys[2 * r + 1]) / (xs[2 * r] + xs[2 * r + 1]) for r in range(rounds)]

    settings = ("on", "off", "ctl")
    on_off, ctl_off = per_round("on", "off"), per_round("ctl", "off")
    cpu_on_off = per_round("on", "off", "cpu")
    return {
        "rounds": rounds, "blocks": {k: got[k] for k in settings},
        "round_ratios": on_off, "control_round_ratios": ctl_off, "cpu_round_ratios": cpu_on_off,
        "on_off": _spread(on_off), "ctl_off": _spread(ctl_off), "cpu_on_off": _spread(cpu_on_off),
        "ratio": _spread(on_off)["median"],
        "ns_per_record": {setting: {key: sum(got[setting][key]) / (calls * rounds * 2) * 1e9
                                    for key in ("wall", "cpu", "store_cpu", "reput_cpu")} for setting in settings},
        "crc_misses": int(sum(got["on"]["crc_misses"])), "records_on": calls * rounds * 2,
        "record_bytes": got["bytes"],
    }  # fmt: skip


def _spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range: how far apart a run's rounds lie, printed beside its median."""
    p25, median, p75 = (float(x) for x in np.percentile(values, [25, 50, 75]))
    return {"median": median, "p25": p25, "p75": p75, "min": min(values), "max": max(values)}


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.quick: bool = args.quick
        self.window_s: float = args.seconds or (1.5 if self.quick else 3.0)
        self.raw_cache: dict[tuple[int, int], dict[str, float]] = {}
        self.gc_cache: dict[tuple[int, int], dict[str, Any]] = {}
        self.overrides: dict[str, str] = dict(args.overrides)
        self.results: dict[str, Any] = {
            "quick": self.quick,
            "window_s": self.window_s,
            "cpus": os.cpu_count(),
            "settings": {**STORE_SETTINGS, **self.overrides},
        }
        self.max_send_rate = 0.0
        self.counter = 0

    @contextlib.contextmanager
    def store(self, mode: str, **extra: str) -> Iterator[RunningService]:
        """A running store, deleted once stopped: a full run writes ~100 GB of 16 KiB rows, more
        than this disk has free, and a full disk refuses puts (and so ruins the next rows)."""
        self.counter += 1
        settings = {**STORE_SETTINGS, **MODES[mode], **self.overrides, **extra}
        name = f"s{self.counter}"
        try:
            with running_service(self.tmp, name, **settings) as service:
                yield service
        finally:
            shutil.rmtree(self.tmp / name, ignore_errors=True)

    def raw(self, producers: int, body: int) -> dict[str, float]:
        key = (producers, body)
        if key not in self.raw_cache:
            self.raw_cache[key] = baselines.raw_append(
                self.tmp, producers=producers, body_size=body, duration_s=self.window_s
            )
        return self.raw_cache[key]

    def group_commit(self, producers: int, body: int) -> dict[str, Any]:
        key = (producers, body)
        if key not in self.gc_cache:
            self.gc_cache[key] = baselines.group_commit(
                self.tmp, producers=producers, body_size=body, duration_s=max(self.window_s, 2.0)
            )
        return self.gc_cache[key]

    # ---------------------------------------------------------------- put matrix

    def put(self) -> None:
        cpus = os.cpu_count() or 1
        producer_counts = [1, 2] if self.quick else [n for n in (1, 2, 4, 8, 16) if n <= max(8, cpus)]
        bodies = [128] if self.quick else [self.args.body] if self.args.body else [128, 1024, 16384]
        rows = []
        print(f"{'mode':<11}{'api':<11}{'prod':>5}{'body':>7}{'msgs/s':>11}{'MB/s':>8}"
              f"{'baseline':>11}{'ratio':>7}{'p50us':>8}{'p99us':>9}{'p99.9us':>9}{'base p99':>9}")  # fmt: skip
        for mode in self.args.modes:
            for body in bodies:
                for api, batch in (("send", 1), ("batch100", 100)):
                    with self.store(mode) as service:  # a store per api: at most ~12 GB on disk
                        for producers in producer_counts:
                            rows.append(self._put_row(service, mode, api, batch, producers, body))
        self.results["put"] = rows

    def _put_row(
        self, service: RunningService, mode: str, api: str, batch: int, producers: int, body: int
    ) -> dict[str, Any]:
        sync = mode == "SYNC"
        window = max(self.window_s, 2.0) if sync else self.window_s
        got = run_producers(
            service.names.base,
            producers=producers,
            body_size=body,
            batch=batch,
            duration_s=window,
            block=1 if sync else ASYNC_SEND_BLOCK,
        )
        lat = percentiles(got.pop("latencies_us"))
        got.pop("during")
        if sync:
            base = self.group_commit(producers, body)
            base_rate, base_p99 = base["msgs_per_s"], base["latency_us"]["p99"]
            base_name = "group commit"
        else:
            base_rate, base_p99, base_name = (
                self.raw(producers, body)["msgs_per_s"],
                float("nan"),
                "raw append",
            )
        if mode == "ASYNC" and api == "send" and producers == 1 and body == 128:
            self.max_send_rate = got["msgs_per_s"]
        row = {
            "mode": mode, "api": api, "producers": producers, "body_bytes": body,
            **got, "latency_us": lat, "baseline": base_name, "baseline_msgs_per_s": base_rate,
            "ratio": _ratio(got["msgs_per_s"], base_rate), "baseline_p99_us": base_p99,
            "p99_ratio": _ratio(lat["p99"], base_p99),
        }  # fmt: skip
        print(f"{mode:<11}{api:<11}{producers:>5}{body:>7}{got['msgs_per_s']:>11.0f}{got['mb_per_s']:>8.1f}"
              f"{base_rate:>11.0f}{row['ratio']:>7.2f}{lat['p50']:>8.0f}{lat['p99']:>9.0f}{lat['p99.9']:>9.0f}"
              f"{base_p99:>9.0f}" + (f"  FAILURES {got['failures']}" if got["failures"] else ""), flush=True)  # fmt: skip
        return row

    # ---------------------------------------------------------------- record CRC cost

    def crc(self) -> None:
        """The whole-record CRC's put cost (issue 35): `send` and send_batch of 100, ASYNC, one
        producer, 128 B bodies, on a store with enabledAppendPropCRC off, then on, then on, then
        off (each row its own store), rounds of that; the ratio is of the medians, same run (on
        this shared 2-core VM single rows vary by 2x: the median of 6 is what is compared)."""
        rounds = 1 if self.quick else 3
        rows = []
        print(f"{'api':<11}{'crc off msgs/s':>16}{'crc on msgs/s':>15}{'on/off':>8}")
        for api, batch in (("send", 1), ("batch100", 100)):
            rates: dict[str, list[float]] = {"false": [], "true": []}
            for _ in range(rounds):
                for setting in ("false", "true", "true", "false"):
                    with self.store("ASYNC", enabledAppendPropCRC=setting) as service:
                        got = run_producers(
                            service.names.base, producers=1, body_size=128, batch=batch,
                            duration_s=self.window_s, block=ASYNC_SEND_BLOCK,
                        )  # fmt: skip
                    assert not got["failures"], got
                    rates[setting].append(got["msgs_per_s"])
            off, on = float(np.median(rates["false"])), float(np.median(rates["true"]))
            row = {"api": api, "off_msgs_per_s": rates["false"], "on_msgs_per_s": rates["true"],
                   "ratio": _ratio(on, off)}  # fmt: skip
            print(f"{api:<11}{off:>16.0f}{on:>15.0f}{row['ratio']:>8.3f}", flush=True)
            rows.append(row)
        self.results["crc"] = rows
        if "crc-same-store" not in (self.args.scenario or []):
            self.crc_same_store()

    def crc_same_store(self) -> None:
        """The same cost with both settings on one store at one time (`crc_pair_worker`): per round
        six blocks of calls, two each of CRC on, off and a second off producer (the control), in
        rotating symmetric orders. The figure is the median of the rounds' on/off ratios (summed
        off block times over summed on ones) with its quartiles and range, and beside it the
        control's off/ctl ratio the same way: the noise floor a ratio must be read against. Then per
        record: wall, this producer's CPU, the store's processes' CPU and reput's, on vs off, and
        the records whose CRC the lock had to correct (its fields guessed wrong)."""
        rounds = 12 if self.quick else 42
        rows = []
        print(f"{'one store':<10}{'on/off median':>14}{'[p25 p75]':>14}{'[min max]':>15}{'ctl/off median':>15}"
              f"{'[p25 p75]':>14}{'[min max]':>15}{'cpu on/off':>11}")  # fmt: skip
        # blocks of ~20-30 ms here: shorter ones (6 ms) let one co-tenant burst swing a round 2x
        for api, batch, block in (("send", 1, 30_000), ("batch100", 100, 600)):
            with self.store("ASYNC", enabledAppendPropCRC="true") as service:
                pids = {role: service.worker_pid(role) for role in layout.ROLES}
                pids = {"supervisor": service.process.pid, **{k: v for k, v in pids.items() if v}}
                out = CTX.Queue()
                proc = CTX.Process(
                    target=crc_pair_worker, args=(service.names.base, 128, batch, block, rounds, pids, out)
                )
                proc.start()
                got = out.get(timeout=600)
                proc.join(60)
            assert not got["failures"], got["failures"]
            row = {"api": api, "block_calls": block, **_crc_rounds(got, block * batch, rounds)}
            a, c = row["on_off"], row["ctl_off"]
            print(f"{api:<10}{a['median']:>14.3f}{a['p25']:>8.3f}{a['p75']:>6.3f}{a['min']:>8.3f}{a['max']:>7.3f}"
                  f"{c['median']:>15.3f}{c['p25']:>8.3f}{c['p75']:>6.3f}{c['min']:>8.3f}{c['max']:>7.3f}"
                  f"{row['cpu_on_off']['median']:>11.3f}", flush=True)  # fmt: skip
            rows.append(row)
        print(f"{'ns/record':<10}{'wall on/off/ctl':>22}{'producer cpu':>20}{'store cpu':>20}{'reput cpu':>20}"
              f"{'crc misses':>12}{'bytes on/off':>14}")  # fmt: skip
        for row in rows:
            per = row["ns_per_record"]

            def three(key: str, per: dict[str, dict[str, float]] = per) -> str:
                return "/".join(f"{per[setting][key]:.0f}" for setting in ("on", "off", "ctl"))

            print(f"{row['api']:<10}{three('wall'):>22}{three('cpu'):>20}{three('store_cpu'):>20}"
                  f"{three('reput_cpu'):>20}{row['crc_misses']:>6}/{row['records_on']:<6}"
                  f"{row['record_bytes']['on']:>7}/{row['record_bytes']['off']}", flush=True)  # fmt: skip
        self.results["crc_same_store"] = rows

    # ---------------------------------------------------------------- e2e latency

    def e2e(self) -> None:
        with self.store("ASYNC") as service:
            if not self.max_send_rate and not self.args.e2e_rate:
                got = run_producers(
                    service.names.base, producers=1, body_size=128, batch=1, duration_s=self.window_s
                )
                self.max_send_rate = got["msgs_per_s"]
            rate = self.args.e2e_rate or self.max_send_rate * 0.10
            duration = 3.0 if self.quick else 10.0
            wait_until(  # a backlog from the rate measurement would be dispatched during the paced run
                lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
                120,
                "reput to catch up before the paced run",
            )
            expected = int(rate * duration) - 5
            ready, out = CTX.Event(), CTX.Queue()
            consumer = CTX.Process(
                target=e2e_consumer, args=(service.names.base, str(service.root), expected, ready, out)
            )
            consumer.start()
            ready.wait(30)
            run_producers(
                service.names.base, producers=1, body_size=128, batch=1, duration_s=duration, rate_per_s=rate
            )
            latencies = sorted(ns / 1000 for ns in out.get(timeout=120))
            consumer.join(30)
        lat = percentiles(latencies)
        hop = baselines.one_hop(rate_per_s=rate, duration_s=duration)["latency_us"]
        self.results["e2e"] = {"rate_per_s": rate, "max_send_rate_per_s": self.max_send_rate, "latency_us": lat,
                               "one_hop_us": hop, "p50_ratio": _ratio(lat["p50"], hop["p50"]),
                               "p99_ratio": _ratio(lat["p99"], hop["p99"]),
                               "target": "p50 <= 2.5x, p99 <= 3x one hop"}  # fmt: skip
        load = "--e2e-rate" if self.args.e2e_rate else "10% load"
        print(f"e2e ASYNC at {load} ({rate:.0f}/s): p50 {lat['p50']:.0f} us, p99 {lat['p99']:.0f} us, "
              f"p99.9 {lat['p99.9']:.0f} us over {lat['samples']} messages; one hop (semaphore, same pacing): "
              f"p50 {hop['p50']:.0f} us, p99 {hop['p99']:.0f} us")  # fmt: skip

    # ---------------------------------------------------------------- reput lag

    def reput(self) -> None:
        duration = 8.0 if self.quick else 30.0
        samples: list[tuple[float, int]] = []

        reput_cpu: dict[str, float] = {}

        def sample(seconds: float) -> None:
            table = service.table()
            reput = _worker_process(service, "workers.reput")
            try:
                t0 = time.monotonic()
                cpu0, count0 = sum(reput.cpu_times()[:2]), table.get(layout.DISPATCH_COUNT)
                while (now := time.monotonic() - t0) < seconds:
                    samples.append(
                        (now, table.get(layout.WROTE_POSITION) - table.get(layout.REPUT_FROM_OFFSET))
                    )
                    time.sleep(0.25)
                cpu = sum(reput.cpu_times()[:2]) - cpu0
                reput_cpu.update(cpu_s=cpu, records=table.get(layout.DISPATCH_COUNT) - count0, wall_s=now)
            finally:
                table.close()

        with self.store("ASYNC", mappedFileSizeCommitLog=str(256 << 20)) as service:
            got = run_producers(service.names.base, producers=2, body_size=128, batch=100,
                                duration_s=duration, during=sample)  # fmt: skip
        # Capacity needs a backlog larger than maxDispatchLagBytes allows: measured without it.
        with self.store("ASYNC", mappedFileSizeCommitLog=str(256 << 20), maxDispatchLagBytes="0") as service:
            catch_up = _reput_catch_up(service, duration_s=4.0 if self.quick else 10.0)
        third = max(1, len(samples) // 3)
        first = [lag for _t, lag in samples[:third]]
        last = [lag for _t, lag in samples[-third:]]
        mean_first, mean_last = sum(first) / len(first), sum(last) / len(last)
        # Bounded: the lag does not grow over the run's last two thirds (least-squares slope).
        later = samples[third:]
        slope = (
            float(np.polyfit([t for t, _ in later], [lag for _, lag in later], 1)[0])
            if len(later) > 2
            else 0.0
        )
        bounded = slope < LAG_SLOPE_BOUND_BYTES_PER_S
        cpu_us = reput_cpu["cpu_s"] / max(reput_cpu["records"], 1) * 1e6
        self.results["reput"] = {
            "duration_s": duration, "put_msgs_per_s": got["msgs_per_s"], "put_mb_per_s": got["mb_per_s"],
            "lag_bytes_samples": samples, "lag_bytes_max": max(lag for _t, lag in samples),
            "lag_bytes_mean_first_third": mean_first, "lag_bytes_mean_last_third": mean_last, "bounded": bounded,
            "lag_slope_bytes_per_s": slope, "max_dispatch_lag_bytes": service.config.max_dispatch_lag_bytes,
            "put_failures": got["failures"],
            "reput_cpu_us_per_record": cpu_us, "reput_capacity_records_per_s": 1e6 / cpu_us,
            "reput_cpu_share": reput_cpu["cpu_s"] / reput_cpu["wall_s"], "catch_up": catch_up,
        }  # fmt: skip
        print(f"reput lag under {got['msgs_per_s']:.0f} msgs/s for {duration:.0f} s: mean first third "
              f"{mean_first / 1024:.0f} KiB, last third {mean_last / 1024:.0f} KiB, max "
              f"{self.results['reput']['lag_bytes_max'] / 1024:.0f} KiB, slope {slope / 1024:.0f} KiB/s "
              f"-> {'bounded' if bounded else 'GROWING'}, {got['failures']} puts refused; "
              f"reput used {cpu_us:.2f} cpu-us a record ({reput_cpu['cpu_s'] / reput_cpu['wall_s']:.0%} of a core), "
              f"so one core dispatches {1e6 / cpu_us:,.0f} records/s")  # fmt: skip
        print(f"reput catch-up: {catch_up['records']} records put while reput was paused, dispatched in "
              f"{catch_up['seconds']:.2f} s = {catch_up['records_per_s']:,.0f} records/s "
              f"({catch_up['cpu_us_per_record']:.2f} cpu-us a record)")  # fmt: skip

    # ---------------------------------------------------------------- recovery

    def recovery(self) -> None:
        target = (128 << 20) if self.quick else (1 << 30)
        body = 16384
        service = start_service(self.tmp, "recovery", **STORE_SETTINGS, **MODES["ASYNC"])
        try:
            while service.read(layout.WROTE_POSITION) < target:
                run_producers(service.names.base, producers=2, body_size=body, batch=32, duration_s=1.0)
            _kill_store(service)
        finally:
            _kill_store(service)
        root = service.root
        files = sorted((root / "commitlog").iterdir())
        t0 = time.perf_counter()
        crc, read = 0, 0
        for path in files:
            with path.open("rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
                    read += len(chunk)
        baseline_s = time.perf_counter() - t0
        (root / "checkpoint").unlink(missing_ok=True)  # so recovery scans (CRC) and re-dispatches it all
        config = MessageStoreConfig.from_file(service.conf)
        t0 = time.perf_counter()
        with MessageStore.open(root, config) as store:
            report = store.recovery
        recovery_s = time.perf_counter() - t0
        assert report is not None
        assert report.abnormal
        scanned = report.recovered_end_offset - report.scan_from_offset
        gib = scanned / (1 << 30)
        per_gib_s = recovery_s / gib
        base_per_gib_s = baseline_s / (read / (1 << 30))
        self.results["recovery"] = {
            "scanned_bytes": scanned, "records_dispatched": report.records_dispatched, "body_bytes": body,
            "recovery_s": recovery_s, "recovery_s_per_gib": per_gib_s, "baseline_read_crc_s_per_gib": base_per_gib_s,
            "ratio": per_gib_s / base_per_gib_s, "target_ratio_max": 2.0,
        }  # fmt: skip
        shutil.rmtree(root)
        print(f"abnormal recovery: {scanned / 2**20:.0f} MiB, {report.records_dispatched} records in "
              f"{recovery_s:.2f} s = {per_gib_s:.2f} s/GiB; read+CRC {base_per_gib_s:.2f} s/GiB; "
              f"ratio {per_gib_s / base_per_gib_s:.2f}")  # fmt: skip

    # ---------------------------------------------------------------- scale

    def scale(self) -> None:
        self.results["scale"] = scale.run(
            self.tmp, quick=self.quick, window_s=self.window_s, overrides=self.overrides
        )

    # ---------------------------------------------------------------- cleaner

    def realistic(self) -> None:
        """The issue's RocketMQ comparison shape (see `bench.store.realistic_worker`) on a store
        with RocketMQ's defaults where the shape sets none: 1 GiB commit-log files, the pool on
        (fresh 1 GiB buffers), keys indexed; beside raw append in the same run. 200,000 messages
        after 2,000 (a tenth of each with --quick)."""
        messages, warmup = (20_000, 200) if self.quick else (200_000, 2_000)
        settings = {
            "mappedFileSizeCommitLog": str(1 << 30),
            "transientStorePoolEnable": "true",
            "transientStorePoolSize": "2",
            "mappedFileSizeConsumeQueue": "6000000",
            "maxHashSlotNum": "5000000",
            "maxIndexNum": "20000000",
        }
        self.counter += 1
        name = f"s{self.counter}"
        try:
            with running_service(self.tmp, name, **{**settings, **self.overrides}) as service:
                out = CTX.Queue()
                proc = CTX.Process(target=realistic_worker, args=(service.names.base, messages, warmup, out))
                proc.start()
                sent, failures, elapsed = out.get(timeout=600)
                proc.join(30)
        finally:
            shutil.rmtree(self.tmp / name, ignore_errors=True)
        rate = sent / elapsed
        raw = baselines.raw_append(self.tmp, producers=1, body_size=128, duration_s=self.window_s)[
            "msgs_per_s"
        ]
        self.results["realistic"] = {"messages": sent, "failures": failures, "msgs_per_s": rate,
                                     "raw_append_msgs_per_s": raw, "ratio": _ratio(rate, raw),
                                     "settings": settings}  # fmt: skip
        print(
            f"realistic send (tags, a key, 1 GiB files, pool): {rate:.0f} msgs/s over {sent} messages, "
            f"raw append {raw:.0f}: {_ratio(rate, raw):.2f}x" + (f"  FAILURES {failures}" if failures else "")
        )

    def cleaner(self) -> None:
        size = 1 << 20
        window = 2.0 if self.quick else 4.0
        settings = {**STORE_SETTINGS, "mappedFileSizeCommitLog": str(size), "deleteWhen": ALL_HOURS,
                    "fileReservedTime": "1", "cleanResourceInterval": "100", "deleteCommitLogFilesInterval": "10"}  # fmt: skip
        with self.store("ASYNC", **settings) as service:
            while service.read(layout.WROTE_POSITION) < 48 * size:
                run_producers(service.names.base, producers=1, body_size=16384, batch=32, duration_s=0.5)
            quiet = run_producers(service.names.base, producers=1, body_size=128, batch=1, duration_s=window)
            min_before = service.read(layout.MIN_OFFSET)
            wrote = service.read(layout.WROTE_POSITION)
            old = time.time() - 2 * 3600
            closed = [p for p in (service.root / "commitlog").iterdir() if int(p.name) + size <= wrote - size]
            for path in closed:
                os.utime(path, (old, old))
            busy = run_producers(service.names.base, producers=1, body_size=128, batch=1, duration_s=window)
            deleted = (service.read(layout.MIN_OFFSET) - min_before) // size
        q, b = percentiles(quiet["latencies_us"]), percentiles(busy["latencies_us"])
        self.results["cleaner"] = {
            "files_deleted_during": deleted, "quiet_latency_us": q, "deleting_latency_us": b,
            "p99_ratio": _ratio(b["p99"], q["p99"]),
            "quiet_msgs_per_s": quiet["msgs_per_s"], "deleting_msgs_per_s": busy["msgs_per_s"],
        }  # fmt: skip
        print(f"put p99 while the cleaner deleted {deleted} files: {b['p99']:.0f} us vs {q['p99']:.0f} us "
              f"without (ratio {self.results['cleaner']['p99_ratio']:.2f}); p99.9 {b['p99.9']:.0f} vs {q['p99.9']:.0f} us")  # fmt: skip

    # ---------------------------------------------------------------- targets

    def targets(self) -> None:
        rows = self.results.get("put", [])

        def row(mode: str, api: str, producers: int) -> dict[str, Any] | None:
            return next((r for r in rows if r["mode"] == mode and r["api"] == api and r["producers"] == producers
                         and r["body_bytes"] == 128), None)  # fmt: skip

        checks: list[tuple[str, str, bool | None]] = []
        if r := row("ASYNC", "send", 1):
            checks.append(
                ("ASYNC 1 producer 128 B send >= 0.5x raw append", f"{r['ratio']:.3f}x", r["ratio"] >= 0.5)
            )
        if r := row("ASYNC", "batch100", 1):
            checks.append(
                (
                    "ASYNC 1 producer 128 B send_batch(100) >= 2.0x raw",
                    f"{r['ratio']:.3f}x",
                    r["ratio"] >= 2.0,
                )
            )
        sync8 = row("SYNC", "send", 8) or row(
            "SYNC", "send", max((r["producers"] for r in rows if r["mode"] == "SYNC"), default=0)
        )
        if sync8:
            checks.append(
                (
                    f"SYNC {sync8['producers']} producers >= 0.9x group commit msgs/s",
                    f"{sync8['ratio']:.3f}x",
                    sync8["ratio"] >= 0.9,
                )
            )
            checks.append((f"SYNC {sync8['producers']} producers p99 <= 1.5x group commit p99",
                           f"{sync8['p99_ratio']:.3f}x", sync8["p99_ratio"] <= 1.5))  # fmt: skip
        if e := self.results.get("e2e"):
            lat, hop = e["latency_us"], e["one_hop_us"]
            checks.append(("e2e ASYNC 10% load p50 <= 2.5x one hop",
                           f"{lat['p50']:.0f} vs {hop['p50']:.0f} us: {e['p50_ratio']:.2f}x", e["p50_ratio"] <= 2.5))  # fmt: skip
            checks.append(("e2e ASYNC 10% load p99 <= 3x one hop",
                           f"{lat['p99']:.0f} vs {hop['p99']:.0f} us: {e['p99_ratio']:.2f}x", e["p99_ratio"] <= 3.0))  # fmt: skip
        if (one := row("ASYNC", "send", 1)) and (four := row("ASYNC", "send", 4)):
            scaling = _ratio(four["msgs_per_s"], one["msgs_per_s"])
            checks.append(("ASYNC send, 4 producers >= 1.6x one", f"{scaling:.2f}x", scaling >= 1.6))
        if re := self.results.get("realistic"):
            checks.append(("realistic send (tags, key, 1 GiB, pool) >= 0.5x raw", f"{re['ratio']:.3f}x",
                           re["ratio"] >= 0.5))  # fmt: skip
        if rp := self.results.get("reput"):
            checks.append(("reput lag bounded", f"max {rp['lag_bytes_max'] / 1024:.0f} KiB", rp["bounded"]))
        if rc := self.results.get("recovery"):
            checks.append(("recovery <= 2x read+CRC per GiB", f"{rc['ratio']:.2f}x", rc["ratio"] <= 2.0))
        if cl := self.results.get("cleaner"):
            checks.append(("put p99 while deleting / without (report)", f"{cl['p99_ratio']:.2f}x", None))
        self.results["targets"] = [{"target": t, "measured": v, "met": ok} for t, v, ok in checks]
        print("\ntargets")
        for t, v, ok in checks:
            print(f"  {'-' if ok is None else 'MET ' if ok else 'MISS'}  {t:<52} {v}")


def _reput_catch_up(service: RunningService, *, duration_s: float) -> dict[str, float]:
    """Reput's dispatch capacity: pause the reput worker (SIGSTOP) while one producer sends
    batches of 100 x 128 B for ``duration_s``, resume it, and time how fast it drains the backlog
    (its batches are then as large as MAX_RECORDS_PER_PASS, as under a sustained overload)."""
    reput = _worker_process(service, "workers.reput")
    table = service.table()
    try:
        reput.suspend()
        try:
            run_producers(service.names.base, producers=1, body_size=128, batch=100, duration_s=duration_s)
        finally:
            cpu0, count0 = sum(reput.cpu_times()[:2]), table.get(layout.DISPATCH_COUNT)
            target = table.get(layout.WROTE_POSITION)
            t0 = time.perf_counter()
            reput.resume()
        deadline = t0 + 300
        while table.get(layout.REPUT_FROM_OFFSET) < target and time.perf_counter() < deadline:
            time.sleep(0.002)
        seconds = time.perf_counter() - t0
        records = table.get(layout.DISPATCH_COUNT) - count0
        cpu_s = sum(reput.cpu_times()[:2]) - cpu0
    finally:
        table.close()
    return {
        "records": records, "seconds": seconds, "records_per_s": records / seconds,
        "cpu_us_per_record": cpu_s / max(records, 1) * 1e6,
    }  # fmt: skip


def _worker_process(service: RunningService, module: str) -> psutil.Process:
    """The store's worker process running ``python -m <module>``."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if module in cmdline and service.names.base in " ".join(cmdline):
            return proc
    raise RuntimeError(f"no {module} process for store {service.names.base}")


def _kill_store(service: RunningService) -> None:
    """SIGKILL the supervisor and every worker (an abnormal exit), then remove its shm."""
    for proc in psutil.process_iter(["cmdline"]):
        if service.names.base in " ".join(proc.info["cmdline"] or []):
            os.kill(proc.pid, signal.SIGKILL)
    if service.process.poll() is None:
        service.process.kill()
    service.process.wait(10)
    StoreShm.unlink_all(service.names)


SCENARIOS: dict[str, Callable[[Bench], None]] = {
    "put": Bench.put,
    "e2e": Bench.e2e,
    "reput": Bench.reput,
    "recovery": Bench.recovery,
    "cleaner": Bench.cleaner,
    "scale": Bench.scale,
    "realistic": Bench.realistic,
    "crc": Bench.crc,
    "crc-same-store": Bench.crc_same_store,
}


def parse_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rmq-bench", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    parser.add_argument(
        "--mode", dest="modes", action="append", choices=list(MODES), help="put modes (default all)"
    )
    parser.add_argument("--body", type=int, help="one body size for the put matrix")
    parser.add_argument("--seconds", type=float, help="put window per row")
    parser.add_argument("--quick", action="store_true", help="fewer rows, shorter windows (a few minutes)")
    parser.add_argument(
        "--e2e-rate",
        type=float,
        default=0.0,
        help="pace the e2e producer at this many msgs/s (default: 10%% of the measured maximum send rate)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        type=parse_setting,
        metavar="KEY=VALUE",
        help="a broker.conf property for every store started (repeatable), e.g. warmMapedFileEnable=false",
    )
    args = parser.parse_args(argv)
    args.modes = args.modes or list(MODES)
    scenarios = args.scenario or list(SCENARIOS)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as tmp:
        bench = Bench(args, Path(tmp))
        free_gib = shutil.disk_usage(tmp).free / (1 << 30)
        bench.results["disk_free_gib"] = free_gib
        if free_gib < MIN_FREE_GIB and not args.quick:
            print(f"warning: {free_gib:.0f} GiB free under {tmp}; a full run needs about {MIN_FREE_GIB} "
                  "(a full disk refuses puts and spoils the rows)", flush=True)  # fmt: skip
        for name in scenarios:
            print(f"\n== {name}", flush=True)
            SCENARIOS[name](bench)
        bench.targets()
    out = RESULTS / f"bench-{stamp}.json"
    out.write_text(json.dumps(bench.results, indent=2))
    print(f"\nwrote {out}")
    for line in charts.write(bench.results, RESULTS / f"bench-{stamp}"):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
