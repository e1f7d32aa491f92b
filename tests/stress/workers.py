"""Processes for the stress suite: producers that mix every put shape, consumers that check
every message they read. Each reports through a multiprocessing queue."""

from __future__ import annotations

import random
import time
from typing import Any

from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.put.producer import Producer
from tests.load import QUEUES, TOPICS, message_for


def produce(store: str, producer: int, duration_s: float, seed: int, out: Any) -> None:
    """Send for ``duration_s``: single sends, one-queue batches (the one-put fast path) and mixed
    batches. Reports the (producer, seq) of every PUT_OK and any other status seen."""
    rnd = random.Random(seed * 1000 + producer)
    acked: list[int] = []
    other: list[str] = []
    seq = 0
    with Producer.attach(store) as p:
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            shape = rnd.choice(("one", "queue-batch", "mixed-batch"))
            count = 1 if shape == "one" else rnd.randint(2, 40)
            items = []
            queue = rnd.randrange(QUEUES)
            topic = rnd.choice(TOPICS)
            for s in range(seq, seq + count):
                t, q, body = message_for(producer, s)
                if shape == "queue-batch":
                    t, q = topic, queue
                items.append(
                    dict(topic=t, body=body, queue_id=q, properties={"p": str(producer), "s": str(s)})
                )
            for s, result in zip(range(seq, seq + count), p.send_batch(items), strict=True):
                if result.ok:
                    acked.append(s)
                else:
                    other.append(result.status.name)
            seq += count
    out.put(("producer", producer, acked, other))


def consume(store: str, consumer: int, queues: list[tuple[str, int]], stop: Any, out: Any) -> None:
    """Read ``queues`` from offset 0 while producers run, until ``stop`` is set and a whole pass
    finds nothing new. Every body must match what its (producer, seq) generates, and queue
    offsets must be contiguous. Reports the (producer, seq) pairs read and the problems found."""
    offsets = dict.fromkeys(queues, 0)
    seen: list[tuple[int, int]] = []
    problems: list[str] = []
    with Consumer.attach(store, f"stress-{consumer}") as c:
        while True:
            stopping = stop.is_set()
            progressed = False
            for topic, queue_id in queues:
                result = c.pull(topic, queue_id, offsets[(topic, queue_id)], 32)
                if result.status is not GetMessageStatus.FOUND:
                    continue
                for message in result.messages:
                    if message.queue_offset != offsets[(topic, queue_id)]:
                        problems.append(
                            f"{topic}/{queue_id}: offset {message.queue_offset}, expected {offsets[(topic, queue_id)]}"
                        )
                    offsets[(topic, queue_id)] = message.queue_offset + 1
                    producer, seq = int(message.properties["p"]), int(message.properties["s"])
                    if message_for(producer, seq)[2] != message.body:
                        problems.append(f"producer {producer} seq {seq}: body differs")
                    seen.append((producer, seq))
                progressed = True
            if stopping and not progressed:
                break
            if not progressed:
                time.sleep(0.005)
    out.put(("consumer", consumer, seen, problems))
