"""The two plain-Python baselines every store figure is divided by, measured in the same run.

- raw append: a process appends length-prefixed records to its own file with ``os.write``, no
  sync, no lock, no encoding beyond the 4-byte prefix. The floor cost of "a Python process puts
  bytes into the page cache" (issue 6: about 570k records/s of 128 B on 2 cores).
- group commit: producers append records to one file under a lock and wait on their own
  semaphore; one flusher process fdatasyncs everything appended so far and wakes every waiter it
  covered. The simplest correct SYNC design in Python (issue 6: about 2.9k/s with 1 producer,
  9.4k/s with 8).
Both run in spawned processes, started together and timed over the same window length as the
store scenario they are compared with.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import time
from pathlib import Path
from typing import Any

_CTX = mp.get_context("spawn")
_LEN = struct.Struct(">i")


def _raw_worker(path: str, body_size: int, duration_s: float, start: Any, out: Any) -> None:
    record = _LEN.pack(body_size) + os.urandom(body_size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start.wait()
        count = 0
        deadline = time.perf_counter() + duration_s
        while True:
            for _ in range(100):
                os.write(fd, record)
            count += 100
            if time.perf_counter() >= deadline:
                break
        elapsed = duration_s + (time.perf_counter() - deadline)
    finally:
        os.close(fd)
        os.unlink(path)
    out.put((count, elapsed))


def _run_together(procs: list[Any], start: Any, out: Any, duration_s: float) -> list[Any]:
    """Start the worker processes, release them at once, collect one result from each."""
    for p in procs:
        p.start()
    time.sleep(0.2)
    start.set()
    results = [out.get(timeout=duration_s + 60) for _ in procs]
    for p in procs:
        p.join()
    return results


def raw_append(tmp: Path, *, producers: int, body_size: int, duration_s: float) -> dict[str, float]:
    """Aggregate records/s of ``producers`` processes each appending to its own file."""
    start = _CTX.Event()
    out = _CTX.Queue()
    procs = [
        _CTX.Process(target=_raw_worker, args=(str(tmp / f"raw{i}.log"), body_size, duration_s, start, out))
        for i in range(producers)
    ]
    results = _run_together(procs, start, out, duration_s)
    msgs_per_s = sum(count / elapsed for count, elapsed in results)
    return {"msgs_per_s": msgs_per_s, "mb_per_s": msgs_per_s * (body_size + 4) / 1e6}


def _gc_flusher(path: str, pending: Any, dones: list[Any], work: Any, stop: Any) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        while not stop.is_set():
            if not work.acquire(timeout=0.05):
                continue
            while work.acquire(False):  # coalesce every request posted so far into one flush
                pass
            waiting = [i for i in range(len(dones)) if pending[i]]
            os.fdatasync(fd)
            for i in waiting:
                pending[i] = 0
                dones[i].release()
    finally:
        os.close(fd)


def _gc_producer(
    index: int,
    path: str,
    body_size: int,
    duration_s: float,
    lock: Any,
    pending: Any,
    done: Any,
    work: Any,
    start: Any,
    out: Any,
) -> None:
    record = _LEN.pack(body_size) + os.urandom(body_size)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    latencies_ns: list[int] = []
    try:
        start.wait()
        deadline = time.perf_counter() + duration_s
        began = time.perf_counter()
        while time.perf_counter() < deadline:
            t0 = time.perf_counter_ns()
            with lock:
                os.write(fd, record)
            pending[index] = 1
            work.release()
            done.acquire()
            latencies_ns.append(time.perf_counter_ns() - t0)
        elapsed = time.perf_counter() - began
    finally:
        os.close(fd)
    out.put((len(latencies_ns), elapsed, latencies_ns))


def group_commit(tmp: Path, *, producers: int, body_size: int, duration_s: float) -> dict[str, Any]:
    """msgs/s and per-send latency (us) of the plain-Python group commit."""
    path = tmp / "group_commit.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, 256 << 20)  # preallocated, as the store's files are
    os.ftruncate(fd, 0)
    os.close(fd)
    lock = _CTX.Lock()
    work = _CTX.Semaphore(0)
    pending = _CTX.Array("b", producers, lock=False)
    dones = [_CTX.Semaphore(0) for _ in range(producers)]
    start, stop = _CTX.Event(), _CTX.Event()
    out = _CTX.Queue()
    flusher = _CTX.Process(target=_gc_flusher, args=(str(path), pending, dones, work, stop))
    flusher.start()
    procs = [
        _CTX.Process(
            target=_gc_producer,
            args=(i, str(path), body_size, duration_s, lock, pending, dones[i], work, start, out),
        )
        for i in range(producers)
    ]
    results = _run_together(procs, start, out, duration_s)
    stop.set()
    flusher.join()
    path.unlink()
    latencies_us = sorted(ns / 1000 for _c, _e, lat in results for ns in lat)
    return {
        "msgs_per_s": sum(count / elapsed for count, elapsed, _ in results),
        "latency_us": percentiles(latencies_us),
    }


def percentiles(sorted_values: list[float]) -> dict[str, float]:
    """p50/p99/p99.9 of already sorted samples (nearest rank)."""
    if not sorted_values:
        return {"p50": float("nan"), "p99": float("nan"), "p99.9": float("nan"), "samples": 0}
    n = len(sorted_values)

    def at(q: float) -> float:
        return sorted_values[min(n - 1, int(q * n))]

    return {"p50": at(0.50), "p99": at(0.99), "p99.9": at(0.999), "samples": n}


def _hop_reader(shm_name: str, sem_name: str, expected: int, ready: Any, out: Any) -> None:
    """Sleep on the semaphore, wake, read the stamped record from shared memory."""
    import mmap

    import posix_ipc

    shm = posix_ipc.SharedMemory(shm_name)
    mm = mmap.mmap(shm.fd, 4096)
    shm.close_fd()
    sem = posix_ipc.Semaphore(sem_name)
    latencies: list[int] = []
    ready.set()
    try:
        for _ in range(expected):
            sem.acquire(30)
            now = time.monotonic_ns()
            record = mm[:128]
            latencies.append(now - int.from_bytes(record[:8], "big"))
    except posix_ipc.BusyError:
        pass
    finally:
        sem.close()
        mm.close()
    out.put(latencies)


def one_hop(*, rate_per_s: float, duration_s: float) -> dict[str, Any]:
    """The e2e target's baseline: one plain Python process writes a 128 B record stamped with
    CLOCK_MONOTONIC into shared memory and posts a semaphore, at ``rate_per_s`` (paced as the e2e
    producer is); another sleeps on the semaphore, wakes and reads it. What waking a sleeping
    process costs on this machine, with nothing else in the way."""
    import posix_ipc

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    shm = posix_ipc.SharedMemory(f"/rmqbench_hop_{tag}", posix_ipc.O_CREX, size=4096)
    sem = posix_ipc.Semaphore(f"/rmqbench_hop_{tag}", posix_ipc.O_CREX, initial_value=0)
    mm = __import__("mmap").mmap(shm.fd, 4096)
    shm.close_fd()
    expected = int(rate_per_s * duration_s)
    ready, out = _CTX.Event(), _CTX.Queue()
    reader = _CTX.Process(target=_hop_reader, args=(shm.name, sem.name, expected, ready, out))
    try:
        reader.start()
        ready.wait(30)
        body = os.urandom(120)
        interval_s = 1 / rate_per_s
        next_at = time.perf_counter()
        for _ in range(expected):
            while (now := time.perf_counter()) < next_at:  # the e2e producer's pacing
                time.sleep(max(0.0, next_at - now - 50e-6))
            next_at += interval_s
            mm[:128] = time.monotonic_ns().to_bytes(8, "big") + body
            sem.release()
        latencies = sorted(ns / 1000 for ns in out.get(timeout=duration_s + 60))
        reader.join(30)
    finally:
        if reader.is_alive():
            reader.kill()
        mm.close()
        shm.unlink()
        sem.unlink()
        sem.close()
    return {"rate_per_s": rate_per_s, "latency_us": percentiles(latencies)}
