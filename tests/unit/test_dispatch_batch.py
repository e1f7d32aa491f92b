"""Batch dispatch writes the same ConsumeQueue and index bytes as dispatching one record at a time.

Each test writes a real CommitLog (or takes a RocketMQ 4.9.8 fixture's), dispatches it into
fresh directories twice, with `Dispatcher.dispatch` record by record and with
`Dispatcher.dispatch_batch` over `CommitLog.iter_batches`, and compares every queue file and every
index file byte for byte (index files in creation order: their names are wall-clock times). Every test runs with the
compiled scan and index writes (rmq_mp/format/_scan.c, rmq_mp/store/_index.c) and with numpy
alone."""

from __future__ import annotations

import hashlib
import random
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.errors import ConfigError
from rmq_mp.format import message as m
from rmq_mp.format import native, record
from rmq_mp.format.queue_entry import PRE_BLANK_SIZE
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.consume_queue import ConsumeQueueTable
from rmq_mp.store.dispatch import INDEX_KEY, Dispatcher
from rmq_mp.store.index_file import IndexFile
from rmq_mp.store.index_service import IndexService
from rmq_mp.store.reporter import Reporter
from tests.conftest import FIXTURE_SETTINGS
from tests.store_content import make_messages

STORE_HOST = ("10.0.0.5", 10911)


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def compiled_parts(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with the compiled scan and index writes, then with numpy alone."""
    parts = (native.scan, native.index)
    saved = [part.active for part in parts]
    for part in parts:
        if request.param == "compiled" and part.built is None:
            pytest.skip(f"not built: {part.why_not_built}")
        part.active = part.built if request.param == "compiled" else None
    try:
        yield request.param
    finally:
        for part, active in zip(parts, saved, strict=True):
            part.active = active


@dataclass(frozen=True)
class Sizes:
    commit_log: int = 64 * 1024
    queue: int = 20 * 100
    hash_slots: int = 64
    index_entries: int = 200


FIXTURE_SIZES = Sizes(
    FIXTURE_SETTINGS["mapped_file_size_commit_log"],
    FIXTURE_SETTINGS["mapped_file_size_consume_queue"],
    FIXTURE_SETTINGS["max_hash_slot_num"],
    FIXTURE_SETTINGS["max_index_num"],
)


def store_timestamp(i: int) -> int:
    """Store time of record i: seconds apart now and then, so index time diffs are not all 0."""
    return 1_795_345_092_000 + i * 7 + (i // 5) * 1_300


def write_log(log_dir: Path, messages: list[m.Message], sizes: Sizes) -> int:
    """Append the messages as the put path does; returns the log's end offset."""
    commit_log = CommitLog(log_dir, sizes.commit_log, writable=True, reporter=Reporter())
    next_offset: dict[tuple[str, int], int] = {}
    try:
        for i, msg in enumerate(messages):
            encoded = record.encode_record(msg, msg.store_host or STORE_HOST)
            (sys_flag,) = struct.unpack_from(">i", encoded, record.POS_SYS_FLAG)
            key = (msg.topic, msg.queue_id)
            queue_offset = next_offset.get(key, 0) if m.is_dispatchable(sys_flag) else 0
            result = commit_log.append(
                encoded,
                sys_flag=sys_flag,
                queue_offset=queue_offset,
                store_timestamp=store_timestamp(i),
            )
            assert result.phy_offset >= 0
            if m.is_dispatchable(sys_flag):
                next_offset[key] = queue_offset + 1
        return commit_log.mfq.max_wrote_position()
    finally:
        commit_log.close()


class Target:
    """Fresh queue and index directories, dispatched into by one path."""

    def __init__(self, root: Path, log_dir: Path, sizes: Sizes, end: int) -> None:
        self.root = root
        self.end = end
        reporter = Reporter()
        self.commit_log = CommitLog(log_dir, sizes.commit_log, writable=False, reporter=reporter)
        self.commit_log.load()
        self.queues = ConsumeQueueTable(root / "consumequeue", sizes.queue, writable=True, reporter=reporter)
        self.index = IndexService(
            root / "index", sizes.hash_slots, sizes.index_entries, writable=True, reporter=reporter
        )
        self.checkpoint = StoreCheckpoint(root / "checkpoint", writable=True)
        self.dispatcher = Dispatcher(self.queues.find, self.index, self.checkpoint)
        self.row_records = 0
        """Records `rows` dispatched as `RecordRows` (the rest: in batch steps)."""

    def per_record(self, start: int = 0, end: int | None = None) -> int:
        count = 0
        for _phy, req in self.commit_log.iter_dispatch(start, check_crc=False, end_offset=end or self.end):
            if req.success and req.size > 0:
                self.dispatcher.dispatch(req)
                count += 1
        return count

    def batches(self, start: int = 0, end: int | None = None, batch_records: int = 65536) -> int:
        count = 0
        for step in self.commit_log.iter_batches(
            start, check_crc=False, end_offset=end or self.end, batch_records=batch_records
        ):
            self.dispatcher.dispatch_batch(step.batch)
            count += len(step.batch)
        return count

    def rows(self, start: int = 0, end: int | None = None, pass_records: int = 12) -> int:
        """As reput's small passes: `CommitLog.scan_rows` and `Dispatcher.dispatch_rows` a few
        records at a time, one `iter_batches` step where those decline (a file's end, anything
        the compiled scan hands back, numpy alone)."""
        end = end or self.end
        count, offset = 0, start
        while offset < end:
            rows = self.commit_log.scan_rows(offset, end, pass_records)
            if rows is not None and self.dispatcher.dispatch_rows(rows) is not None:
                self.row_records += len(rows)
                count += len(rows)
                offset = rows.stop
                continue
            step = next(
                self.commit_log.iter_batches(
                    offset, check_crc=False, end_offset=end, max_records=pass_records
                ),
                None,
            )
            if step is None or step.next_offset <= offset:
                break
            self.dispatcher.dispatch_batch(step.batch)
            count += len(step.batch)
            offset = step.next_offset
        return count

    def close(self) -> dict[str, object]:
        """Close everything; returns the digest of what was written."""
        logics = self.checkpoint.logics_msg_timestamp
        self.queues.close()
        self.index.close()
        self.commit_log.close()
        return {**digest(self.root), "logics_msg_timestamp": logics}


def digest(root: Path) -> dict[str, object]:
    queues = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "consumequeue").rglob("*"))
        if p.is_file()
    }
    index_dir = root / "index"
    index = (
        [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(index_dir.iterdir())]
        if index_dir.is_dir()
        else []
    )
    return {"queues": queues, "index": index}


def both_ways(
    tmp: Path, log_dir: Path, sizes: Sizes, end: int, batch_records: int = 65536, rows_expected: bool = False
) -> dict[str, object]:
    """Per record, in batches, and as reput's small passes (`Target.rows`): the same bytes.
    ``rows_expected``: most records went as `RecordRows` (with the compiled scan)."""
    one = Target(tmp / "per-record", log_dir, sizes, end)
    counted = one.per_record()
    expected = one.close()
    other = Target(tmp / "batch", log_dir, sizes, end)
    assert other.batches(batch_records=batch_records) == counted
    got = other.close()
    assert got == expected
    small = Target(tmp / "rows", log_dir, sizes, end)
    assert small.rows(pass_records=min(batch_records, 64)) == counted
    if native.scan.active is None:
        assert small.row_records == 0
    elif rows_expected:  # the compiled scan reads most records itself
        assert small.row_records > counted // 2
    assert small.close() == expected
    return got


def producer_messages(count: int) -> list[m.Message]:
    """What `Producer.send_batch` writes: one topic, UNIQ_KEY only, runs of 100 per queue."""
    gen = m.UniqueIdGenerator()
    return [
        m.Message(
            topic="BenchTopic",
            body=bytes(128),
            queue_id=i // 100 % 8,
            properties={m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: gen.next_id()},
        )
        for i in range(count)
    ]


def keyed_messages(count: int, seed: int) -> list[m.Message]:
    """ASCII properties with TAGS and several KEYS words (double spaces too), no UNIQ_KEY on some,
    transactions of every kind, and delayed messages to SCHEDULE_TOPIC_XXXX."""
    rnd = random.Random(seed)
    messages = []
    for i in range(count):
        props = {"TAGS": rnd.choice(["TagA", "TagB", "t"])}
        words = [f"ORD{rnd.randrange(40)}" for _ in range(rnd.randint(0, 4))]
        if words:
            props["KEYS"] = rnd.choice([" ", "  "]).join(words)
        if rnd.random() < 0.7:
            props["UNIQ_KEY"] = f"0A000001{i:024X}"
        topic, queue_id = rnd.choice([("Orders", rnd.randrange(3)), ("Pay", 0), ("Orders", 1)])
        if rnd.random() < 0.05:
            topic, queue_id = m.SCHEDULE_TOPIC, 2
            props["DELAY"] = str(rnd.randint(1, 20))
        sys_flag = rnd.choice(
            [0] * 10 + [m.TRANSACTION_PREPARED_TYPE, m.TRANSACTION_COMMIT_TYPE, m.TRANSACTION_ROLLBACK_TYPE]
        )
        messages.append(
            m.Message(
                topic=topic,
                body=rnd.randbytes(rnd.randint(0, 200)),
                queue_id=queue_id,
                properties=props,
                sys_flag=sys_flag,
            )
        )
    return messages


# ------------------------------------------------------------------------------ fixtures


@pytest.mark.parametrize("store", ["clean-store", "crashed-store"])
@pytest.mark.parametrize("batch_records", [7, 65536])
def test_rocketmq_fixture_logs(
    rocketmq_fixtures: Path, tmp_path: Path, store: str, batch_records: int
) -> None:
    log_dir = rocketmq_fixtures / store / "commitlog"
    files = sorted(log_dir.iterdir())
    data_end = int(files[-1].name) + len(files[-1].read_bytes().rstrip(b"\0"))
    got = both_ways(tmp_path, log_dir, FIXTURE_SIZES, data_end, batch_records)
    assert len(got["index"]) > 1  # type: ignore[arg-type]


def test_clean_store_batch_dispatch_rebuilds_rocketmq_files(rocketmq_fixtures: Path, tmp_path: Path) -> None:
    """Dispatching the clean fixture's log from scratch gives RocketMQ's own queue and index files."""
    source = rocketmq_fixtures / "clean-store"
    target = Target(tmp_path / "rebuilt", source / "commitlog", FIXTURE_SIZES, 8_356_744)
    assert target.batches() == 12_000
    assert target.close()["queues"] == digest(source)["queues"]
    assert digest(tmp_path / "rebuilt")["index"] == digest(source)["index"]


# ------------------------------------------------------------------------------ generated logs


@pytest.mark.parametrize(
    ("workload", "batch_records"),
    [
        ("producer", 65536),
        ("producer", 333),
        ("keyed", 65536),
        ("keyed", 50),
        ("fixture-like", 65536),
        ("fixture-like", 1),
    ],
)
def test_generated_logs(tmp_path: Path, workload: str, batch_records: int) -> None:
    """Small files: the log, the queues and the index all roll, mid-batch."""
    messages = {
        "producer": lambda: producer_messages(3000),
        "keyed": lambda: keyed_messages(2000, 3),
        "fixture-like": lambda: make_messages(1500, 11),
    }[workload]()
    sizes = Sizes()
    end = write_log(tmp_path / "commitlog", messages, sizes)
    got = both_ways(tmp_path, tmp_path / "commitlog", sizes, end, batch_records, workload != "fixture-like")
    assert len(list((tmp_path / "commitlog").iterdir())) > 3
    assert len(got["index"]) > 3  # type: ignore[arg-type]
    assert max(len(list(p.iterdir())) for p in (tmp_path / "batch" / "consumequeue").glob("*/*")) > 1


MESSAGE = st.builds(
    lambda topic, queue_id, tags, keys, uniq, extra, body, tx, v6: m.Message(
        topic=topic,
        queue_id=queue_id,
        body=body,
        sys_flag=tx,
        properties={
            k: v
            for k, v in {
                "TAGS": tags,
                "KEYS": keys,
                "UNIQ_KEY": uniq,
                "x": extra,
                **({"DELAY": "2"} if topic == m.SCHEDULE_TOPIC else {}),
            }.items()
            if v
        },
        born_host=("2001:db8::1", 1) if v6 else ("10.0.0.1", 1),
    ),
    st.sampled_from(["T", "Topic-2", "主题-τ", m.SCHEDULE_TOPIC]),
    st.integers(0, 2),
    st.sampled_from(["", "TagA", "标签", "tag-😀"]),
    st.lists(st.sampled_from(["k1", "k2", "", "订单", "long-key-" * 3]), max_size=4).map(" ".join),
    st.sampled_from(["", "U1", "0A0000010000000000000000000000FF"]),
    st.sampled_from(["", "v", "Zürich"]),
    st.binary(max_size=300),
    st.sampled_from(
        [0, 0, 0, m.TRANSACTION_PREPARED_TYPE, m.TRANSACTION_COMMIT_TYPE, m.TRANSACTION_ROLLBACK_TYPE]
    ),
    st.booleans(),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(MESSAGE, min_size=1, max_size=20), st.integers(1, 60), st.integers(1, 500))
def test_any_messages(
    tmp_path_factory: pytest.TempPathFactory, template: list[m.Message], repeat: int, batch_records: int
) -> None:
    tmp = tmp_path_factory.mktemp("any")
    messages = [template[i % len(template)] for i in range(repeat * len(template))]
    sizes = Sizes(commit_log=16 * 1024, queue=20 * 20, hash_slots=16, index_entries=30)
    end = write_log(tmp / "commitlog", messages, sizes)
    both_ways(tmp, tmp / "commitlog", sizes, end, batch_records)
    shutil.rmtree(tmp)


def test_a_small_pass_whose_only_keys_are_rollback_records_makes_no_index_file(tmp_path: Path) -> None:
    """Found by test_any_messages: a small pass (rows) with keys only on ROLLBACK records made an
    empty index file where per record and in batches none is made (they are not indexed)."""
    keyed = m.Message(topic="T", body=b"", properties={"KEYS": "k1"}, sys_flag=m.TRANSACTION_ROLLBACK_TYPE)
    messages = [m.Message(topic="T", body=b""), m.Message(topic="T", body=b""), keyed]
    sizes = Sizes(commit_log=16 * 1024, queue=20 * 20, hash_slots=16, index_entries=30)
    end = write_log(tmp_path / "commitlog", messages, sizes)
    assert both_ways(tmp_path, tmp_path / "commitlog", sizes, end, 1)["index"] == []


# ------------------------------------------------------------------------------ re-dispatch


def test_redispatch_over_a_dispatched_range_changes_nothing(tmp_path: Path) -> None:
    """Recovery and a restarted reput replay ranges already dispatched; both paths skip them
    the same way, whether the replay starts on a file boundary or mid-file."""
    sizes = Sizes()
    end = write_log(tmp_path / "commitlog", keyed_messages(1500, 8), sizes)
    middle = 3 * sizes.commit_log
    ranges = [(0, middle + 5000), (0, None), (middle, None), (0, None)]
    results = []
    for name in ("per-record", "batch", "rows"):
        target = Target(tmp_path / name, tmp_path / "commitlog", sizes, end)
        for start, stop in ranges:
            if name == "per-record":
                target.per_record(start, stop)
            elif name == "batch":
                target.batches(start, stop, batch_records=97)
            else:
                target.rows(start, stop, pass_records=13)
        results.append(target.close())
    assert results[0] == results[1] == results[2]
    once = Target(tmp_path / "once", tmp_path / "commitlog", sizes, end)
    once.batches()
    assert once.close() == results[1]


def test_queues_first_written_above_offset_zero_are_prefilled(tmp_path: Path) -> None:
    """Dispatch starting in the middle of the log: each queue's first file gets pre-blank
    entries up to its first queue offset (`fillPreBlank`), on both paths."""
    sizes = Sizes()
    end = write_log(tmp_path / "commitlog", producer_messages(2500), sizes)
    start = 2 * sizes.commit_log
    results = []
    for name in ("per-record", "batch", "rows"):
        target = Target(tmp_path / name, tmp_path / "commitlog", sizes, end)
        {"per-record": target.per_record, "batch": target.batches, "rows": target.rows}[name](start)
        results.append(target.close())
    assert results[0] == results[1] == results[2]
    first_entries = [
        struct.unpack(">qiq", sorted(queue.iterdir())[0].read_bytes()[:20])
        for queue in (tmp_path / "batch" / "consumequeue" / "BenchTopic").iterdir()
    ]
    assert (0, PRE_BLANK_SIZE, 0) in first_entries


def test_record_partly_indexed_before_a_crash_gets_only_its_missing_keys(tmp_path: Path) -> None:
    """Keys of one record were being put when the process died: the index's end is that record.
    Both paths add only the keys not there yet (RocketMQ would add them all twice)."""
    sizes = Sizes(index_entries=1000)
    messages = keyed_messages(300, 5)
    messages[150].properties.update(KEYS="a b c", UNIQ_KEY="U150")
    messages[150].sys_flag = 0
    end = write_log(tmp_path / "commitlog", messages, sizes)
    results = []
    for name in ("per-record", "batch", "rows"):
        target = Target(tmp_path / name, tmp_path / "commitlog", sizes, end)
        reqs = [
            req
            for _phy, req in target.commit_log.iter_dispatch(0, check_crc=False, end_offset=end)
            if req.success and req.size
        ]
        victim = next(req for req in reqs if req.uniq_key == "U150")
        for req in reqs:
            if req is victim:
                break
            target.dispatcher.dispatch(req)
        index_file = target.index.last_file()
        assert index_file.put_key(f"{victim.topic}#U150", victim.phy_offset, victim.store_timestamp)
        assert index_file.put_key(f"{victim.topic}#a", victim.phy_offset, victim.store_timestamp)
        {"per-record": target.per_record, "batch": target.batches, "rows": target.rows}[name](
            victim.phy_offset
        )
        keys = [
            k for f in target.index.files for k in f.select_phy_offsets(f"{victim.topic}#b", 10, 0, 1 << 62)
        ]
        assert keys == [victim.phy_offset]
        assert [
            k for f in target.index.files for k in f.select_phy_offsets(f"{victim.topic}#a", 10, 0, 1 << 62)
        ].count(victim.phy_offset) == 1
        results.append(target.close())
    assert results[0] == results[1] == results[2]


def test_put_hashes_matches_put_hash_with_a_stray_slot(tmp_path: Path) -> None:
    """A slot pointing past the entry count (a torn put) changes how later puts link: the block
    put then goes one key at a time, and both give the same bytes."""
    rnd = random.Random(9)
    hashes = np.array([rnd.randrange(2**31) for _ in range(120)], dtype=np.int64)
    phys = np.arange(120, dtype=np.int64) * 100
    stamps = 1_795_345_092_000 + np.arange(120, dtype=np.int64) * 700
    files = []
    for name, block in (("one", False), ("block", True)):
        path = tmp_path / name
        index = IndexFile(path, 16, 100, writable=True, reporter=Reporter(), create=True)
        index.put_hashes(hashes[:10], phys[:10], stamps[:10])
        assert index._mm is not None
        slot = int(hashes[10]) % 16
        index._mm[40 + slot * 4 : 44 + slot * 4] = struct.pack(">i", index.index_count + 3)  # stray
        if block:
            assert index.put_hashes(hashes[10:], phys[10:], stamps[10:]) == 89
        else:
            for h, p, t in zip(
                hashes[10:99].tolist(), phys[10:99].tolist(), stamps[10:99].tolist(), strict=True
            ):
                assert index.put_hash(h, p, t)
            assert not index.put_hash(int(hashes[99]), int(phys[99]), int(stamps[99]))
        index.close()
        files.append(path.read_bytes())
    assert files[0] == files[1]


def test_put_hash_rows_matches_put_hashes(tmp_path: Path) -> None:
    """Reput's small passes put keys as Python ints: the same bytes as the numpy block put, in
    chunks of any size, with store times before the file's begin (clipped to 0), far after it
    (clipped to INT_MAX seconds), and a file that fills mid-chunk."""
    rnd = random.Random(5)
    count = 150
    hashes = [rnd.randrange(2**31) for _ in range(count)]
    phys = [i * 100 for i in range(count)]
    base = 1_795_345_092_000
    stamps = [
        base + rnd.choice([-5_000, 0, 999, 1_000, 1_001, 7_777, 3_000_000_000_000]) for _ in range(count)
    ]
    files: list[bytes] = []
    taken: list[int] = []
    for name in ("block", "rows"):
        path = tmp_path / name
        index = IndexFile(path, 16, 100, writable=True, reporter=Reporter(), create=True)
        done = 0
        while done < count:
            step = rnd.randint(1, 13) if name == "rows" else 7
            if name == "rows":
                n = index.put_hash_rows(
                    hashes[done : done + step], phys[done : done + step], stamps[done : done + step]
                )
            else:
                n = index.put_hashes(
                    np.array(hashes[done : done + step], dtype=np.int64),
                    np.array(phys[done : done + step], dtype=np.int64),
                    np.array(stamps[done : done + step], dtype=np.int64),
                )
            if n == 0:
                break
            done += n
        taken.append(done)
        index.close()
        files.append(path.read_bytes())
    assert taken == [99, 99]  # the file holds 99 keys (entry 0 is never used)
    assert files[0] == files[1]


# ------------------------------------------------------------------------------ isolation


@pytest.mark.parametrize("path", ["per-record", "batches", "rows"])
@pytest.mark.parametrize("target", ["queue", "index"])
def test_isolating_dispatch_quarantines_what_fails_and_catches_it_up(
    tmp_path: Path, path: str, target: str
) -> None:
    """A file where a queue's directory (or the index's) must go: with ``isolate`` the other
    queues and the index get the same bytes as an undisturbed dispatch, the fault names the
    first record missed, and a re-dispatch from there once the file is gone completes it."""
    log_dir = tmp_path / "log"
    end = write_log(log_dir, keyed_messages(600, seed=3), Sizes())
    reference = Target(tmp_path / "reference", log_dir, Sizes(), end)
    reference.batches()
    expected = reference.close()

    faulty = Target(tmp_path / "faulty", log_dir, Sizes(), end)
    faulty.dispatcher.isolate = True
    blocker = faulty.root / "consumequeue" / "Orders" / "1" if target == "queue" else faulty.root / "index"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("in the way")
    assert {"per-record": faulty.per_record, "batches": faulty.batches, "rows": faulty.rows}[path]() > 0
    faults = faulty.dispatcher.take_faults()
    key = ("Orders", 1) if target == "queue" else INDEX_KEY
    assert [(f.key, type(f.error)) for f in faults] == [(key, FileExistsError)]
    assert faulty.dispatcher.quarantined == {key}
    snapshot = digest(faulty.root)
    if target == "queue":
        assert snapshot["index"] == expected["index"]

        def others(queues: object) -> dict[str, str]:
            assert isinstance(queues, dict)
            return {k: v for k, v in queues.items() if not k.startswith("consumequeue/Orders/1")}

        assert others(snapshot["queues"]) == others(expected["queues"])
        first = next(
            phy
            for phy, req in faulty.commit_log.iter_dispatch(0, check_crc=False, end_offset=end)
            if (req.topic, req.queue_id) == key and m.is_dispatchable(req.sys_flag)
        )
    else:
        assert snapshot["queues"] == expected["queues"]
        assert snapshot["index"] == []
        first = 0
    assert faults[0].phy_offset <= first

    blocker.unlink()
    for step in faulty.commit_log.iter_batches(faults[0].phy_offset, check_crc=False, end_offset=end):
        if target == "queue":
            faulty.dispatcher.dispatch_queue(step.batch, *key)
        else:
            faulty.index.build_index_batch(step.batch)
    faulty.dispatcher.quarantined.discard(key)
    assert faulty.close() == expected


def test_dispatch_raises_without_isolate(tmp_path: Path) -> None:
    """Recovery's mode: the queue's error stops dispatch there."""
    log_dir = tmp_path / "log"
    end = write_log(log_dir, keyed_messages(50, seed=4), Sizes())
    target = Target(tmp_path / "t", log_dir, Sizes(), end)
    (target.root / "index").parent.mkdir(parents=True, exist_ok=True)
    (target.root / "index").write_text("in the way")
    with pytest.raises(FileExistsError):
        target.batches()
    assert target.dispatcher.faults == []
    assert target.dispatcher.quarantined == set()
    target.close()


def test_max_index_num_1_is_a_config_error_and_leaves_no_file(tmp_path: Path) -> None:
    index = IndexService(tmp_path / "index", 16, 1, writable=True, reporter=Reporter())
    with pytest.raises(ConfigError, match="maxIndexNum=1 leaves an index file no room"):
        index.build_index_hashes(100, store_timestamp(0), [1, 2])
    assert not (tmp_path / "index").exists()
    assert index.files == []
