"""A store whose supervisor died and whose pid another process took: `run.py status` and
`run.py stop` know it by the start time beside the pid (shm/layout.py SUPERVISOR_START_MS), so
stop cleans up after the dead supervisor instead of signalling the stranger (with the pid alone
it took the stranger for the supervisor, and sent it SIGTERM). A consumer-table slot likewise
(shm/waiters.py JOINED_MS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm import waiters as wt
from shm.layout import Role
from shm.pointer_table import PointerTable, pid_alive_since, process_start_ms
from tests.service import ROOT, start_service, wait_processes_gone


def run_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_a_reused_supervisor_pid_is_not_the_supervisor(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        table = service.table()
        supervisor_start = table.get(layout.SUPERVISOR_START_MS)
        table.close()
        assert supervisor_start == process_start_ms(service.process.pid)
        service.process.kill()
        service.process.wait(30)
        # the kernel hands the dead supervisor's pid to another process: here, the stranger's
        writer = PointerTable.attach(service.names.pointer_table, Role.SUPERVISOR)
        writer.set(layout.SUPERVISOR_PID, stranger.pid)
        writer.close()

        status = run_py("status", "--conf", str(service.conf))
        assert status.returncode == 1, status.stdout + status.stderr
        assert "is gone" in status.stderr
        stop = run_py("stop", "--conf", str(service.conf))
        assert stop.returncode == 1, stop.stdout + stop.stderr
        assert "was not running" in stop.stdout
        assert stranger.poll() is None  # not signalled
        assert service.names.leftovers() == []
    finally:
        stranger.kill()
        stranger.wait()
        wait_processes_gone([stranger.pid])


def test_a_consumer_slot_whose_pid_was_reused_is_free_again(tmp_path: Path) -> None:
    """A consumer-table slot records when its consumer claimed it (waiters.JOINED_MS), as group
    members do: a slot left by a consumer that died, whose pid the kernel then gave a process
    started later, is claimed again and pins no commit-log file; the pid alone kept it taken
    (maxConsumerNum=1: every later attach refused) and the cleaner waiting on its hold."""
    service = start_service(tmp_path, maxConsumerNum="1")
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        store = RunningStore.attach(service.names.base, Role.CONSUMER)
        waiters = store.shm.waiters
        started_ms = process_start_ms(stranger.pid)

        def forge(joined_ms: int) -> None:
            """Slot 0 as a consumer that joined at ``joined_ms`` with the stranger's pid left it."""
            with store.shm.flags_lock("test: a consumer that died in slot 0"):
                waiters.set(0, wt.HOLD, 0)
                waiters.set(0, wt.JOINED_MS, joined_ms)
                waiters.set(0, wt.PID, stranger.pid)

        forge(started_ms + 1000)  # the stranger itself claimed it: a live consumer
        assert waiters.holders_below(1 << 40, pid_alive_since) == [stranger.pid]
        with pytest.raises(ShmAttachError, match="maxConsumerNum"):
            Consumer.attach(service.names.base, "G")
        forge(started_ms - 60_000)  # a consumer that joined a minute before the stranger started
        assert waiters.holders_below(1 << 40, pid_alive_since) == []
        with Consumer.attach(service.names.base, "G") as consumer:  # the slot is claimed again
            assert consumer.store.shm.waiters.get(0, wt.PID) == os.getpid()
            assert consumer.store.shm.waiters.get(0, wt.JOINED_MS) >= started_ms
        store.close()
    finally:
        stranger.kill()
        stranger.wait()
        wait_processes_gone([stranger.pid])
        service.stop()
