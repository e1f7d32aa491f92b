"""A damaged slave (stopped; the tail of its last commit-log file overwritten with garbage, the
file truncated mid record, or one byte flipped in a record with sound records after it) restarts,
resumes from its last intact record, and converges with the master byte for byte. The flipped
byte: a master's clean-exit recovery would step over that record (docs/damage.md), but a slave
keeps no byte that is not its master's, so its log is cut there and fetched again."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from shm import layout
from tests.ha.pair import assert_same_log, put, start_master, start_slave, wait_caught_up
from tests.service import wait_until

HB = {"haSendHeartbeatInterval": "200"}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped"])
def test_a_damaged_slave_resumes_from_its_last_intact_record(tmp_path: Path, damage: str) -> None:
    rng = random.Random(damage)
    master = start_master(tmp_path, **HB)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **HB)
    end = put(master, 1500, body_bytes=700)  # into the second 1 MiB file
    wait_caught_up(slave, end)
    assert slave.stop() == 0

    size = master.config.mapped_file_size_commit_log
    last = slave.root / "commitlog" / f"{end - end % size:020d}"
    cut_at = end - rng.randrange(50, 600)  # inside the last record or the one before
    if damage == "flipped":
        cut_at = end - rng.randrange(1500, 2000)  # two records or more after it
        with last.open("r+b") as f:
            f.seek(cut_at % size)
            byte = f.read(1)[0]
            f.seek(cut_at % size)
            f.write(bytes([byte ^ 0x20]))
    elif damage == "garbage":
        with last.open("r+b") as f:
            f.seek(cut_at % size)
            f.write(bytes(rng.randrange(1, 256) for _ in range(end - cut_at + 4096)))
    else:
        with last.open("r+b") as f:
            f.truncate(cut_at % size)
    end = put(master, 500, body_bytes=700)  # more while it is down

    slave = start_slave(tmp_path, port, **HB)
    wait_caught_up(slave, end)
    wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 30, "the master to see the ack")
    assert_same_log(master, slave, end)
    resumed = [
        int(n)
        for n in re.findall(r"ha: slave of \S+ from (\d+)", (slave.root / "logs" / "ha.log").read_text())
    ]
    assert resumed[-1] <= cut_at, f"resumed from {resumed[-1]}, past the damage at {cut_at}"
    assert resumed[-1] > cut_at - 2000, "resumed from the last intact record, not further back"
    assert slave.stop() == 0
    assert_same_log(master, slave, end)
