"""PushConsumer: RocketMQ's DefaultMQPushConsumer over a local store.

A user subscribes, registers a listener and starts; rmq-mp does the rest, as RocketMQ's client
does: one pull thread (PullMessageService) long-polls the group's queues through a `Consumer`
and hands the messages to a pool of consume threads (ConsumeMessageConcurrentlyService, or
ConsumeMessageOrderlyService: one queue to one thread at a time, in queue order). The offsets it
commits are each queue's lowest message still in flight (`ProcessQueue`), every
``persist_consumer_offset_interval_ms`` and at shutdown, so a crash re-delivers what was being
consumed and never skips what was not.

A message whose listener answers RECONSUME_LATER, raises, or holds it past ``consume_timeout_min``
is stored again on the group's retry topic with its next delay level (`send_back`), which the
consumer subscribes to by itself in CLUSTERING mode; after ``max_reconsume_times`` retries it goes
to the dead-letter topic ``%DLQ%<group>``. When even that put fails, the message is consumed
again locally 5 s later (RocketMQ's submitConsumeRequestLater). A broadcasting consumer only
logs a failed message, as RocketMQ's does. Orderly listeners answer
SUSPEND_CURRENT_QUEUE_A_MOMENT to have the same batch again after
``suspend_current_queue_time_ms``; past ``max_reconsume_times`` (unbounded by default, as
RocketMQ) a message goes to the dead-letter topic so the queue moves on.

The consumer's `Consumer` and `Producer` belong to the pull thread alone (neither is
thread-safe); consume threads touch only their `ProcessQueue` (its own lock), the counters and
the send-back producer (under ``_send_back_lock``).

Under CLUSTERING the `Consumer` shares the group's queues among its members (rmq_mp/client/rebalance.py).
Before a rebalance that may hand a queue to another member, this consumer commits every queue's
progress and lets running orderly batches finish (up to the consume timeout), so the next holder
repeats only what was in flight and an orderly queue is never consumed by two members at once;
a queue it lost is dropped, and late results for it are thrown away.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rmq_mp import validators as v
from rmq_mp.client import send_back
from rmq_mp.client.consumer import (
    ConsumeFromWhere,
    Consumer,
    check_consume_from_where,
    parse_tag_expression,
)
from rmq_mp.client.process_queue import MessageQueue, ProcessQueue
from rmq_mp.client.rebalance import REBALANCE_INTERVAL_MS, MessageModel
from rmq_mp.config.topics import is_dlq_topic
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError, StoreError, StoreNotRunningError
from rmq_mp.format import message as m
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store.running_store import START_TIMEOUT_S

log = logging.getLogger("rmq_mp.client.push_consumer")

POLL_WAIT_S = 0.5
"""The longest one long poll of the pull thread: a shutdown, a due retry or an offset persist
waits at most this long behind it (new messages wake it at once)."""
LOCAL_RETRY_DELAY_S = 5.0
"""A message whose send-back failed is consumed again this much later (submitConsumeRequestLater)."""
RETRY_AFTER_ERROR_S = 1.0
"""The pull thread's pause after a poll failed (the store restarting): it reattaches by itself."""
TIMEOUT_DELAY_LEVEL = 3
"""The delay level of a message sent back for its consume timeout (cleanExpireMsg)."""
JAVA_INT_MAX = 2**31 - 1


class ServiceState(enum.Enum):
    CREATE_JUST = "CREATE_JUST"
    RUNNING = "RUNNING"
    SHUTDOWN_ALREADY = "SHUTDOWN_ALREADY"


class ConsumerStateError(StoreError):
    """A call the consumer's state does not allow (RocketMQ's MQClientException "The
    PushConsumer service state not OK"): start twice, subscribe or register after start, start
    without a listener or a subscription."""


@dataclass(slots=True)
class ConsumeConcurrentlyContext:
    """What a concurrent listener may set: ``ack_index`` (the last message of a successful batch
    that counts as consumed; the rest are retried) and ``delay_level_when_next_consume`` (0:
    the broker's 3 + reconsume times; -1: straight to the dead-letter topic)."""

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0
    ack_index: int = JAVA_INT_MAX


@dataclass(slots=True)
class ConsumeOrderlyContext:
    """What an orderly listener may set: ``suspend_current_queue_time_ms`` for this suspension
    (-1: the consumer's ``suspend_current_queue_time_ms``)."""

    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_ms: int = -1


ConcurrentListener = Callable[[list[MessageExt], ConsumeConcurrentlyContext], ConsumeConcurrentlyStatus]
OrderlyListener = Callable[[list[MessageExt], ConsumeOrderlyContext], ConsumeOrderlyStatus]


@dataclass(order=True)
class _Later:
    due_s: float
    seq: int
    run: Callable[[], None] = field(compare=False)


class PushConsumer:
    """``PushConsumer(store, group)``, then `subscribe`, `register_message_listener`, `start`;
    `shutdown` (or a ``with`` block) stops it. Settings are RocketMQ's DefaultMQPushConsumer
    fields, with units in their names."""

    def __init__(
        self,
        store: str | os.PathLike[str],
        group: str,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        client_id: str | None = None,
        rebalance_interval_ms: int = REBALANCE_INTERVAL_MS,
        consume_thread_num: int = 4,
        consume_message_batch_max_size: int = 1,
        pull_batch_size: int = 32,
        pull_threshold_for_queue: int = 1000,
        max_reconsume_times: int = -1,
        consume_timeout_min: float = 15.0,
        suspend_current_queue_time_ms: int = 1000,
        persist_consumer_offset_interval_ms: int = 5000,
        start_timeout_s: float = START_TIMEOUT_S,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_timestamp_ms: int | None = None,
    ) -> None:
        self.store = store
        self.consume_from_where, self.consume_timestamp_ms = check_consume_from_where(
            consume_from_where, consume_timestamp_ms
        )
        self._suspended = threading.Event()
        """`suspend`: the pull thread pulls nothing (in-flight messages are still consumed)."""
        self.group = v.check_group(group)
        if not isinstance(message_model, MessageModel):
            raise InvalidArgumentTypeError(
                f"message_model must be a MessageModel, not {type(message_model).__name__}"
            )
        self.message_model = message_model
        self.broadcasting = message_model is MessageModel.BROADCASTING
        self.client_id = client_id
        self.rebalance_interval_ms = rebalance_interval_ms
        self.consume_thread_num = _bounded(consume_thread_num, "consume_thread_num", 1, 1000)
        self.consume_message_batch_max_size = _bounded(
            consume_message_batch_max_size, "consume_message_batch_max_size", 1, 1024
        )
        self.pull_batch_size = _bounded(pull_batch_size, "pull_batch_size", 1, 1024)
        self.pull_threshold_for_queue = _bounded(
            pull_threshold_for_queue, "pull_threshold_for_queue", 1, 65535
        )
        self.max_reconsume_times = _bounded(max_reconsume_times, "max_reconsume_times", -1, JAVA_INT_MAX)
        self.consume_timeout_ms = int(_positive(consume_timeout_min, "consume_timeout_min") * 60_000)
        self.suspend_current_queue_time_ms = _bounded(
            suspend_current_queue_time_ms, "suspend_current_queue_time_ms", 10, 30_000
        )
        self.persist_consumer_offset_interval_ms = _bounded(
            persist_consumer_offset_interval_ms, "persist_consumer_offset_interval_ms", 1, JAVA_INT_MAX
        )
        self.start_timeout_s = start_timeout_s
        self.subscriptions: dict[str, str] = {}
        self.stats: Counter[str] = Counter()
        """consumed, reconsume_later, sent_back, dead_lettered, local_retries, timed_out."""
        self.state = ServiceState.CREATE_JUST
        self._listener: Callable[..., Any] | None = None
        self._orderly = False
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set by consume threads when room frees up or a retry is due soon; the pull thread waits on it."""
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._committed: dict[MessageQueue, int] = {}
        self._later: list[_Later] = []
        self._later_lock = threading.Lock()
        self._seq = itertools.count()
        self._send_back_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._orderly_lock = threading.Lock()
        self._orderly_idle = threading.Condition(self._orderly_lock)
        """Notified when an orderly queue's consume thread lets go of it."""
        self._quiescing = False
        """Orderly: a rebalance is about to run; no new batch starts until it has."""
        self._persisted_at_s = 0.0
        self._expiry_checked_at_s = 0.0
        self.failure: BaseException | None = None
        """What stopped the pull thread, if anything did (it logs it too)."""

    # ------------------------------------------------------------------ setup

    @property
    def effective_max_reconsume_times(self) -> int:
        """-1 means 16 for a concurrent listener and unbounded (Integer.MAX_VALUE) for an orderly one."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return JAVA_INT_MAX if self._orderly else send_back.DEFAULT_MAX_RECONSUME_TIMES

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``'s messages whose tags match ``expression`` (``*`` or ``A || B``)."""
        self._require(ServiceState.CREATE_JUST, "subscribe")
        v.check_topic(topic, with_offsets=True)
        if not isinstance(expression, str):
            raise InvalidArgumentTypeError(f"expression must be a str, not {type(expression).__name__}")
        parse_tag_expression(expression)
        self.subscriptions[topic] = expression

    def register_message_listener(self, listener: Callable[..., Any], *, orderly: bool = False) -> None:
        """``listener(msgs, context)`` answers a `ConsumeConcurrentlyStatus` (or, with
        ``orderly``, a `ConsumeOrderlyStatus`); raising counts as RECONSUME_LATER (orderly:
        SUSPEND_CURRENT_QUEUE_A_MOMENT). It runs on the consume threads."""
        self._require(ServiceState.CREATE_JUST, "register_message_listener")
        if not callable(listener):
            raise InvalidArgumentTypeError(f"listener must be callable, not {type(listener).__name__}")
        self._listener = listener
        self._orderly = _flag(orderly, "orderly")

    def start(self) -> None:
        """Attach, subscribe (CLUSTERING: the group's retry topic too) and start pulling."""
        self._require(ServiceState.CREATE_JUST, "start")
        if self._listener is None:
            raise ConsumerStateError("start() before register_message_listener()")
        if not self.subscriptions:
            raise ConsumerStateError("start() before subscribe()")
        consumer = Consumer.attach(
            self.store, self.group, message_model=self.message_model, client_id=self.client_id,
            rebalance_interval_ms=self.rebalance_interval_ms, start_timeout_s=self.start_timeout_s,
            consume_from_where=self.consume_from_where, consume_timestamp_ms=self.consume_timestamp_ms,
        )  # fmt: skip
        try:
            producer = Producer.attach(self.store, start_timeout_s=self.start_timeout_s)
        except BaseException:
            consumer.close()
            raise
        self._consumer, self._producer = consumer, producer
        consumer.before_rebalance = self._before_release
        consumer.after_rebalance = self._after_rebalance
        for topic, expression in self.subscriptions.items():
            consumer.subscribe(topic, expression)
        if not self.broadcasting:
            consumer.subscribe(m.retry_topic(self.group), "*")
        self._executor = ThreadPoolExecutor(
            self.consume_thread_num, thread_name_prefix="ConsumeMessageThread"
        )
        self.state = ServiceState.RUNNING
        self._persisted_at_s = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"PullMessageService-{self.group}", daemon=True
        )
        self._thread.start()

    def shutdown(self) -> None:
        """Stop pulling, let running listeners finish (queued work is dropped: it is below the
        committed offset, so the next start consumes it), commit, detach. A second call does
        nothing."""
        if self.state is not ServiceState.RUNNING:
            self.state = ServiceState.SHUTDOWN_ALREADY
            return
        self.state = ServiceState.SHUTDOWN_ALREADY
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        assert self._executor is not None
        assert self._consumer is not None
        assert self._producer is not None
        self._executor.shutdown(wait=True, cancel_futures=True)
        try:
            self._persist_offsets()
        except StoreError as exc:
            log.warning("consumer group %s: offsets not committed at shutdown: %s", self.group, exc)
        finally:
            self._consumer.close()
            self._producer.close()

    def __enter__(self) -> PushConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _require(self, state: ServiceState, call: str) -> None:
        if self.state is not state:
            raise ConsumerStateError(f"{call}(): the consumer is {self.state.value}, not {state.value}")

    def committed_offsets(self) -> dict[MessageQueue, int]:
        """What this consumer committed last, by queue (for operators and tests)."""
        return dict(self._committed)

    # ------------------------------------------------------------------ positions

    def suspend(self) -> None:
        """Stop pulling (RocketMQ's DefaultMQPushConsumer.suspend): messages already fetched are
        still consumed and committed; this member keeps its queues (under CLUSTERING nobody
        else reads them meanwhile). Callable from any thread, a listener's included."""
        self._suspended.set()

    def resume(self) -> None:
        """Pull again after `suspend`."""
        self._suspended.clear()
        self._wake.set()

    pause = suspend
    """Kafka's name (for the whole consumer: `Consumer.pause` takes queues)."""

    @property
    def suspended(self) -> bool:
        return self._suspended.is_set()

    def seek(self, topic: str, queue_id: int, offset: int) -> Future[None]:
        """Consume this queue from ``offset`` on: done by the pull thread at its next turn (the
        returned future says when, or raises what `Consumer.seek` refused: the queue must be one
        this member holds, the offset within the queue's range). Messages of the queue still in
        flight are dropped (their results ignored) and the offset is committed at once, so a
        restart resumes there too. RocketMQ's push consumer has no seek (an operator's
        resetOffset does this); this is its client-side form."""
        self._require(ServiceState.RUNNING, "seek")
        done: Future[None] = Future()

        def apply() -> None:
            try:
                consumer = self._consumer
                assert consumer is not None
                consumer.seek(topic, queue_id, offset)
                mq = MessageQueue(topic, queue_id)
                pq = self._pqs.pop(mq, None)
                if pq is not None:
                    pq.dropped = True
                consumer.commit({(topic, queue_id): offset})
                self._committed[mq] = offset
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        self._later_run(0.0, apply)
        return done

    def end_offsets(self) -> dict[MessageQueue, int]:
        """Each queue this member holds: one past its last dispatched message (none unless
        running)."""
        consumer = self._consumer
        if consumer is None or self.state is not ServiceState.RUNNING:
            return {}
        return {mq: consumer._offsets(mq.topic, mq.queue_id)[2] for mq in list(self._pqs)}

    def lag(self) -> dict[MessageQueue, int]:
        """Messages not yet consumed, per queue this member holds: the queue's end less its
        lowest offset still in flight (what a restart would consume again from); none unless
        running."""
        consumer = self._consumer
        if consumer is None or self.state is not ServiceState.RUNNING:
            return {}
        return {
            mq: max(0, consumer._offsets(mq.topic, mq.queue_id)[2] - pq.commit_offset())
            for mq, pq in list(self._pqs.items())
        }

    # ------------------------------------------------------------------ pull thread

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self._stop.is_set():
            try:
                self._housekeeping()
                if self._suspended.is_set():
                    self._wait_resumed()
                    continue
                if self._in_flight() >= self.pull_threshold_for_queue * max(1, len(self._pqs)):
                    self._wake.wait(POLL_WAIT_S)  # flow control: consume threads set it as they finish
                    self._wake.clear()
                    continue
                msgs = consumer.poll(timeout_s=self._poll_wait_s(), max_msgs=self.pull_batch_size)
                self._accept(consumer, msgs)
            except StoreNotRunningError as exc:
                log.warning("consumer group %s: %s", self.group, exc)
                self._stop.wait(RETRY_AFTER_ERROR_S)
            except BaseException as exc:  # the thread must not die silently
                log.exception("consumer group %s: pull thread stopped", self.group)
                self.failure = exc
                return

    def _wait_resumed(self) -> None:
        """Suspended: wait for `resume` (or a due retry, a persist, a stop) instead of pulling."""
        self._wake.wait(POLL_WAIT_S)
        self._wake.clear()

    def _poll_wait_s(self) -> float:
        with self._later_lock:
            if self._later:
                return max(0.0, min(POLL_WAIT_S, self._later[0].due_s - time.monotonic()))
        return POLL_WAIT_S

    def _in_flight(self) -> int:
        return sum(pq.count() for pq in self._pqs.values())

    def _accept(self, consumer: Consumer, msgs: list[MessageExt]) -> None:
        """Put one poll's messages into their process queues and hand them to consume threads.
        Every queue this member reads gets a process queue that learns the pull's next offset (a
        filtered-out tail is progress to commit too); a queue it lost is dropped (its in-flight
        results are thrown away: the new holder reads them again from the committed offset)."""
        by_queue: dict[MessageQueue, list[MessageExt]] = {}
        for msg in msgs:
            by_queue.setdefault(MessageQueue(msg.topic, msg.queue_id), []).append(msg)
        for topic, queue_ids in consumer.assignment().items():
            next_offsets = consumer.subscriptions[topic].next_offsets
            for queue_id in queue_ids:
                mq = MessageQueue(topic, queue_id)
                next_offset = next_offsets.get(queue_id)
                batch = by_queue.get(mq)
                pq = self._pqs.get(mq)
                if pq is None:
                    if next_offset is None:
                        continue  # claimed, never committed and not read yet: nothing to commit
                    start = batch[0].queue_offset if batch else next_offset
                    pq = self._pqs[mq] = ProcessQueue(mq, start, orderly=self._orderly)
                if not batch:
                    if next_offset is not None:
                        pq.advance(next_offset)
                    continue
                pq.put(batch, batch[-1].queue_offset + 1 if next_offset is None else next_offset)
                if self._orderly:
                    self._schedule_orderly(pq)
                else:
                    size = self.consume_message_batch_max_size
                    for i in range(0, len(batch), size):
                        self._submit(self._consume_concurrently, pq, batch[i : i + size])
        self._drop_lost(consumer)

    def _drop_lost(self, consumer: Consumer) -> None:
        """Drop the process queues of queues this member no longer holds: results still coming
        for them are thrown away (the new holder reads them again from the committed offset)."""
        for mq in [mq for mq in self._pqs if not consumer.owns(mq.topic, mq.queue_id)]:
            self._pqs.pop(mq).dropped = True
            self._committed.pop(mq, None)

    def _before_release(self) -> None:
        """The group changed: the coming rebalance may hand queues to another member. Orderly
        batches finish first (no queue consumed by two members at once) and every queue's
        progress is committed, so the next holder repeats only what is still in flight."""
        if self._orderly:  # in the pull thread, inside the poll that rebalances
            with self._orderly_idle:
                self._quiescing = True
                deadline = time.monotonic() + self.consume_timeout_ms / 1000
                while any(pq.consuming for pq in self._pqs.values()) and time.monotonic() < deadline:
                    self._orderly_idle.wait(deadline - time.monotonic())
        self._persist_offsets()

    def _after_rebalance(self) -> None:
        """Right after the rebalance: the queues it released are dropped before any orderly
        batch starts again."""
        assert self._consumer is not None
        self._drop_lost(self._consumer)
        if self._orderly:
            with self._orderly_idle:
                self._quiescing = False
            for pq in list(self._pqs.values()):
                self._schedule_orderly(pq)

    def _housekeeping(self) -> None:
        now_s = time.monotonic()
        due: list[_Later] = []
        with self._later_lock:
            while self._later and self._later[0].due_s <= now_s:
                due.append(heapq.heappop(self._later))
        for item in due:
            item.run()
        if not self._orderly and now_s - self._expiry_checked_at_s >= min(
            1.0, self.consume_timeout_ms / 4000
        ):
            self._expiry_checked_at_s = now_s
            self._clean_expired()
        if (now_s - self._persisted_at_s) * 1000 >= self.persist_consumer_offset_interval_ms:
            self._persisted_at_s = now_s
            self._persist_offsets()

    def _persist_offsets(self) -> None:
        """Commit each queue's lowest offset still in flight, where it moved."""
        assert self._consumer is not None
        offsets = {}
        for mq, pq in list(self._pqs.items()):
            offset = pq.commit_offset()
            if self._committed.get(mq) != offset:
                offsets[(mq.topic, mq.queue_id)] = offset
        if offsets:
            self._consumer.commit(offsets)
            for (topic, queue_id), offset in offsets.items():
                self._committed[MessageQueue(topic, queue_id)] = offset

    def _clean_expired(self) -> None:
        """cleanExpireMsg: a message its listener has held past the consume timeout is sent back
        (delay level 3) and taken out of flight, so its queue's offset moves on."""
        for pq in list(self._pqs.values()):
            for msg in pq.expired(self.consume_timeout_ms):
                if self._send_back(msg, TIMEOUT_DELAY_LEVEL):
                    pq.remove([msg])
                    self._count("timed_out")
                    log.warning(
                        "consumer group %s: message %s of %s held past consumeTimeout (%d ms): sent back",
                        self.group, msg.msg_id, pq.mq, self.consume_timeout_ms,
                    )  # fmt: skip

    def _later_run(self, delay_s: float, run: Callable[[], None]) -> None:
        with self._later_lock:
            heapq.heappush(self._later, _Later(time.monotonic() + delay_s, next(self._seq), run))
        self._wake.set()

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._executor is not None
        if not self._stop.is_set():
            self._executor.submit(fn, *args)

    # ------------------------------------------------------------------ consume threads

    def _views(self, msgs: list[MessageExt]) -> list[MessageExt]:
        return [send_back.original_view(msg, self.group) for msg in msgs]

    def _consume_concurrently(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if pq.dropped or self._stop.is_set():
            return
        context = ConsumeConcurrentlyContext(pq.mq)
        pq.started(msgs)
        status: object
        try:
            status = self._listener_call(msgs, context)
        except Exception:
            log.exception(
                "consumer group %s: listener raised for %d messages of %s", self.group, len(msgs), pq.mq
            )
            status = None
        if not isinstance(status, ConsumeConcurrentlyStatus):
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if pq.dropped:
            return  # the queue moved to another member: it consumes from the committed offset
        ack = (
            min(context.ack_index, len(msgs) - 1)
            if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS
            else -1
        )
        done, failed = msgs[: ack + 1], msgs[ack + 1 :]
        again: list[MessageExt] = []
        if failed:
            self._count("reconsume_later", len(failed))
            if self.broadcasting:
                for msg in failed:
                    log.warning(
                        "consumer group %s (broadcasting): message %s failed, not retried",
                        self.group,
                        msg.msg_id,
                    )
            else:
                for msg in failed:
                    if not self._send_back(msg, context.delay_level_when_next_consume):
                        again.append(msg)
        retried = {id(msg) for msg in again}
        finished = pq.remove(done + [msg for msg in failed if id(msg) not in retried])
        done_ids = {id(msg) for msg in done}
        self._count("consumed", sum(1 for msg in finished if id(msg) in done_ids))
        if again:
            for msg in again:
                msg.reconsume_times += 1
            self._count("local_retries", len(again))
            self._later_run(LOCAL_RETRY_DELAY_S, lambda: self._submit(self._consume_concurrently, pq, again))
        self._wake.set()

    def _listener_call(self, msgs: list[MessageExt], context: Any) -> object:
        assert self._listener is not None
        return self._listener(self._views(msgs), context)

    def _send_back(self, msg: MessageExt, delay_level: int) -> bool:
        """Store ``msg`` again on the retry topic (or the dead-letter topic after its last retry);
        False when the put failed (the message is then consumed again locally)."""
        assert self._producer is not None
        back = send_back.message_back(
            msg, self.group, delay_level=delay_level, max_reconsume_times=self.effective_max_reconsume_times
        )
        try:
            with self._send_back_lock:
                result = self._producer.send_batch([back])
        except StoreError as exc:
            log.warning("consumer group %s: send back of %s failed: %s", self.group, msg.msg_id, exc)
            return False
        if not result.ok:
            log.warning(
                "consumer group %s: send back of %s refused: %s", self.group, msg.msg_id, result[0].reason
            )
            return False
        self._count("dead_lettered" if is_dlq_topic(back.topic) else "sent_back")
        return True

    def _schedule_orderly(self, pq: ProcessQueue) -> None:
        """One consume thread per queue at a time, none while the queue is suspended."""
        with self._orderly_lock:
            if (
                self._quiescing
                or pq.consuming
                or pq.dropped
                or pq.suspended_until_s > time.monotonic()
                or not pq.waiting()
            ):
                return
            pq.consuming = True
        self._submit(self._consume_orderly, pq)

    def _consume_orderly(self, pq: ProcessQueue) -> None:
        try:
            while not pq.dropped and not self._stop.is_set() and not self._quiescing:
                msgs = pq.take(self.consume_message_batch_max_size)
                if not msgs:
                    break
                context = ConsumeOrderlyContext(pq.mq)
                status: object
                try:
                    status = self._listener_call(msgs, context)
                except Exception:
                    log.exception("consumer group %s: orderly listener raised for %s", self.group, pq.mq)
                    status = None
                if pq.dropped:
                    return
                if status is ConsumeOrderlyStatus.SUCCESS:
                    self._count("consumed", len(pq.remove(msgs)))
                    continue
                self._count("reconsume_later", len(msgs))
                if not self._suspend(pq, msgs, context):
                    continue
                break
        finally:
            with self._orderly_idle:
                pq.consuming = False
                self._orderly_idle.notify_all()
            self._wake.set()
        self._schedule_orderly(pq)

    def _suspend(self, pq: ProcessQueue, msgs: list[MessageExt], context: ConsumeOrderlyContext) -> bool:
        """checkReconsumeTimes: a message past its retries goes to the dead-letter topic (its
        queue moves on); the rest are consumed again after the suspension. False when nothing is
        left to consume again."""
        limit = self.effective_max_reconsume_times
        again = []
        for msg in msgs:
            if msg.reconsume_times >= limit and self._send_back(msg, -1):
                pq.remove([msg])
            else:
                msg.reconsume_times += 1
                again.append(msg)
        if not again:
            return False
        pq.take_again(again)
        pause_ms = context.suspend_current_queue_time_ms
        if pause_ms < 0:
            pause_ms = self.suspend_current_queue_time_ms
        pq.suspended_until_s = time.monotonic() + pause_ms / 1000
        self._later_run(pause_ms / 1000, lambda: self._schedule_orderly(pq))
        return True

    def _count(self, what: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[what] += n


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentTypeError(f"{what} must be a bool, not {type(value).__name__}")
    return value


def _bounded(value: object, what: str, low: int, high: int) -> int:
    number = v.integer(value, what)
    if not low <= number <= high:
        raise InvalidArgumentError(f"{what} {number} must be from {low} to {high}")
    return number


def _positive(value: object, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgumentTypeError(f"{what} must be a number, not {type(value).__name__}")
    if not 0 < value < float("inf"):
        raise InvalidArgumentError(f"{what} {value!r} must be a positive, finite number")
    return float(value)


__all__: Sequence[str] = (
    "ConsumeConcurrentlyContext",
    "ConsumeOrderlyContext",
    "ConsumerStateError",
    "MessageQueue",
    "PushConsumer",
    "ServiceState",
)
