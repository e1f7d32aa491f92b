"""`rmq-bench --scenario scale` (issue 17): how a store behaves as its queue count grows.

For each queue count (8, 1,000 and 10,000; ``--quick``: 8 and 1,000), with RocketMQ's default
ConsumeQueue and index geometry, one store:

- **put**: one producer process `send`s 128-byte messages round-robin over every queue (topics
  of 8 queues each) for the window: msgs/s and p50/p99 send latency. The ratio is against the
  8-queue row of the same run: RocketMQ's known weakness is the scattered writes of many queues.
- **disk and shared memory**: blocks the store directory and the store's /dev/shm objects
  really hold (sparse files and untouched pages count nothing).
- **consumer catch-up**: one process pulls every queue from offset 0 to its end (32 a pull).
- **recovery**: the supervisor's own recovery time (`recovery_ms`) after a clean stop and after
  SIGKILL of every process (abnormal: from the checkpoint, CRC checked).
Stores are deleted once measured. Also runnable alone: ``python -m bench.scale [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.baselines import percentiles
from bench.service import RunningService, cleanup_started, running_service, start_service_within, wait_until
from bench.store import CTX, _collect
from shm import layout

QUEUES_PER_TOPIC = 8
SETTINGS = {
    # RocketMQ's default ConsumeQueue (300,000 entries) and index geometry; small commit-log files
    # so the run does not hold GiBs of log.
    "mappedFileSizeCommitLog": str(256 << 20),
    "mappedFileSizeConsumeQueue": "6000000",
    "maxHashSlotNum": "5000000",
    "maxIndexNum": "20000000",
}


def queue_list(queues: int) -> list[tuple[str, int]]:
    return [(f"scale-{i // QUEUES_PER_TOPIC}", i % QUEUES_PER_TOPIC) for i in range(queues)]


def send_round_robin(name: str, queues: int, duration_s: float, start: Any, out: Any) -> None:
    """`send` 128-byte bodies over every queue in turn; report (sent, failures, s, latencies ns)."""
    from rmq_mp.put.producer import Producer

    targets = queue_list(queues)
    body = os.urandom(128)
    latencies: list[int] = []
    sent = failures = 0
    with Producer.attach(name) as producer:
        for topic, queue_id in targets[: min(queues, 64)]:  # warm up
            producer.send(topic, body, queue_id=queue_id)
        start.wait()
        began = time.perf_counter()
        deadline = began + duration_s
        perf_ns = time.perf_counter_ns
        i = 0
        while time.perf_counter() < deadline:
            topic, queue_id = targets[i % queues]
            i += 1
            t0 = perf_ns()
            failures += not producer.send(topic, body, queue_id=queue_id).ok
            latencies.append(perf_ns() - t0)
            sent += 1
        elapsed = time.perf_counter() - began
    out.put((sent, failures, elapsed, latencies))


def catch_up(name: str, queues: int, out: Any) -> None:
    """Pull every queue from 0 to its end; report (messages, seconds)."""
    from rmq_mp.client.consumer import Consumer
    from rmq_mp.outcomes import GetMessageStatus

    read = 0
    began = time.perf_counter()
    with Consumer.attach(name, "scale-catch-up") as consumer:
        for topic, queue_id in queue_list(queues):
            offset = 0
            while (result := consumer.pull(topic, queue_id, offset, 32)).status is GetMessageStatus.FOUND:
                read += len(result.messages)
                offset = result.next_begin_offset
    out.put((read, time.perf_counter() - began))


def allocated_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def shm_bytes(service: RunningService) -> tuple[int, int]:
    """(allocated, reserved) bytes of the store's /dev/shm segments and semaphores."""
    allocated = reserved = 0
    for entry in service.names.leftovers():
        st = (Path("/dev/shm") / entry).stat()
        allocated += st.st_blocks * 512
        reserved += st.st_size
    return allocated, reserved


def _kill(service: RunningService) -> None:
    for proc in psutil.process_iter(["cmdline"]):
        if service.names.base in " ".join(proc.info["cmdline"] or []):
            os.kill(proc.pid, signal.SIGKILL)
    service.process.kill()  # the supervisor's command line names the conf, not the shm
    service.process.wait(30)
    from shm.store_shm import StoreShm

    StoreShm.unlink_all(service.names)


def measure(tmp: Path, queues: int, window_s: float, overrides: dict[str, str]) -> dict[str, Any]:
    name = f"scale{queues}"
    settings = {**SETTINGS, **overrides}
    row: dict[str, Any] = {"queues": queues}
    try:
        with running_service(tmp, name, **settings) as service:
            start, out = CTX.Event(), CTX.Queue()
            proc = CTX.Process(
                target=send_round_robin, args=(service.names.base, queues, window_s, start, out)
            )
            proc.start()
            time.sleep(0.5)  # let it attach and warm up before the window opens
            start.set()
            sent, failures, elapsed, latencies = _collect(out, [proc], window_s + 600)[0]
            lat = percentiles(sorted(ns / 1000 for ns in latencies))
            wrote = service.read(layout.WROTE_POSITION)
            wait_until(lambda: service.read(layout.REPUT_FROM_OFFSET) >= wrote, 600, "dispatch to catch up")
            row |= {
                "msgs_per_s": sent / elapsed,
                "failures": failures,
                "send_p50_us": lat["p50"],
                "send_p99_us": lat["p99"],
                "messages": sent,
                "queues_written": min(sent, queues),
            }
            reader = CTX.Process(target=catch_up, args=(service.names.base, queues, out))
            reader.start()
            read, seconds = _collect(out, [reader], 900)[0]
            row |= {"catch_up_msgs_per_s": read / seconds, "catch_up_s": seconds, "catch_up_read": read}
            row["shm_allocated_bytes"], row["shm_reserved_bytes"] = shm_bytes(service)
        row["disk_allocated_bytes"] = allocated_bytes(tmp / name)
        # Recovery reads every queue's files: ~2 ms a queue from a cold page cache on this VM.
        service = start_service_within(600, tmp, name, settings)
        row["recovery_normal_ms"] = service.read(layout.RECOVERY_MS)
        _kill(service)
        service = start_service_within(600, tmp, name, settings)
        row["recovery_abnormal_ms"] = service.read(layout.RECOVERY_MS)
        service.stop()
    finally:
        cleanup_started()  # a failed row leaves no store process, segment or semaphore behind
        shutil.rmtree(tmp / name, ignore_errors=True)
    return row


def run(tmp: Path, *, quick: bool, window_s: float, overrides: dict[str, str]) -> dict[str, Any]:
    counts = [8, 1000] if quick else [8, 1000, 10000]
    rows: list[dict[str, Any]] = []
    print(f"{'queues':>7}{'msgs/s':>10}{'ratio':>7}{'p50us':>8}{'p99us':>9}{'disk MiB':>10}{'shm MiB':>9}"
          f"{'catch-up/s':>12}{'rec ms':>8}{'abn ms':>8}")  # fmt: skip
    for queues in counts:
        row = measure(tmp, queues, window_s, overrides)
        row["ratio_vs_8"] = row["msgs_per_s"] / rows[0]["msgs_per_s"] if rows else 1.0
        rows.append(row)
        print(f"{queues:>7}{row['msgs_per_s']:>10.0f}{row['ratio_vs_8']:>7.2f}{row['send_p50_us']:>8.0f}"
              f"{row['send_p99_us']:>9.0f}{row['disk_allocated_bytes'] / 2**20:>10.1f}"
              f"{row['shm_allocated_bytes'] / 2**20:>9.1f}{row['catch_up_msgs_per_s']:>12.0f}"
              f"{row['recovery_normal_ms']:>8}{row['recovery_abnormal_ms']:>8}", flush=True)  # fmt: skip
    return {"rows": rows, "settings": {**SETTINGS, **overrides}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-scale-") as tmp:
        run(Path(tmp), quick=args.quick, window_s=args.seconds, overrides={})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
