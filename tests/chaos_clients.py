"""Client processes of the chaos soak (tests/crash/test_chaos_soak.py).

``python -m tests.chaos_clients producer <store> <seed> <out>``: sends until killed, a seeded mix
of what users send (tags, keys as a list, user properties, a delay level, batches of dicts) to
GroupT, PushT and DelayT, and writes one JSON line per result, flushed (a kill -9 leaves every
acknowledgement it got on disk): ``n`` (the message's number, in its body ``<topic>-<n>``), the
topic, ``kind``, ``born_ms``, and the result's status, queue id, queue offset and commit-log
offset.

``python -m tests.chaos_clients pusher <store> <out>``: a `PushConsumer` of PushT (group
``pushers``, one retry): a message whose number is a multiple of ``FAIL_EVERY`` is always
answered RECONSUME_LATER, so it goes to ``%RETRY%pushers`` and then to ``%DLQ%pushers``; every
other message is consumed, its body and reconsume times written before it is acknowledged. Runs
until SIGTERM, then shuts down cleanly.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
import time

FAIL_EVERY = 5
"""PushT messages numbered a multiple of this always fail: they end as dead letters."""
MAX_RECONSUME_TIMES = 1
DELAY_LEVEL = 1


def body_of(topic: str, n: int) -> bytes:
    return f"{topic}-{n}".encode()


def producer(store: str, seed: int, out_path: str) -> int:
    from rmq_mp.put.producer import Producer

    rnd = random.Random(seed)
    n = 0
    with Producer.attach(store) as p, open(out_path, "w", encoding="utf-8") as out:
        while True:
            kind = rnd.choice(("tags-keys", "properties", "delay", "batch", "plain"))
            if kind == "batch":
                items = []
                for _ in range(rnd.randint(2, 5)):
                    topic = rnd.choice(("GroupT", "PushT"))
                    items.append(
                        (
                            n,
                            topic,
                            {"topic": topic, "body": body_of(topic, n), "tags": "TagB", "keys": [f"k{n}"]},
                        )
                    )
                    n += 1
                born_ms = int(time.time() * 1000)
                results = list(p.send_batch([item for _n, _t, item in items]))
                sent = [(m, t, r) for (m, t, _item), r in zip(items, results, strict=True)]
            else:
                topic = "DelayT" if kind == "delay" else rnd.choice(("GroupT", "PushT"))
                born_ms = int(time.time() * 1000)
                if kind == "tags-keys":
                    r = p.send(topic, body_of(topic, n), tags="TagA", keys=[f"k{n}", "chaos"])
                elif kind == "properties":
                    r = p.send(topic, body_of(topic, n), properties={"n": str(n), "source": "chaos"})
                elif kind == "delay":
                    r = p.send(topic, body_of(topic, n), properties={"DELAY": str(DELAY_LEVEL)})
                else:
                    r = p.send(topic, body_of(topic, n))
                sent = [(n, topic, r)]
                n += 1
            for m, topic, r in sent:
                out.write(
                    json.dumps(
                        {
                            "n": m,
                            "t": topic,
                            "kind": kind,
                            "born_ms": born_ms,
                            "s": r.status.name,
                            "q": r.queue_id,
                            "o": r.queue_offset,
                            "phy": r.commit_log_offset,
                        }
                    )
                    + "\n"
                )
            out.flush()


def pusher(store: str, out_path: str) -> int:
    from rmq_mp.client.push_consumer import ConsumeConcurrentlyContext, PushConsumer
    from rmq_mp.format.message import MessageExt
    from rmq_mp.outcomes import ConsumeConcurrentlyStatus

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    lock = threading.Lock()
    with open(out_path, "a", encoding="utf-8") as out:

        def listener(msgs: list[MessageExt], _c: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            (msg,) = msgs
            if int(msg.body.decode().rsplit("-", 1)[1]) % FAIL_EVERY == 0:
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            with lock:
                out.write(json.dumps({"b": msg.body.decode(), "r": msg.reconsume_times}) + "\n")
                out.flush()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(
            store, "pushers", max_reconsume_times=MAX_RECONSUME_TIMES, persist_consumer_offset_interval_ms=200
        )
        consumer.subscribe("PushT", "*")
        consumer.register_message_listener(listener)
        consumer.start()
        stop.wait()
        consumer.shutdown()
    return 0


def main() -> int:
    if sys.argv[1] == "producer":
        return producer(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    return pusher(sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    raise SystemExit(main())
