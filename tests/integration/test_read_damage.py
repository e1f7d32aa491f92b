"""Damage a read meets is never served and never stops a consumer (issue 18, items 2 and 6).

Each test writes a real store with several small commit-log files, damages an OLDER file (not
among the last three, which clean-exit recovery checks) or a ConsumeQueue entry, stops cleanly,
reopens, and reads through every path: pulls return every other message exactly once with the
bytes that were acknowledged, the bad record is skipped with one report naming its byte range,
and a look-up of exactly it raises a typed error."""

from __future__ import annotations

import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import BodyCrcError, CorruptFileError, CorruptRecordError
from rmq_mp.format.message import Message, MessageExt
from rmq_mp.format.queue_entry import CQ_ENTRY, CQ_STORE_UNIT_SIZE
from rmq_mp.outcomes import GetMessageResult, GetMessageStatus
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.message_store import MessageStore
from rmq_mp.tools.admin import main as admin_main
from rmq_mp.tools.store_status import collect_status
from shm import layout
from tests.service import running_service, write_conf

TOPIC = "ReadDamage"
QUEUES = 2
COUNT = 800
SETTINGS = {
    "mappedFileSizeCommitLog": str(64 * 1024),
    "mappedFileSizeConsumeQueue": str(100 * CQ_STORE_UNIT_SIZE),
    "maxHashSlotNum": "64",
    "maxIndexNum": "200",
}
ADMIN_SETTINGS = [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]


@dataclass(frozen=True)
class Written:
    """One acknowledged message: what was sent and where the store put it."""

    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    body: bytes
    key: str
    msg_id: str


def store_config(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig.from_properties({**SETTINGS, "storePathRootDir": str(root)}, source="test")


def write_store(config: MessageStoreConfig) -> list[Written]:
    rnd = random.Random(18)
    written = []
    with MessageStore.open(config=config) as store:
        for i in range(COUNT):
            body, key = rnd.randbytes(rnd.randint(200, 600)), f"key-{i}"
            message = Message(
                topic=TOPIC, body=body, properties={"KEYS": key, "TAGS": "TagA"}, queue_id=i % QUEUES
            )
            r = store.put_message(message)
            assert r.ok, r
            written.append(
                Written(i % QUEUES, r.queue_offset, r.phy_offset, r.wrote_bytes, body, key, r.msg_id)
            )
    files = sorted((Path(config.store_path_root_dir) / "commitlog").iterdir())
    assert len(files) >= 6, "the first commit-log file must not be among the last three"
    return written


def log_file(config: MessageStoreConfig, phy_offset: int) -> Path:
    size = config.mapped_file_size_commit_log
    return Path(config.commit_log_dir) / offset_to_file_name(phy_offset - phy_offset % size)


def flip_body_byte(config: MessageStoreConfig, victim: Written) -> Path:
    """Flip one byte in the middle of ``victim``'s stored body, in place."""
    path = log_file(config, victim.phy_offset)
    data = path.read_bytes()
    start = victim.phy_offset - int(path.name)
    at = data.index(victim.body, start, start + victim.size) + len(victim.body) // 2
    with path.open("r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0xFF]))
    return path


def cq_file(config: MessageStoreConfig, queue_id: int, queue_offset: int) -> Path:
    position = queue_offset * CQ_STORE_UNIT_SIZE
    size = config.mapped_file_size_consume_queue
    return (
        Path(config.store_path_root_dir)
        / "consumequeue"
        / TOPIC
        / str(queue_id)
        / offset_to_file_name(position - position % size)
    )


def rewrite_entry(config: MessageStoreConfig, queue_id: int, queue_offset: int, phy: int, size: int) -> Path:
    path = cq_file(config, queue_id, queue_offset)
    position = queue_offset * CQ_STORE_UNIT_SIZE % config.mapped_file_size_consume_queue
    with path.open("r+b") as f:
        f.seek(position)
        _phy, _size, tags = CQ_ENTRY.unpack(f.read(CQ_STORE_UNIT_SIZE))
        f.seek(position)
        f.write(CQ_ENTRY.pack(phy, size, tags))
    return path


def drain(pull: object, queue_id: int, max_msgs: int = 32, offset: int = 0) -> list[MessageExt]:
    """Every message of a queue by pulls from ``offset``, each pull going on from the last one's
    next offset, until the queue's end: a consumer that never gets stuck."""
    assert callable(pull)
    got: list[MessageExt] = []
    while True:
        result: GetMessageResult = pull(TOPIC, queue_id, offset, max_msgs)
        if result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE:
            return got
        assert result.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE), result
        assert result.next_begin_offset > offset
        got.extend(result.messages)
        offset = result.next_begin_offset


def served(messages: list[MessageExt]) -> list[tuple[int, int, bytes]]:
    return [(m.queue_id, m.queue_offset, m.body) for m in messages]


def expected(written: list[Written], queue_id: int, *, without: set[int]) -> list[tuple[int, int, bytes]]:
    return [
        (w.queue_id, w.queue_offset, w.body)
        for w in written
        if w.queue_id == queue_id and w.queue_offset not in without
    ]


def findings(reporter_findings: list, kind: str) -> list[tuple[str, int, int]]:
    return sorted((d.path, d.start, d.end) for d in reporter_findings if d.kind == kind)


def test_a_flipped_body_byte_in_an_older_file_is_never_served(tmp_path: Path) -> None:
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim = next(w for w in written if w.queue_id == 0 and w.queue_offset == 5)
    assert victim.phy_offset < config.mapped_file_size_commit_log
    path = flip_body_byte(config, victim)
    damaged_range = (str(path), victim.phy_offset, victim.phy_offset + victim.size)

    with MessageStore.open(config=config) as store:
        assert store.reporter.findings == [], "clean-exit recovery does not read the first file"
        assert store.max_phy_offset() == written[-1].phy_offset + written[-1].size

        for _ in range(2):  # pulled again: still skipped, still reported once
            assert served(drain(store.get_message, 0)) == expected(written, 0, without={5})
            assert findings(store.reporter.findings, "record-crc-failed") == [damaged_range]
        assert served(drain(store.get_message, 1)) == expected(written, 1, without=set())
        assert store.reporter.count() == 1
        assert store.read_skips.skipped == 1

        around = store.get_message(TOPIC, 0, 4, 3)
        assert [m.queue_offset for m in around.messages] == [4, 6, 7]
        assert around.next_begin_offset == 8
        # One message asked for from the bad one: the pull goes on to the next good one, as past
        # an entry a filter skips (the bad one does not use up the pull).
        one = store.get_message(TOPIC, 0, 5, 1)
        assert [m.queue_offset for m in one.messages] == [6]
        assert one.next_begin_offset == 7

        with pytest.raises(BodyCrcError, match=f"commit-log offset {victim.phy_offset}.*body CRC"):
            store.look_message_by_offset(victim.phy_offset)
        with pytest.raises(BodyCrcError):
            store.view_message_by_id(victim.msg_id)
        with pytest.raises(BodyCrcError, match=f"{TOPIC}/0 queue offset 5"):
            store.look_message_by_queue_offset(TOPIC, 0, 5)
        assert store.query_message(TOPIC, victim.key) == []
        neighbour = next(w for w in written if w.queue_id == 0 and w.queue_offset == 6)
        assert [m.body for m in store.query_message(TOPIC, neighbour.key)] == [neighbour.body]
        assert [m.commit_log_offset for m in store.iter_messages()] == [
            w.phy_offset for w in written if w is not victim
        ]
        assert store.reporter.count() == 1, "every path met the same record: one report in this process"


def test_rmq_admin_never_prints_the_damaged_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = store_config(tmp_path / "admin-store")
    written = write_store(config)
    victim = next(w for w in written if w.queue_id == 1 and w.queue_offset == 7)
    flip_body_byte(config, victim)
    store = ["--store", config.store_path_root_dir, *ADMIN_SETTINGS]

    with caplog.at_level(logging.WARNING, logger="rmq_mp.damage"):
        assert admin_main(["printMsg", *store, "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == COUNT - 1
    assert not any(f'"commitLogOffset":{victim.phy_offset},' in x for x in lines)
    assert any(
        "record-crc-failed" in r.getMessage()
        and f"[{victim.phy_offset}, {victim.phy_offset + victim.size})" in r.getMessage()
        for r in caplog.records
    )
    assert admin_main(["queryMsgById", *store, "--id", victim.msg_id]) == 2
    assert "body CRC" in capsys.readouterr().err
    assert admin_main(["queryMsgByOffset", *store, "--topic", TOPIC, "--queue", "1", "--offset", "7"]) == 2
    assert "body CRC" in capsys.readouterr().err
    assert admin_main(["queryMsgByKey", *store, "--topic", TOPIC, "--key", victim.key, "--json"]) == 0
    assert capsys.readouterr().out == ""


def test_queue_entries_that_do_not_point_at_their_record_are_skipped_and_reported(tmp_path: Path) -> None:
    config = store_config(tmp_path / "store")
    written = write_store(config)
    by_offset = {(w.queue_id, w.queue_offset): w for w in written}
    middle, other_queue, wrong_size = by_offset[(0, 10)], by_offset[(1, 20)], by_offset[(0, 99)]
    first_queue_file = str(cq_file(config, 0, 0))

    with MessageStore.open(config=config) as store:
        # Damaged while open (recovery checks every entry at start and would rebuild them): the
        # store reads its queue files through shared mappings, so it sees these writes.
        rewrite_entry(config, 0, 10, middle.phy_offset + 17, middle.size)
        rewrite_entry(config, 0, 20, other_queue.phy_offset, other_queue.size)
        rewrite_entry(config, 0, 99, wrong_size.phy_offset, wrong_size.size + 8)
        for _ in range(2):
            assert served(drain(store.get_message, 0, max_msgs=7)) == expected(
                written, 0, without={10, 20, 99}
            )
        reports = sorted((d for d in store.reporter.findings), key=lambda d: d.start)
        assert [(d.kind, d.path, d.start, d.end) for d in reports] == [
            ("queue-entry-invalid", first_queue_file, q * 20, q * 20 + 20) for q in (10, 20, 99)
        ]
        assert "no valid record" in reports[0].reason
        assert f"the record there is {TOPIC} queue 1 offset 20" in reports[1].reason
        assert f"{wrong_size.size + 8} bytes" in reports[2].reason
        # A pull reads entries of one queue file at most (RocketMQ's getIndexBuffer): one that
        # meets only the bad last entry of a file answers NO_MATCHED_MESSAGE, next offset past it.
        tail = store.get_message(TOPIC, 0, 99, 32)
        assert (tail.status, tail.messages, tail.next_begin_offset) == (
            GetMessageStatus.NO_MATCHED_MESSAGE,
            [],
            100,
        )
        for queue_offset in (10, 20, 99):
            with pytest.raises(CorruptRecordError, match=f"queue offset {queue_offset}"):
                store.look_message_by_queue_offset(TOPIC, 0, queue_offset)
        assert [m.body for m in store.query_message(TOPIC, other_queue.key)] == [other_queue.body]
        assert store.reporter.count() == 3
    with MessageStore.open(config=config) as store:  # recovery rebuilds the three entries
        assert served(drain(store.get_message, 0)) == expected(written, 0, without=set())
        assert [d.kind for d in store.reporter.findings] == ["cq-entries-dropped"]


def test_a_running_store_skips_damage_for_every_consumer_and_counts_it(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "store.conf", tmp_path / "store", **SETTINGS)
    config = MessageStoreConfig.from_file(conf)
    written = write_store(config)
    victim = next(w for w in written if w.queue_id == 0 and w.queue_offset == 3)
    flip_body_byte(config, victim)
    pointed = next(w for w in written if w.queue_id == 0 and w.queue_offset == 40)
    want = {0: expected(written, 0, without={3, 40}), 1: expected(written, 1, without=set())}

    with running_service(tmp_path, "store", **SETTINGS) as service:
        rewrite_entry(config, 0, 40, pointed.phy_offset + 1, pointed.size)  # after recovery's check
        with Consumer.attach(service.names.base, "damage-pull") as consumer:
            for queue_id in range(QUEUES):
                assert served(drain(consumer.pull, queue_id)) == want[queue_id]
            kinds = sorted(d.kind for d in consumer.reporter.findings)
            assert kinds == ["queue-entry-invalid", "record-crc-failed"]
            assert service.read(layout.READ_SKIPPED_RECORDS) == 2
            assert served(drain(consumer.pull, 0)) == want[0]
        with Consumer.attach(service.names.base, "damage-poll") as consumer:
            consumer.subscribe(TOPIC, from_offsets=dict.fromkeys(range(QUEUES), 0))
            polled: list[MessageExt] = []
            while batch := consumer.poll(timeout_s=0.5):
                polled.extend(batch)
            assert sorted(served(polled)) == sorted(want[0] + want[1])
            assert consumer.subscriptions[TOPIC].next_offsets == {0: COUNT // 2, 1: COUNT // 2}
            assert consumer.reporter.findings == [], "reported once per process: by the first consumer"
        assert service.read(layout.READ_SKIPPED_RECORDS) == 2
        assert collect_status(service.config)["counters"]["read_skipped_records"] == 2


def test_a_queue_file_deleted_under_a_running_store_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    """A queue file removed while the store runs (an operator's rm, a damaged disk), one the
    consumer has not mapped yet: its pull raises CorruptFileError naming the file and what the
    store says the queue holds, not a bare FileNotFoundError; the other queue reads on, and a
    restart rebuilds the queue from the commit log."""
    conf = write_conf(tmp_path / "store.conf", tmp_path / "store", **SETTINGS)
    config = MessageStoreConfig.from_file(conf)
    written = write_store(config)
    want = {q: expected(written, q, without=set()) for q in range(QUEUES)}
    second = (
        Path(config.store_path_root_dir)
        / "consumequeue"
        / TOPIC
        / "0"
        / offset_to_file_name(100 * CQ_STORE_UNIT_SIZE)
    )
    with running_service(tmp_path, "store", **SETTINGS) as service:
        second.unlink()
        with Consumer.attach(service.names.base, "gone") as consumer:
            with pytest.raises(CorruptFileError, match=f"{second}: missing, though the store says queue"):
                consumer.pull(TOPIC, 0, 150)
            assert served(drain(consumer.pull, 1)) == want[1]
    with (
        running_service(tmp_path, "store", **SETTINGS) as service,
        Consumer.attach(service.names.base, "gone") as consumer,
    ):
        assert served(drain(consumer.pull, 0)) == want[0]


def damage_for_spark(config: MessageStoreConfig, written: list[Written]) -> dict[int, set[int]]:
    """A flipped body and four bad entries in queue 0: into a record's middle, at another queue's
    record, with a wrong size, across a segment's end. Returns the bad queue offsets per queue."""
    by_offset = {(w.queue_id, w.queue_offset): w for w in written}
    flip_body_byte(config, by_offset[(0, 5)])
    rewrite_entry(config, 0, 10, by_offset[(0, 10)].phy_offset + 17, by_offset[(0, 10)].size)
    rewrite_entry(config, 0, 20, by_offset[(1, 20)].phy_offset, by_offset[(1, 20)].size)
    rewrite_entry(config, 0, 30, by_offset[(0, 30)].phy_offset, by_offset[(0, 30)].size + 8)
    rewrite_entry(config, 0, 40, config.mapped_file_size_commit_log - 100, 300)
    return {0: {5, 10, 20, 30, 40}, 1: set()}


def test_the_spark_source_skips_and_reports_what_a_pull_skips(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    from rmq_mp.spark.source import REPORTER, QueueSlice, read_slice
    from rmq_mp.spark.store_files import resolve_store

    config = store_config(tmp_path / "store")
    written = write_store(config)
    bad = damage_for_spark(config, written)
    ref = resolve_store(config.store_path_root_dir)
    for queue_id in range(QUEUES):
        part = QueueSlice(ref, TOPIC, queue_id, 0, COUNT // QUEUES)
        rows = [
            row
            for batch in read_slice(part, include_properties=True)
            for row in batch.select(["queue_id", "queue_offset", "body"]).to_pylist()
        ]
        assert [(r["queue_id"], r["queue_offset"], r["body"]) for r in rows] == expected(
            written, queue_id, without=bad[queue_id]
        )
    mine = [d for d in REPORTER.findings if d.path.startswith(str(tmp_path))]
    first_log = str(log_file(config, 0))
    first_queue_file = str(cq_file(config, 0, 0))
    victim = next(w for w in written if (w.queue_id, w.queue_offset) == (0, 5))
    assert sorted((d.kind, d.path, d.start, d.end) for d in mine) == [
        ("queue-entry-invalid", first_queue_file, q * 20, q * 20 + 20) for q in (10, 20, 30, 40)
    ] + [("record-crc-failed", first_log, victim.phy_offset, victim.phy_offset + victim.size)]
    reasons = {d.start: d.reason for d in mine}
    assert "body CRC" in reasons[victim.phy_offset]
    assert "no valid record" in reasons[200]
    assert f"the record there is {TOPIC} queue 1 offset 20" in reasons[400]
    assert "outside one commit-log segment" in reasons[800]


def test_a_broken_record_in_an_older_file_ends_that_file_for_a_scan_not_the_scan(tmp_path: Path) -> None:
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim = next(w for w in written if w.queue_id == 1 and w.queue_offset == 9)
    path = log_file(config, victim.phy_offset)
    with path.open("r+b") as f:  # the magic code: no size to step over it by
        f.seek(victim.phy_offset - int(path.name) + 4)
        f.write(b"\0\0\0\0")
    next_file = int(path.name) + config.mapped_file_size_commit_log

    with MessageStore.open(config=config) as store:
        scanned = [m.commit_log_offset for m in store.iter_messages()]
        assert scanned == [w.phy_offset for w in written if not victim.phy_offset <= w.phy_offset < next_file]
        assert findings(store.reporter.findings, "record-invalid") == [
            (str(path), victim.phy_offset, next_file)
        ]
        assert served(drain(store.get_message, 1)) == expected(written, 1, without={9})
        [entry] = [d for d in store.reporter.findings if d.kind == "queue-entry-invalid"]
        assert "unknown magic code" in entry.reason
        with pytest.raises(CorruptRecordError, match="unknown magic code"):
            store.look_message_by_offset(victim.phy_offset)


def damage_in_older_file(
    config: MessageStoreConfig, written: list[Written], at: int, data: bytes
) -> tuple[Written, Written]:
    """``data`` written ``at`` bytes into queue 1's offset-9 record, in a file older than the last
    three (which recovery's scan does not check); that record and the one after it."""
    victim = next(w for w in written if w.queue_id == 1 and w.queue_offset == 9)
    after = next(w for w in written if w.phy_offset > victim.phy_offset)
    path = log_file(config, victim.phy_offset)
    assert int(path.name) < written[-1].phy_offset - 3 * config.mapped_file_size_commit_log, "an older file"
    with path.open("r+b") as f:
        f.seek(victim.phy_offset - int(path.name) + at)
        f.write(data)
    return victim, after


def test_a_queue_rebuilt_from_the_log_goes_past_a_broken_record_in_an_older_file(tmp_path: Path) -> None:
    """Recovery rebuilding a lost ConsumeQueue walks the older files too (which its scan does not
    check): a record there whose magic code is gone is reported and stepped over at the next
    sound record (its magic code and its own PHYSICALOFFSET), not the end of the walk."""
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim, after = damage_in_older_file(config, written, 4, b"\0\0\0\0")  # the magic code
    queue_dir = Path(config.store_path_root_dir) / "consumequeue" / TOPIC / "1"
    for file in queue_dir.iterdir():
        file.unlink()
    queue_dir.rmdir()

    with MessageStore.open(config=config) as store:
        [(where, start, resume)] = findings(store.reporter.findings, "record-invalid")
        assert (where, start, resume) == (str(config.commit_log_dir), victim.phy_offset, after.phy_offset)
        [report] = [d for d in store.reporter.findings if d.kind == "record-invalid"]
        assert "dispatch went past a damaged record" in report.reason
        assert served(drain(store.get_message, 1)) == expected(written, 1, without={9})
        assert served(drain(store.get_message, 0)) == expected(written, 0, without=set())
        seen = len(store.reporter.findings)
    with MessageStore.open(config=config) as store:  # the next start keeps the queue and its hole
        again = [d.kind for d in store.reporter.findings[seen:] if d.path.startswith(str(tmp_path))]
        assert not {"cq-rebuilt", "cq-entries-dropped", "record-invalid"} & set(again), again
        assert served(drain(store.get_message, 1)) == expected(written, 1, without={9})


def test_a_record_whose_queue_id_is_damaged_in_an_older_file_makes_no_queue_when_the_log_is_walked_again(
    tmp_path: Path,
) -> None:
    """A record in an older file whose QUEUEID is damaged (its whole-record CRC fails), and the
    index lost, so recovery walks the log from its start again: the record is stepped over and
    reported, not dispatched to a queue of the damaged id (seed 1435 of
    tests/crash/test_compound_damage: that queue's only entry was found damaged at every later
    start, and the whole log was dispatched again each time)."""
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim, after = damage_in_older_file(config, written, 13, b"\x01")  # QUEUEID's second byte: 1 -> 65537
    shutil.rmtree(Path(config.store_path_root_dir) / "index")

    with MessageStore.open(config=config) as store:
        assert [s.queue_id for s in store.queue_status(TOPIC)] == [0, 1]
        [(where, start, resume)] = findings(store.reporter.findings, "record-invalid")
        assert (where, start, resume) == (str(config.commit_log_dir), victim.phy_offset, after.phy_offset)
        assert served(drain(store.get_message, 1)) == expected(written, 1, without={9})
        assert served(drain(store.get_message, 0)) == expected(written, 0, without=set())
        assert [m.commit_log_offset for m in store.query_message(TOPIC, written[-1].key)] == [
            written[-1].phy_offset
        ]
    with MessageStore.open(config=config) as store:  # the next start dispatches nothing again
        assert store.recovery is not None
        assert store.recovery.records_dispatched == 0, store.recovery
        assert [s.queue_id for s in store.queue_status(TOPIC)] == [0, 1]
        assert served(drain(store.get_message, 1)) == expected(written, 1, without={9})


def test_a_queue_rebuilt_past_its_damaged_first_record_is_not_rebuilt_again(tmp_path: Path) -> None:
    """A lost queue rebuilt from the log whose first record (queue offset 0, in an older file)
    fails its body CRC: the rebuild steps over it (the queue begins at offset 1), and the
    next start's check of queue heads walks the log the same way, so it does not take the
    damaged record for one the queue lacks and rebuild the queue at every start (seed 140 of
    tests/crash/test_compound_damage)."""
    config = store_config(tmp_path / "store")
    written = write_store(config)
    victim = next(w for w in written if w.queue_id == 1 and w.queue_offset == 0)
    flip_body_byte(config, victim)
    shutil.rmtree(Path(config.store_path_root_dir) / "consumequeue" / TOPIC / "1")

    with MessageStore.open(config=config) as store:
        assert [start for _where, start, _resume in findings(store.reporter.findings, "record-invalid")] == [
            victim.phy_offset
        ]
        assert store.get_message(TOPIC, 1, 0, 1).status is GetMessageStatus.OFFSET_TOO_SMALL
        assert served(drain(store.get_message, 1, offset=1)) == expected(written, 1, without={0})
    with MessageStore.open(config=config) as store:
        assert store.recovery is not None
        assert store.recovery.records_dispatched == 0, store.recovery
        assert not {"cq-rebuilt", "cq-entries-dropped"} & {d.kind for d in store.reporter.findings}
        assert served(drain(store.get_message, 1, offset=1)) == expected(written, 1, without={0})
        assert served(drain(store.get_message, 0)) == expected(written, 0, without=set())
