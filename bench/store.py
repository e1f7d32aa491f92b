"""Store-side workloads for `python -m bench`: producer and consumer processes on a real store.

Every worker is a spawned process that attaches by shm name, as any client would. Producers
wait on a shared start event so all of them (and the clock) start together; each checks every
status it gets back and reports failures, so a figure is never bought with lost messages.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from typing import Any

CTX = mp.get_context("spawn")
TOPIC = "BenchTopic"
E2E_TOPIC = "BenchE2E"
"""The paced e2e producer's topic: only stamped bodies in it."""
QUEUES = 8


def put_worker(
    name: str,
    index: int,
    body_size: int,
    batch: int,
    duration_s: float,
    start: Any,
    out: Any,
    rate_per_s: float = 0.0,
    block: int = 1,
) -> None:
    """Send for ``duration_s`` (``batch`` 1: `send`; more: `send_batch` of a `MessageBatch`) and report
    (messages, failures, elapsed s, per-call latencies in ns). ``rate_per_s`` > 0 paces sends and
    stamps each body with CLOCK_MONOTONIC for end-to-end latency. ``block`` > 1 (`send` only):
    sends go in blocks of that many between looks at the clock, as the raw-append baseline
    writes, and only each block's first call is timed (a sample of the latencies): with a send
    under a microsecond, timing every call cost a third of the loop. Every status is still checked."""
    from rmq_mp.format.message_batch import MessageBatch
    from rmq_mp.put.producer import Producer

    body = os.urandom(body_size)
    items = MessageBatch(TOPIC, [body] * batch, queue_id=index % QUEUES)  # RocketMQ's batch shape
    latencies_ns: list[int] = []
    sent = failures = 0
    assertions: list[str] = []
    with Producer.attach(name) as producer:
        for _ in range(20):  # warm up: first touch, imports, caches
            producer.send(TOPIC, body, queue_id=index % QUEUES)
        start.wait()
        began = time.perf_counter()
        deadline = began + duration_s
        interval_s = 1 / rate_per_s if rate_per_s else 0.0
        next_at = began
        perf_ns = time.perf_counter_ns
        while True:
            now = time.perf_counter()
            if now >= deadline:
                break
            if interval_s:
                if now < next_at:
                    time.sleep(max(0.0, next_at - now - 50e-6))
                    continue
                next_at += interval_s
                stamp = time.monotonic_ns().to_bytes(8, "big")
                result = producer.send(E2E_TOPIC, stamp + body[8:], queue_id=0)
                sent += 1
                failures += not result.ok
                continue
            if block > 1 and batch == 1:
                queue_id = index % QUEUES
                t0 = perf_ns()
                failures += not producer.send(TOPIC, body, queue_id=queue_id).ok
                latencies_ns.append(perf_ns() - t0)
                for _ in range(block - 1):
                    failures += not producer.send(TOPIC, body, queue_id=queue_id).ok
                sent += block
                continue
            t0 = perf_ns()
            try:
                if batch == 1:
                    ok = producer.send(TOPIC, body, queue_id=index % QUEUES).ok
                    failures += not ok
                else:
                    failures += producer.send_batch(items).failures
            except AssertionError as exc:  # an invariant check of the put path: count and report it
                failures += batch
                assertions.append(str(exc))
            latencies_ns.append(perf_ns() - t0)
            sent += batch
        elapsed = time.perf_counter() - began
    if assertions:
        print(
            f"producer {index}: {len(assertions)} put-path assertions failed, first: {assertions[0]}",
            flush=True,
        )
    out.put((sent, failures, elapsed, latencies_ns))


CRC_ORDERS = (
    ("on", "off", "ctl", "ctl", "off", "on"),
    ("off", "ctl", "on", "on", "ctl", "off"),
    ("ctl", "on", "off", "off", "on", "ctl"),
)
"""`crc_pair_worker`'s block orders, one a round in turn: each setting first, middle and last as
often, and each round symmetric, so a drift within a round or across rounds favours none."""


def cpu_ns(pids: list[int]) -> int:
    """CPU time of every thread of ``pids`` in ns (/proc/PID/task/TID/schedstat: the scheduler's
    own run time, exact; psutil's cpu_times counts in 10 ms ticks, too coarse for 20 ms blocks)."""
    total = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def crc_pair_worker(
    name: str, body_size: int, batch: int, block: int, rounds: int, store_pids: dict[str, int], out: Any
) -> None:
    """The whole-record CRC's cost on one store at one time: three producers in this process, one
    writing the CRC (the store's setting: "on") and two built from one attach with
    ``enabled_append_prop_crc`` off ("off" and the control "ctl", the same settings: their ratio is
    the noise floor printed beside on/off; records without the CRC are what a 4.9.8 store writes
    and every reader takes both). ``rounds`` of six timed blocks of ``block`` calls in the orders
    of CRC_ORDERS, each call `send` (``batch`` 1) or `send_batch` of a `MessageBatch`; every status
    checked. A co-tenant's burst then hits a block of a round, not a setting's whole store. Per
    block: wall s, this process's CPU s, the store's processes' CPU s (``store_pids``, role ->
    pid; and reput's alone) and the records whose CRC the lock corrected (a wrong guess of its
    fields). Reports {setting: {"wall": [...], "cpu", "store_cpu", "reput_cpu", "crc_misses"},
    "failures": n, "bytes": {setting: record size}}."""
    import dataclasses

    from rmq_mp.format.message_batch import MessageBatch
    from rmq_mp.put.producer import Producer
    from rmq_mp.store.running_store import RunningStore
    from shm.layout import Role

    body = os.urandom(body_size)
    items = MessageBatch(TOPIC, [body] * batch, queue_id=0)
    blocks: dict[str, dict[str, list[float]]] = {
        setting: {"wall": [], "cpu": [], "store_cpu": [], "reput_cpu": [], "crc_misses": []}
        for setting in ("on", "off", "ctl")
    }
    failures = 0
    sizes: dict[str, int] = {}
    plain = [RunningStore.attach(name, Role.PRODUCER, writable_log=True) for _ in range(2)]
    for store in plain:
        store.config = dataclasses.replace(store.config, enabled_append_prop_crc=False)
    all_pids = list(store_pids.values())
    reput_pid = [store_pids["reput"]]
    with Producer.attach(name) as on, Producer(plain[0]) as off, Producer(plain[1]) as ctl:
        assert on.encoder.append_crc, "the store must run with the CRC on"
        assert not off.encoder.append_crc
        assert not ctl.encoder.append_crc
        producers = {"on": on, "off": off, "ctl": ctl}
        for setting, producer in producers.items():
            for _ in range(2000):  # warm up: first touch, imports, caches
                first = producer.send(TOPIC, body, queue_id=0)
            second = producer.send(TOPIC, body, queue_id=0)
            sizes[setting] = second.commit_log_offset - first.commit_log_offset

        def misses(producer: Producer) -> int:
            return int(getattr(producer._native, "crc_misses", 0))

        for r in range(rounds):
            for setting in CRC_ORDERS[r % len(CRC_ORDERS)]:
                producer = producers[setting]
                got = blocks[setting]
                missed, store0, reput0 = misses(producer), cpu_ns(all_pids), cpu_ns(reput_pid)
                cpu0 = time.process_time()
                began = time.perf_counter()
                if batch == 1:
                    for i in range(block):
                        failures += not producer.send(TOPIC, body, queue_id=i & 7).ok
                else:
                    for _ in range(block):
                        failures += producer.send_batch(items).failures
                got["wall"].append(time.perf_counter() - began)
                got["cpu"].append(time.process_time() - cpu0)
                got["store_cpu"].append((cpu_ns(all_pids) - store0) / 1e9)
                got["reput_cpu"].append((cpu_ns(reput_pid) - reput0) / 1e9)
                got["crc_misses"].append(misses(producer) - missed)
    out.put({**blocks, "failures": failures, "bytes": sizes})


def e2e_consumer(name: str, store_dir: str, expected: int, ready: Any, out: Any) -> None:
    """Long-poll queue 0 of the e2e topic; report send-to-receive latencies in ns."""
    from rmq_mp.client.consumer import Consumer

    latencies_ns: list[int] = []
    with Consumer.attach(store_dir, "bench-e2e") as consumer:
        offset = consumer.pull(E2E_TOPIC, 0, 0, 1).max_offset if expected else 0
        ready.set()
        idle_deadline = time.monotonic() + 30
        while len(latencies_ns) < expected and time.monotonic() < idle_deadline:
            result = consumer.pull(E2E_TOPIC, 0, offset, 32, timeout_s=2)
            now = time.monotonic_ns()
            for message in result.messages:
                latencies_ns.append(now - int.from_bytes(message.body[:8], "big"))
            if result.messages:
                offset = result.next_begin_offset
                idle_deadline = time.monotonic() + 30
    out.put(latencies_ns)


def _collect(out: Any, procs: list[Any], timeout_s: float) -> list[Any]:
    """One report per process; raises if a process died without reporting (no silent hang)."""
    results: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"bench workers failed (exit codes {dead}) or timed out") from None
    for p in procs:
        p.join(30)
    return results


def run_producers(
    name: str,
    *,
    producers: int,
    body_size: int,
    batch: int,
    duration_s: float,
    rate_per_s: float = 0.0,
    during: Any = None,
    block: int = 1,
) -> dict[str, Any]:
    """Run ``producers`` put workers together; ``during(seconds)`` runs in this process meanwhile
    (sampling lag, say). Returns msgs/s, MB/s, failures and the workers' latencies in us."""
    start = CTX.Event()
    out = CTX.Queue()
    procs = [
        CTX.Process(
            target=put_worker, args=(name, i, body_size, batch, duration_s, start, out, rate_per_s, block)
        )
        for i in range(producers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    extra = during(duration_s) if during is not None else None
    results = _collect(out, procs, duration_s + 120)
    msgs_per_s = sum(sent / elapsed for sent, _f, elapsed, _l in results)
    latencies_us = sorted(ns / 1000 for *_x, lat in results for ns in lat)
    return {
        "msgs_per_s": msgs_per_s,
        "mb_per_s": msgs_per_s * body_size / 1e6,
        "failures": sum(f for _s, f, _e, _l in results),
        "latencies_us": latencies_us,
        "during": extra,
    }


def realistic_worker(name: str, messages: int, warmup: int, out: Any) -> None:
    """The shape the issue compared with RocketMQ 4.9.8's store: one producer, 128 B bodies with
    tags ``TagA`` and one key, 8 queues in turn, ``warmup`` sends then ``messages`` timed ones,
    every status checked. Reports (messages, failures, elapsed s)."""
    from rmq_mp.put.producer import Producer

    body = os.urandom(128)
    failures = 0
    with Producer.attach(name) as producer:
        for i in range(warmup):
            failures += not producer.send(TOPIC, body, tags="TagA", keys=f"k{i}", queue_id=i % QUEUES).ok
        began = time.perf_counter()
        for i in range(messages):
            failures += not producer.send(TOPIC, body, tags="TagA", keys=f"key-{i}", queue_id=i % QUEUES).ok
        elapsed = time.perf_counter() - began
    out.put((messages, failures, elapsed))
