"""A slow disk, for real (tests.faultfs with a fsync delay): flushes over 500 ms are logged in
the flusher's own log, as RocketMQ logs "Flush data to disk costs"."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_mp.put.producer import Producer
from tests.crash.test_fsync_failure import faulty_dir, fuse_unavailable
from tests.service import running_service, wait_until

__all__ = ["faulty_dir"]  # the fixture, shared with the failing-fsync tests

pytestmark = pytest.mark.skipif(bool(fuse_unavailable()), reason=fuse_unavailable() or "-")


def test_a_flush_over_500_ms_is_logged(faulty_dir: tuple[Path, Path]) -> None:
    mount, fail_switch = faulty_dir
    slow = fail_switch.with_name(".slow-fsync")
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "5000"}
    with running_service(mount, **settings) as service, Producer.attach(service.root) as producer:
        flusher_log = service.root / "logs" / "flusher.log"
        assert producer.send("F", b"fast", queue_id=0).ok
        assert "flush data to disk costs" not in flusher_log.read_text()
        slow.write_text("700")
        assert producer.send("F", b"slow", queue_id=0).ok
        slow.unlink()
        wait_until(lambda: "flush data to disk costs" in flusher_log.read_text(), 30, "the slow-flush line")
