"""Helpers to run a real store (supervisor + workers as OS processes) in tests: the launcher of
bench/service.py, and what only tests need (producer processes, acknowledgements, draining)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

import psutil

from bench.service import (  # the launcher benchmarks share; re-exported for the tests
    BASE_SETTINGS as BASE_SETTINGS,
)
from bench.service import (
    ROOT as ROOT,
)
from bench.service import (
    STARTED as STARTED,
)
from bench.service import (
    RunningService as RunningService,
)
from bench.service import (
    cleanup_started as cleanup_started,
)
from bench.service import (
    leftover_processes as leftover_processes,
)
from bench.service import (
    running_service as running_service,
)
from bench.service import (
    start_service as start_service,
)
from bench.service import (
    start_service_within as start_service_within,
)
from bench.service import (
    store_cpu_fraction as store_cpu_fraction,
)
from bench.service import (
    wait_until as wait_until,
)
from bench.service import (
    write_conf as write_conf,
)
from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus
from shm import layout


def wait_processes_gone(pids: Collection[int], timeout_s: float = 15) -> None:
    """Wait until none of ``pids`` runs (a zombie counts as gone): the workers of a supervisor
    killed with SIGKILL exit by themselves once they see it is gone."""
    wait_until(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
        ),
        timeout_s,
        "workers to exit",
    )


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a client process wrote to ``path`` (none yet: none), up to a torn last line
    (the process was killed inside its write)."""
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return found


def kill_tree(service: RunningService, timeout_s: float = 30) -> None:
    """SIGKILL the supervisor and every worker at once (a machine's crash, as the store sees it;
    a stopped process too), and wait until none of them runs."""
    pids = [
        service.process.pid,
        *(p.pid for p in psutil.Process(service.process.pid).children(recursive=True)),
    ]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    service.process.wait(timeout_s)
    wait_processes_gone(pids, timeout_s)


def start_producers(
    service: RunningService, tmp_path: Path, counts: list[int], batch: int | list[int] = 1
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """Producer processes running tests.load (producer i sends counts[i] messages); returns
    (processes, the files they write their acknowledgements to)."""
    batches = batch if isinstance(batch, list) else [batch] * len(counts)
    outs = [tmp_path / f"producer{i}.jsonl" for i in range(len(counts))]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.load", service.names.base, str(i), str(count), str(out), str(b)],
            cwd=ROOT,
        )
        for i, (count, out, b) in enumerate(zip(counts, outs, batches, strict=True))
    ]
    return procs, outs


def acknowledged(out: Path) -> list[dict[str, Any]]:
    """The acknowledgements a tests.load producer wrote (a torn last line is ignored)."""
    acks = []
    for line in out.read_text().splitlines() if out.exists() else []:
        try:
            acks.append(json.loads(line))
        except json.JSONDecodeError:  # the producer died mid-line
            break
    return acks


def drain_every_queue(consumer: Consumer) -> int:
    """Read every queue of the store from offset 0, checking offsets are contiguous; returns
    how many messages were read."""
    seen = 0
    for topic, queue_id, _slot in list(consumer.queues.queues()):
        offset = 0
        while (result := consumer.pull(topic, queue_id, offset, 32)).status is GetMessageStatus.FOUND:
            assert [m.queue_offset for m in result.messages] == list(
                range(offset, offset + len(result.messages))
            )
            offset = result.next_begin_offset
            seen += len(result.messages)
    return seen


def poll_bodies(
    consumer: Consumer, count: int, timeout_s: float, what: str, poll_s: float = 0.5
) -> list[bytes]:
    """The bodies ``consumer.poll`` hands out, polled until at least ``count`` came (a wait on the
    store, not on time); the last poll may bring more, which the caller's assertion then sees."""
    got: list[bytes] = []

    def enough() -> bool:
        got.extend(message.body for message in consumer.poll(poll_s))
        return len(got) >= count

    wait_until(enough, timeout_s, what)
    return got


def worker_passes(service: RunningService, role: str, passes: int = 2, timeout_s: float = 60) -> None:
    """Wait until ``role``'s loop has finished ``passes`` more passes (its ``work_count``): with
    two, a whole pass began after this call, so whatever that worker would do about the state
    seen now, it has done (how a test shows something did *not* happen, without a sleep)."""
    field = layout.worker_field(role, "work_count")
    start = service.read(field)
    wait_until(lambda: service.read(field) >= start + passes, timeout_s, f"{passes} {role} passes")


def wait_in(thread: threading.Thread, function: str, timeout_s: float = 20) -> None:
    """Wait until ``thread`` is inside ``function`` (a frame of that name is on its stack): a
    call proven to be blocked where the test means it to be, not assumed to be after a sleep."""

    def inside() -> bool:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
        return False

    wait_until(inside, timeout_s, f"{thread.name} to be in {function}")


def reference_put_path(producer: Any) -> None:
    """Make ``producer`` send through the pure-Python reference only (its compiled send closed):
    for white-box tests that record the reference's own stores. The compiled core keeps the same
    order in C (rmq_mp/put/_core.c), which tests/unit/test_native_core.py checks by outcome."""
    if producer._native is not None:
        producer._native.close()
        producer._native = None
        vars(producer).pop("send", None)
