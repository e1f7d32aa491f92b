"""Broker scale (issue 17), bounded for CI: thousands of queues (some with 127-byte topic names),
a hundred consumer groups committing tens of thousands of offsets from several processes, and
every message and every committed offset checked exactly: live, from a fresh process, and after
a restart (offsets back from consumerOffset.json, messages from the recovered queues).

``RMQ_SCALE_TOPICS`` x ``RMQ_SCALE_QUEUES`` queues (200 x 50 = 10,000 by default) and
``RMQ_SCALE_GROUPS`` groups (200, each a consumer attached at once, 200 offsets each: 40,000
committed offsets); about 30 s on 2 cores. The seed is printed;
``RMQ_SCALE_SEED`` replays one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
from pathlib import Path
from typing import Any

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.tools.store_status import collect_status
from shm import layout
from tests.service import running_service, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.stress]

PER_QUEUE = 3


def topic_names(count: int) -> list[str]:
    """Every fifth topic name is RocketMQ's longest (127 bytes), some multi-byte."""
    names = []
    for t in range(count):
        name = f"scale-{t}"
        if t % 5 == 0:
            name += "-" + "主" * 30  # 3 UTF-8 bytes each
            name += "x" * (127 - len(name.encode()))
            assert len(name.encode()) == 127
        names.append(name)
    return names


def body_of(topic: str, queue_id: int, n: int) -> bytes:
    return f"{topic}/{queue_id}/{n}".encode()


def produce(store: str, topics: list[str], queues: int, part: int, parts: int, out: Any) -> None:
    """Send PER_QUEUE messages to every ``parts``-th queue, in round-robin batches."""
    mine = [
        (t, q) for i, (t, q) in enumerate((t, q) for t in topics for q in range(queues)) if i % parts == part
    ]
    failures = []
    with Producer.attach(store) as producer:
        for n in range(PER_QUEUE):
            for start in range(0, len(mine), 200):
                items = [
                    {"topic": t, "body": body_of(t, q, n), "queue_id": q}
                    for t, q in mine[start : start + 200]
                ]
                failures += [r.status.name for r in producer.send_batch(items) if not r.ok]
    out.put(failures)


def commit(store: str, groups: list[str], plan: dict[str, dict[tuple[str, int], int]], out: Any) -> None:
    """A consumer per group, all attached at once; each commits its planned offsets in two calls
    (new offsets, then overwritten)."""
    consumers = [Consumer.attach(store, group) for group in groups]
    try:
        for consumer in consumers:
            offsets = plan[consumer.group]
            consumer.commit({queue: offset - 1 for queue, offset in offsets.items()})
            consumer.commit(offsets)
    finally:
        for consumer in consumers:
            consumer.close()
    out.put(len(groups))


def read_offsets(store: str, plan: dict[str, dict[tuple[str, int], int]], out: Any) -> None:
    found = {}
    for group, offsets in plan.items():
        with Consumer.attach(store, group) as consumer:
            found[group] = {queue: consumer.committed_offset(*queue) for queue in offsets}
    out.put(found)


def check_every_message(store: str, topics: list[str], queues: int) -> None:
    with Consumer.attach(store, "checker") as consumer:
        for topic in topics:
            for queue_id in range(queues):
                result = consumer.pull(topic, queue_id, 0, 32)
                assert result.status is GetMessageStatus.FOUND, (topic, queue_id, result.status)
                assert [m.body for m in result.messages] == [
                    body_of(topic, queue_id, n) for n in range(PER_QUEUE)
                ]
                assert [m.queue_offset for m in result.messages] == list(range(PER_QUEUE))
                assert result.max_offset == PER_QUEUE


def test_ten_thousand_queues_and_two_hundred_groups_every_offset_exact(tmp_path: Path) -> None:
    n_topics = int(os.environ.get("RMQ_SCALE_TOPICS", "200"))
    queues = int(os.environ.get("RMQ_SCALE_QUEUES", "50"))
    n_groups = int(os.environ.get("RMQ_SCALE_GROUPS", "200"))
    seed = int(os.environ.get("RMQ_SCALE_SEED", random.randrange(1 << 30)))
    print(f"scale seed {seed} (RMQ_SCALE_SEED={seed} replays it)")
    rnd = random.Random(seed)
    topics = topic_names(n_topics)
    all_queues = [(t, q) for t in topics for q in range(queues)]
    groups = [
        f"group-{g}" + ("_" * (255 - len(f"group-{g}")) if g % 10 == 0 else "") for g in range(n_groups)
    ]
    plan = {g: {queue: rnd.randint(1, PER_QUEUE) for queue in rnd.sample(all_queues, 200)} for g in groups}
    ctx = mp.get_context("spawn")
    settings = {
        "mappedFileSizeConsumeQueue": str(20 * 64),
        "flushConsumerOffsetInterval": "500",
        "defaultTopicQueueNums": str(queues),  # a send names only queues its topic has
    }
    with running_service(tmp_path, **settings) as service:
        out = ctx.Queue()
        workers = [
            ctx.Process(target=produce, args=(service.names.base, topics, queues, i, 2, out))
            for i in range(2)
        ]
        workers += [
            ctx.Process(target=commit, args=(service.names.base, groups[i::4], plan, out)) for i in range(4)
        ]
        for worker in workers:
            worker.start()
        results = [out.get(timeout=240) for _ in workers]
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        assert [r for r in results if isinstance(r, list) and r] == []
        reader = ctx.Process(target=read_offsets, args=(service.names.base, plan, out))
        reader.start()
        assert out.get(timeout=120) == plan  # every committed offset, read by another process
        reader.join(60)
        wrote = service.read(layout.WROTE_POSITION)
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= wrote, 120, "reput to dispatch everything"
        )
        check_every_message(service.names.base, topics, queues)
        tables = collect_status(service.config)["tables"]
        assert tables["maxConsumeQueueNum"]["used"] == len(all_queues)
        assert tables["maxConsumerOffsetNum"]["used"] == sum(len(offsets) for offsets in plan.values())
        assert tables["maxConsumerNum"]["used"] == 0  # every consumer closed
    with running_service(tmp_path, **settings) as service:  # the same store, restarted
        reader = ctx.Process(target=read_offsets, args=(service.names.base, plan, out))
        reader.start()
        assert out.get(timeout=120) == plan
        reader.join(60)
        check_every_message(service.names.base, topics, queues)
        with Producer.attach(service.names.base) as producer:  # queue offsets continue exactly
            topic, queue_id = all_queues[-1]
            assert producer.send(topic, b"after", queue_id=queue_id).queue_offset == PER_QUEUE
