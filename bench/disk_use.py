"""Disk a store allocates for many queues of one message each, against issue 17's target.

    python -m bench.disk_use [--queues N] [--queues-per-topic Q] [--dir DIR] [--set KEY=VALUE ...]

Starts a real store with RocketMQ's default geometry (1 GiB commit-log files, 300,000-entry
ConsumeQueue files, 5,000,000 x 20,000,000 index files, warmMapedFileEnable off as in RocketMQ),
sends one message to each of N queues (Q a topic), waits until all are dispatched, and sums
st_blocks * 512 over the store directory, by part. Target: 12,000 queues under 1.5 GiB, commit
log included. The store is deleted afterwards. ``--dir`` puts it on another filesystem (the
default is the system temp directory). Needs maxConsumeQueueNum >= N (the default 65,536); reput
keeps at most maxOpenConsumeQueueFiles queue files mapped, whatever N.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.__main__ import parse_setting
from bench.service import running_service, wait_until
from rmq_mp.put.producer import Producer
from shm import layout

GIB = 1 << 30
MIB = 1 << 20
TARGET_BYTES = 3 * GIB // 2
DEFAULT_GEOMETRY = {
    "mappedFileSizeCommitLog": str(GIB),
    "mappedFileSizeConsumeQueue": str(300_000 * 20),
    "maxHashSlotNum": "5000000",
    "maxIndexNum": "20000000",
    "warmMapedFileEnable": "false",
}


def allocated_bytes(path: Path) -> int:
    """st_blocks * 512 of ``path`` and everything under it (directories included)."""
    if not path.exists():
        return 0
    return path.lstat().st_blocks * 512 + sum(p.lstat().st_blocks * 512 for p in path.rglob("*"))


def apparent_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.disk_use", description=__doc__)
    parser.add_argument("--queues", type=int, default=12_000)
    parser.add_argument("--queues-per-topic", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], type=parse_setting, metavar="KEY=VALUE"
    )
    args = parser.parse_args(argv)
    settings = {
        **DEFAULT_GEOMETRY,
        "defaultTopicQueueNums": str(args.queues_per_topic),  # a send names only its topic's queues
        **dict(args.overrides),
    }
    print(f"{args.queues} queues, {args.queues_per_topic} a topic, one message each; {settings}")
    tmp = Path(tempfile.mkdtemp(prefix="rmq-disk-use-", dir=args.dir))
    try:
        with running_service(tmp, "store", **settings) as service, Producer.attach(service.root) as producer:
            began = time.perf_counter()
            for n in range(args.queues):
                topic, queue_id = f"T{n // args.queues_per_topic}", n % args.queues_per_topic
                result = producer.send(
                    topic, b"one message of %s/%d" % (topic.encode(), queue_id), queue_id=queue_id
                )
                if not result.ok:
                    raise SystemExit(
                        f"send to {topic}/{queue_id} failed: {result.status.name} {result.reason}"
                    )
            wait_until(
                lambda: service.read(layout.REPUT_FROM_OFFSET) == service.read(layout.WROTE_POSITION),
                600,
                "every message dispatched",
            )
            sent_s = time.perf_counter() - began
            root = service.root
            parts = {name: allocated_bytes(root / name) for name in ("commitlog", "consumequeue", "index")}
            total = allocated_bytes(root)
            parts["other (config, checkpoint, logs, store dir)"] = total - sum(parts.values())
            print(f"sent and dispatched in {sent_s:.1f} s")
            print(f"{'part':<46}{'allocated MiB':>14}{'apparent MiB':>14}")
            for name, used in parts.items():
                shown = (
                    apparent_bytes(root / name) / MIB if name in ("commitlog", "consumequeue", "index") else 0
                )
                print(f"{name:<46}{used / MIB:>14.1f}{shown:>14.1f}")
            verdict = "under" if total < TARGET_BYTES else "OVER"
            print(f"{'total':<46}{total / MIB:>14.1f}   ({verdict} the {TARGET_BYTES / GIB:.1f} GiB target)")
            print(f"per queue (consumequeue part): {parts['consumequeue'] / args.queues / 1024:.1f} KiB")
        return 0 if total < TARGET_BYTES else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
