"""Positions in the clients against a real store: `Consumer` seek, seek by time, position, end
offsets, lag, pause and resume; where a group with no committed offset starts
(`ConsumeFromWhere`); a `PushConsumer`'s suspend, resume, seek and lag."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rmq_mp.client.consumer import ConsumeFromWhere, Consumer, QueueNotAssignedError
from rmq_mp.client.process_queue import MessageQueue
from rmq_mp.client.push_consumer import PushConsumer
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError
from rmq_mp.format import message as m
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import ConsumeConcurrentlyStatus
from rmq_mp.put.producer import Producer
from shm import queue_offsets as qo
from tests.service import RunningService, poll_bodies, running_service, wait_in, wait_until

TOPIC = "Pos"
WAIT_S = 60


def send(service: RunningService, count: int, start: int = 0, *, topic: str = TOPIC, queues: int = 2) -> None:
    """``count`` messages ``b"<i>"`` round-robin over ``queues``, waited for until dispatched."""
    with Producer.attach(service.names.base) as producer:
        for i in range(start, start + count):
            assert producer.send(topic, str(i).encode(), queue_id=i % queues).ok
    with Consumer.attach(service.names.base, "probe") as probe:
        wait_until(
            lambda: (
                sum(probe.queues.get(s, qo.DISPATCHED) for _q, s in probe.queues.queues_of(topic))
                >= start + count
            ),
            WAIT_S,
            "reput to dispatch",
        )


def queue_messages(service: RunningService, queue_id: int) -> list[MessageExt]:
    with Consumer.attach(service.names.base, "reader") as reader:
        return reader.pull(TOPIC, queue_id, 0, 1000).messages


def test_seek_position_time_end_offsets_lag_pause(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        send(service, 40)
        q0 = queue_messages(service, 0)
        with Consumer.attach(service.names.base, "g") as consumer:
            with pytest.raises(QueueNotAssignedError):
                consumer.seek(TOPIC, 0, 3)  # nothing subscribed
            consumer.subscribe(TOPIC)
            assert len(poll_bodies(consumer, 40, WAIT_S, "40 messages")) == 40
            assert consumer.assignment() == {TOPIC: [0, 1]}
            assert consumer.end_offsets() == {(TOPIC, 0): 20, (TOPIC, 1): 20}
            assert consumer.beginning_offsets() == {(TOPIC, 0): 0, (TOPIC, 1): 0}
            assert consumer.position(TOPIC, 0) == 20
            assert consumer.lag() == {(TOPIC, 0): 0, (TOPIC, 1): 0}

            consumer.seek(TOPIC, 0, 15)
            assert consumer.position(TOPIC, 0) == 15
            assert consumer.lag()[(TOPIC, 0)] == 5
            again = consumer.poll(1.0)
            assert [(msg.queue_id, msg.queue_offset) for msg in again] == [(0, o) for o in range(15, 20)]
            with pytest.raises(InvalidArgumentError, match="outside its stored range"):
                consumer.seek(TOPIC, 0, 21)
            with pytest.raises(QueueNotAssignedError):
                consumer.seek(TOPIC, 5, 0)
            with pytest.raises(InvalidArgumentTypeError):
                consumer.pause([TOPIC])  # type: ignore[list-item]

            consumer.seek_to_beginning(TOPIC)
            assert consumer.lag() == {(TOPIC, 0): 20, (TOPIC, 1): 20}
            consumer.seek_to_end(TOPIC, 1)
            assert consumer.position(TOPIC, 1) == 20

            # By time: the first message stored at or after each of queue 0's store times.
            times = [msg.store_timestamp for msg in q0]
            for offset, ts in enumerate(times):
                first = times.index(ts)  # equal times: the first of them
                assert consumer.offsets_for_times({(TOPIC, 0): ts}) == {(TOPIC, 0): first}, offset
                nearest = consumer.search_offset(TOPIC, 0, ts)
                assert times[nearest] == ts
            assert consumer.offsets_for_times({(TOPIC, 0): times[-1] + 1, (TOPIC, 7): 0}) == {
                (TOPIC, 0): None,
                (TOPIC, 7): None,
            }
            consumer.seek_to_time(TOPIC, times[-1] + 1, queue_id=0)
            assert consumer.position(TOPIC, 0) == 20
            consumer.seek_to_time(TOPIC, times[10], queue_id=0)
            assert consumer.position(TOPIC, 0) == times.index(times[10])

            # Pause: polls skip queue 0 (kept by this member) until resumed.
            consumer.seek_to_beginning(TOPIC)
            consumer.pause([(TOPIC, 0)])
            assert consumer.paused() == {(TOPIC, 0)}
            got: list[MessageExt] = []
            while batch := consumer.poll(0.2):
                got.extend(batch)
            assert {msg.queue_id for msg in got} == {1}
            assert len(got) == 20
            assert consumer.lag() == {(TOPIC, 0): 20, (TOPIC, 1): 0}
            consumer.resume()
            got = consumer.poll(1.0, max_msgs=100)
            assert [(msg.queue_id, msg.queue_offset) for msg in got] == [(0, o) for o in range(20)]
            consumer.commit()
            assert consumer.committed_offset(TOPIC, 0) == 20


def first_poll(consumer: Consumer) -> list[int]:
    """The bodies (as ints) a subscribed consumer reads until a short poll brings nothing."""
    got: list[int] = []
    while batch := consumer.poll(0.3, max_msgs=100):
        got.extend(int(msg.body) for msg in batch)
    return sorted(got)


def test_consume_from_where_for_a_group_with_no_committed_offset(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        send(service, 20)
        times = [msg.store_timestamp for msg in queue_messages(service, 0)]
        store = service.names.base
        with Consumer.attach(store, "first") as first:
            first.subscribe(TOPIC)
            assert first_poll(first) == list(range(20))
            first.commit()
        where = ConsumeFromWhere
        with (
            Consumer.attach(store, "last", consume_from_where=where.CONSUME_FROM_LAST_OFFSET) as last,
            Consumer.attach(store, "first", consume_from_where=where.CONSUME_FROM_LAST_OFFSET) as committed,
            Consumer.attach(
                store, "timed", consume_from_where=where.CONSUME_FROM_TIMESTAMP, consume_timestamp_ms=times[5]
            ) as timed,
        ):
            for consumer in (last, committed, timed):
                consumer.subscribe(TOPIC)
            assert first_poll(last) == []  # from the end
            assert last.position(TOPIC, 0) == 10
            assert first_poll(committed) == []  # a committed offset wins over where
            start = timed.search_offset(TOPIC, 0, times[5])
            assert times[start] == times[5]
            assert [b for b in first_poll(timed) if b % 2 == 0] == list(range(2 * start, 20, 2))
            send(service, 6, 20)
            assert first_poll(last) == list(range(20, 26))
            assert first_poll(committed) == list(range(20, 26))
        # A retry topic starts from its beginning under LAST (RocketMQ's rule).
        retry = m.retry_topic("late")
        send(service, 3, topic=retry, queues=1)
        with Consumer.attach(store, "late", consume_from_where=where.CONSUME_FROM_LAST_OFFSET) as late:
            late.subscribe(retry)
            assert first_poll(late) == [0, 1, 2]
        with pytest.raises(InvalidArgumentTypeError):
            Consumer.attach(store, "bad", consume_from_where="LAST")  # type: ignore[arg-type]


def test_push_consumer_suspend_resume_seek_lag_and_from_last(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        send(service, 10)
        seen: list[MessageExt] = []
        lock = threading.Lock()

        def listener(msgs: list[MessageExt], _context: object) -> ConsumeConcurrentlyStatus:
            with lock:
                seen.extend(msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        def count() -> int:
            with lock:
                return len(seen)

        push = PushConsumer(
            service.names.base, "push", consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
        )
        push.subscribe(TOPIC)
        push.register_message_listener(listener)
        with push:
            push.start()
            assert push._thread is not None
            wait_until(lambda: len(push.end_offsets()) == 2, WAIT_S, "both queues held")
            send(service, 4, 10)
            wait_until(lambda: count() >= 4, WAIT_S, "the 4 sent after the start")
            assert sorted(int(msg.body) for msg in seen) == [10, 11, 12, 13]  # not the 10 before

            push.suspend()
            wait_in(push._thread, "_wait_resumed")
            send(service, 6, 14)
            wait_in(push._thread, "_wait_resumed")
            assert count() == 4
            assert push.suspended
            mq0 = MessageQueue(TOPIC, 0)
            assert push.lag() == {mq0: 3, MessageQueue(TOPIC, 1): 3}
            push.resume()
            wait_until(lambda: count() >= 10, WAIT_S, "the 6 sent while suspended")
            wait_until(lambda: sum(push.lag().values()) == 0, WAIT_S, "lag 0")

            push.seek(TOPIC, 0, 2).result(WAIT_S)
            wait_until(lambda: count() >= 18, WAIT_S, "queue 0 from offset 2 again")
            with lock:
                again = sorted(msg.queue_offset for msg in seen[10:] if msg.queue_id == 0)
            assert again == list(range(2, 10))
            with pytest.raises(InvalidArgumentError):
                push.seek(TOPIC, 0, 99).result(WAIT_S)
            assert push.end_offsets() == {mq0: 10, MessageQueue(TOPIC, 1): 10}
        assert push.end_offsets() == {}
        assert push.lag() == {}
