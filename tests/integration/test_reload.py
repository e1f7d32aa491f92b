"""Live reload of broker.conf (SIGHUP, `run.py reload` / `rmq-mp reload`): the keys
rmq_mp/config/live.py lists apply to a running store without a restart (shown by what the
cleaner then does), all or none; a changed key that needs a restart, or a file that does not
load, is refused in one line and changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from bench.service import BASE_SETTINGS, RunningService
from rmq_mp.config.live import PUBLISHED_KEYS, decode
from rmq_mp.put.producer import Producer
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm.layout import Role
from tests.service import ROOT, running_service, wait_until, worker_passes

EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))
KEEP = dict(
    deleteWhen=EVERY_HOUR,
    fileReservedTime="72",
    cleanResourceInterval="200",
    deleteCommitLogFilesInterval="0",
)


def rewrite(service: RunningService, **settings: str) -> None:
    props = {"storePathRootDir": str(service.root), **BASE_SETTINGS, **KEEP, **settings}
    service.conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")


def reload(service: RunningService) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "reload", "--conf", str(service.conf)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def live_word(service: RunningService, key: str) -> object:
    return decode(key, service.read(layout.live_setting(PUBLISHED_KEYS.index(key))))


def test_reload_applies_live_settings_to_the_workers(tmp_path: Path) -> None:
    with running_service(tmp_path, **KEEP) as service, Producer.attach(service.root) as producer:
        for i in range(300):
            assert producer.send("C", bytes(10_000), queue_id=i % 4).ok
        size = service.config.mapped_file_size_commit_log
        wrote = service.read(layout.WROTE_POSITION)
        current = wrote - wrote % size
        assert current >= 2 * size
        worker_passes(service, "cleaner")
        assert service.read(layout.MIN_OFFSET) == 0, "72 hours kept: nothing expired"

        rewrite(service, fileReservedTime="0", diskMaxUsedSpaceRatio="80", flushConsumerOffsetInterval="1000")
        result = reload(service)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"reloaded store {service.root}: "), result.stdout
        for change in (
            "fileReservedTime 72 -> 0",
            "diskMaxUsedSpaceRatio 75 -> 80",
            "flushConsumerOffsetInterval",
        ):
            assert change in result.stdout
        assert service.read(layout.LIVE_SETTINGS_GENERATION) == 1
        # The cleaner took it: the expired files go, but the one being written.
        wait_until(
            lambda: service.read(layout.MIN_OFFSET) == current, 20, "expired files deleted after reload"
        )
        assert producer.send("C", b"still writable", queue_id=0).ok
        # A process attaching now sees the live values, not the descriptor's from the start.
        store = RunningStore.attach(str(service.root), Role.CONSUMER)
        try:
            assert (store.config.file_reserved_time, store.config.disk_max_used_space_ratio) == (0, 80)
            assert store.config.delete_when == EVERY_HOUR
        finally:
            store.close()
        # Reloading the same file again changes nothing.
        again = reload(service)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip().endswith("no setting changed")
        assert service.read(layout.LIVE_SETTINGS_GENERATION) == 1
        log = (service.root / "logs" / "supervisor.log").read_text()
        assert "reloaded" in log
        assert "took the reloaded settings" in (service.root / "logs" / "cleaner.log").read_text()


def test_reload_refuses_a_key_that_needs_a_restart_and_applies_nothing(tmp_path: Path) -> None:
    with running_service(tmp_path, **KEEP) as service:
        rewrite(service, fileReservedTime="1", mappedFileSizeCommitLog="2097152")
        result = reload(service)
        assert result.returncode == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0] == (
            "run.py: error: reload refused, nothing applied: mappedFileSizeCommitLog: 1048576 -> 2097152 "
            "changed (needs a restart)"
        )
        assert service.read(layout.RELOADS_DONE) == 0  # refused before signalling
        # The supervisor refuses the same on SIGHUP (systemd's ExecReload), in one log line.
        done = service.read(layout.RELOADS_DONE)
        os.kill(service.process.pid, signal.SIGHUP)
        wait_until(lambda: service.read(layout.RELOADS_DONE) == done + 1, 20, "the reload handled")
        assert service.read(layout.LIVE_SETTINGS_GENERATION) == 0
        assert live_word(service, "file_reserved_time") == 72
        refusals = [
            line
            for line in (service.root / "logs" / "supervisor.log").read_text().splitlines()
            if "reload refused" in line
        ]
        assert len(refusals) == 1
        assert "mappedFileSizeCommitLog: 1048576 -> 2097152" in refusals[0]
        # A file that does not load is refused too, and the store runs on.
        service.conf.write_text("storePathRootDir=" + str(service.root) + "\nnoSuchKey=1\n", encoding="utf-8")
        bad = reload(service)
        assert bad.returncode == 2
        assert bad.stderr.startswith("run.py: error: ")
        assert "noSuchKey" in bad.stderr
        os.kill(service.process.pid, signal.SIGHUP)
        wait_until(lambda: service.read(layout.RELOADS_DONE) == done + 2, 20, "the second reload handled")
        assert service.read(layout.LIVE_SETTINGS_GENERATION) == 0
        assert service.read(layout.STATE) == layout.RUNNING
        with Producer.attach(service.root) as producer:
            assert producer.send("T", b"after two refused reloads").ok
