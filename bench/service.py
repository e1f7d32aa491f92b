"""A real store (run.py's supervisor and its workers, OS processes) started for a benchmark or a
test, waited on through its shared memory, and stopped with a check that nothing is left.

Benchmarks and tests both start stores this way; tests/service.py adds the test-only helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ShmAttachError
from rmq_mp.logs import log_dir
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

    def supervisor_log(self) -> str:
        """The supervisor's own log file, written as each line is logged. Its console (`log`)
        holds a start's warnings back until the store runs (`HeldConsole`), so a reader there
        right after `STATE` says RUNNING can miss them."""
        return (log_dir(self.root) / "supervisor.log").read_text()

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


def _run_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, in ns, from the scheduler's own count
    (/proc/<pid>/task/<tid>/schedstat), not the 10 ms ticks of `cpu_times`: an idle store takes a
    few ticks in seconds, and which process a tick lands on is chance."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended between the glob and the read
            continue
    return total


def store_cpu_fraction(service: RunningService, seconds: float) -> float:
    """CPU time the supervisor and all its workers use over ``seconds``, as a fraction of a core
    (the scheduler's run time where the kernel keeps it, else the tick-based `cpu_times`)."""
    root = psutil.Process(service.process.pid)
    procs = [root, *root.children(recursive=True)]
    if Path(f"/proc/{root.pid}/task/{root.pid}/schedstat").exists():
        before_ns = [_run_ns(p.pid) for p in procs]
        time.sleep(seconds)
        return sum(_run_ns(p.pid) - b for p, b in zip(procs, before_ns, strict=True)) / 1e9 / seconds
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
