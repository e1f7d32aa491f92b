"""Sustained `send_batch` rate over time, to see what first touch of fresh pages costs.

    python -m bench.first_touch [--seconds S] [--pretouch-gib G] [--set KEY=VALUE ...]

One producer (this process) sends 100 x 128 B `MessageBatch`es to a real ASYNC store for S
seconds and prints, every 0.5 s, its rate, its own user and system CPU (cores), the dispatch
lag and the kernel's Dirty/Writeback. On a VM that hands freed guest pages back to the host
(free page reporting), the first touch of such a page is a host fault: the rate halves once the
writes run past the pages freed recently, and the producer's system CPU rises. ``--pretouch-gib``
allocates, touches and frees that much memory first, to show the fast phase lengthen by as much;
``--set warmMapedFileEnable=true`` moves the first touch to the allocator. No baseline: this
explains a bench figure (bench/NOTES.md), it is not one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.__main__ import MODES, STORE_SETTINGS, parse_setting
from bench.service import running_service
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.put.producer import Producer
from shm import layout

WINDOW_S = 0.5
BATCHES_PER_CHECK = 500


def _dirty_writeback_mib() -> tuple[int, int]:
    kib = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            kib[key] = int(value.split()[0])
    return kib["Dirty"] >> 10, kib["Writeback"] >> 10


def _measure(producer: Producer, seconds: float) -> None:
    batch = MessageBatch("BenchTopic", [os.urandom(128)] * 100, queue_id=0)
    began = window_start = time.perf_counter()
    cpu_start = os.times()
    sent = 0
    while window_start - began < seconds:
        for _ in range(BATCHES_PER_CHECK):
            producer.send_batch(batch)
        sent += BATCHES_PER_CHECK * len(batch.bodies)
        now = time.perf_counter()
        if now - window_start < WINDOW_S:
            continue
        cpu = os.times()
        elapsed = now - window_start
        lag = producer.table.get(layout.WROTE_POSITION) - producer.table.get(layout.REPUT_FROM_OFFSET)
        dirty, writeback = _dirty_writeback_mib()
        print(f"{now - began:>5.1f}{sent / elapsed:>11.0f}{(cpu.user - cpu_start.user) / elapsed:>6.2f}"
              f"{(cpu.system - cpu_start.system) / elapsed:>6.2f}{lag >> 20:>9}{dirty:>11}{writeback:>8}",
              flush=True)  # fmt: skip
        window_start, cpu_start, sent = now, cpu, 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_touch", description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--pretouch-gib", type=int, default=0)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], type=parse_setting, metavar="KEY=VALUE"
    )
    args = parser.parse_args(argv)
    settings = {**STORE_SETTINGS, **MODES["ASYNC"], "warmMapedFileEnable": "false", **dict(args.overrides)}
    print(f"warmMapedFileEnable={settings['warmMapedFileEnable']} pretouch={args.pretouch_gib} GiB")
    print(f"{'t s':>5}{'msgs/s':>11}{'user':>6}{'sys':>6}{'lag MiB':>9}{'dirty MiB':>11}{'wb MiB':>8}")
    with (
        tempfile.TemporaryDirectory(prefix="rmq-bench-") as tmp,
        running_service(Path(tmp), "ft", **settings) as service,
        Producer.attach(service.names.base) as producer,
    ):
        if args.pretouch_gib:
            touched = bytearray(args.pretouch_gib << 30)  # zero-filled: every page written
            del touched
        _measure(producer, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
