"""kill -9 of a process holding the store's flags lock (issue 29 point 4): the lock records its
owner, the next taker finds it dead and takes the lock over (counted, the dead pid kept), so
consumers still attach, the supervisor still persists, and `run.py stop` says what it found.
(The put lock's kill -9 tests are tests/crash/test_native_critical_section.py and the semaphore
lock's tests/unit/test_semaphore_signal.py; a dead-supervisor stop that takes a dead producer's
put lock over is in test_fence.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.put.producer import Producer
from shm import layout
from shm.layout import Role
from shm.pointer_table import PointerTable, process_start_ms
from tests.service import ROOT, RunningService, running_service, wait_until


def _flags_lock_holder(service: RunningService) -> subprocess.Popen[bytes]:
    """A consumer-role process stopped (SIGSTOP) inside the flags lock."""
    code = (
        "import os, signal\n"
        "from shm.layout import Role\n"
        "from shm.names import ShmNames\n"
        "from shm.store_shm import StoreShm\n"
        f"shm = StoreShm.attach(ShmNames.for_store({str(service.root)!r}, {service.config.shm_name!r}), "
        "Role.CONSUMER)\n"
        "with shm.flags_lock('be killed holding it'):\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    wait_until(
        lambda: holder.poll() is not None or psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED,
        30,
        "the holder to stop inside the flags lock",
    )
    assert holder.poll() is None, f"the holder exited with {holder.returncode}"
    assert service.read(layout.FLAGS_LOCK_OWNER_PID) == holder.pid
    return holder


def _run_py_stop(service: RunningService) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "stop", "--conf", str(service.conf)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_flags_lock_holder_killed_is_taken_over(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        with Producer.attach(service.root) as producer:
            assert producer.send("L", b"before", queue_id=0).ok
        flags_before = service.read(layout.RUNNING_FLAGS)
        holder = _flags_lock_holder(service)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        with Consumer.attach(service.root, "g") as consumer:  # registers under the flags lock
            assert [m.body for m in consumer.pull("L", 0, 0, 10, timeout_s=5).messages] == [b"before"]
            consumer.commit({("L", 0): 1})
        assert service.read(layout.FLAGS_LOCK_RECOVERIES) == 1
        assert service.read(layout.FLAGS_LOCK_LAST_DEAD_PID) == holder.pid
        assert service.read(layout.FLAGS_LOCK_OWNER_PID) == 0, "released after the takeover"
        assert service.read(layout.RUNNING_FLAGS) == flags_before, "the guarded flags as they were"
        stopped = _run_py_stop(service)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"flags lock taken over from a dead holder 1 time(s) (last pid {holder.pid})" in stopped.stdout
    offsets = (service.root / "config" / "consumerOffset.json").read_text()
    assert '"L@g"' in offsets, "the stop persisted the group's offsets through the taken-over lock"


def test_stop_says_a_dead_process_holds_the_flags_lock_and_stops_cleanly(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        holder = _flags_lock_holder(service)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        stopped = _run_py_stop(service)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"flags lock held now by dead pid {holder.pid}" in stopped.stdout, stopped.stdout
    # exit 0: the supervisor's final persist took the dead holder's lock over and succeeded


def test_a_live_holder_is_named_not_taken_over(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        holder = _flags_lock_holder(service)
        try:
            with pytest.raises(ShmAttachError, match=f"held by pid {holder.pid}, alive"):
                Consumer.attach(service.root, "g")
            assert service.read(layout.FLAGS_LOCK_RECOVERIES) == 0
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)


def test_a_holder_pid_reused_by_a_later_process_is_taken_over(tmp_path: Path) -> None:
    """The flags lock's holder died and its pid now runs another process, started after the lock
    was taken (FLAGS_LOCK_SINCE_MS): that process is not the holder, so the lock is taken over
    (before the check a live pid alone kept it held for good)."""
    with running_service(tmp_path) as service:
        holder = _flags_lock_holder(service)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            table = PointerTable.attach(service.names.pointer_table, Role.CONSUMER)
            try:  # what a reused pid looks like: a live process newer than the lock's taking
                table.set(layout.FLAGS_LOCK_OWNER_PID, later.pid)
                table.set(layout.FLAGS_LOCK_SINCE_MS, process_start_ms(later.pid) - 60_000)
            finally:
                table.close()
            with Consumer.attach(service.root, "g"):
                pass
            assert service.read(layout.FLAGS_LOCK_RECOVERIES) == 1
            assert service.read(layout.FLAGS_LOCK_LAST_DEAD_PID) == later.pid
            assert later.poll() is None, "the process that reused the pid is left alone"
        finally:
            later.kill()
            later.wait(30)
