"""A producer process for the HA adversary tests:
``python -m tests.ha.ha_producer <store> <producer> <seed> <count> <out> <big_permille> <small_max>
<hold>``.

Sends up to ``count`` messages one by one, as fast as the store answers; message ``seq``'s
topic, queue, keys and body derive from (seed, producer, seq) (`message_for`), so a checker can
regenerate every byte. ``big_permille`` of them (per mille) carry a 1-3.75 MiB body, the others
0..``small_max`` bytes. Each answer is written to ``out`` as one JSON line, flushed before the
next send (so a PUT_OK the test reads was answered): seq, status, queue id and offset, the
commit-log offset, the uniq key and the body's size; an exception ends the run with a line naming it.
With ``hold`` 1, a SLAVE_NOT_AVAILABLE answer holds the producer until a slave is connected
again (as tests/ha/sync_load.py): a master with no slave stores no more than one message a
producer, so a returning old master is not hundreds of small files ahead of the new one (it
walks back one file a master's heartbeat interval, docs/replication.md).
"""

from __future__ import annotations

import json
import random
import sys
import time

from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout

TOPICS = ("HaKillA", "HaKillB")
QUEUES = 4
BIG_MIN_BYTES = 1 << 20
BIG_MAX_BYTES = (15 << 20) // 4
"""3.75 MiB: under maxMessageSize (4 MiB) with the record's header and properties."""


def message_for(
    seed: int, producer: int, seq: int, big_permille: int, small_max: int
) -> tuple[str, int, bytes]:
    """(topic, queue id, body) of message ``seq`` of ``producer``."""
    rnd = random.Random(f"{seed}-{producer}-{seq}")
    topic, queue_id = rnd.choice(TOPICS), rnd.randrange(QUEUES)
    big = rnd.randrange(1000) < big_permille
    size = rnd.randint(BIG_MIN_BYTES, BIG_MAX_BYTES) if big else rnd.randint(0, small_max)
    return topic, queue_id, rnd.randbytes(size)


def keys_for(producer: int, seq: int) -> str:
    return f"p{producer}-s{seq}"


def main() -> int:
    store, producer, seed, count, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    big_permille, small_max, hold = int(sys.argv[6]), int(sys.argv[7]), sys.argv[8] == "1"
    with Producer.attach(store) as p, open(out, "w", encoding="utf-8") as f:
        for seq in range(count):
            topic, queue_id, body = message_for(seed, producer, seq, big_permille, small_max)
            try:
                r = p.send(topic, body, queue_id=queue_id, keys=keys_for(producer, seq), tags="T")
            except Exception as exc:  # the store was killed under it: say so and stop
                f.write(json.dumps({"seq": seq, "status": "EXCEPTION", "reason": repr(exc)}) + "\n")
                f.flush()
                return 0
            f.write(json.dumps({"seq": seq, "status": r.status.name, "topic": topic, "queue_id": r.queue_id,
                                "queue_offset": r.queue_offset, "phy": r.commit_log_offset,
                                "uniq_key": r.uniq_key, "body_bytes": len(body), "reason": r.reason}) + "\n")  # fmt: skip
            f.flush()
            while (
                hold
                and r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
                and not p.store.table.get(layout.HA_CONNECTIONS)
            ):
                time.sleep(0.01)  # a load generator's pause, not a test's wait
    return 0


if __name__ == "__main__":
    sys.exit(main())
