"""A store whose supervisor died and whose pid another process took: `run.py status` and
`run.py stop` know it by the start time beside the pid (shm/layout.py SUPERVISOR_START_MS), so
stop cleans up after the dead supervisor instead of signalling the stranger (with the pid alone
it took the stranger for the supervisor, and sent it SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shm import layout
from shm.layout import Role
from shm.pointer_table import PointerTable, process_start_ms
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
