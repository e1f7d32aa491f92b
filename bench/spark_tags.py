"""A Spark read filtered to one tag in ten: the ``tags`` option (pushed into the read, entries
dropped on their ConsumeQueue tags code before any record is read) against the read as it was
before issue 34, every record read and decoded and the filter applied by Spark, in the same run.

    python -m bench.spark_tags [--messages N] [--repeat R] [--master local[2]]

Builds a store with the library writer (two topics, four queues each, 100-700 byte bodies, tags
Tag0..Tag9 in turn), then times, alternately, ``load().where("tags = 'Tag3'")`` and
``option("tags", "Tag3").load()``, each materialising every column into Spark's ``noop`` sink;
best of ``--repeat`` runs each. The figure is the ratio (issue 34's goal: at least 5x). A third
timing, a tag no message has, is what any query of the store costs (planning, the store's
queue ends, Spark's tasks and workers): the filtered read cannot go below it. Prints a table,
writes bench/results/spark_tags.json. About 5 minutes for the default 1,000,000 messages on 2
cores (bench/NOTES.md: why fewer messages give a lower ratio).
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
from pathlib import Path
from typing import Any

from bench.spark_read import QUEUES, TOPICS, _time, build_store
from rmq_mp.format.message import Message

RESULTS = Path(__file__).resolve().parent / "results"
TAG = "Tag3"


def tag_message(i: int, rnd: random.Random) -> Message:
    """The i-th message: tags Tag0..Tag9 in turn, a key, two topics of four queues."""
    return Message(
        topic=TOPICS[i % 2],
        body=rnd.randbytes(rnd.randint(100, 700)),
        properties={"TAGS": f"Tag{i % 10}", "KEYS": f"order-{i}"},
        queue_id=(i // 2) % QUEUES,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_tags")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    from rmq_mp.spark.session import local_session

    work = Path(tempfile.mkdtemp(prefix="rmq-bench-spark-tags-"))
    try:
        build_store(work / "store", args.messages, message_of=tag_message)
        spark = local_session("bench.spark_tags", master=args.master, work_dir=work / "spark")
        try:
            store = str(work / "store")

            def where() -> Any:
                return spark.read.format("rmq").option("store", store).load().where(f"tags = '{TAG}'")

            def pushed(tag: str = TAG) -> Any:
                return spark.read.format("rmq").option("store", store).option("tags", tag).load()

            want = args.messages // 10
            assert where().count() == pushed().count() == want  # also the warm-up
            where_s, pushed_s, floor_s = [], [], []
            for _ in range(args.repeat):
                where_s.append(_time(lambda: where().write.format("noop").mode("overwrite").save()))
                pushed_s.append(_time(lambda: pushed().write.format("noop").mode("overwrite").save()))
                floor_s.append(
                    _time(lambda: pushed("NoSuchTag").write.format("noop").mode("overwrite").save())
                )
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results: dict[str, Any] = {
        "messages": args.messages,
        "rows": want,
        "master": args.master,
        "where_s": where_s,
        "tags_option_s": pushed_s,
        "no_rows_s": floor_s,
        "speedup": min(where_s) / min(pushed_s),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
    }
    print(f"{'one tag in ten (16 columns, noop sink)':<40} {'best s':>8} {'rows/s':>12}")
    print(f"{'load().where(tags = ...) (before)':<40} {min(where_s):>8.2f} {want / min(where_s):>12,.0f}")
    print(
        f"{'option(tags, ...) (ConsumeQueue codes)':<40} {min(pushed_s):>8.2f} {want / min(pushed_s):>12,.0f}"
    )
    print(f"{'option(tags, NoSuchTag): the query floor':<40} {min(floor_s):>8.2f}")
    print(f"speedup: {results['speedup']:.1f}x")
    print(f"{args.messages} messages, {args.master}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark_tags.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
