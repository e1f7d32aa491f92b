"""An empty slave of a master with several files (issue 31): the master answers its first report
of 0 from the start of the file holding its end (RocketMQ 4.9.8), and the slave's log begins
there, its ConsumeQueues at non-zero queue offsets padded with pre-blanks (`fillPreBlank`), as
RocketMQ's slave's do. Real processes; the slave then restarts cleanly and after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from rmq_mp.client.consumer import Consumer
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE, PRE_BLANK_ENTRY
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.store.message_store import MessageStore
from shm import layout
from tests.ha.pair import commit_log, put, start_master, start_slave, wait_caught_up
from tests.service import ROOT, RunningService, wait_until

HB = {"haSendHeartbeatInterval": "1000"}
SIZE = 1 << 20  # BASE_SETTINGS' mappedFileSizeCommitLog
CQ_FILE = 20000  # BASE_SETTINGS' mappedFileSizeConsumeQueue


def _same_log_from(master: RunningService, slave: RunningService, start: int, end: int) -> None:
    """The slave holds no file below ``start`` and the master's bytes from there to ``end``."""
    ours, theirs = commit_log(master), commit_log(slave)
    assert min(theirs) == f"{start:020d}", sorted(theirs)
    for offset in range(start, end, SIZE):
        name = f"{offset:020d}"
        upto = min(SIZE, end - offset)
        assert theirs[name][:upto] == ours[name][:upto], f"file {name} differs"


def _read_all(service: RunningService, topic: str) -> dict[int, list[tuple[int, int, bytes]]]:
    """Every message of every queue of ``topic`` from its minimum offset: (queue offset, phy, body)."""
    out: dict[int, list[tuple[int, int, bytes]]] = {}
    with Consumer.attach(service.names.base, "reader") as consumer:
        for queue_id in range(8):
            low, high = consumer.min_offset(topic, queue_id), consumer.max_offset(topic, queue_id)
            got: list[tuple[int, int, bytes]] = []
            offset = low
            while offset < high:
                result = consumer.pull(topic, queue_id, offset, 32)
                assert result.status is GetMessageStatus.FOUND, (queue_id, offset, result.status)
                got += [(m.queue_offset, m.commit_log_offset, m.body) for m in result.messages]
                offset = result.next_begin_offset
            if high:
                out[queue_id] = got
    return out


def _check_slave_reads(master: RunningService, slave: RunningService, start: int) -> None:
    """The slave serves, queue by queue, exactly the master's messages stored from ``start``;
    its queues begin at the first of them (below: OFFSET_TOO_SMALL)."""
    mine, theirs = _read_all(slave, "HaTopic"), _read_all(master, "HaTopic")
    assert mine
    for queue_id, messages in theirs.items():
        expected = [m for m in messages if m[1] >= start]
        assert mine[queue_id] == expected, f"queue {queue_id}"
        assert expected[0][0] > 0, "the slave's queue starts above offset 0"
    with Consumer.attach(slave.names.base, "reader") as consumer:
        first = min(mine)
        result = consumer.pull("HaTopic", first, 0, 32)
        assert result.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert result.next_begin_offset == mine[first][0][0]


def _check_queue_files(master: RunningService, slave: RunningService) -> None:
    """Each of the slave's queues: first file named by the file holding its first entry, pre-blank
    entries before it, then the master's entries byte for byte (RocketMQ's fillPreBlank)."""
    base_s, base_m = slave.root / "consumequeue" / "HaTopic", master.root / "consumequeue" / "HaTopic"
    for queue_dir in sorted(base_s.iterdir()):
        names = sorted(p.name for p in queue_dir.iterdir())
        first_file = int(names[0])
        data = (queue_dir / names[0]).read_bytes()
        blanks = 0
        while data[blanks * CQ_STORE_UNIT_SIZE : (blanks + 1) * CQ_STORE_UNIT_SIZE] == PRE_BLANK_ENTRY:
            blanks += 1
        assert first_file % CQ_FILE == 0
        first_entry = first_file + blanks * CQ_STORE_UNIT_SIZE
        assert first_entry > 0
        for name in names:
            theirs = (base_m / queue_dir.name / name).read_bytes()
            ours = (queue_dir / name).read_bytes()
            skip = blanks * CQ_STORE_UNIT_SIZE if name == names[0] else 0
            used = len(ours.rstrip(b"\0"))
            assert ours[skip:used] == theirs[skip:used], f"{queue_dir.name}/{name}"


def _status_json(service: RunningService) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "run.py", "status", "--conf", str(service.conf), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out))


def test_an_empty_slave_of_a_master_with_several_files_starts_at_its_last_file(tmp_path: Path) -> None:
    master = start_master(tmp_path, **HB)
    end = put(master, 9000, body_bytes=300)  # about 4 MiB: the end in the fifth file
    start = end - end % SIZE
    assert start >= 3 * SIZE
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, **HB)
    wait_caught_up(slave, end)
    assert slave.read(layout.MIN_OFFSET) == start
    _same_log_from(master, slave, start, end)
    _check_slave_reads(master, slave, start)
    assert "the master starts this empty slave at" in (slave.root / "logs" / "ha.log").read_text()

    end = put(master, 3000, body_bytes=300)  # follows across the next roll
    assert end - end % SIZE > start
    wait_caught_up(slave, end)
    _same_log_from(master, slave, start, end)
    _check_slave_reads(master, slave, start)
    status = _status_json(slave)
    assert status["replication"]["received_end"] == end  # type: ignore[index]

    assert slave.stop() == 0  # a clean restart resumes from its own end
    slave = start_slave(tmp_path, port, **HB)
    assert slave.read(layout.MIN_OFFSET) == start
    end = put(master, 500, body_bytes=300)
    wait_caught_up(slave, end)
    _check_slave_reads(master, slave, start)

    tree = psutil.Process(slave.process.pid)  # kill -9 of the whole slave, then start again
    for proc in [tree, *tree.children(recursive=True)]:
        proc.kill()
    slave.process.wait(10)
    end = put(master, 500, body_bytes=300)
    slave = start_slave(tmp_path, port, **HB)
    wait_caught_up(slave, end)
    _same_log_from(master, slave, start, end)
    _check_slave_reads(master, slave, start)
    firsts = {queue_id: messages[0][0] for queue_id, messages in _read_all(slave, "HaTopic").items()}
    assert slave.stop() == 0
    assert master.stop() == 0
    _check_queue_files(master, slave)
    with MessageStore.open(slave.root, slave.config, read_only=True) as store:  # an offline reader
        assert store.min_phy_offset() == start
        assert {q.queue_id: q.min_offset for q in store.queue_status("HaTopic")} == firsts
    admin = subprocess.run(  # rmq-admin on the stopped slave's files
        [sys.executable, "-m", "rmq_mp.tools.admin", "topicStatus", "-t", "HaTopic", "--json",
         "--store", str(slave.root), "--conf", str(slave.conf)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [json.loads(line) for line in admin.splitlines()]
    assert {row["queueId"]: row["minOffset"] for row in rows} == firsts


def test_the_slaves_ha_worker_killed_after_the_first_frame_resumes(tmp_path: Path) -> None:
    master = start_master(tmp_path, **HB)
    end = put(master, 6000, body_bytes=300)
    start = end - end % SIZE
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), **HB)
    wait_until(lambda: slave.read(layout.HA_SLAVE_RECEIVED_END) > start, 60, "the first frame")
    pid = slave.worker_pid("ha")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: slave.worker_pid("ha") not in (0, pid), 30, "the ha worker's restart")
    wait_caught_up(slave, end)
    _same_log_from(master, slave, start, end)
    _check_slave_reads(master, slave, start)


def test_the_cleaner_of_a_slave_begun_at_a_later_file(tmp_path: Path) -> None:
    """The slave's cleaner deletes its first file (fileReservedTime 0, a manual run) as on a
    master: MIN_OFFSET moves past it, the slave follows on, consumers read every message left."""
    master = start_master(tmp_path, **HB)
    end = put(master, 9000, body_bytes=300)
    start = end - end % SIZE
    slave = start_slave(tmp_path, master.read(layout.HA_LISTEN_PORT), fileReservedTime="0", **HB)
    wait_caught_up(slave, end)
    end = put(master, 4000, body_bytes=300)  # past the next roll
    wait_caught_up(slave, end)
    assert end - end % SIZE > start
    admin = subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", "deleteExpiredCommitLog", "-n", slave.names.base, "--json"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(admin)["min_offset"] >= start + SIZE
    assert f"{start:020d}" not in commit_log(slave)
    end = put(master, 300, body_bytes=300)
    wait_caught_up(slave, end)
    low = slave.read(layout.MIN_OFFSET)
    _same_log_from(master, slave, low, end)
    with Consumer.attach(slave.names.base, "reader") as consumer:
        served = set()
        for queue_id in range(8):
            offset, high = consumer.min_offset("HaTopic", queue_id), consumer.max_offset("HaTopic", queue_id)
            while offset < high:
                result = consumer.pull("HaTopic", queue_id, offset, 32)
                served |= {m.commit_log_offset for m in result.messages}
                offset = result.next_begin_offset
    expected = {m[1] for messages in _read_all(master, "HaTopic").values() for m in messages if m[1] >= low}
    assert expected <= served


def test_an_empty_slave_with_preallocated_or_damaged_files_begins_at_the_masters_file(tmp_path: Path) -> None:
    """A slave whose allocator left empty files ahead (zeros) drops the ones below the master's
    start and fsyncs the directory; one whose only file holds a stray byte and no record has it
    dropped by recovery (named in the damage log, as any torn tail) and is then empty."""
    master = start_master(tmp_path, **HB)
    end = put(master, 6000, body_bytes=300)
    start = end - end % SIZE
    assert start >= 2 * SIZE
    port = master.read(layout.HA_LISTEN_PORT)
    for name, stray_at in (("slave", -1), ("stray", SIZE - 1)):
        directory = tmp_path / name / "commitlog"
        directory.mkdir(parents=True)
        for offset in (0, SIZE):
            data = bytearray(SIZE)
            if stray_at >= 0:
                data[stray_at] = 1
            (directory / f"{offset:020d}").write_bytes(data)
        slave = start_slave(tmp_path, port, name, **HB)
        wait_caught_up(slave, end)
        assert slave.read(layout.MIN_OFFSET) == start
        _same_log_from(master, slave, start, end)  # no file below the start
        log = (slave.root / "logs" / "ha.log").read_text()
        assert f"the master starts this empty slave at {start}" in log
        assert f"removed the empty files {0:020d}" in log  # recovery drops the files past the first
        damage = "commitlog-truncated" in (slave.root / "logs" / "supervisor.log").read_text()
        assert damage == (stray_at >= 0)
        assert slave.stop() == 0
    assert master.stop() == 0
