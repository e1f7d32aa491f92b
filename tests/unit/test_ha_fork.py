"""workers/ha_fork.py on real commit-log files written by the library store: where a probe asks
from, and what the master's frames from there show (a match, a fork at a record's start, the
master's end, nothing at the probe, the slave's first byte), whatever the frames' sizes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import ha_frame
from rmq_mp.format.message import Message
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.shared_log import SharedCommitLog
from workers import ha_fork
from workers.ha_fork import ForkCheck, Verdict


def _store(root: Path, config: MessageStoreConfig, bodies: list[bytes]) -> list[int]:
    """A store at ``root`` holding ``bodies`` in order; each record's start, then the end."""
    starts = []
    with MessageStore.open(root, config) as store:
        for body in bodies:
            result = store.put_message(Message(topic="T", body=body))
            starts.append(result.phy_offset)
        starts.append(store.max_phy_offset())
    return starts


def _log(root: Path, config: MessageStoreConfig, end: int) -> SharedCommitLog:
    log = SharedCommitLog(
        root / "commitlog", config.mapped_file_size_commit_log, writable=False, delay_level_ms=[]
    )
    log.sync_positions(min_offset=0, readable_end=end)
    return log


def _frames(log: SharedCommitLog, start: int, end: int, size: int, batch: int) -> list[ha_frame.Frame]:
    """The master's frames of ``[start, end)``: at most ``batch`` bytes, never across a file."""
    frames = []
    while start < end:
        n = min(batch, end - start, size - start % size)
        mf = log.file_at(start)
        at = start - mf.file_from_offset
        frames.append(ha_frame.Frame(start, bytes(mf.buf[at : at + n])))
        start += n
    return frames


def _run(check: ForkCheck, frames: list[ha_frame.Frame]) -> ha_fork.Outcome:
    for frame in frames:
        outcome = check.feed(frame)
        if outcome.verdict is not Verdict.PENDING:
            return outcome
    return check.feed(ha_frame.Frame(check.pos, b""))  # then the master has nothing more


@pytest.fixture
def config(small_config: MessageStoreConfig) -> MessageStoreConfig:
    return small_config


BODIES = [bytes([i % 251]) * (300 + 37 * i) for i in range(400)]  # rolls 64 KiB files


@pytest.mark.parametrize("batch", [1, 97, 32 << 10])
def test_forks_at_the_start_of_the_first_record_that_differs(
    tmp_path: Path, config: MessageStoreConfig, batch: int
) -> None:
    size = config.mapped_file_size_commit_log
    fork_index = 300
    shared = _store(tmp_path / "s", config, BODIES[:fork_index])  # the common prefix, then apart
    shutil.copytree(tmp_path / "s", tmp_path / "m")
    master_starts = shared[:-1] + _store(tmp_path / "m", config, BODIES[fork_index:])
    slave_starts = shared[:-1] + _store(tmp_path / "s", config, [b"other"] * 50)
    slave_end = slave_starts[-1]
    master_end = master_starts[-1]
    slave, master = _log(tmp_path / "s", config, slave_end), _log(tmp_path / "m", config, master_end)
    starts = ha_fork.probe_starts(slave, 0, slave_end, size)
    assert starts[0] == slave_starts[-2], "first the last record"
    files = list(range(starts[1], -1, -size))
    assert starts[1:] == [*files[:-1], slave_starts[1], 0], (
        "then each file start; byte 0's second record first"
    )
    outcomes = []
    for start in starts:
        check = ForkCheck(slave, start, slave_end, size, last=start == 0)
        outcome = _run(check, _frames(master, start, master_end, size, batch))
        outcomes.append(outcome)
        if outcome.verdict is not Verdict.NEXT_PROBE:
            break
    assert outcomes[-1].verdict is Verdict.FORKED
    assert outcomes[-1].offset == master_starts[fork_index]
    assert all(o.verdict is Verdict.NEXT_PROBE for o in outcomes[:-1])
    assert outcomes[0].differs, "other bytes at the slave's last record: its log is not the master's there"


def test_a_fork_inside_the_first_file_of_a_master_that_rolled_on_is_found(
    tmp_path: Path, config: MessageStoreConfig
) -> None:
    """A returning old master whose whole log lies in file 0, against a new master that rolled
    past it: a report of 0 is an empty slave's, answered from the master's last file, so byte 0
    cannot be compared (tests/ha/test_failover.py seed 104 refused there). The probe at the
    second record can: the fork is found where the logs part."""
    size = config.mapped_file_size_commit_log
    shared = _store(tmp_path / "s", config, BODIES[:3])
    shutil.copytree(tmp_path / "s", tmp_path / "m")
    master_starts = shared[:-1] + _store(tmp_path / "m", config, BODIES[3:200])
    slave_starts = shared[:-1] + _store(tmp_path / "s", config, [b"only the old master's"] * 20)
    slave_end, master_end = slave_starts[-1], master_starts[-1]
    assert slave_end < size < master_end
    slave, master = _log(tmp_path / "s", config, slave_end), _log(tmp_path / "m", config, master_end)
    starts = ha_fork.probe_starts(slave, 0, slave_end, size)
    assert starts == [slave_starts[-2], slave_starts[1], 0]
    outcomes = []
    for start in starts:
        answered_from = start if start else master_end - master_end % size  # as any master answers
        check = ForkCheck(slave, start, slave_end, size, last=start == 0)
        outcomes.append(_run(check, _frames(master, answered_from, master_end, size, 32 << 10)))
        if outcomes[-1].verdict is not Verdict.NEXT_PROBE:
            break
    assert [o.verdict for o in outcomes] == [Verdict.NEXT_PROBE, Verdict.FORKED]
    assert outcomes[-1].offset == shared[3]


def test_matching_logs_hand_on_what_lies_past_the_slaves_end(
    tmp_path: Path, config: MessageStoreConfig
) -> None:
    size = config.mapped_file_size_commit_log
    starts = _store(tmp_path / "m", config, BODIES)
    master = _log(tmp_path / "m", config, starts[-1])
    slave_end = starts[250] + 10  # a record cut by a frame: its first 10 bytes
    probe = ha_fork.probe_starts(master, 0, starts[250], size)[0]
    assert probe == starts[249]
    check = ForkCheck(master, probe, slave_end, size, last=False)
    frames = _frames(master, probe, starts[-1], size, 32 << 10)
    outcome = _run(check, frames)
    assert outcome.verdict is Verdict.MATCHED
    assert outcome.tail is not None
    assert outcome.tail.phy_offset == slave_end
    assert outcome.tail.data == frames[0].data[slave_end - probe :]


def test_a_slave_ahead_of_the_master_forks_at_the_masters_end(
    tmp_path: Path, config: MessageStoreConfig
) -> None:
    size = config.mapped_file_size_commit_log
    starts = _store(tmp_path / "s", config, BODIES)
    log = _log(tmp_path / "s", config, starts[-1])
    master_end = starts[200]
    check = ForkCheck(log, starts[150], starts[-1], size, last=False)
    outcome = _run(check, _frames(log, starts[150], master_end, size, 4096))
    assert (outcome.verdict, outcome.offset) == (Verdict.FORKED, master_end)


def test_nothing_at_the_probe_asks_further_back_then_refuses(
    tmp_path: Path, config: MessageStoreConfig
) -> None:
    size = config.mapped_file_size_commit_log
    starts = _store(tmp_path / "s", config, BODIES)
    log = _log(tmp_path / "s", config, starts[-1])
    for last, verdict in ((False, Verdict.NEXT_PROBE), (True, Verdict.REFUSED)):
        check = ForkCheck(log, starts[3], starts[-1], size, last=last)
        outcome = check.feed(ha_frame.Frame(starts[3], b""))
        assert (outcome.verdict, outcome.offset) == (verdict, starts[3])
        assert f"nothing at {starts[3]}" in outcome.why
        assert not outcome.differs, "nothing there (a master behind, or a cleaner gap) is no difference"


def test_a_first_record_that_differs_at_the_slaves_first_byte_shares_nothing(
    tmp_path: Path, config: MessageStoreConfig
) -> None:
    size = config.mapped_file_size_commit_log
    ours = _store(tmp_path / "s", config, BODIES[:50])
    theirs = _store(tmp_path / "m", config, [b"x" * 500] * 50)
    slave, master = _log(tmp_path / "s", config, ours[-1]), _log(tmp_path / "m", config, theirs[-1])
    check = ForkCheck(slave, 0, ours[-1], size, last=True)
    outcome = _run(check, _frames(master, 0, theirs[-1], size, 32 << 10))
    assert (outcome.verdict, outcome.offset) == (Verdict.FORKED, 0)
    with pytest.raises(ha_fork.HaProtocolError):  # a frame not where the comparison stands
        ForkCheck(slave, ours[1], ours[-1], size, last=True).feed(ha_frame.Frame(ours[2], b"x"))
    # From 0, a frame elsewhere is the master's answer to a report of 0 (its last file): byte 0
    # cannot be asked for, so the slave cannot tell (the cleaner outran it, test_cleaner_gap).
    refused = ForkCheck(slave, 0, ours[-1], size, last=True).feed(ha_frame.Frame(size, b"x"))
    assert (refused.verdict, refused.offset) == (Verdict.REFUSED, 0)


def test_a_locate_skips_the_probes_above_the_masters_end() -> None:
    """A `Locate` (a report of 0) learns the file holding the master's end from its first frame:
    data there means a probe from any start up to that file's start finds some, a heartbeat
    means only starts below it do. Byte 0 is never chosen before the second record."""
    size = 1000
    starts = [5321, 5000, 4000, 3000, 2000, 1000, 123, 0]  # probe_starts' shape, latest first
    locate = ha_fork.Locate()
    data = locate.feed(ha_frame.Frame(3000, b"x"))
    assert (data.verdict, data.offset) == (ha_fork.Verdict.LOCATED, 3001)
    assert starts[ha_fork.first_below(starts, data.offset, size)] == 3000
    heartbeat = ha_fork.Locate().feed(ha_frame.Frame(3000, b""))
    assert starts[ha_fork.first_below(starts, heartbeat.offset, size)] == 2000
    assert starts[ha_fork.first_below(starts, 1, size)] == 123  # the master's end in file 0
    assert ha_fork.first_below([5321, 5000, 0], 1, size) == 2  # no second record listed: byte 0
    assert starts[ha_fork.first_below(starts, 10_000, size)] == 5321
