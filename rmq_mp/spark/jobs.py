"""`rmq-spark`: segment-parallel jobs over a store, one Spark task per CommitLog segment.

    rmq-spark audit         --store DIR                      CRC, record chain, PHYSICALOFFSET per segment
    rmq-spark rebuild-index --store DIR --target DIR         ConsumeQueue + IndexFile rebuilt, then compared
    rmq-spark export        --store DIR --target DIR [--topic T ...]   Parquet, topic=/queue_id= partitions
    rmq-spark stats         --store DIR [--topic T ...] [--top N]      per queue counts, bytes, times; top keys

Common options: ``--conf FILE`` / ``--set key=value`` for the settings that shape the files (as
`rmq-admin`), ``--master`` (default ``local[*]``), ``--json`` (one JSON report on stdout).
A running store (directory or shm name) is read up to its readable end when the job starts
(`running_readable_end`); export and stats on a stopped slave stop where its log is not
confirmed as its master's (`ha_log.stopped_read_end`). Progress (tasks done / total) goes to stderr while the job runs. Exit status: 0 when the job
found nothing wrong, 1 when `audit` or `rebuild-index` found a problem, 2 for a usage or store
error (one line, as `rmq-admin`; a bad store, ``--topic`` or ``--target`` before Spark starts).
The report is printed when the job ends; a closed pipe (``| head -1``) ends it quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO, TypeVar

from rmq_mp import file_modes
from rmq_mp.config.store_config import MessageStoreConfig, parse_properties
from rmq_mp.errors import StoreError
from rmq_mp.format import record
from rmq_mp.spark.segments import (
    QueueStats,
    Segment,
    SegmentAudit,
    audit_segment,
    export_segment,
    list_segments,
    rebuild_segment,
    stats_segment,
)
from rmq_mp.store import ha_log
from rmq_mp.store.index_service import IndexService, index_keys
from rmq_mp.store.reporter import Reporter

T = TypeVar("T")


def store_config(store: str, conf: str | None, settings: list[str]) -> MessageStoreConfig:
    """The store's settings: a running store's from shared memory, else ``--conf``/``--set``."""
    from rmq_mp.store.running_store import resolve_names
    from shm.store_shm import read_descriptor

    if not store.strip():
        raise StoreError("--store is empty: name a store directory or a running store's shm name")
    properties: dict[str, str] = {}
    root = store
    try:
        descriptor = read_descriptor(resolve_names(store))
        properties.update(descriptor["properties"])
        root = str(descriptor["root"])
    except StoreError:
        if not Path(store).is_dir():
            raise StoreError("no such store directory, and no running store has that shm name") from None
    if conf:
        properties.update(parse_properties(Path(conf).read_text(encoding="utf-8-sig"), source=conf))
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise StoreError(f"--set takes key=value, got {item!r}")
        properties[key.strip()] = value.strip()
    properties["storePathRootDir"] = root
    config = MessageStoreConfig.from_properties(properties, source=conf or "--set")
    if not config.commit_log_dir.is_dir():
        raise StoreError(f"{root}: not a store directory (no {config.commit_log_dir.name}/)")
    return config


def running_readable_end(store: str) -> int | None:
    """A running store's readable end (`RunningStore.readable_end`: what its readers may see),
    read once when a job starts; None for a store that is not running. The jobs stop there: the
    rest of the file being written and the files allocated ahead hold no records yet."""
    from rmq_mp.store.running_store import RunningStore
    from shm.layout import Role

    try:
        running = RunningStore.attach(store, Role.CONSUMER)
    except StoreError:
        return None
    try:
        return running.readable_end()
    finally:
        running.close()


def run_with_progress(spark: Any, label: str, action: Callable[[], T], *, out: TextIO | None) -> T:
    """Run ``action`` (which starts Spark jobs) in a thread tagged with a job group, printing
    completed/total tasks of that group to ``out`` as they change."""
    sc = spark.sparkContext
    group = f"rmq-spark-{label}-{uuid.uuid4().hex[:8]}"
    box: dict[str, Any] = {}

    def target() -> None:
        sc.setJobGroup(group, label)
        try:
            box["value"] = action()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=target, name=group)
    started = time.monotonic()
    worker.start()
    last = (-1, -1)
    while worker.is_alive():
        worker.join(0.5)
        if out is None:
            continue
        tracker = sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        if total and (done, total) != last:
            print(f"{label}: {done}/{total} tasks, {time.monotonic() - started:.1f} s", file=out, flush=True)
            last = (done, total)
    if "error" in box:
        raise box["error"]
    if out is not None:
        print(f"{label}: done in {time.monotonic() - started:.1f} s", file=out, flush=True)
    result: T = box["value"]
    return result


def _map_segments(spark: Any, segments: list[Segment], fn: Callable[[Segment], T]) -> list[T]:
    """One task per segment; results in segment order."""
    if not segments:
        return []
    return list(spark.sparkContext.parallelize(segments, len(segments)).map(fn).collect())


# ------------------------------------------------------------------------------------- audit


def audit(
    spark: Any, config: MessageStoreConfig, *, readable_end: int | None = None, out: TextIO | None = None
) -> list[SegmentAudit]:
    segments = list_segments(config.commit_log_dir, readable_end)
    return run_with_progress(spark, "audit", lambda: _map_segments(spark, segments, audit_segment), out=out)


# ------------------------------------------------------------------------------------- rebuild-index


def rebuild_index(
    spark: Any,
    config: MessageStoreConfig,
    target: Path,
    *,
    readable_end: int | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Rebuild ConsumeQueues (in the tasks) and IndexFiles (one writer, commit-log order) under
    ``target``, then compare them with the store's own (of a running store: as far as its
    readable end when the job started; what it writes meanwhile shows as a difference)."""
    if target.exists() and any(target.iterdir()):
        raise StoreError(f"--target {target} is not empty")
    target.mkdir(parents=True, exist_ok=True)
    segments = list_segments(config.commit_log_dir, readable_end)
    cq_size = config.mapped_file_size_consume_queue
    delay = list(record.parse_delay_levels(config.message_delay_level))
    root = str(target)
    parts = run_with_progress(
        spark,
        "rebuild-index",
        lambda: _map_segments(spark, segments, lambda seg: rebuild_segment(seg, root, cq_size, delay)),
        out=out,
    )
    index = IndexService(
        target / "index", config.max_hash_slot_num, config.max_index_num, writable=True, reporter=Reporter()
    )
    indexed = [r for part in parts for r in part.index_records]
    try:
        for phy, store_ts, sys_flag, topic, keys, uniq in indexed:
            index.build_index(
                record.DispatchRequest(
                    size=1, success=True, topic=topic, phy_offset=phy, store_timestamp=store_ts,
                    keys=keys, uniq_key=uniq, sys_flag=sys_flag,
                )
            )  # fmt: skip
        index.flush()
        keys_total, keys_missing = _check_keys(index, indexed)
    finally:
        index.close()
    report: dict[str, Any] = {
        "segments": len(segments),
        "cq_entries": sum(p.cq_entries for p in parts),
        "errors": [e for p in parts for e in p.audit.errors],
        "keys_total": keys_total,
        "keys_missing": keys_missing,
        **_compare_tree(Path(config.store_path_root_dir) / "consumequeue", target / "consumequeue", "cq"),
        **_compare_index(Path(config.store_path_root_dir) / "index", target / "index"),
    }
    return report


def rebuild_ok(report: dict[str, Any]) -> bool:
    """Whether `rebuild-index` exits 0: no damage met, every key found, every ConsumeQueue file
    of the store rebuilt byte for byte."""
    return not (report["errors"] or report["keys_missing"] or report["cq_differ"] or report["cq_missing"])


def _check_keys(
    index: IndexService, indexed: list[tuple[int, int, int, str, str, str | None]]
) -> tuple[int, list[str]]:
    """Every key of every indexed record is found through the rebuilt index, at its offset."""
    total = 0
    missing: list[str] = []
    for phy, store_ts, _sys, topic, keys, uniq in indexed:
        req = record.DispatchRequest(size=1, success=True, topic=topic, keys=keys, uniq_key=uniq)
        for key in index_keys(req):
            total += 1
            found = [
                p
                for f in index.files
                if f.is_time_matched(store_ts - 1000, store_ts + 1000)
                for p in f.select_phy_offsets(key, 1 << 30, store_ts - 1000, store_ts + 1000)
            ]
            if phy not in found:
                missing.append(f"{key}@{phy}")
    return total, missing


def _compare_tree(ours: Path, rebuilt: Path, prefix: str) -> dict[str, Any]:
    mine = {p.relative_to(ours): p for p in ours.rglob("*") if p.is_file()} if ours.is_dir() else {}
    theirs = (
        {p.relative_to(rebuilt): p for p in rebuilt.rglob("*") if p.is_file()} if rebuilt.is_dir() else {}
    )
    differ = sorted(
        str(k) for k in mine.keys() & theirs.keys() if mine[k].read_bytes() != theirs[k].read_bytes()
    )
    return {
        f"{prefix}_files": len(mine),
        f"{prefix}_identical": len(mine.keys() & theirs.keys()) - len(differ),
        f"{prefix}_differ": differ,
        f"{prefix}_missing": sorted(str(k) for k in mine.keys() - theirs.keys()),
        f"{prefix}_extra": sorted(str(k) for k in theirs.keys() - mine.keys()),
    }


def _compare_index(ours: Path, rebuilt: Path) -> dict[str, Any]:
    """Index files are named by creation time, so they are compared in order, by content."""
    mine = sorted(p for p in ours.iterdir() if p.name.isdigit()) if ours.is_dir() else []
    theirs = sorted(p for p in rebuilt.iterdir() if p.name.isdigit()) if rebuilt.is_dir() else []
    identical = sum(a.read_bytes() == b.read_bytes() for a, b in zip(mine, theirs, strict=False))
    return {"index_files": len(mine), "index_rebuilt_files": len(theirs), "index_identical": identical}


# ------------------------------------------------------------------------------------- export


def export(
    spark: Any,
    config: MessageStoreConfig,
    target: Path,
    topics: frozenset[str] | None,
    *,
    readable_end: int | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Dispatched messages of ``topics`` (all when None) to Parquet under ``target``, partitioned
    by topic and queue (Hive layout: ``spark.read.parquet(target)`` gets both columns back)."""
    if target.exists() and any(target.iterdir()):
        raise StoreError(f"--target {target} is not empty")
    target.mkdir(parents=True, exist_ok=True)
    segments = list_segments(config.commit_log_dir, readable_end)
    dest = str(target)
    broker = str(Path(config.store_path_root_dir).resolve())
    started = time.monotonic()
    parts = run_with_progress(
        spark,
        "export",
        lambda: _map_segments(spark, segments, lambda seg: export_segment(seg, topics, dest, broker)),
        out=out,
    )
    seconds = time.monotonic() - started
    (target / "_SUCCESS").touch()
    log_bytes = sum(p.audit.record_bytes for p in parts)
    return {
        "segments": len(segments),
        "rows": sum(p.rows for p in parts),
        "files": sum(len(p.files) for p in parts),
        "parquet_bytes": sum(p.bytes_written for p in parts),
        "commit_log_bytes": log_bytes,
        "seconds": seconds,
        "mb_per_s": log_bytes / 1e6 / seconds if seconds > 0 else 0.0,
        "errors": [e for p in parts for e in p.audit.errors],
    }


# ------------------------------------------------------------------------------------- stats


def stats(
    spark: Any,
    config: MessageStoreConfig,
    topics: frozenset[str] | None,
    top: int,
    *,
    readable_end: int | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    segments = list_segments(config.commit_log_dir, readable_end)
    parts = run_with_progress(
        spark,
        "stats",
        lambda: _map_segments(spark, segments, lambda seg: stats_segment(seg, topics)),
        out=out,
    )
    queues: dict[tuple[str, int], QueueStats] = {}
    keys: Counter[tuple[str, str]] = Counter()
    for part in parts:
        for key, q in part.queues.items():
            queues.setdefault(key, QueueStats()).merge(q)
        keys.update(part.keys)
    return {
        "queues": [{"topic": t, "queue_id": q, **asdict(s)} for (t, q), s in sorted(queues.items())],
        "top_keys": [{"topic": t, "key": k, "count": c} for (t, k), c in keys.most_common(top)],
        "errors": [e for p in parts for e in p.audit.errors],
    }


# ------------------------------------------------------------------------------------- CLI


def _print_audit(reports: list[SegmentAudit]) -> None:
    print(f"{'segment':<22} {'records':>9} {'bytes':>12} {'blank at':>12}  problems")
    for r in reports:
        blank = str(r.blank_at) if r.blank_at is not None else "-"
        print(f"{Path(r.path).name:<22} {r.records:>9} {r.record_bytes:>12} {blank:>12}  {len(r.errors)}")
        for phy, problem in r.errors:
            print(f"  {Path(r.path).name} offset {phy} (position {phy - r.file_offset}): {problem}")
    bad = sum(len(r.errors) for r in reports)
    print(f"{len(reports)} segment(s), {sum(r.records for r in reports)} record(s), {bad} problem(s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmq-spark", description="segment-parallel Spark jobs over an rmq-mp store"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", required=True, help="store directory (or a running store's shm name)")
    common.add_argument("--conf", help="broker.conf with the store's settings")
    common.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a broker.conf property"
    )
    common.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    common.add_argument("--json", action="store_true", help="print the report as one JSON object")
    common.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("audit", parents=[common], help="check CRC, record chain and PHYSICALOFFSET per segment")
    p = sub.add_parser("rebuild-index", parents=[common], help="rebuild ConsumeQueue and IndexFile, compare")
    p.add_argument("--target", type=Path, required=True)
    p = sub.add_parser("export", parents=[common], help="topics to Parquet, partitioned by topic and queue")
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--topic", action="append", help="a topic to export (repeatable; default all)")
    p = sub.add_parser("stats", parents=[common], help="per queue counts, bytes, time range; top keys")
    p.add_argument("--topic", action="append", help="a topic (repeatable; default all)")
    p.add_argument("--top", type=int, default=10, help="how many top keys (default 10)")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """What the arguments can get wrong, refused before Spark starts (seconds, and lines of its
    own on stderr): ``--topic`` by the rules `rmq-admin` applies (an empty or invalid name would
    export or count nothing and exit 0), and ``--target``, which must be an empty directory or
    none yet (`main` makes it once the store is found)."""
    from rmq_mp import validators

    for topic in getattr(args, "topic", None) or []:
        validators.check_topic(topic, "--topic")
    target: Path | None = getattr(args, "target", None)
    if target is not None and target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise StoreError(f"--target {target} is not an empty directory")


def _problem(exc: Exception) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, StoreError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)
        config = store_config(args.store, args.conf, args.set)
        file_modes.apply(config.store_group_access)  # before Spark's processes start: they inherit it
        if getattr(args, "target", None) is not None:
            args.target.mkdir(parents=True, exist_ok=True)
    except (StoreError, OSError) as exc:
        print(f"rmq-spark: error: {args.store}: {_problem(exc)}", file=sys.stderr)
        return 2
    from rmq_mp.spark.session import local_session

    spark = local_session(f"rmq-spark {args.command}", master=args.master)
    progress = None if args.quiet else sys.stderr
    report = io.StringIO()
    try:
        with contextlib.redirect_stdout(report):
            code = _run(spark, args, config, progress)
    except (StoreError, OSError) as exc:
        print(f"rmq-spark: error: {args.store}: {_problem(exc)}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    try:
        sys.stdout.write(report.getvalue())
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's final flush
    except BrokenPipeError:
        # The reader (`| head -1`) went away: no traceback, the job's exit status all the same,
        # and no second failure in the interpreter's final flush of stdout.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _run(spark: Any, args: argparse.Namespace, config: MessageStoreConfig, progress: TextIO | None) -> int:
    topics = frozenset(args.topic) if getattr(args, "topic", None) else None
    end = running_readable_end(args.store)
    if end is not None and progress is not None:
        print(f"{args.command}: running store: read up to its readable end, offset {end}", file=progress)
    if end is None and args.command in ("export", "stats"):  # the jobs that hand out messages
        window = ha_log.stopped_read_end(config.root_dir)  # a stopped slave's: a fork, an unconfirmed log
        if window >= 0:
            end = window
            print(
                f"{args.command}: records from commit-log offset {window} are left out: this slave's log "
                f"is not confirmed as its master's from there (docs/replication.md)",
                file=sys.stderr,
            )
    if args.command == "audit":
        reports = audit(spark, config, readable_end=end, out=progress)
        if args.json:
            print(json.dumps([asdict(r) for r in reports]))
        else:
            _print_audit(reports)
        return 1 if any(r.errors for r in reports) else 0
    if args.command == "rebuild-index":
        report = rebuild_index(spark, config, args.target, readable_end=end, out=progress)
        ok = rebuild_ok(report)
        if args.json:
            print(json.dumps(report))
        else:
            print(
                f"consume queues: {report['cq_identical']}/{report['cq_files']} files identical "
                f"({report['cq_entries']} entries); differ: {report['cq_differ'] or 'none'}; "
                f"missing: {report['cq_missing'] or 'none'}; extra: {report['cq_extra'] or 'none'}"
            )
            print(
                f"index: {report['index_identical']}/{report['index_files']} files identical in content, "
                f"{report['index_rebuilt_files']} rebuilt; keys found {report['keys_total'] - len(report['keys_missing'])}"
                f"/{report['keys_total']}"
            )
            for phy, problem in report["errors"]:
                print(f"  offset {phy}: {problem}")
        return 0 if ok else 1
    if args.command == "export":
        report = export(spark, config, args.target, topics, readable_end=end, out=progress)
        if args.json:
            print(json.dumps(report))
        else:
            print(
                f"exported {report['rows']} row(s) into {report['files']} file(s) "
                f"({report['parquet_bytes']} bytes of Parquet from {report['commit_log_bytes']} bytes of "
                f"records) in {report['seconds']:.1f} s: {report['mb_per_s']:.1f} MB/s"
            )
        return 0
    report = stats(spark, config, topics, args.top, readable_end=end, out=progress)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'topic':<32} {'queue':>5} {'count':>9} {'bytes':>12} {'first store':<24} last store")
        from rmq_mp.tools.admin_common import iso

        for q in report["queues"]:
            print(
                f"{q['topic'][:32]:<32} {q['queue_id']:>5} {q['count']:>9} {q['record_bytes']:>12} "
                f"{iso(q['first_store_ms']):<24} {iso(q['last_store_ms'])}"
            )
        print("top keys:")
        for k in report["top_keys"]:
            print(f"  {k['count']:>7}  {k['topic']}#{k['key']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
