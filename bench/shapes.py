"""`python -m bench.shapes`: issue 33's rows, every send shape beside plain `send` in one run.

One producer process (spawned, attached by shm name) on one ASYNC store with the pool on sends
``--messages`` 128 B messages per row after 2,000, in rounds: plain `send`, then each shape, then
plain again; each shape's ratio is to the mean of its round's two plain rows. Every status is
checked, and the run fails if a timed send was served by the reference (reference_sends) for a
reason of its shape (STORE_REASONS, the store's state, are printed, not failed).
Then, each on a fresh store:

- warm-up: the first 100,000 sends on a fresh store (10 chunks of 10,000) against the 100,000
  after them (the steady rate);
- rocketmq: issue 33's comparison shape (tags TagA, one key given as a list, 8 queues in turn,
  1 GiB files, pool off, 200,000 sends after 2,000; ASYNC 1 producer, SYNC 4 producers of 5,000
  each), printed beside the issue's RocketMQ 4.9.8 figures (324k msgs/s ASYNC, 17.8k SYNC), which
  were measured on another day: those ratios are not same-run. The ASYNC store has RocketMQ's
  defaults where the issue names nothing (ROCKETMQ_DEFAULTS: no warming, its consume-queue and
  index file sizes, not the test-sized ones of bench.service), and its figure is a loop with no
  clock reads of its own; a second pass of 200,000 stamps each send (two perf_counter_ns, about
  0.19 us a send in CPython) for the p99 and reports its own rate.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.service import running_service
from bench.store import CTX

STORE_REASONS = frozenset(("new_file", "new_queue", "store_busy"))
"""Reference sends the store's state causes, not the shape (a file switch, the periodic look at
topics.json, back-pressure while reput lags): the reference handles them by design."""
TOPIC = "Shapes"
QUEUES = 8
ROCKETMQ_ASYNC_MSGS_S = 324_000
"""Issue 33: RocketMQ 4.9.8 `putMessage`, 1 thread, pool off (not this run, not this day)."""
ROCKETMQ_SYNC_MSGS_S = 17_800
"""Issue 33: RocketMQ 4.9.8 SYNC_FLUSH, 4 threads, 20,000 messages (not this run, not this day)."""
ROCKETMQ_DEFAULTS = {
    "mappedFileSizeCommitLog": str(1 << 30),
    "warmMapedFileEnable": "false",
    "mappedFileSizeConsumeQueue": str(300_000 * 20),
    "maxHashSlotNum": "5000000",
    "maxIndexNum": "20000000",
}
"""The ASYNC comparison store: RocketMQ 4.9.8's MessageStoreConfig defaults where the issue's
figure names no setting. bench.service's base settings size consume-queue files at 1,000 entries
and index files at 4,000, so reput made and flushed a new file every 1,000 messages of a queue
and every 2,000 keyed messages: on 2 cores that CPU came off the producer (bench/NOTES.md
2026-11-27, cmpshape)."""


def _shapes() -> list[tuple[str, dict[str, Any], Any]]:
    """(name, send keywords, body maker) per row; issue 33's table, then the rest of point 1."""
    plain = bytes
    return [
        ("tags", {"tags": "TagA"}, plain),
        ("tags + key str", {"tags": "TagA", "keys": "k1"}, plain),
        ("tags + key list", {"tags": "TagA", "keys": ["k1"]}, plain),
        ("keys tuple", {"keys": ("k1", "x")}, plain),
        ("property", {"properties": {"a": "1"}}, plain),
        ("bytearray body", {}, bytearray),
        ("memoryview body", {}, memoryview),
        ("numpy body", {}, lambda b: np.frombuffer(b, dtype=np.uint8)),
        ("flag", {"flag": 7}, plain),
        ("delay level 3", {"properties": {"DELAY": "3"}}, plain),
        ("no queue id (rotated)", {"queue_id": None}, plain),
    ]


def _reference_sends(producer: Any) -> dict[str, int]:
    from shm.layout import Role
    from shm.metrics import MetricsTable

    table = MetricsTable.attach(producer.store.names.metrics, Role.CONSUMER)
    try:
        return table.totals().reference_sends
    finally:
        table.close()


def _timed(producer: Any, messages: int, kw: dict[str, Any], make: Any) -> float:
    """msgs/s of ``messages`` sends of one shape (bodies made before the clock starts)."""
    bodies = [make(os.urandom(128)) for _ in range(64)]
    send = producer.send
    failures = 0
    began = time.perf_counter()
    if "queue_id" in kw:
        for i in range(messages):
            failures += not send(TOPIC, bodies[i & 63], **kw).ok
    else:
        for i in range(messages):
            failures += not send(TOPIC, bodies[i & 63], queue_id=i & 7, **kw).ok
    elapsed = time.perf_counter() - began
    if failures:
        raise AssertionError(f"{failures} sends of {kw} failed")
    return messages / elapsed


def shapes_worker(name: str, messages: int, rounds: int, out: Any) -> None:
    from rmq_mp.put.producer import Producer

    with Producer.attach(name) as producer:
        for level in (3,):  # each queue's first send (the reference's, by design) before the clock
            producer.send(TOPIC, b"w", queue_id=0, properties={"DELAY": str(level)})
        for i in range(2000):
            producer.send(TOPIC, b"w" * 128, queue_id=i & 7)
        rows: dict[str, list[float]] = {}
        plain: list[float] = []
        before = _reference_sends(producer)
        for _ in range(rounds):
            first = _timed(producer, messages, {}, bytes)
            shape_rates = {n: _timed(producer, messages, kw, make) for n, kw, make in _shapes()}
            last = _timed(producer, messages, {}, bytes)
            plain += [first, last]
            for n, rate in shape_rates.items():
                rows.setdefault(n, []).append(rate / ((first + last) / 2))
                rows.setdefault(f"{n} msgs/s", []).append(rate)
        after = _reference_sends(producer)
        served = {why: n - before[why] for why, n in after.items() if n > before[why]}
    out.put({"plain msgs/s": plain, "rows": rows, "reference_sends": served})


def warmup_worker(name: str, out: Any) -> None:
    """The first 100,000 sends on a fresh store, in chunks of 10,000, then 100,000 more."""
    from rmq_mp.put.producer import Producer

    body = os.urandom(128)
    with Producer.attach(name) as producer:
        send = producer.send
        chunks = []
        for _ in range(20):
            began = time.perf_counter()
            for i in range(10_000):
                send(TOPIC, body, queue_id=i & 7)
            chunks.append(10_000 / (time.perf_counter() - began))
    out.put(chunks)


def rocketmq_sends(name: str, messages: int, warmup: int, start: Any) -> tuple[int, float, np.ndarray]:
    """Issue 33's comparison shape (tags TagA, one key as a list, 8 queues in turn), timed after
    ``warmup`` sends once ``start`` is set: (failures, seconds, each send's latency in us)."""
    from rmq_mp.put.producer import Producer

    body = os.urandom(128)
    latencies_us = np.empty(messages, dtype=np.float64)
    failures = 0
    with Producer.attach(name) as producer:
        for i in range(warmup):
            failures += not producer.send(TOPIC, body, tags="TagA", keys=[f"k{i}"], queue_id=i & 7).ok
        start.wait()
        began = time.perf_counter()
        for i in range(messages):
            t = time.perf_counter_ns()
            failures += not producer.send(TOPIC, body, tags="TagA", keys=[f"key-{i}"], queue_id=i & 7).ok
            latencies_us[i] = (time.perf_counter_ns() - t) / 1000
        elapsed = time.perf_counter() - began
    return failures, elapsed, latencies_us


def rocketmq_async_sends(
    name: str, messages: int, warmup: int, start: Any
) -> tuple[int, float, float, np.ndarray]:
    """`rocketmq_sends` timed twice once ``start`` is set: ``messages`` sends with no clock read
    of the loop's own, then ``messages`` more each stamped. (failures, seconds unstamped, seconds
    stamped, each stamped send's latency in us)."""
    from rmq_mp.put.producer import Producer

    body = os.urandom(128)
    latencies_us = np.empty(messages, dtype=np.float64)
    failures = 0
    with Producer.attach(name) as producer:
        send = producer.send
        for i in range(warmup):
            failures += not send(TOPIC, body, tags="TagA", keys=[f"k{i}"], queue_id=i & 7).ok
        start.wait()
        began = time.perf_counter()
        for i in range(messages):
            failures += not send(TOPIC, body, tags="TagA", keys=[f"key-{i}"], queue_id=i & 7).ok
        plain_s = time.perf_counter() - began
        began = time.perf_counter()
        for i in range(messages, 2 * messages):
            t = time.perf_counter_ns()
            failures += not send(TOPIC, body, tags="TagA", keys=[f"key-{i}"], queue_id=i & 7).ok
            latencies_us[i - messages] = (time.perf_counter_ns() - t) / 1000
        stamped_s = time.perf_counter() - began
    return failures, plain_s, stamped_s, latencies_us


def rocketmq_async_worker(name: str, messages: int, warmup: int, start: Any, out: Any) -> None:
    """`rocketmq_async_sends` in a producer process, handing back the p99 (us) of the stamped pass."""
    failures, plain_s, stamped_s, latencies_us = rocketmq_async_sends(name, messages, warmup, start)
    out.put((messages, failures, plain_s, stamped_s, float(np.percentile(latencies_us, 99))))


def rocketmq_worker(name: str, messages: int, warmup: int, start: Any, out: Any) -> None:
    """`rocketmq_sends` in a producer process, handing back its p99 (us)."""
    failures, elapsed, latencies_us = rocketmq_sends(name, messages, warmup, start)
    out.put((messages, failures, elapsed, float(np.percentile(latencies_us, 99))))


def _run(target: Any, *args: Any, procs: int = 1, barrier: bool = False) -> list[Any]:
    out = CTX.Queue()
    start = CTX.Barrier(procs) if barrier else None
    workers = [
        CTX.Process(target=target, args=(*args, *((start,) if barrier else ()), out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join(60)
        assert w.exitcode == 0, f"{target.__name__} exited {w.exitcode}"
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.shapes", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--messages", type=int, default=60_000, help="timed sends per row")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip", action="append", default=[], choices=["shapes", "warmup", "rocketmq"])
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    pool = {"flushDiskType": "ASYNC_FLUSH", "transientStorePoolEnable": "true", "transientStorePoolSize": "3"}
    files = {"mappedFileSizeCommitLog": str(64 << 20), "warmMapedFileEnable": "true"}
    with tempfile.TemporaryDirectory(prefix="bench-shapes-") as tmp:
        if "shapes" not in args.skip:
            with running_service(Path(tmp), "shapes", **pool, **files) as service:
                (got,) = _run(shapes_worker, service.names.base, args.messages, args.rounds)
            print(f"plain send msgs/s per row: {[round(r) for r in got['plain msgs/s']]}")
            for name, _kw, _make in _shapes():
                ratios, rates = got["rows"][name], got["rows"][f"{name} msgs/s"]
                print(
                    f"{name:<24} {min(rates) / 1e3:7.0f}-{max(rates) / 1e3:.0f}k msgs/s  "
                    f"{min(ratios):.2f}-{max(ratios):.2f}x plain"
                )
            print(f"timed sends served by the reference, per reason: {got['reference_sends']}")
            unexpected = {why: n for why, n in got["reference_sends"].items() if why not in STORE_REASONS}
            if unexpected:  # the store's state may send a put to the reference; a shape may not
                raise SystemExit(f"timed sends went to the reference: {unexpected}")
            report["shapes"] = got
        if "warmup" not in args.skip:
            with running_service(Path(tmp), "warm", **pool, **files) as service:
                (chunks,) = _run(warmup_worker, service.names.base)
            first, steady = (
                100_000 / sum(10_000 / c for c in chunks[:10]),
                100_000 / sum(10_000 / c for c in chunks[10:]),
            )
            print(
                f"warm-up: first 100k {first / 1e3:.0f}k msgs/s, next 100k {steady / 1e3:.0f}k: "
                f"{first / steady:.2f}x steady; chunks of 10k (k msgs/s): {[round(c / 1e3) for c in chunks]}"
            )
            report["warmup"] = {"chunks": chunks, "first_over_steady": first / steady}
        if "rocketmq" not in args.skip:
            with running_service(
                Path(tmp), "rmq-async", flushDiskType="ASYNC_FLUSH", **ROCKETMQ_DEFAULTS
            ) as service:
                ((n, failures, plain_s, stamped_s, p99_us),) = _run(
                    rocketmq_async_worker, service.names.base, 200_000, 2_000, barrier=True
                )
            rate, stamped = n / plain_s, n / stamped_s
            print(
                f"rocketmq shape ASYNC 1 producer: {rate / 1e3:.0f}k msgs/s (each send stamped: "
                f"{stamped / 1e3:.0f}k msgs/s, p99 {p99_us:.1f} us), failures {failures}; "
                f"{rate / ROCKETMQ_ASYNC_MSGS_S:.2f}x the issue's RocketMQ 324k (NOT same-run)"
            )
            big = {"mappedFileSizeCommitLog": str(1 << 30), "warmMapedFileEnable": "true"}
            with running_service(Path(tmp), "rmq-sync", flushDiskType="SYNC_FLUSH", **big) as service:
                got4 = _run(rocketmq_worker, service.names.base, 5_000, 500, procs=4, barrier=True)
            rate4 = sum(r[0] for r in got4) / max(r[2] for r in got4)
            print(
                f"rocketmq shape SYNC 4 producers: {rate4 / 1e3:.1f}k msgs/s (p99 {max(r[3] for r in got4):.0f} us), "
                f"failures {sum(r[1] for r in got4)}; {rate4 / ROCKETMQ_SYNC_MSGS_S:.2f}x the issue's RocketMQ "
                f"17.8k (NOT same-run)"
            )
            report["rocketmq"] = {
                "async_msgs_s": rate,
                "async_stamped_msgs_s": stamped,
                "async_p99_us": p99_us,
                "sync4_msgs_s": rate4,
            }
    print(json.dumps(report, default=float)[:2000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
