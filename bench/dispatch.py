"""`python -m bench.dispatch`: CommitLog -> ConsumeQueue + index dispatch, records/s of the batch
path (`Dispatcher.dispatch_batch` over `CommitLog.iter_batches`) vs the per-record path
(`Dispatcher.dispatch` over `CommitLog.iter_dispatch`) on the same log, in the same run.

Each workload writes a real CommitLog (records encoded by `record.encode_record`, appended with
`CommitLog.append`), then dispatches all of it into fresh ConsumeQueue and index directories
once record by record and three times in batches (the median is reported), and checks that
every batch run left the per-record run's bytes (the figure is void otherwise). Workloads:
  producer  what `Producer.send_batch` writes: 128 B bodies, 8 queues, UNIQ_KEY only
  keys      the same plus TAGS and two KEYS words
  mixed     RocketMQ-fixture-like variety: 4 topics (one non-ASCII), random tags, 0-3 KEYS,
            UNIQ_KEY on half, extra properties, bodies of 0-2 KiB, 3% transactions
  sync      bench.sync_group's sends: TagA, one KEYS word, UNIQ_KEY, 4 producers over 8 queues

``--pass-records K`` measures reput's small passes instead: the log dispatched K records a
pass, as a batch each and as `RecordRows` (`CommitLog.scan_rows`, `Dispatcher.dispatch_rows`),
alternating, the CPU a pass of every run, files checked against the per-record dispatch's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.consume_queue import ConsumeQueueTable
from rmq_mp.store.dispatch import Dispatcher
from rmq_mp.store.index_service import IndexService
from rmq_mp.store.reporter import Reporter

COMMIT_LOG_FILE_BYTES = 64 << 20
CQ_FILE_BYTES = 6_000_000
HASH_SLOTS = 500_000
INDEX_ENTRIES = 2_000_000
BATCH_RECORDS = 20_000  # reput's MAX_RECORDS_PER_PASS
BATCH_RUNS = 3
"""The batch path runs this many times (median reported; each checked byte for byte against the
per-record run, which runs once: it takes 20x longer)."""
STORE_HOST = ("10.0.0.5", 10911)


def producer_messages(count: int, rng: random.Random) -> Iterator[m.Message]:
    body = rng.randbytes(128)
    uniq = m.UniqueIdGenerator()
    for i in range(count):
        yield m.Message(
            topic="BenchTopic",
            body=body,
            queue_id=i // 100 % 8,  # send_batch: 100 at a time to one queue
            properties={m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq.next_id()},
            born_timestamp=1_790_000_000_000 + i // 1000,
        )


def keyed_messages(count: int, rng: random.Random) -> Iterator[m.Message]:
    for i, msg in enumerate(producer_messages(count, rng)):
        msg.properties[m.PROPERTY_TAGS] = "TagA" if i % 3 else "TagB"
        msg.properties[m.PROPERTY_KEYS] = f"order-{i:08d} user-{i % 9973:05d}"
        yield msg


def mixed_messages(count: int, rng: random.Random) -> Iterator[m.Message]:
    topics = [("OrderTopic", 1), ("Payments", 4), ("t_%RETRY%x_" + "a" * 60, 8), ("主题-τ", 2)]
    words = ["red", "green", "blue", "Zürich", "北京", "São Paulo"]
    uniq = m.UniqueIdGenerator()
    for i in range(count):
        topic, queues = rng.choice(topics)
        props: dict[str, str] = {"CLUSTER": "DefaultCluster"}
        roll = rng.random()
        if roll < 0.3:
            props[m.PROPERTY_TAGS] = rng.choice(["TagA", "TagB", "标签", "café", f"w{rng.randrange(50)}"])
        keys = [f"ORD{rng.randrange(3000)}" for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
        if keys:
            props[m.PROPERTY_KEYS] = " ".join(keys)
        if rng.random() < 0.5:
            props[m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq.next_id()
        if rng.random() < 0.4:
            props["city"] = rng.choice(words)
        if rng.random() < 0.3:
            props["seq"] = str(i)
        tx = rng.random()
        sys_flag = m.TRANSACTION_PREPARED_TYPE if tx < 0.02 else m.TRANSACTION_COMMIT_TYPE if tx < 0.03 else 0
        yield m.Message(
            topic=topic,
            body=rng.randbytes(rng.choice([0, 40, 300, 2000])),
            queue_id=rng.randrange(queues),
            properties=props,
            sys_flag=sys_flag,
            born_timestamp=1_790_000_000_000 + i // 1000,
        )


def sync_messages(count: int, rng: random.Random) -> Iterator[m.Message]:
    """bench.sync_group's sends (`bench.shapes.rocketmq_sends`): TagA, one KEYS word, UNIQ_KEY,
    4 producers each sending to the 8 queues in turn, interleaved."""
    body = rng.randbytes(128)
    uniq = m.UniqueIdGenerator()
    for i in range(count):
        producer, sent = i % 4, i // 4
        yield m.Message(
            topic="BenchTopic",
            body=body,
            queue_id=(sent + producer) & 7,
            properties={
                m.PROPERTY_TAGS: "TagA",
                m.PROPERTY_KEYS: f"key-{sent}",
                m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq.next_id(),
            },
            born_timestamp=1_790_000_000_000 + i // 10,
        )


WORKLOADS: dict[str, Callable[[int, random.Random], Iterator[m.Message]]] = {
    "producer": producer_messages,
    "keys": keyed_messages,
    "mixed": mixed_messages,
    "sync": sync_messages,
}


def write_log(log_dir: Path, messages: Iterator[m.Message]) -> tuple[int, int]:
    """Append every message as the put path does (queue offsets per queue, store time per
    record); returns the number of records and the log's end offset."""
    commit_log = CommitLog(log_dir, COMMIT_LOG_FILE_BYTES, writable=True, reporter=Reporter())
    next_offset: dict[tuple[str, int], int] = {}
    count = 0
    try:
        for msg in messages:
            encoded = record.encode_record(msg, STORE_HOST)
            sys_flag = int.from_bytes(encoded[record.POS_SYS_FLAG : record.POS_SYS_FLAG + 4], "big")
            key = (msg.topic, msg.queue_id)
            queue_offset = next_offset.get(key, 0) if m.is_dispatchable(sys_flag) else 0
            result = commit_log.append(
                encoded, sys_flag=sys_flag, queue_offset=queue_offset, store_timestamp=msg.born_timestamp + 5
            )
            assert result.phy_offset >= 0, result
            if m.is_dispatchable(sys_flag):
                next_offset[key] = queue_offset + 1
            count += 1
        commit_log.flush()
        end = commit_log.mfq.max_wrote_position()
    finally:
        commit_log.close()
    return count, end


@contextlib.contextmanager
def dispatch_target(log_dir: Path, out: Path) -> Iterator[tuple[CommitLog, Dispatcher]]:
    """The log at ``log_dir`` read-only, and a dispatcher into fresh queue and index
    directories under ``out``; all closed after."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    reporter = Reporter()
    commit_log = CommitLog(log_dir, COMMIT_LOG_FILE_BYTES, writable=False, reporter=reporter)
    commit_log.load()
    queues = ConsumeQueueTable(out / "consumequeue", CQ_FILE_BYTES, writable=True, reporter=reporter)
    index = IndexService(out / "index", HASH_SLOTS, INDEX_ENTRIES, writable=True, reporter=reporter)
    try:
        yield commit_log, Dispatcher(queues.find, index, StoreCheckpoint(out / "checkpoint", writable=True))
    finally:
        queues.close()
        index.close()
        commit_log.close()


def dispatch_once(log_dir: Path, end: int, out: Path, *, batch: bool) -> tuple[int, float]:
    """Dispatch the log up to ``end`` into fresh queue and index directories under ``out``;
    returns (records, seconds)."""
    records = 0
    with dispatch_target(log_dir, out) as (commit_log, dispatcher):
        started = time.perf_counter()
        if batch:
            for step in commit_log.iter_batches(
                commit_log.min_offset(), check_crc=False, end_offset=end, batch_records=BATCH_RECORDS
            ):
                dispatcher.dispatch_batch(step.batch)
                records += len(step.batch)
                if step.tail is not None and not step.tail.success:
                    raise AssertionError(f"invalid record at {step.stop}: {step.tail.reason}")
        else:
            for _phy, req in commit_log.iter_dispatch(
                commit_log.min_offset(), check_crc=False, end_offset=end
            ):
                if req.success and req.size > 0:
                    dispatcher.dispatch(req)
                    records += 1
        elapsed = time.perf_counter() - started
    return records, elapsed


def dispatch_passes(
    log_dir: Path, end: int, out: Path, pass_records: int, *, rows: bool
) -> tuple[int, float]:
    """Dispatch the log as reput's passes of ``pass_records`` records: each a batch
    (`iter_batches`, `dispatch_batch`) or, with ``rows``, `CommitLog.scan_rows` and
    `Dispatcher.dispatch_rows` (a batch step where they decline); returns (passes, CPU seconds
    of the passes)."""
    passes = 0
    with dispatch_target(log_dir, out) as (commit_log, dispatcher):
        starts = [phy for phy, _req in commit_log.iter_dispatch(0, check_crc=False, end_offset=end)] + [end]
        started = time.process_time()
        for first in range(0, len(starts) - 1, pass_records):
            offset, stop = starts[first], starts[min(first + pass_records, len(starts) - 1)]
            while offset < stop:
                small = commit_log.scan_rows(offset, stop, pass_records) if rows else None
                if small is not None and dispatcher.dispatch_rows(small) is not None:
                    offset = small.stop
                    continue
                step = next(
                    commit_log.iter_batches(
                        offset, check_crc=False, end_offset=stop, max_records=pass_records
                    )
                )
                dispatcher.dispatch_batch(step.batch)
                offset = step.next_offset
            passes += 1
        elapsed = time.process_time() - started
    return passes, elapsed


def run_passes(workloads: list[str], records: int, pass_records: int, tmp: Path, seed: int = 7) -> None:
    """Batch and row passes alternating, BATCH_RUNS each, every run's CPU a pass printed; each
    run's files checked against the per-record dispatch's."""
    print(f"passes of {pass_records} records, CPU a pass (us), runs alternating batch / rows:")
    for name in workloads:
        log_dir = tmp / name / "commitlog"
        count, end = write_log(log_dir, WORKLOADS[name](records, random.Random(seed)))
        dispatch_once(log_dir, end, tmp / name / "per-record", batch=False)
        reference = tree_digest(tmp / name / "per-record")
        figures: dict[str, list[float]] = {"batch": [], "rows": []}
        for _run in range(BATCH_RUNS):
            for path in figures:
                passes, seconds = dispatch_passes(
                    log_dir, end, tmp / name / path, pass_records, rows=path == "rows"
                )
                if tree_digest(tmp / name / path) != reference:
                    raise AssertionError(
                        f"{name}: {path} passes and per-record dispatch wrote different files"
                    )
                figures[path].append(seconds / passes * 1e6)
        ratios = [b / r for b, r in zip(figures["batch"], figures["rows"], strict=True)]
        print(
            f"{name:<10}{count:>8} records: batch {' '.join(f'{v:.0f}' for v in figures['batch'])}, "
            f"rows {' '.join(f'{v:.0f}' for v in figures['rows'])} us a pass "
            f"(batch / rows {' '.join(f'{v:.2f}' for v in ratios)}); files identical",
            flush=True,
        )
        shutil.rmtree(tmp / name)


def tree_digest(root: Path) -> dict[str, Any]:
    """sha256 of every queue file, and of the index files in name (creation) order."""
    queues = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "consumequeue").rglob("*"))
        if p.is_file()
    }
    index = [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((root / "index").iterdir())]
    return {"queues": queues, "index": index}


def run(workloads: list[str], records: int, tmp: Path, seed: int = 7) -> list[dict[str, Any]]:
    rows = []
    print(
        f"{'workload':<10}{'records':>10}{'per-record/s':>14}{'batch/s':>12}{'ratio':>8}{'batch us/rec':>14}"
    )
    for name in workloads:
        log_dir = tmp / name / "commitlog"
        count, end = write_log(log_dir, WORKLOADS[name](records, random.Random(seed)))
        n_ref, ref_s = dispatch_once(log_dir, end, tmp / name / "per-record", batch=False)
        reference = tree_digest(tmp / name / "per-record")
        shutil.rmtree(tmp / name / "per-record")
        batch_runs = []
        for run_no in range(BATCH_RUNS):
            n_bat, seconds = dispatch_once(log_dir, end, tmp / name / "batch", batch=True)
            assert n_ref == n_bat == count, (n_ref, n_bat, count)
            if tree_digest(tmp / name / "batch") != reference:
                raise AssertionError(
                    f"{name}: batch and per-record dispatch wrote different files ({run_no})"
                )
            batch_runs.append(seconds)
        bat_s = sorted(batch_runs)[len(batch_runs) // 2]
        same = True
        row = {
            "workload": name, "records": count, "per_record_per_s": count / ref_s,
            "batch_per_s": count / bat_s, "ratio": ref_s / bat_s, "batch_us_per_record": bat_s / count * 1e6,
            "batch_runs_s": batch_runs, "identical_files": same,
        }  # fmt: skip
        rows.append(row)
        print(f"{name:<10}{count:>10}{row['per_record_per_s']:>14.0f}{row['batch_per_s']:>12.0f}"
              f"{row['ratio']:>8.1f}{row['batch_us_per_record']:>14.2f}", flush=True)  # fmt: skip
        shutil.rmtree(tmp / name)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dispatch", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="default: all")
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument(
        "--pass-records",
        type=int,
        help="instead: reput's small passes of this many records, batch vs rows (CPU a pass)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-bench-dispatch-") as tmp:
        if args.pass_records:
            run_passes(args.workload or list(WORKLOADS), args.records, args.pass_records, Path(tmp))
        else:
            run(args.workload or list(WORKLOADS), args.records, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
