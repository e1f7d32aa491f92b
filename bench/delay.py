"""Delayed-delivery accuracy: how late the scheduler delivers, idle and at load.

    python -m bench.delay [--seconds S] [--rate N] [--load-rate N]

A store with ``messageDelayLevel=1s 2s``; a process sends ``--rate`` level-1 delayed messages a
second for ``--seconds`` while, in the loaded scenario, another process sends ``--load-rate``
plain 128-byte messages a second (batches of 100 every 1/(rate/100) s) to another topic.
Lateness of a message = the store time of its delivered record minus its due time (the store
time of its schedule record + 1 s), both written by the store: what a consumer sees on top of
the delay. Baseline, in the same process tree at the same load: the overshoot of a
``time.sleep`` to an absolute time in the sending process (the OS timer's own lateness), which
no scheduler on this machine can beat. Prints a table and writes bench/results/delay.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.service import running_service
from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.store.schedule import SCHEDULE_TOPIC
from shm import layout

RESULTS = Path(__file__).resolve().parent / "results"
LEVEL_MS = 1000


def _delayed(store: str, seconds: float, rate: int, out: Any) -> None:
    """Send level-1 messages at ``rate``/s; report each sleep's overshoot (the baseline)."""
    from rmq_mp.put.producer import Producer

    overshoot_ms = []
    with Producer.attach(store) as producer:
        start = time.time()
        for i in range(int(seconds * rate)):
            target = start + i / rate
            time.sleep(max(0.0, target - time.time()))
            overshoot_ms.append((time.time() - target) * 1000)
            producer.send("Delayed", str(i).encode(), properties={"DELAY": "1"}, queue_id=i % 4)
    out.put(overshoot_ms)


def _load(store: str, seconds: float, rate: int) -> None:
    from rmq_mp.format.message_batch import MessageBatch
    from rmq_mp.put.producer import Producer

    body = bytes(128)
    with Producer.attach(store) as producer:
        start = time.time()
        batches = int(seconds * rate / 100)
        for i in range(batches):
            time.sleep(max(0.0, start + i * 100 / rate - time.time()))
            producer.send_batch(MessageBatch("Load", [body] * 100, queue_id=i % 4))


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def _drain(consumer: Consumer, topic: str, queues: range) -> list[Any]:
    got = []
    for queue_id in queues:
        offset = 0
        while (r := consumer.pull(topic, queue_id, offset, 256)).status is GetMessageStatus.FOUND:
            got.extend(r.messages)
            offset = r.next_begin_offset
    return got


def scenario(seconds: float, rate: int, load_rate: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_service(
            Path(tmp), messageDelayLevel="1s 2s", mappedFileSizeCommitLog=str(256 << 20)
        ) as service,
    ):
        queue = ctx.Queue()
        procs = [ctx.Process(target=_delayed, args=(service.names.base, seconds, rate, queue))]
        if load_rate:
            procs.append(ctx.Process(target=_load, args=(service.names.base, seconds, load_rate)))
        for p in procs:
            p.start()
        started = time.monotonic()
        overshoot = queue.get(timeout=seconds + 120)
        for p in procs:
            p.join(120)
        puts_per_s = service.read(layout.PUT_COUNT) / (time.monotonic() - started)
        expected = int(seconds * rate)
        with Consumer.attach(service.root, "bench") as consumer:
            deadline = time.monotonic() + 60
            while len(delivered := _drain(consumer, "Delayed", range(4))) < expected:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(delivered)} of {expected} delayed messages delivered")
                time.sleep(0.2)
            scheduled = {x.body: x.store_timestamp for x in _drain(consumer, SCHEDULE_TOPIC, range(1))}
        late = [float(x.store_timestamp - (scheduled[x.body] + LEVEL_MS)) for x in delivered]
    early = sum(1 for v in late if v < 0)
    return {
        "messages": len(late),
        "load_msgs_per_s": load_rate,
        "store_puts_per_s": round(puts_per_s),
        "early": early,
        "lateness_ms": {"p50": pct(late, 50), "p99": pct(late, 99), "max": max(late)},
        "baseline_sleep_overshoot_ms": {"p50": pct(overshoot, 50), "p99": pct(overshoot, 99)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=50, help="delayed messages a second")
    parser.add_argument("--load-rate", type=int, default=20000, help="plain messages a second beside them")
    args = parser.parse_args()
    rows = {
        "idle": scenario(args.seconds, args.rate, 0),
        "load": scenario(args.seconds, args.rate, args.load_rate),
    }
    print(f"{'scenario':<8} {'msgs':>6} {'load/s':>8} {'puts/s':>8} {'early':>5} {'late p50':>9} {'p99':>7} {'max':>7} "
          f"{'sleep p50':>10} {'p99':>7}")  # fmt: skip
    for name, r in rows.items():
        lat, base = r["lateness_ms"], r["baseline_sleep_overshoot_ms"]
        print(
            f"{name:<8} {r['messages']:>6} {r['load_msgs_per_s']:>8} {r['store_puts_per_s']:>8} {r['early']:>5} {lat['p50']:>7.1f}ms "
            f"{lat['p99']:>5.1f}ms {lat['max']:>5.0f}ms {base['p50']:>8.2f}ms {base['p99']:>5.2f}ms"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "delay.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
