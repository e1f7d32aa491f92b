"""Progress bars: drawn on a terminal, silent otherwise (rmq_mp.progress)."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.format.message import Message
from rmq_mp.progress import enabled, progress
from rmq_mp.store.message_store import MessageStore
from tests.service import ROOT
from tests.unit.test_admin import FIXTURE_SETTINGS


def test_silent_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMQ_PROGRESS", raising=False)
    stream = io.StringIO()
    assert not enabled(stream)
    with progress("work", total=10, stream=stream) as bar:
        for i in range(10):
            bar.update(i + 1)
    assert bar.completed == 10
    assert stream.getvalue() == ""


def test_forced_on_draws_the_description(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQ_PROGRESS", "1")
    stream = io.StringIO()
    with progress("exporting", total=3, stream=stream) as bar:
        bar.advance(3)
    assert "exporting" in stream.getvalue()
    monkeypatch.setenv("RMQ_PROGRESS", "0")
    assert not enabled(stream)


def test_recovery_shows_progress_only_when_asked(
    small_config, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    with MessageStore.open(config=small_config) as store:
        for i in range(200):
            store.put_message(Message(topic="T", body=b"x" * 100, properties={"KEYS": f"k{i}"}))
    monkeypatch.delenv("RMQ_PROGRESS", raising=False)
    MessageStore.open(config=small_config).close()
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("RMQ_PROGRESS", "1")
    MessageStore.open(config=small_config).close()
    assert "recovery: checking commit log" in capfd.readouterr().err


def test_print_msg_draws_a_bar_on_a_terminal(rocketmq_fixtures: Path) -> None:
    """A real pseudo-terminal on stderr, as a person at a shell has."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "RMQ_PROGRESS"}
    command = [
        sys.executable,
        "-m",
        "rmq_mp.tools.admin",
        "printMsg",
        "--store",
        str(rocketmq_fixtures / "clean-store"),
    ]
    with subprocess.Popen(
        [*command, *FIXTURE_SETTINGS, "--json"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=slave, env=env
    ) as proc:
        os.close(slave)
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        assert proc.wait(120) == 0
    os.close(master)
    assert b"printMsg" in drawn
    assert b"\x1b[" in drawn  # drawn with terminal control sequences


def test_audit_digests_show_progress_when_asked(
    small_config, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from rmq_mp.tools.audit import digest_report

    with MessageStore.open(config=small_config) as store:
        for i in range(50):
            store.put_message(Message(topic="T", body=b"y%d" % i))
    monkeypatch.setenv("RMQ_PROGRESS", "1")
    with MessageStore.open(config=small_config, read_only=True) as store:
        capfd.readouterr()
        lines = digest_report(store)
    assert lines[-1].startswith("TOTAL messages=50 mismatches=0")
    assert "audit: queue digests" in capfd.readouterr().err
