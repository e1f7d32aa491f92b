"""The put lock alone: the compiled core's atomic lock against the POSIX semaphore it replaced.

    python -m bench.put_lock [--seconds S] [--producers 1,2,4,8]

N processes each take the lock, copy a 128 B record into a shared segment and move a shared
write position (the put's critical section without the encode), release, and go again, for S
seconds; the same for both locks in one run, alternating, so the ratio holds on a noisy VM.
Reports acquisitions/s in all, per lock kind and process count, and the ratio atomic/semaphore.
A final check in each run: the write position equals the acquisitions (no lost update).
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import posix_ipc

from rmq_mp.put import native

CTX = mp.get_context("spawn")
RESULTS = Path(__file__).resolve().parent / "results"
_LOCK, _WROTE, _DATA = 0, 1, 64  # word indexes of the segment: lock word, write position, records


def _worker(kind: str, shm_name: str, sem_name: str, seconds: float, start: Any, out: Any) -> None:
    shm = posix_ipc.SharedMemory(shm_name)
    mm = mmap.mmap(shm.fd, shm.size)
    shm.close_fd()
    words = memoryview(mm).cast("q")
    record = os.urandom(128)
    sem = posix_ipc.Semaphore(sem_name)
    core = native.lock_core
    pid = os.getpid()
    capacity = (len(mm) - _DATA * 8) // 128
    count = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            if kind == "atomic":
                assert core is not None
                core.lock_acquire(mm, _LOCK, pid, 20_000, 50)
            else:
                sem.acquire()
            wrote = words[_WROTE]
            at = _DATA * 8 + (wrote % capacity) * 128
            mm[at : at + 128] = record
            words[_WROTE] = wrote + 1
            if kind == "atomic":
                assert core is not None
                core.lock_release(mm, _LOCK)
            else:
                sem.release()
        count += 100
    words.release()
    mm.close()
    sem.close()
    out.put(count)


def run(kind: str, producers: int, seconds: float) -> float:
    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    shm = posix_ipc.SharedMemory(f"/rmqbench_lock_{tag}", posix_ipc.O_CREX, size=1 << 20)
    sem = posix_ipc.Semaphore(f"/rmqbench_lock_{tag}", posix_ipc.O_CREX, initial_value=1)
    try:
        start, out = CTX.Event(), CTX.Queue()
        procs = [
            CTX.Process(target=_worker, args=(kind, shm.name, sem.name, seconds, start, out))
            for _ in range(producers)
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)
        began = time.perf_counter()
        start.set()
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
        elapsed = time.perf_counter() - began
        for p in procs:
            p.join(30)
        mm = mmap.mmap(shm.fd, shm.size)
        wrote = int.from_bytes(mm[8:16], "little")
        mm.close()
        assert wrote == total, f"{kind}: {total} acquisitions, write position {wrote}: an update was lost"
        return total / elapsed
    finally:
        shm.close_fd()
        shm.unlink()
        sem.unlink()
        sem.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.put_lock", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--producers", default="1,2,4,8")
    args = parser.parse_args(argv)
    if native.lock_core is None:
        print(f"no compiled core ({native.why_reference}): nothing to compare")
        return 1
    rows = []
    print(f"{'producers':>9} {'atomic/s':>12} {'semaphore/s':>12} {'ratio':>7}")
    for producers in (int(n) for n in args.producers.split(",")):
        atomic = run("atomic", producers, args.seconds)
        semaphore = run("semaphore", producers, args.seconds)
        rows.append({"producers": producers, "atomic_per_s": atomic, "semaphore_per_s": semaphore})
        print(f"{producers:>9} {atomic:>12.0f} {semaphore:>12.0f} {atomic / semaphore:>7.2f}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "put_lock.json").write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
