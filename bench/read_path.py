"""What serving a message costs: pulls through the library and through a running store.

    python -m bench.read_path [--messages N] [--rounds R] [--before TREE]

Builds one store with the library writer (one topic, four queues, 100-700 byte bodies, tags,
keys), then measures, best of three passes each:

- **library**: `MessageStore.get_message` over every queue from offset 0, 32 a pull, on a
  read-only open;
- **pull**: the store started (``run.py start``), one `Consumer` pulling every queue from 0,
  32 a pull;
- **poll**: a `Consumer` subscribed to the topic, ``poll(max_msgs=32)`` until every message
  is read.

With ``--before TREE`` (a checkout of another commit, e.g. ``git archive <commit> | tar -x -C
TREE``) every round measures that tree and this one, alternately, each in a child process of
this one against the same store, and prints this tree's msgs/s over the other's: on a shared
machine only such interleaved ratios mean anything (bench/NOTES.md). Without it, this tree only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPIC = "ReadBench"
QUEUES = 4
PASSES = 3
SETTINGS = {
    "mappedFileSizeCommitLog": str(64 << 20),
    "mappedFileSizeConsumeQueue": str(300_000 * 20),
    "messageIndexEnable": "false",
}


def build(root: Path, messages: int) -> None:
    from rmq_mp.config.store_config import MessageStoreConfig
    from rmq_mp.format.message import Message
    from rmq_mp.store.message_store import MessageStore

    config = MessageStoreConfig.from_properties({**SETTINGS, "storePathRootDir": str(root)}, source="bench")
    rnd = random.Random(11)
    with MessageStore.open(config=config) as store:
        for i in range(messages):
            result = store.put_message(
                Message(
                    topic=TOPIC,
                    body=rnd.randbytes(rnd.randint(100, 700)),
                    properties={"TAGS": f"Tag{i % 5}", "KEYS": f"order-{i}"},
                    queue_id=i % QUEUES,
                    born_timestamp=1_700_000_000_000 + i,
                )
            )
            assert result.ok, result


def _best(action: Any, expected: int) -> float:
    """msgs/s of the fastest of PASSES runs of ``action`` (which returns how many it read)."""
    best = float("inf")
    for _ in range(PASSES):
        started = time.perf_counter()
        read = action()
        best = min(best, time.perf_counter() - started)
        assert read == expected, (read, expected)
    return expected / best


def measure(tmp: Path, name: str, messages: int) -> dict[str, float]:
    """This interpreter's tree (PYTHONPATH) against the store at ``tmp/name``."""
    from bench.service import running_service
    from rmq_mp.client.consumer import Consumer
    from rmq_mp.config.store_config import MessageStoreConfig
    from rmq_mp.outcomes import GetMessageStatus
    from rmq_mp.store.message_store import MessageStore

    found = GetMessageStatus.FOUND
    config = MessageStoreConfig.from_properties(
        {**SETTINGS, "storePathRootDir": str(tmp / name)}, source="bench"
    )

    def library() -> int:
        read = 0
        with MessageStore.open(config=config, read_only=True) as store:
            for queue_id in range(QUEUES):
                offset = 0
                while (result := store.get_message(TOPIC, queue_id, offset, 32)).status is found:
                    read += len(result.messages)
                    offset = result.next_begin_offset
        return read

    row = {"library_msgs_per_s": _best(library, messages)}
    with running_service(tmp, name, **SETTINGS) as service:

        def pull() -> int:
            read = 0
            with Consumer.attach(service.names.base, "bench-pull") as consumer:
                for queue_id in range(QUEUES):
                    offset = 0
                    while (result := consumer.pull(TOPIC, queue_id, offset, 32)).status is found:
                        read += len(result.messages)
                        offset = result.next_begin_offset
            return read

        def poll() -> int:
            read = 0
            with Consumer.attach(service.names.base, "bench-poll") as consumer:
                consumer.subscribe(TOPIC, from_offsets=dict.fromkeys(range(QUEUES), 0))
                while batch := consumer.poll(timeout_s=0, max_msgs=32):
                    read += len(batch)
            return read

        row["pull_msgs_per_s"] = _best(pull, messages)
        row["poll_msgs_per_s"] = _best(poll, messages)
    return row


def _child(tree: Path, tmp: Path, name: str, messages: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, __file__, "--measure", str(tmp), name, str(messages)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.read_path")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another tree to measure alternately")
    parser.add_argument("--measure", nargs=3, metavar=("TMP", "NAME", "MESSAGES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        tmp, name, messages = args.measure
        print(json.dumps(measure(Path(tmp), name, int(messages))))
        return
    this = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="rmq-bench-read-"))
    try:
        build(tmp / "store", args.messages)
        trees = {"after": this, **({"before": args.before.resolve()} if args.before else {})}
        rows: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
        for round_ in range(args.rounds):
            for label, tree in trees.items() if round_ % 2 == 0 else reversed(trees.items()):
                rows[label].append(_child(tree, tmp, "store", args.messages))
                print(
                    f"round {round_ + 1} {label}: "
                    + "  ".join(f"{k} {v:,.0f}" for k, v in rows[label][-1].items())
                )
        if args.before:
            for key in rows["after"][0]:
                ratios = [a[key] / b[key] for a, b in zip(rows["after"], rows["before"], strict=True)]
                print(f"{key}: after/before " + ", ".join(f"{r:.2f}" for r in ratios))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
