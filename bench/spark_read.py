"""Spark batch read of a store against reading the same messages from Parquet, in the same run;
and the export job's MB/s.

    python -m bench.spark_read [--messages N] [--master local[2]]

Builds a store with the library writer (two topics, four queues each, 100-700 byte bodies, tags,
keys and properties), exports it to Parquet with `rmq-spark export` (one task per CommitLog
segment; MB/s of CommitLog record bytes), then times, alternately, ``spark.read.format("rmq")``
over the store and ``spark.read.parquet`` over the export, each materialising every column into
Spark's ``noop`` sink; best of ``--repeat`` runs each. The ratio rmq/Parquet is the figure (issue
7's goal: at least 0.5). Prints a table, writes bench/results/spark_read.json. Takes about a
minute for the default 200,000 messages on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format.message import Message
from rmq_mp.store.message_store import MessageStore

RESULTS = Path(__file__).resolve().parent / "results"
TOPICS = ("Orders", "Payments")
QUEUES = 4


def read_message(i: int, rnd: random.Random) -> Message:
    """The i-th message of this bench's store: tags, keys and a user property."""
    props = {"TAGS": f"Tag{i % 5}", "KEYS": f"order-{i} customer-{i % 1000}", "seq": str(i)}
    return Message(
        topic=TOPICS[i % 2],
        body=rnd.randbytes(rnd.randint(100, 700)),
        properties=props,
        queue_id=i % QUEUES,
        born_timestamp=1_700_000_000_000 + i,
    )


def build_store(
    root: Path,
    messages: int,
    seed: int = 7,
    message_of: Callable[[int, random.Random], Message] = read_message,
) -> MessageStoreConfig:
    """A store of ``messages`` written by the library writer (64 MiB files, no index), the i-th
    message ``message_of(i, rnd)`` with one seeded random source: the Spark benches' input."""
    config = MessageStoreConfig().replace(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=64 << 20,
        mapped_file_size_consume_queue=300_000 * 20,
        message_index_enable=False,
    )
    rnd = random.Random(seed)
    with MessageStore.open(config=config) as store:
        for i in range(messages):
            result = store.put_message(message_of(i, rnd))
            assert result.ok, result
    return config


def _time(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_read")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    from rmq_mp.spark.jobs import export
    from rmq_mp.spark.session import local_session

    work = Path(tempfile.mkdtemp(prefix="rmq-bench-spark-"))
    try:
        started = time.perf_counter()
        config = build_store(work / "store", args.messages)
        build_s = time.perf_counter() - started
        spark = local_session("bench.spark_read", master=args.master, work_dir=work / "spark")
        try:
            store = str(work / "store")
            rmq = spark.read.format("rmq").option("store", store)
            assert rmq.load().count() == args.messages  # warm-up: planner and worker processes
            report = export(spark, config, work / "parquet", None, out=None)
            assert report["rows"] == args.messages
            parquet = spark.read.parquet(str(work / "parquet"))
            assert parquet.count() == args.messages
            rmq_s, parquet_s = [], []
            for _ in range(args.repeat):
                rmq_s.append(_time(lambda: rmq.load().write.format("noop").mode("overwrite").save()))
                parquet_s.append(
                    _time(
                        lambda: (
                            spark.read.parquet(str(work / "parquet"))
                            .write.format("noop")
                            .mode("overwrite")
                            .save()
                        )
                    )
                )
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rmq_rows_s = args.messages / min(rmq_s)
    parquet_rows_s = args.messages / min(parquet_s)
    results: dict[str, Any] = {
        "messages": args.messages,
        "master": args.master,
        "store_build_s": build_s,
        "rmq_read_s": rmq_s,
        "parquet_read_s": parquet_s,
        "rmq_rows_per_s": rmq_rows_s,
        "parquet_rows_per_s": parquet_rows_s,
        "rmq_vs_parquet": rmq_rows_s / parquet_rows_s,
        "export_s": report["seconds"],
        "export_commit_log_bytes": report["commit_log_bytes"],
        "export_parquet_bytes": report["parquet_bytes"],
        "export_mb_per_s": report["mb_per_s"],
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
    }
    print(f"{'read (all 16 columns, noop sink)':<36} {'best s':>8} {'rows/s':>12}")
    print(f"{'spark.read.format(rmq)':<36} {min(rmq_s):>8.2f} {rmq_rows_s:>12,.0f}")
    print(f"{'spark.read.parquet (same messages)':<36} {min(parquet_s):>8.2f} {parquet_rows_s:>12,.0f}")
    print(f"rmq / parquet: {results['rmq_vs_parquet']:.2f}x")
    print(
        f"export: {report['commit_log_bytes'] / 1e6:.1f} MB of records -> {report['parquet_bytes'] / 1e6:.1f} MB "
        f"of Parquet in {report['seconds']:.2f} s = {report['mb_per_s']:.1f} MB/s"
    )
    print(f"{args.messages} messages, {args.master}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark_read.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
