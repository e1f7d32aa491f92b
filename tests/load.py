"""A producer process for tests: ``python -m tests.load <store> <producer> <count> <out> [batch]``.

Sends ``count`` messages whose topic, queue, size and body derive from (producer, seq), so a
reader can regenerate and compare every byte, and writes one line per acknowledged send to
``out`` (JSON: seq, status, queue offset, commit-log offset, reason)."""

from __future__ import annotations

import json
import random
import sys

from rmq_mp.put.producer import Producer

TOPICS = ("LoadA", "LoadB", "LoadC")
QUEUES = 8


def message_for(producer: int, seq: int) -> tuple[str, int, bytes]:
    rnd = random.Random(producer * 10_000_019 + seq)
    size = rnd.choice([0, rnd.randint(1, 100), rnd.randint(100, 1000), rnd.randint(1000, 4000)])
    return rnd.choice(TOPICS), rnd.randrange(QUEUES), rnd.randbytes(size)


def main() -> int:
    store, producer, count, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    with Producer.attach(store) as p, open(out, "w", encoding="utf-8") as f:
        for start in range(0, count, batch):
            seqs = range(start, min(start + batch, count))
            items = []
            for seq in seqs:
                topic, queue_id, body = message_for(producer, seq)
                items.append(dict(topic=topic, body=body, queue_id=queue_id,
                                  properties={"producer": str(producer), "seq": str(seq)}))  # fmt: skip
            for seq, result in zip(seqs, p.send_batch(items), strict=True):
                f.write(json.dumps({"seq": seq, "status": result.status.name, "queue_offset": result.queue_offset,
                                    "phy": result.commit_log_offset, "reason": result.reason}) + "\n")  # fmt: skip
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
