"""A consumer group draining a backlog: aggregate msgs/s of 1, 2 and 4 member processes.

    python -m bench.consumer_group [--messages N] [--rounds R] [--members 1 2 4]

One store (16 queues, ASYNC_FLUSH), a backlog of ``--messages`` 100-byte messages written
before any consumer starts; then, for each group size, a fresh group (so each drains the whole
backlog from offset 0) of member processes (MessageModel.CLUSTERING) that poll 256 at a time and
commit after every batch, from a common start (a barrier) until the group has read the backlog.
The baseline is the same run's one-member group; each row shows its ratio to it. The rebalance
at the start (members joining and splitting the 16 queues) is inside the timed window. Best of
``--rounds`` per size. Prints a table and writes bench/results/consumer_group.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier, Lock
from pathlib import Path

from bench.service import running_service
from rmq_mp.client.consumer import Consumer
from rmq_mp.put.producer import Producer

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC, QUEUES, BATCH = "BenchGroup", 16, 256


def _member(
    store: str, group: str, client_id: str, total: int, start: Barrier, lock: Lock,
    done: Synchronized[int], end_s: Synchronized[float],
) -> None:  # fmt: skip
    with Consumer.attach(store, group, client_id=client_id) as consumer:
        consumer.subscribe(TOPIC)
        start.wait()
        while done.value < total:
            batch = consumer.poll(0.05, BATCH)
            if not batch:
                continue
            consumer.commit()
            with lock:
                done.value += len(batch)
                if done.value >= total and end_s.value == 0.0:
                    end_s.value = time.monotonic()


def drain(store: str, group: str, members: int, total: int) -> float:
    """Aggregate msgs/s of ``members`` processes in ``group`` reading the ``total`` backlog."""
    ctx = mp.get_context("spawn")
    start, lock = ctx.Barrier(members + 1), ctx.Lock()
    done, end_s = ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False)
    procs = [
        ctx.Process(target=_member, args=(store, group, f"{group}-{i}", total, start, lock, done, end_s))
        for i in range(members)
    ]
    for proc in procs:
        proc.start()
    try:
        start.wait(120)
        began = time.monotonic()
        for proc in procs:
            proc.join(600)
            assert proc.exitcode == 0, f"member exited {proc.exitcode}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    assert done.value >= total, (done.value, total)
    return total / (end_s.value - began)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    settings = {
        "defaultTopicQueueNums": str(QUEUES),
        "mappedFileSizeCommitLog": str(64 << 20),
        "mappedFileSizeConsumeQueue": "6000000",
        "maxHashSlotNum": "500000",
        "maxIndexNum": "2000000",
    }
    with tempfile.TemporaryDirectory() as tmp, running_service(Path(tmp), **settings) as service:
        store = service.names.base
        with Producer.attach(store) as producer:
            body = b"x" * 100
            for start in range(0, args.messages, 512):
                items = [
                    {"topic": TOPIC, "body": body, "queue_id": i % QUEUES}
                    for i in range(start, min(start + 512, args.messages))
                ]
                assert all(r.ok for r in producer.send_batch(items))
        rates: dict[int, float] = {}
        for round_ in range(args.rounds):
            for members in args.members:
                rate = drain(store, f"bench_{members}_{round_}", members, args.messages)
                rates[members] = max(rates.get(members, 0.0), rate)
    base = rates[min(rates)]
    rows = [
        {"members": m, "msgs_per_s": round(r), "ratio_vs_1": round(r / base, 2)}
        for m, r in sorted(rates.items())
    ]
    print(
        f"{'members':>8} {'msgs/s':>10} {'vs 1':>6}   ({args.messages:,} messages, {QUEUES} queues, best of {args.rounds})"
    )
    for row in rows:
        print(f"{row['members']:>8} {row['msgs_per_s']:>10,} {row['ratio_vs_1']:>6}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "consumer_group.json").write_text(
        json.dumps({"messages": args.messages, "queues": QUEUES, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
