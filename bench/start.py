"""`python -m bench.start`: a store's start and stop, its workers forked from the supervisor
(workers/spawn.py) against the same store with them executed (``RMQ_EXEC_WORKERS=1``).

Each round starts and stops one store each way, alternating which goes first; measured per cycle:
the wall time to RUNNING, the wall time of the stop, and the CPU of every process of the store
(the supervisor and its workers, reaped, so counted in this process's RUSAGE_CHILDREN). Prints
the medians and the forked/executed ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.service import running_service


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def _exec_workers(on: bool) -> Iterator[None]:
    before = os.environ.get("RMQ_EXEC_WORKERS")
    os.environ["RMQ_EXEC_WORKERS"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["RMQ_EXEC_WORKERS"]
        else:
            os.environ["RMQ_EXEC_WORKERS"] = before


def cycle(executed: bool) -> tuple[float, float, float]:
    """(start s, stop s, CPU s of the store's processes) of one start and stop."""
    with tempfile.TemporaryDirectory() as tmp, _exec_workers(executed):
        cpu_before = _children_cpu_s()
        began = time.perf_counter()
        with running_service(Path(tmp), "start-exec" if executed else "start-fork"):
            running = time.perf_counter()
        stopped = time.perf_counter()
        return running - began, stopped - running, _children_cpu_s() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    rows: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for index in range(args.rounds):
        for executed in (index % 2 == 0, index % 2 != 0):
            rows[executed].append(cycle(executed))
    medians = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in rows.items()}
    print(f"{'workers':10} {'start s':>8} {'stop s':>8} {'CPU s':>8}   (medians of {args.rounds})")
    for executed, label in ((True, "executed"), (False, "forked")):
        start_s, stop_s, cpu_s = medians[executed]
        print(f"{label:10} {start_s:8.3f} {stop_s:8.3f} {cpu_s:8.3f}")
    ratios = [medians[False][i] / medians[True][i] for i in range(3)]
    print(f"{'forked/ex':10} {ratios[0]:8.2f} {ratios[1]:8.2f} {ratios[2]:8.2f}")


if __name__ == "__main__":
    main()
