"""Helpers to run a real store (supervisor + workers as OS processes) in tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from rmq_mp.config import MessageStoreConfig
from rmq_mp.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.status import GetMessageStatus
from shm import layout
from shm.layout import Role
from shm.names import ShmNames
from shm.pointer_table import PointerTable

ROOT = Path(__file__).resolve().parents[1]
BASE_SETTINGS = {
    "mappedFileSizeCommitLog": "1048576",
    "mappedFileSizeConsumeQueue": "20000",
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
}


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """The one polling helper tests may use: wait for something another process does."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


STARTED: list[RunningService] = []
"""Every service a test started; `cleanup_started` kills and unlinks what a failed test left."""


def cleanup_started() -> None:
    from shm.store_shm import StoreShm

    while STARTED:
        service = STARTED.pop()
        for proc in psutil.process_iter(["cmdline"]):
            if service.names.base in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait(10)
        StoreShm.unlink_all(service.names)


@dataclass
class RunningService:
    conf: Path
    config: MessageStoreConfig
    names: ShmNames
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def root(self) -> Path:
        return Path(self.config.store_path_root_dir)

    def table(self) -> PointerTable:
        return PointerTable.attach(self.names.pointer_table, Role.CONSUMER)

    def read(self, field: layout.Field) -> int:
        table = self.table()
        try:
            return table.get(field)
        finally:
            table.close()

    def worker_pid(self, role: str) -> int:
        return self.read(layout.worker_field(role, "pid"))

    def stop(self, timeout_s: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout_s)
        return self.process.returncode


def write_conf(path: Path, root: Path, **settings: str) -> Path:
    props = {"storePathRootDir": str(root), **BASE_SETTINGS, **settings}
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
    return path


def start_service(tmp_path: Path, name: str = "store", **settings: str) -> RunningService:
    return start_service_within(60, tmp_path, name, settings)


def start_service_within(
    start_timeout_s: float, tmp_path: Path, name: str, settings: dict[str, str]
) -> RunningService:
    """`start_service` for a store whose recovery may take long (a bench's large stores)."""
    conf = write_conf(tmp_path / f"{name}.conf", tmp_path / name, **settings)
    config = MessageStoreConfig.from_file(conf)
    names = ShmNames.for_store(config.store_path_root_dir, config.shm_name)
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf)],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip
    service = RunningService(conf, config, names, process, log)
    STARTED.append(service)

    def running() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"supervisor exited with {process.returncode}:\n{log.read_text()}")
        try:
            # A crashed run's table may still say RUNNING: it must be this supervisor's.
            return (
                service.read(layout.SUPERVISOR_PID) == process.pid
                and service.read(layout.STATE) == layout.RUNNING
            )
        except ShmAttachError:
            return False

    wait_until(running, start_timeout_s, "the store to start")
    return service


def wait_processes_gone(pids: list[int], timeout_s: float = 15) -> None:
    """Wait until none of ``pids`` runs (a zombie counts as gone): the workers of a supervisor
    killed with SIGKILL exit by themselves once they see it is gone."""
    wait_until(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
        ),
        timeout_s,
        "workers to exit",
    )


def store_cpu_fraction(service: RunningService, seconds: float) -> float:
    """CPU time the supervisor and all its workers use over ``seconds``, as a fraction of a core."""
    root = psutil.Process(service.process.pid)
    procs = [root, *root.children(recursive=True)]
    before = [p.cpu_times() for p in procs]
    time.sleep(seconds)
    used = 0.0
    for proc, b in zip(procs, before, strict=True):
        a = proc.cpu_times()
        used += (a.user + a.system) - (b.user + b.system)
    return used / seconds


def leftover_processes(names: ShmNames) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if names.base in " ".join(cmd):
            found.append(" ".join(cmd))
    return found


@contextmanager
def running_service(tmp_path: Path, name: str = "store", **settings: str) -> Iterator[RunningService]:
    service = start_service(tmp_path, name, **settings)
    try:
        yield service
    finally:
        code = service.stop()
        for proc in psutil.process_iter(["cmdline"]):
            if service.names.base in " ".join(proc.info["cmdline"] or []):
                os.kill(proc.pid, signal.SIGKILL)
        assert code in (0, 1), f"supervisor exit code {code}: {service.log.read_text()}"
        assert service.names.leftovers() == [], "shared memory left behind"
        assert leftover_processes(service.names) == [], "processes left behind"


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


def reference_put_path(producer: Any) -> None:
    """Make ``producer`` send through the pure-Python reference only (its compiled send closed):
    for white-box tests that record the reference's own stores. The compiled core keeps the same
    order in C (rmq_mp/put/_core.c), which tests/unit/test_native_core.py checks by outcome."""
    if producer._native is not None:
        producer._native.close()
        producer._native = None
        vars(producer).pop("send", None)
