"""The master's cleaner deletes commit-log files a stopped slave has not got: the master shows it
while the slave is connected (CONN_BEHIND_MIN_OFFSET, an ERROR in ha.log), the slave cannot
compare its log with the master's and refuses with one line (SLAVE_REFUSED, where), never a
silent gap (its log stays a prefix of what the master had); the operator's way out (docs/replication.md) is a slave rebuilt from a copy of the master's store,
which then follows byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from rmq_mp.tools.monitoring import StoreCollector
from shm import layout
from tests.ha.pair import commit_log, put, start_master, start_slave, wait_caught_up
from tests.service import ROOT, RunningService, wait_until

FILE_BYTES = 128 << 10
SETTINGS = {
    "haSendHeartbeatInterval": "200",
    "mappedFileSizeCommitLog": str(FILE_BYTES),
    "fileReservedTime": "0",  # every file but the one being written is expired at once
    "deleteWhen": str((datetime.now().hour + 12) % 24),  # not now: only the manual request deletes
    "cleanResourceInterval": "100",
    "deleteCommitLogFilesInterval": "0",
}


def _json_status(service: RunningService) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "run.py", "status", "--conf", str(service.conf), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def _metric(service: RunningService, name: str) -> float:
    for family in StoreCollector(service.config).collect():
        if family.name == name:
            [sample] = family.samples
            return sample.value
    raise AssertionError(f"no metric {name}")


def test_a_slave_behind_the_cleaner_gets_no_gap_and_is_rebuilt_from_a_copy(tmp_path: Path) -> None:
    settings = SETTINGS
    master = start_master(tmp_path, **settings)
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **settings)
    slave_end = put(master, 100)
    wait_caught_up(slave, slave_end)
    assert slave.stop() == 0

    end = put(master, 2000, body_bytes=400)  # about 7 files of 128 KiB the slave has not got
    before = commit_log(master)  # what the master had, to hold the slave's log against
    wait_until(lambda: master.read(layout.REPUT_FROM_OFFSET) >= end, 30, "the master's dispatch")
    subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", "deleteExpiredCommitLog", "--name", master.names.base],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    min_offset = master.read(layout.MIN_OFFSET)
    assert min_offset > slave_end, (min_offset, slave_end)

    slave = start_slave(tmp_path, port, **settings)  # resumes from slave_end: deleted on the master
    slot = layout.ha_connection_field(0, "state")
    wait_until(lambda: master.read(slot) == layout.CONN_BEHIND_MIN_OFFSET, 30, "the master to see the gap")
    ha_log = (master.root / "logs" / "ha.log").read_text()  # logged before the state is shown
    assert f"but the master's oldest byte is {min_offset}" in ha_log
    assert "the cleaner deleted the files between" in ha_log  # once per connection
    # The slave cannot compare its log with the master's (ha_fork: the master has nothing where
    # its log begins), so it refuses, saying where, and stays refusing: never a silent gap.
    wait_until(lambda: slave.read(layout.HA_SLAVE_STATE) == layout.SLAVE_REFUSED, 60, "the slave to refuse")
    assert slave.read(layout.HA_SLAVE_FORK_OFFSET) == 0, "the first byte it could not compare"
    assert slave.read(layout.HA_SLAVE_RECEIVED_END) == slave_end
    assert slave.read(layout.WROTE_POSITION) == slave_end
    slave_log = (slave.root / "logs" / "ha.log").read_text()
    assert "refusing to replicate from" in slave_log
    assert "give it a copy of the master's store" in slave_log

    wait_until(lambda: _metric(master, "rmq_ha_slaves_behind_min_offset") == 0, 30, "the refusing slave gone")

    assert slave.stop() == 0  # no silent gap: what the slave holds is what the master had
    theirs = b"".join(commit_log(slave).values())
    assert theirs[:slave_end] == b"".join(before.values())[:slave_end]
    assert not any(theirs[slave_end : slave_end + FILE_BYTES]), "nothing written past its end"

    # The way out: the slave rebuilt from a copy of the running master's store (its last record
    # may be torn by the copy: recovery cuts it and the slave asks from there).
    shutil.rmtree(slave.root)
    shutil.copytree(master.root, slave.root, ignore=shutil.ignore_patterns("logs"))
    slave = start_slave(tmp_path, port, **settings)
    end = put(master, 300, body_bytes=400)
    wait_caught_up(slave, end)
    wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 30, "the master to see the ack")
    assert _metric(master, "rmq_ha_slaves_behind_min_offset") == 0
    ours, theirs_files = commit_log(master), commit_log(slave)
    for offset in range(min_offset, end, FILE_BYTES):
        name = f"{offset:020d}"
        upto = min(FILE_BYTES, end - offset)
        assert theirs_files[name][:upto] == ours[name][:upto], f"file {name} differs"
