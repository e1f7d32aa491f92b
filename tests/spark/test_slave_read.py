"""The `rmq` source over a slave whose log begins at its master's last file (issue 31: an empty
slave of a master with several files): its queues start at non-zero offsets behind pre-blank
ConsumeQueue entries, and a batch read returns exactly the master's messages stored from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from shm import layout
from tests.ha.pair import put, start_master, start_slave, wait_caught_up

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

COLUMNS = ["topic", "queue_id", "queue_offset", "commit_log_offset", "body"]


def test_a_batch_read_of_a_slave_begun_at_the_masters_last_file(spark, tmp_path: Path) -> None:
    master = start_master(tmp_path, haSendHeartbeatInterval="1000")
    end = put(master, 9000, body_bytes=300)
    start = end - end % (1 << 20)
    assert start > 0
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), haSendHeartbeatInterval="1000")
    wait_caught_up(slave, end)
    assert slave.stop() == 0
    assert master.stop() == 0

    def rows(root: Path) -> list[tuple]:
        df = spark.read.format("rmq").option("store", str(root)).load().select(*COLUMNS)
        return sorted(
            (r.topic, r.queue_id, r.queue_offset, r.commit_log_offset, bytes(r.body)) for r in df.collect()
        )

    ours = rows(slave.root)
    theirs = [r for r in rows(master.root) if r[3] >= start]
    assert ours == theirs
    assert min(r[2] for r in ours) > 0, "its queues begin above offset 0"
