"""Long-poll wake latency and idle CPU of a real store, beside a same-run baseline.

    python -m bench.wakeup [--samples N]

- baseline: one-way latency of a POSIX semaphore post between two processes (half a round trip),
  the floor for any cross-process wakeup on this machine;
- measured: a producer process sends a message stamped with CLOCK_MONOTONIC right after `send`
  returns; a consumer blocked in `pull(timeout_s=...)` records when it has the message. That is
  send-return -> dispatch by reput -> wake -> read, an upper bound on dispatch -> wake;
- idle CPU: all store processes (supervisor + workers) over 5 s with no traffic.
Prints a table and writes bench/results/wakeup.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import posix_ipc

from bench.service import running_service, store_cpu_fraction
from rmq_mp.client.consumer import Consumer

RESULTS = Path(__file__).resolve().parent / "results"


def _echo(name_in: str, name_out: str, rounds: int) -> None:
    sin, sout = posix_ipc.Semaphore(name_in), posix_ipc.Semaphore(name_out)
    for _ in range(rounds):
        sin.acquire()
        sout.release()


def semaphore_baseline_us(rounds: int = 2000) -> list[float]:
    names = (f"/rmqbench_in_{id(rounds)}", f"/rmqbench_out_{id(rounds)}")
    sin = posix_ipc.Semaphore(names[0], posix_ipc.O_CREX, initial_value=0)
    sout = posix_ipc.Semaphore(names[1], posix_ipc.O_CREX, initial_value=0)
    try:
        proc = mp.get_context("spawn").Process(target=_echo, args=(*names, rounds))
        proc.start()
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            sin.release()
            sout.acquire()
            samples.append((time.perf_counter_ns() - t0) / 2000)
        proc.join()
    finally:
        for s in (sin, sout):
            s.unlink()
            s.close()
    return samples


def _producer(store: str, samples: int, interval_s: float) -> None:
    from rmq_mp.put.producer import Producer

    with Producer.attach(store) as producer:
        for _ in range(samples):
            time.sleep(interval_s)
            producer.send("Wake", b"", queue_id=0, properties={"t": str(time.monotonic_ns())})


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    baseline = semaphore_baseline_us()
    with tempfile.TemporaryDirectory() as tmp, running_service(Path(tmp)) as service:
        time.sleep(1.0)
        idle = store_cpu_fraction(service, 5.0)
        producer = mp.get_context("spawn").Process(
            target=_producer, args=(service.names.base, args.samples, 0.02)
        )
        wake_us: list[float] = []
        with Consumer.attach(service.root, "bench") as consumer:
            producer.start()
            offset = 0
            while len(wake_us) < args.samples:
                result = consumer.pull("Wake", 0, offset, 32, timeout_s=5)
                now = time.monotonic_ns()
                wake_us.extend((now - int(m.properties["t"])) / 1000 for m in result.messages)
                offset = result.next_begin_offset
            producer.join()
    report = {
        "baseline_semaphore_one_way_us": {"p50": pct(baseline, 50), "p99": pct(baseline, 99)},
        "long_poll_send_to_wake_us": {
            "p50": pct(wake_us, 50),
            "p99": pct(wake_us, 99),
            "samples": len(wake_us),
        },
        "ratio_p50": pct(wake_us, 50) / pct(baseline, 50),
        "idle_cpu_fraction_of_one_core": idle,
    }
    print(f"{'measure':<34} {'p50':>10} {'p99':>10}")
    print(
        f"{'semaphore post, one way (baseline)':<34} {pct(baseline, 50):>8.1f}us {pct(baseline, 99):>8.1f}us"
    )
    print(f"{'send -> long-poll consumer woken':<34} {pct(wake_us, 50):>8.1f}us {pct(wake_us, 99):>8.1f}us")
    print(f"ratio p50 {report['ratio_p50']:.1f}x baseline;  idle store CPU {idle:.2%} of one core")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "wakeup.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
