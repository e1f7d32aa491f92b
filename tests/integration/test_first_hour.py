"""A user's first hour (issue 19): what `run.py start --daemon`, `run.py demo`, the status line and
the supervisor's log tell a newcomer, and how producers and consumers behave across a restart."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from rmq_mp.config_manager import loads
from shm.names import ShmNames
from tests.service import ROOT, leftover_processes, running_service, write_conf

RUN = [sys.executable, str(ROOT / "run.py")]


def run_py(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_daemon_start_prints_the_shm_name_and_why_a_second_start_fails(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "d.conf", tmp_path / "d")
    names = ShmNames.for_store(str(tmp_path / "d"))
    started = run_py("start", "--daemon", "--conf", str(conf))
    try:
        assert started.returncode == 0, started.stderr
        assert f"running as shm {names.base}," in started.stdout
        again = run_py("start", "--daemon", "--conf", str(conf))
        assert again.returncode == 2, again.stdout + again.stderr
        assert again.stderr.startswith("run.py: error: "), again.stderr
        assert "already running" in again.stderr or "already started" in again.stderr, again.stderr
        assert len(again.stderr.splitlines()) == 1, again.stderr
    finally:
        stopped = run_py("stop", "--conf", str(conf))
    assert stopped.returncode == 0, stopped.stderr
    assert names.leftovers() == []
    assert leftover_processes(names) == []


def test_daemon_start_prints_a_busy_metrics_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = write_conf(tmp_path / "d.conf", tmp_path / "d", metricsPort=str(port))
        result = run_py("start", "--daemon", "--conf", str(conf))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"run.py: error: metricsPort={port}: cannot listen on 127.0.0.1")
    assert ShmNames.for_store(str(tmp_path / "d")).leftovers() == []


def test_adjusted_and_ignored_settings_are_in_the_supervisor_log(tmp_path: Path) -> None:
    settings = {
        "flushDiskType": "SYNC_FLUSH",
        "transientStorePoolEnable": "true",
        "namesrvAddr": "127.0.0.1:9876",
    }
    with running_service(tmp_path, **settings) as service:
        log = (service.root / "logs" / "supervisor.log").read_text()
    assert "setting adjusted" in log
    assert "transientStorePoolEnable: true -> false (the pool is used only under ASYNC_FLUSH)" in log
    assert "setting ignored" in log
    assert "namesrvAddr=127.0.0.1:9876 (name-server registration" in log


def test_a_store_without_adjustments_logs_none(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        log = (service.root / "logs" / "supervisor.log").read_text()
    assert "setting adjusted" not in log
    assert "setting ignored" not in log


def test_demo_commits_so_a_second_demo_consumes_only_its_own(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "demo.conf", tmp_path / "demo")
    outputs = []
    for _ in range(2):
        result = run_py("demo", "--conf", str(conf), "--messages", "300", timeout_s=240)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs.append(result.stdout)
    for output in outputs:
        assert "consumed 300 messages" in output, output
        assert "committed its offsets" in output, output
    offsets = loads((tmp_path / "demo" / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert sum(offsets["DemoOrders@demo-group"].values()) == 600
    # The status line says what a batch's latency is: per message and per call, never unlabelled.
    status_line = next(line for line in outputs[0].splitlines() if line.startswith("producers "))
    assert "300 message(s) in 1 call(s): put latency avg " in status_line
    assert " us a message, " in status_line
    assert " us a call " in status_line
