"""systemd's ``Type=notify`` (issue 34 point 6): the supervisor tells $NOTIFY_SOCKET READY=1 only
once the store runs, RELOADING=1 then READY=1 around a reload, STOPPING=1 when its stop begins; conf/rmq-mp.service is a unit systemd
accepts. The test binds the socket systemd would and starts the store as the unit does."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.service import STARTED, RunningService, write_conf
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ShmAttachError
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from shm.names import ShmNames
from tests.service import ROOT, leftover_processes
from workers.notify import SystemdNotifier
from workers.supervisor import Supervisor

WAIT_S = 60


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket bound where systemd's would be (a short path: sun_path is 108 bytes)."""
    path = Path("/tmp") / f"rmq-notify-{uuid.uuid4().hex}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(WAIT_S)  # a bounded wait on a message, not a sleep
    try:
        yield sock, str(path)
    finally:
        sock.close()
        path.unlink(missing_ok=True)


def receive(sock: socket.socket) -> dict[str, str]:
    try:
        data = sock.recv(4096)
    except TimeoutError:
        raise AssertionError(f"no notification within {WAIT_S} s") from None
    return dict(line.split("=", 1) for line in data.decode().splitlines())


def test_ready_once_running_and_stopping_on_stop(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, address = notify_socket
    conf = write_conf(tmp_path / "broker.conf", tmp_path / "store")
    config = MessageStoreConfig.from_file(conf)
    names = ShmNames.for_store(config.store_path_root_dir, config.shm_name)
    log = tmp_path / "supervisor.log"
    env = {**os.environ, "NOTIFY_SOCKET": address}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        )  # fmt: skip
    service = RunningService(conf, config, names, process, log)
    STARTED.append(service)  # killed and unlinked by the autouse fixture if this test fails

    ready = receive(sock)
    # Received: the store must already be running, under this supervisor, every worker up.
    assert ready["READY"] == "1", ready
    assert int(ready["MAINPID"]) == process.pid
    try:
        assert service.read(layout.STATE) == layout.RUNNING
    except ShmAttachError:
        raise AssertionError("READY=1 arrived before the store's shared memory existed") from None
    assert service.read(layout.SUPERVISOR_PID) == process.pid
    assert str(tmp_path / "store") in ready["STATUS"]
    for role in Supervisor(config).roles():  # the committer runs with the pool only
        pid = service.worker_pid(role)
        assert pid, role
        assert "NOTIFY_SOCKET" not in psutil.Process(pid).environ(), f"worker {role} inherited the socket"
    with Producer.attach(str(tmp_path / "store"), start_timeout_s=0) as producer:
        assert producer.send("NotifyTopic", b"ready means ready").status is PutMessageStatus.PUT_OK

    process.send_signal(signal.SIGHUP)  # `systemctl reload` (ExecReload): RELOADING=1, then READY=1
    reloading = receive(sock)
    assert reloading["RELOADING"] == "1", reloading
    assert int(reloading["MONOTONIC_USEC"]) > 0
    assert receive(sock)["READY"] == "1"
    process.send_signal(signal.SIGTERM)  # what `systemctl stop` sends (KillMode=mixed: the main process)
    stopping = receive(sock)
    assert stopping["STOPPING"] == "1", stopping
    assert process.wait(WAIT_S) == 0, log.read_text()
    STARTED.remove(service)
    sock.settimeout(0)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)  # nothing after STOPPING=1
    assert names.leftovers() == []
    assert leftover_processes(names) == []


def test_notifier_speaks_the_sd_notify_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An abstract-namespace address (``@name``), one datagram per message, the variable taken
    out of the environment; no socket, or one that is gone, is not an error."""
    name = f"rmq-notify-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(WAIT_S)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notifier = SystemdNotifier.from_environment()
        assert "NOTIFY_SOCKET" not in os.environ
        assert notifier.reloading()
        reloading = receive(sock)
        assert reloading["RELOADING"] == "1"
        assert int(reloading["MONOTONIC_USEC"]) > 0
        assert notifier.stopping()
        assert receive(sock)["STOPPING"] == "1"
    assert not notifier.stopping()  # the socket is gone: logged, not raised
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not SystemdNotifier.from_environment().ready("x")
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert not SystemdNotifier.from_environment().enabled


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_file_is_one_systemd_accepts(tmp_path: Path) -> None:
    """conf/rmq-mp.service: Type=notify on the foreground supervisor, SIGTERM to it alone, SIGHUP
    for reload; `systemd-analyze verify` finds nothing to say (its ExecStart pointed at a binary
    that exists here: verify checks that too)."""
    text = (ROOT / "conf" / "rmq-mp.service").read_text(encoding="utf-8")
    settings = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Type"] == "notify"
    assert settings["NotifyAccess"] == "main"
    assert settings["KillMode"] == "mixed"
    assert settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    command = settings["ExecStart"].split()
    assert command[0].endswith("/rmq-mp")
    assert command[1] == "start"
    assert "--daemon" not in command  # Type=notify: the main process is the supervisor itself
    unit = tmp_path / "rmq-mp.service"
    unit.write_text(text.replace(command[0], shutil.which("true") or "/bin/true"), encoding="utf-8")
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
