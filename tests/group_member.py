"""A consumer-group member process for tests and the bench:
``python -m tests.group_member <store> <group> <client_id> <out> <stop_file> [options]``.

Subscribes to ``--topic`` and polls until ``stop_file`` exists and a poll finds nothing, or
SIGTERM (a clean leave: the consumer closes after committing what it read), committing after
every ``--commit-every`` batches (1: each), each batch taking ``--work-s`` to process first.
Writes JSON lines to ``out``, flushed before each commit (so a kill -9 leaves every read it
committed on disk): ``{"e": "read", "q": queue,
"o": offset, "b": body, "t": monotonic_s}`` per message, ``{"e": "commit", "t0": s, "t": s,
"offs": {queue: next_offset}}`` after each commit (``t0`` before it, ``t`` after, ``offs`` the
queues it committed), ``{"e": "assign", "queues": [...], "t": monotonic_s}`` whenever its
assignment changes, ``{"e": "done", "n": count}`` last. Monotonic time is the machine's, so a
test orders the events of several members (tests/integration/test_consumer_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

from rmq_mp.client.consumer import Consumer
from rmq_mp.client.rebalance import MessageModel
from rmq_mp.errors import StoreNotRunningError


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("store", "group", "client_id", "out", "stop_file"):
        parser.add_argument(name)
    parser.add_argument("--topic", default="GroupT")
    parser.add_argument("--broadcasting", action="store_true")
    parser.add_argument("--poll-s", type=float, default=0.2)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--max", type=int, default=32)
    parser.add_argument("--quiet", action="store_true", help="count only (the bench)")
    parser.add_argument("--commit-every", type=int, default=1, help="commit after every N batches")
    parser.add_argument(
        "--work-s", type=float, default=0.0, help="seconds each batch takes to process, before its commit"
    )
    parser.add_argument(
        "--across-restarts",
        action="store_true",
        help="a poll or commit refused while the store is down (StoreNotRunningError) is tried again, "
        "as an application riding a restart would; the consumer attaches to the next start by itself",
    )
    args = parser.parse_args()
    model = MessageModel.BROADCASTING if args.broadcasting else MessageModel.CLUSTERING
    count = 0
    leaving: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: leaving.append(signum))
    with (
        Consumer.attach(
            args.store, args.group, message_model=model, client_id=args.client_id,
            rebalance_interval_ms=args.interval_ms,
        ) as consumer,
        open(args.out, "a", encoding="utf-8") as out,
    ):  # fmt: skip
        consumer.subscribe(args.topic)
        assigned: list[int] = []
        uncommitted = 0
        while True:
            try:
                batch = consumer.poll(args.poll_s, args.max)
            except StoreNotRunningError:
                if not args.across_restarts or leaving:
                    raise
                time.sleep(args.poll_s)  # the store is down: look again, as an application would
                continue
            now = consumer.assignment().get(args.topic, [])
            if now != assigned:
                assigned = now
                out.write(json.dumps({"e": "assign", "queues": now, "t": time.monotonic()}) + "\n")
                out.flush()
            if not batch and not (leaving and uncommitted):
                if leaving:  # SIGTERM: a clean leave, everything read committed
                    break
                if os.path.exists(args.stop_file):
                    break
                continue
            count += len(batch)
            if not args.quiet and batch:
                read_s = time.monotonic()
                out.write(
                    "".join(
                        json.dumps(
                            {
                                "e": "read",
                                "q": m.queue_id,
                                "o": m.queue_offset,
                                "b": m.body.decode(),
                                "t": read_s,
                            }
                        )
                        + "\n"
                        for m in batch
                    )
                )
                out.flush()
            uncommitted += 1 if batch else 0
            if batch and args.work_s:
                time.sleep(args.work_s)  # processing: the batch stays uncommitted meanwhile
            if uncommitted < args.commit_every and not leaving:
                continue
            offsets = _to_commit(consumer, args.topic)
            before_s = time.monotonic()
            try:
                consumer.commit()
            except StoreNotRunningError:  # the reads stand; the next start serves them again
                if not args.across_restarts:
                    raise
                if leaving:  # the store is down: leave without, as a killed member would
                    break
                continue
            uncommitted = 0
            if not args.quiet:
                commit = {"e": "commit", "t0": before_s, "t": time.monotonic(), "offs": offsets}
                out.write(json.dumps(commit) + "\n")
                out.flush()
            if leaving:  # SIGTERM: a clean leave, after what it read was committed
                break
        out.write(json.dumps({"e": "done", "n": count}) + "\n")
    return 0


def _to_commit(consumer: Consumer, topic: str) -> dict[int, int]:
    """What `Consumer.commit` records for ``topic`` now: the next offsets of the queues this
    member reads (under CLUSTERING only those it holds)."""
    sub = consumer.subscriptions[topic]
    held = set(consumer.assignment().get(topic, []))
    return {q: o for q, o in sub.next_offsets.items() if q in held}


if __name__ == "__main__":
    raise SystemExit(main())
