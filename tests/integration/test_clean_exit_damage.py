"""A damaged record in the commit-log files a clean exit's recovery scans (the last three).

RocketMQ 4.9.8's normal recovery cuts the log at the first bad record there. After a clean exit
everything was flushed, so a bad record with sound records after it is rot or tampering, not a
torn write: rmq-mp steps over it as over a bad record in an older file (never served, reported
once as `record-invalid`, the log's end where it was), so the intact records after it stay
served, and the next start, whose window of three files may take in an older damaged file once
a cut has deleted the newest, serves the same (seeds 1636, 2414 and 2716 of
tests/crash/test_compound_damage). A damaged tail (no sound record after it) is still cut, as is
a bad record after a crash (unless the checkpoint shows the record after it flushed) and in a
slave's log (a slave keeps no byte that is not its master's: it fetches the record again).

Each test writes a real store (tests/integration/test_read_damage.py's: 800 records, two
queues, 64 KiB files), damages one record, reopens it and reads every queue."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from rmq_mp.format.message import Message
from rmq_mp.store.message_store import MessageStore
from tests.integration.test_read_damage import (
    QUEUES,
    TOPIC,
    Written,
    drain,
    expected,
    findings,
    flip_body_byte,
    log_file,
    served,
    store_config,
    write_store,
)

DAMAGES = ["body-byte", "magic-zeroed", "totalsize"]


def damage(config: MessageStoreConfig, victim: Written, how: str) -> None:
    """One byte of the body flipped, the magic code zeroed, or TOTALSIZE 4 KiB too large (past
    the next records, past the newest file's written bytes or past its own file's end)."""
    if how == "body-byte":
        flip_body_byte(config, victim)
        return
    path = log_file(config, victim.phy_offset)
    at, data = (4, bytes(4)) if how == "magic-zeroed" else (0, (victim.size + 4096).to_bytes(4, "big"))
    with path.open("r+b") as f:
        f.seek(victim.phy_offset - int(path.name) + at)
        f.write(data)


def pick(config: MessageStoreConfig, written: list[Written], where: str) -> Written:
    """A record of the last three files: the last of queue 0 (only queue 1's last after it), the
    last of a file (its blank after it), or one in the middle of the third-last file."""
    size = config.mapped_file_size_commit_log
    if where == "last-of-queue":
        victim = written[-2]
        assert victim.queue_id == 0
        assert written[-1].queue_id == 1
        return victim
    window = written[-1].phy_offset // size - 2  # the third-last file
    assert window > 0, "older files than the three scanned"
    if where == "last-of-file":
        return next(
            w
            for w, after in itertools.pairwise(written)
            if w.phy_offset // size == window + 1 and after.phy_offset // size == window + 2
        )
    in_window = [w for w in written if w.phy_offset // size == window]
    return in_window[len(in_window) // 2]


def read_all(store: MessageStore) -> dict[int, list[tuple[int, int, bytes]]]:
    return {queue_id: served(drain(store.get_message, queue_id)) for queue_id in range(QUEUES)}


def without(written: list[Written], victims: list[Written]) -> dict[int, list[tuple[int, int, bytes]]]:
    return {
        queue_id: expected(
            written, queue_id, without={v.queue_offset for v in victims if v.queue_id == queue_id}
        )
        for queue_id in range(QUEUES)
    }


CUT_KINDS = {"commitlog-truncated", "cq-entries-truncated", "index-entries-truncated", "commitlog-missing"}


@pytest.mark.parametrize("where", ["mid-file", "last-of-file", "last-of-queue"])
@pytest.mark.parametrize("how", DAMAGES)
def test_a_clean_exits_bad_record_with_sound_ones_after_it_is_stepped_over_not_cut_at(
    tmp_path: Path, how: str, where: str
) -> None:
    config = store_config(tmp_path / "store")
    written = write_store(config)
    end = written[-1].phy_offset + written[-1].size
    victim = pick(config, written, where)
    after = written[written.index(victim) + 1]
    damage(config, victim, how)
    want = without(written, [victim])
    last_of_queue = max(w.queue_offset for w in written if w.queue_id == victim.queue_id)

    with MessageStore.open(config=config) as store:
        assert store.recovery is not None
        assert (store.recovery.recovered_end_offset, store.recovery.commit_log_bytes_dropped) == (end, 0)
        assert findings(store.reporter.findings, "record-invalid") == [
            (str(config.commit_log_dir), victim.phy_offset, after.phy_offset)
        ], "reported once, from the bad record to the next sound one"
        assert not CUT_KINDS & {d.kind for d in store.reporter.findings}, store.reporter.findings
        assert read_all(store) == want
        assert store.query_message(TOPIC, victim.key) == []
        assert [m.body for m in store.query_message(TOPIC, after.key)] == [after.body]
    with MessageStore.open(config=config) as store:  # the next clean start: the same, nothing redone
        assert store.recovery is not None
        assert (store.recovery.recovered_end_offset, store.recovery.records_dispatched) == (end, 0)
        assert not CUT_KINDS & {d.kind for d in store.reporter.findings}, store.reporter.findings
        assert read_all(store) == want
        new = store.put_message(Message(topic=TOPIC, body=b"after the damage", queue_id=victim.queue_id))
        assert (new.phy_offset, new.queue_offset) == (end, last_of_queue + 1), "no queue offset reused"
    with MessageStore.open(config=config) as store:
        got = read_all(store)
        assert got[victim.queue_id][-1] == (victim.queue_id, last_of_queue + 1, b"after the damage")
        got[victim.queue_id].pop()
        assert got == want


def assert_cut_at(store: MessageStore, config: MessageStoreConfig, phy_offset: int, end: int) -> None:
    """The log recovered to ``phy_offset``, its cut ``[phy_offset, end)`` reported, nothing stepped over."""
    assert store.recovery is not None
    assert store.recovery.recovered_end_offset == phy_offset
    assert findings(store.reporter.findings, "commitlog-truncated") == [
        (str(config.commit_log_dir), phy_offset, end)
    ]
    assert findings(store.reporter.findings, "record-invalid") == []


@pytest.mark.parametrize("how", DAMAGES)
def test_a_clean_exits_damaged_tail_is_still_cut(tmp_path: Path, how: str) -> None:
    """The newest record damaged, nothing sound after it: as RocketMQ, the log is cut there."""
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim = written[-1]
    end = victim.phy_offset + victim.size
    damage(config, victim, how)
    want = without(written, [victim])

    with MessageStore.open(config=config) as store:
        assert_cut_at(store, config, victim.phy_offset, end)
        assert read_all(store) == want
    with MessageStore.open(config=config) as store:
        assert store.recovery is not None
        assert store.recovery.recovered_end_offset == victim.phy_offset
        assert store.reporter.findings == []
        assert read_all(store) == want


@pytest.mark.parametrize("role", ["crash", "slave"])
def test_a_bad_record_with_sound_ones_after_it_is_cut_at_after_a_crash_or_in_a_slave(
    tmp_path: Path, role: str
) -> None:
    """After a crash a torn write looks the same as rot, so the log is cut at the first bad record
    (RocketMQ's rule; the record after it is the last flushed, newer than the checkpoint's safe
    time, 3 s before it); a slave's log too after a clean exit, so that it fetches the record again
    from its master rather than keep a byte that is not the master's."""
    config = store_config(tmp_path / "store")
    written = write_store(config)
    end = written[-1].phy_offset + written[-1].size
    victim = pick(config, written, "last-of-queue")  # the record after it: the checkpoint's time
    damage(config, victim, "body-byte")
    if role == "crash":
        (Path(config.store_path_root_dir) / "abort").touch()
    else:
        config = config.replace(broker_role=BrokerRole.SLAVE)

    with MessageStore.open(config=config) as store:
        assert_cut_at(store, config, victim.phy_offset, end)
        kept = [w for w in written if w.phy_offset < victim.phy_offset]
        assert read_all(store) == {q: expected(kept, q, without=set()) for q in range(QUEUES)}


def test_without_crc_checks_at_recovery_a_flipped_body_is_left_to_the_reads(tmp_path: Path) -> None:
    """``checkCRCOnRecover=false``: recovery checks no CRC (RocketMQ's meaning), so a flipped body
    byte is neither cut at nor stepped over by it; every read checks the CRC and skips the record.
    A zeroed magic code is still found, by the header check, and stepped over."""
    config = store_config(tmp_path / "store").replace(check_crc_on_recover=False)
    written = write_store(config)
    end = written[-1].phy_offset + written[-1].size
    flipped = pick(config, written, "mid-file")
    zeroed = pick(config, written, "last-of-file")
    damage(config, flipped, "body-byte")
    damage(config, zeroed, "magic-zeroed")
    after = written[written.index(zeroed) + 1]

    with MessageStore.open(config=config) as store:
        assert store.recovery is not None
        assert store.recovery.recovered_end_offset == end
        assert findings(store.reporter.findings, "record-invalid") == [
            (str(config.commit_log_dir), zeroed.phy_offset, after.phy_offset)
        ]
        assert findings(store.reporter.findings, "record-crc-failed") == []
        assert read_all(store) == without(written, [flipped, zeroed])
        assert [start for _p, start, _e in findings(store.reporter.findings, "record-crc-failed")] == [
            flipped.phy_offset
        ]


def test_a_crash_after_the_step_over_does_not_cut_what_the_clean_start_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean start steps over a bad record; the store then takes puts and crashes. The crash's
    recovery scans from the checkpoint's file, which may hold the bad record again: the sound
    record after it was stored before the checkpoint's safe time (RocketMQ's mark of a log flushed
    up to there: it scans no file below the one holding it), so it was flushed before the crash
    and the bad record is rot, not a torn write: stepped over again, not cut at, so the records
    after it, the puts since the clean start among them, stay (a cut would drop acknowledged
    puts that the clean start's own cut would have kept)."""
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim = pick(config, written, "last-of-queue")
    after = written[-1]
    damage(config, victim, "body-byte")
    with MessageStore.open(config=config) as store:
        assert findings(store.reporter.findings, "record-invalid") == [
            (str(config.commit_log_dir), victim.phy_offset, after.phy_offset)
        ]
    store = MessageStore.open(config=config)
    try:
        real = time.time
        with monkeypatch.context() as clock:  # the puts come 10 s later, the checkpoint with them
            clock.setattr(time, "time", lambda: real() + 10)
            puts = [
                store.put_message(Message(topic=TOPIC, body=b"later %d" % i, queue_id=i % QUEUES))
                for i in range(4)
            ]
            assert all(p.ok for p in puts)
            store.flush()
    finally:
        store._release()  # a crash: the abort marker stays
    assert (Path(config.store_path_root_dir) / "abort").exists()

    with MessageStore.open(config=config) as store:
        assert store.recovery is not None
        assert store.recovery.abnormal
        assert store.recovery.scan_from_offset <= victim.phy_offset, "the crash's scan meets it again"
        assert store.recovery.recovered_end_offset == puts[-1].phy_offset + puts[-1].wrote_bytes
        assert not CUT_KINDS & {d.kind for d in store.reporter.findings}, store.reporter.findings
        assert [start for _p, start, _e in findings(store.reporter.findings, "record-invalid")] == [
            victim.phy_offset
        ]
        want = without(written, [victim])
        for i, p in enumerate(puts):
            want[i % QUEUES].append((i % QUEUES, p.queue_offset, b"later %d" % i))
        assert read_all(store) == want


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_last_record_whose_entry_opens_a_queue_file_keeps_its_queue_offset(
    tmp_path: Path, how: str
) -> None:
    """The queue's last record damaged, its entry the first of a ConsumeQueue file: the check
    compares it from the previous file's last entry (a known record boundary) and keeps it, a read
    skips it, and the next put takes the queue offset after it. Alone in its file, the entry had
    no boundary before it and was cut, and the next put took its queue offset again: a consumer
    already past it would have skipped the new message."""
    config = store_config(tmp_path / "store").replace(mapped_file_size_consume_queue=133 * 20)
    written = write_store(config)
    victim = pick(config, written, "last-of-queue")
    assert victim.queue_offset % 133 == 0, "its entry opens a queue file (399 = 3 x 133)"
    damage(config, victim, how)
    want = without(written, [victim])

    with MessageStore.open(config=config) as store:
        assert read_all(store) == want
        new = store.put_message(Message(topic=TOPIC, body=b"after the damage", queue_id=victim.queue_id))
        assert new.queue_offset == victim.queue_offset + 1, "no queue offset reused"
