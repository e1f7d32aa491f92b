"""PushConsumer against a real store: listeners on a thread pool, offsets committed by
themselves, failed messages retried through the group's retry topic, dead letters, the consume
timeout, orderly queues, and argument and state checks."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.client.process_queue import MessageQueue
from rmq_mp.client.push_consumer import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumerStateError,
    PushConsumer,
)
from rmq_mp.client.rebalance import MessageModel
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError
from rmq_mp.format import message as m
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, GetMessageStatus
from rmq_mp.put.producer import Producer
from tests.service import ROOT, RunningService, running_service, wait_until

SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
FAST_DELAYS = {"messageDelayLevel": "1s 1s 1s 1s 1s 1s"}
"""Every retry one second later (levels past the last are clamped to it)."""
WAIT_S = 120


def send(service: RunningService, topic: str, count: int, *, queues: int = 4) -> list[str]:
    """``count`` messages with bodies ``b"<i>"`` over ``queues`` queues; their UNIQ_KEYs."""
    with Producer.attach(service.names.base) as producer:
        keys = []
        for i in range(count):
            result = producer.send(topic, str(i).encode(), tags="T", queue_id=i % queues)
            assert result.ok, result
            keys.append(result.msg_id)
        return keys


class Seen:
    """What a listener was handed, from any consume thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.msgs: list[MessageExt] = []

    def add(self, msgs: list[MessageExt]) -> None:
        with self.lock:
            self.msgs.extend(msgs)

    def answer(self, msgs: list[MessageExt], status: ConsumeConcurrentlyStatus) -> ConsumeConcurrentlyStatus:
        """A listener's body: record ``msgs``, answer ``status``."""
        self.add(msgs)
        return status

    def count(self) -> int:
        with self.lock:
            return len(self.msgs)

    def bodies(self) -> Counter[bytes]:
        with self.lock:
            return Counter(msg.body for msg in self.msgs)


def read_all(service: RunningService, topic: str) -> list[MessageExt]:
    """Every message of ``topic`` through a plain consumer (queue by queue from 0)."""
    with Consumer.attach(service.names.base, "reader") as reader:
        found = []
        for queue_id, _slot in reader.queues.queues_of(topic):
            offset = 0
            while (r := reader.pull(topic, queue_id, offset, 32)).status is GetMessageStatus.FOUND:
                found.extend(r.messages)
                offset = r.next_begin_offset
        return found


def test_every_message_is_consumed_once_and_the_offsets_are_committed(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        send(service, "Orders", 200)
        seen = Seen()

        def listener(
            msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeConcurrentlyStatus:
            assert context.message_queue == (msgs[0].topic, msgs[0].queue_id)
            seen.add(msgs)
            return SUCCESS

        consumer = PushConsumer(service.names.base, "g1", consume_message_batch_max_size=4)
        consumer.subscribe("Orders", "*")
        consumer.register_message_listener(listener)
        with consumer:
            consumer.start()
            wait_until(lambda: seen.count() >= 200, WAIT_S, "200 messages consumed")
        assert seen.bodies() == Counter(str(i).encode() for i in range(200))
        assert consumer.stats["consumed"] == 200
        assert {
            (mq.topic, mq.queue_id): o
            for mq, o in consumer.committed_offsets().items()
            if mq.topic == "Orders"
        } == {("Orders", q): 50 for q in range(4)}
        with Consumer.attach(service.names.base, "g1") as plain:
            assert [plain.committed_offset("Orders", q) for q in range(4)] == [50] * 4

        # A second start of the group consumes only what came after its commit.
        send(service, "Orders", 8)
        again = Seen()
        second = PushConsumer(service.names.base, "g1")
        second.subscribe("Orders", "*")
        second.register_message_listener(lambda msgs, _c: again.answer(msgs, SUCCESS))
        with second:
            second.start()
            wait_until(lambda: again.count() >= 8, WAIT_S, "8 new messages")
        assert sorted(msg.queue_offset for msg in again.msgs) == [50, 50, 50, 50, 51, 51, 51, 51]


def test_a_failed_message_is_retried_with_its_count_then_dead_lettered(tmp_path: Path) -> None:
    with running_service(tmp_path, **FAST_DELAYS) as service:
        send(service, "Orders", 6, queues=2)
        seen = Seen()
        attempts: dict[bytes, list[int]] = defaultdict(list)
        attempted_ms: dict[bytes, list[int]] = defaultdict(list)

        def listener(msgs: list[MessageExt], _c: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            msg = msgs[0]
            assert msg.topic == "Orders"  # a retry is handed over under its first topic
            seen.add(msgs)
            with seen.lock:
                attempts[msg.body].append(msg.reconsume_times)
                attempted_ms[msg.body].append(int(time.time() * 1000))
            number = int(msg.body)
            if number == 0:
                raise RuntimeError("always fails")  # counts as RECONSUME_LATER
            if number == 1 and msg.reconsume_times < 1:
                return LATER
            return SUCCESS

        consumer = PushConsumer(service.names.base, "g2", max_reconsume_times=2)
        consumer.subscribe("Orders", "*")
        consumer.register_message_listener(listener)
        with consumer:
            consumer.start()
            wait_until(lambda: consumer.stats["dead_lettered"] >= 1, WAIT_S, "message 0 dead-lettered")
            wait_until(lambda: seen.count() >= 6 + 2 + 1, WAIT_S, "every attempt")
        assert attempts[b"0"] == [0, 1, 2]
        assert attempts[b"1"] == [0, 1]
        for body in (b"0", b"1"):  # each retry waited out its delay level (1 s here), never less
            times = attempted_ms[body]
            assert all(later - earlier >= 1000 for earlier, later in itertools.pairwise(times)), times
        assert all(attempts[str(i).encode()] == [0] for i in range(2, 6))
        assert consumer.stats["sent_back"] == 3
        assert consumer.stats["dead_lettered"] == 1

        retries = read_all(service, m.retry_topic("g2"))
        assert sorted((msg.body, msg.reconsume_times) for msg in retries) == [(b"0", 1), (b"0", 2), (b"1", 1)]
        for msg in retries:
            assert msg.properties[m.PROPERTY_RETRY_TOPIC] == "Orders"
            assert m.PROPERTY_ORIGIN_MESSAGE_ID in msg.properties
            assert msg.properties[m.PROPERTY_REAL_TOPIC] == m.retry_topic("g2")  # through the schedule topic
        # dead_lettered counts an acknowledged put; it is readable once reput dispatched it
        wait_until(
            lambda: len(read_all(service, m.dlq_topic("g2"))) == 1, WAIT_S, "the dead letter dispatched"
        )
        (dead,) = read_all(service, m.dlq_topic("g2"))
        assert (dead.body, dead.reconsume_times) == (b"0", 3)
        assert dead.properties[m.PROPERTY_RETRY_TOPIC] == "Orders"
        assert (
            dead.properties[m.PROPERTY_ORIGIN_MESSAGE_ID]
            == next(r for r in retries if r.body == b"0").properties[m.PROPERTY_ORIGIN_MESSAGE_ID]
        )
    topics = TopicConfigManager(service.root / "config" / "topics.json")
    topics.load()
    for name in (m.retry_topic("g2"), m.dlq_topic("g2")):  # created with one queue, as the broker does
        found = topics.get(name)
        assert found is not None
        assert (found.read_queue_nums, found.write_queue_nums) == (1, 1)


def test_a_message_held_past_the_consume_timeout_is_sent_back_and_its_queue_moves_on(tmp_path: Path) -> None:
    with running_service(tmp_path, **FAST_DELAYS) as service:
        send(service, "Orders", 3, queues=1)
        release = threading.Event()
        seen = Seen()

        def listener(msgs: list[MessageExt], _c: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            seen.add(msgs)
            if msgs[0].body == b"0" and msgs[0].reconsume_times == 0:
                release.wait(WAIT_S)  # held past the timeout; its late answer must not count
            return SUCCESS

        consumer = PushConsumer(
            service.names.base, "g3", consume_timeout_min=0.01, persist_consumer_offset_interval_ms=50
        )
        consumer.subscribe("Orders", "*")
        consumer.register_message_listener(listener)
        with consumer:
            consumer.start()
            wait_until(lambda: consumer.stats["timed_out"] == 1, WAIT_S, "the held message timed out")
            wait_until(
                lambda: consumer.committed_offsets().get(MessageQueue("Orders", 0)) == 3,
                WAIT_S,
                "the queue's offset past it",
            )
            wait_until(
                lambda: (b"0", 1) in {(x.body, x.reconsume_times) for x in seen.msgs}, WAIT_S, "the retry"
            )
            release.set()
        assert consumer.stats["consumed"] == 3  # 1, 2 and the retry of 0; the late answer is dropped


def test_an_orderly_listener_sees_each_queue_in_order_and_a_suspended_batch_again(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        send(service, "Orders", 120, queues=3)
        order: dict[int, list[int]] = defaultdict(list)
        busy: set[int] = set()
        lock = threading.Lock()
        suspended = threading.Event()
        suspended_batch: list[int] = []

        def listener(msgs: list[MessageExt], context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
            queue_id = context.message_queue.queue_id
            with lock:
                assert queue_id not in busy, "two threads in one queue"
                busy.add(queue_id)
            try:
                offsets = [msg.queue_offset for msg in msgs]
                if queue_id == 1 and 9 in offsets and not suspended.is_set():
                    suspended_batch.extend(offsets)
                    suspended.set()
                    context.suspend_current_queue_time_ms = 20
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                with lock:
                    order[queue_id].extend(msg.queue_offset for msg in msgs)
                return ConsumeOrderlyStatus.SUCCESS
            finally:
                with lock:
                    busy.discard(queue_id)

        consumer = PushConsumer(
            service.names.base, "g4", consume_message_batch_max_size=3, consume_thread_num=4
        )
        consumer.subscribe("Orders", "*")
        consumer.register_message_listener(listener, orderly=True)
        with consumer:
            consumer.start()
            wait_until(lambda: sum(len(o) for o in list(order.values())) >= 120, WAIT_S, "120 in order")
        assert order == {q: list(range(40)) for q in range(3)}
        assert suspended.is_set()  # and its batch was consumed again, in order (above)
        assert consumer.stats["reconsume_later"] == len(suspended_batch)


def test_a_broadcasting_consumer_does_not_retry(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        send(service, "Orders", 4, queues=1)
        seen = Seen()
        consumer = PushConsumer(service.names.base, "g5", message_model=MessageModel.BROADCASTING)
        consumer.subscribe("Orders", "*")
        consumer.register_message_listener(lambda msgs, _c: seen.answer(msgs, LATER))
        with consumer:
            consumer.start()
            wait_until(lambda: consumer.stats["reconsume_later"] >= 4, WAIT_S, "4 failures")
        assert consumer.stats["sent_back"] == 0
        assert seen.count() == 4
        assert read_all(service, m.retry_topic("g5")) == []


def test_arguments_and_states_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        PushConsumer("x", "")
    with pytest.raises(InvalidArgumentError):
        PushConsumer("x", "g", consume_thread_num=0)
    with pytest.raises(InvalidArgumentTypeError):
        PushConsumer("x", "g", max_reconsume_times="16")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        PushConsumer("x", "g", consume_timeout_min=float("nan"))
    consumer = PushConsumer("x", "g")
    with pytest.raises(InvalidArgumentError):
        consumer.subscribe("", "*")
    with pytest.raises(InvalidArgumentTypeError):
        consumer.register_message_listener("not callable")  # type: ignore[arg-type]
    with pytest.raises(ConsumerStateError, match="register_message_listener"):
        consumer.start()
    consumer.register_message_listener(lambda msgs, c: SUCCESS)
    with pytest.raises(ConsumerStateError, match="subscribe"):
        consumer.start()
    consumer.shutdown()  # never started: nothing to stop
    with pytest.raises(ConsumerStateError):
        consumer.subscribe("Orders")


def test_an_orderly_queue_moves_to_a_joining_member_where_the_first_stopped(tmp_path: Path) -> None:
    """Two orderly members of one group: the second joins while the first is consuming. Every
    message is consumed exactly once (the first commits and finishes its batches before it lets
    a queue go), each queue in order, and no queue by both members at once."""
    with running_service(tmp_path) as service:
        send(service, "Orders", 400, queues=8)
        lock = threading.Lock()
        log: list[tuple[str, int, int, float, float]] = []  # member, queue, offset, start, end

        def listener_for(
            member: str,
        ) -> Callable[[list[MessageExt], ConsumeOrderlyContext], ConsumeOrderlyStatus]:
            def listener(msgs: list[MessageExt], _c: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
                start = time.monotonic()
                time.sleep(0.002)  # work that takes time, so the join lands mid-stream
                end = time.monotonic()
                with lock:
                    log.extend((member, msg.queue_id, msg.queue_offset, start, end) for msg in msgs)
                return ConsumeOrderlyStatus.SUCCESS

            return listener

        members = []
        for name in ("a", "b"):
            member = PushConsumer(service.names.base, "g6", consume_message_batch_max_size=2)
            member.subscribe("Orders", "*")
            member.register_message_listener(listener_for(name), orderly=True)
            members.append(member)
        try:
            members[0].start()
            wait_until(lambda: len(log) >= 60, WAIT_S, "the first member under way")
            members[1].start()
            wait_until(lambda: len(log) >= 400, WAIT_S, "every message")
        finally:
            for member in members:
                member.shutdown()
        consumed = Counter((queue, offset) for _m, queue, offset, _s, _e in log)
        assert consumed == Counter({(q, o): 1 for q in range(8) for o in range(50)})
        assert {member for member, *_ in log} == {"a", "b"}
        for queue in range(8):
            records = sorted((r for r in log if r[1] == queue), key=lambda r: r[2])
            assert [r[2] for r in records] == list(range(50))
            for before, after in itertools.pairwise(records):
                if before[0] != after[0]:
                    assert before[4] <= after[3], f"queue {queue} consumed by both members at once"


def test_push_members_in_processes_lose_nothing_across_kill_9_of_one(tmp_path: Path) -> None:
    """Two push-consumer processes of one group; one is killed with SIGKILL mid-stream. Every
    message is consumed at least once; repeated are only messages the dead member consumed after
    its last commit (200 ms apart) and those running when a queue moved at the join."""
    with running_service(tmp_path) as service:
        send(service, "Orders", 3000, queues=8)
        outs = [tmp_path / f"member{i}.txt" for i in range(2)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.push_member", service.names.base, "g7", "Orders", str(out)],
                cwd=ROOT,
            )
            for out in outs
        ]

        def bodies(out: Path) -> list[str]:
            return out.read_text().splitlines() if out.exists() else []

        try:
            wait_until(
                lambda: len(bodies(outs[0])) >= 300 and len(bodies(outs[1])) >= 300,
                WAIT_S,
                "both members at work",
            )
            procs[0].kill()
            procs[0].wait(30)
            wait_until(
                lambda: {*bodies(outs[0]), *bodies(outs[1])} >= {str(i) for i in range(3000)},
                WAIT_S,
                "every message",
            )
            procs[1].terminate()
            assert procs[1].wait(60) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(30)
        seen = Counter(body for out in outs for body in bodies(out))
        assert set(seen) == {str(i) for i in range(3000)}
        # Repeated: what the dead member consumed after its last commit, and what a member had
        # finished above a message still in flight when it handed a queue over at the join (its
        # commit is the lowest offset in flight, as RocketMQ's; one slow message lets the other
        # consume threads run ahead of it, so that part has no fixed size: 9 from a member's
        # 4 threads, seen in CI). Either way a repeat lies in a queue that changed hands, and
        # every queue the dead member held did: at the join or at its death.
        changed_hands = {int(body) % 8 for body in bodies(outs[0])}
        repeated_elsewhere = sorted(
            int(b) for b, n in seen.items() if n > 1 and int(b) % 8 not in changed_hands
        )
        assert not repeated_elsewhere, (
            f"repeats in queues that never changed hands: {repeated_elsewhere[:10]}"
        )
        # One message can be both: running on a member when its queue moved at the join, and
        # consumed again by the dead member after its last commit (three times in all; seen in
        # CI when member 1 joined first and handed queues 0-3 to member 0). Never more.
        assert all(n <= 3 for n in seen.values())
