"""A failing fsync, for real: the store lives on a FUSE passthrough (tests.faultfs) whose fsync
returns EIO on demand. No acknowledgement of data that is not on disk (RocketMQ issue #2706)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus, RunningFlags
from rmq_mp.put.producer import Producer
from shm import layout
from tests.service import ROOT, running_service, wait_until, worker_passes


def fuse_unavailable() -> str:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if importlib.util.find_spec("fuse") is None:
        return "fusepy is not installed (pip install fusepy)"
    import ctypes.util

    if ctypes.util.find_library("fuse") is None and not os.environ.get("FUSE_LIBRARY_PATH"):
        return "libfuse2 is not installed (apt-get install libfuse2)"
    if os.geteuid() != 0:
        return "mounting FUSE here needs root"
    return ""


pytestmark = pytest.mark.skipif(bool(fuse_unavailable()), reason=fuse_unavailable() or "-")


@pytest.fixture
def faulty_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(mount point, fault switch): fsync fails while the switch file exists."""
    backing, mount = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mount.mkdir()
    fs = subprocess.Popen([sys.executable, "-m", "tests.faultfs", str(backing), str(mount)], cwd=ROOT)
    try:
        wait_until(lambda: os.path.ismount(mount), 10, "the FUSE mount")
        yield mount, backing / ".fail-fsync"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        fs.terminate()
        fs.wait(10)


def test_failed_fsync_is_never_acknowledged(faulty_dir: tuple[Path, Path]) -> None:
    mount, switch = faulty_dir
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "800"}
    with running_service(mount, **settings) as service, Producer.attach(service.root) as producer:
        for i in range(20):
            assert producer.send("F", b"durable %d" % i, queue_id=0).status is PutMessageStatus.PUT_OK
        flushed = service.read(layout.FLUSHED_POSITION)
        switch.touch()
        failed = producer.send("F", b"not on disk", queue_id=0)
        assert failed.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert service.read(layout.FLUSHED_POSITION) == flushed, (
            "a failed fsync never advances the flushed offset"
        )
        failures = service.read(layout.FLUSH_FAILURES)
        assert failures > 0
        # The flusher tried again and failed again, then reput looked at the log: the record is
        # still not durable, so not readable (proven by those later passes, not by a wait).
        wait_until(lambda: service.read(layout.FLUSH_FAILURES) > failures, 10, "another failed fsync")
        worker_passes(service, "reput")
        assert service.read(layout.FLUSHED_POSITION) == flushed
        with Consumer.attach(service.root, "g") as consumer:
            assert consumer.pull("F", 0, 20).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            switch.unlink()
            assert producer.send("F", b"disk is back", queue_id=0).status is PutMessageStatus.PUT_OK
            wait_until(
                lambda: len(consumer.pull("F", 0, 20, 10).messages) == 2, 60, "both visible once on disk"
            )
            assert [m.body for m in consumer.pull("F", 0, 20, 10).messages] == [
                b"not on disk",
                b"disk is back",
            ]


def test_failed_fsync_can_make_the_store_read_only(faulty_dir: tuple[Path, Path]) -> None:
    mount, switch = faulty_dir
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "800", "enableRunningFlagsInFlush": "true"}
    with running_service(mount, **settings) as service, Producer.attach(service.root) as producer:
        assert producer.send("F", b"ok", queue_id=0).ok
        switch.touch()
        assert producer.send("F", b"fails", queue_id=0).status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        wait_until(
            lambda: bool(service.read(layout.RUNNING_FLAGS) & RunningFlags.NOT_WRITEABLE), 5, "NOT_WRITEABLE"
        )
        switch.unlink()
        refused = producer.send("F", b"refused", queue_id=0)
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "NOT_WRITEABLE" in refused.reason
