"""Scheduler: delivers delayed messages when due (RocketMQ 4.9.8's ScheduleMessageService).

A delayed put is stored on SCHEDULE_TOPIC_XXXX queue ``level - 1`` with its delivery time as
the ConsumeQueue tags code (`rmq_mp.store.schedule`). For each level this worker reads its queue from
the level's offset in the schedule table (`shm.schedule_offsets`), and for each entry whose
delivery time has come reads the record, builds the real message (`schedule.message_timeup`)
and puts it through the normal put path (a `Producer` of its own: the put lock, journal and
wake-ups as any producer's), then advances the offset. The first entry not yet due stops its
level: one level has one delay, so its entries are in due order. A level is done when it
reaches what reput dispatched.

Sleeping: until the earliest delivery time of any level (`interval_s`), or until reput wakes
it on a dispatch to SCHEDULE_TOPIC_XXXX (`has_work` sees a queue's dispatched offset move),
never polling.

Crash contract (RocketMQ's): the offset moves only after the put of that message succeeded,
and delayOffset.json is persisted from the table by the supervisor, so a kill -9 of this
worker (its restart reads the table) or of the supervisor (the next start reads the file)
delivers a message again at worst, never loses one, and never delivers one early.

A put refused for good (MESSAGE_ILLEGAL: the real topic or queue is refused, or REAL_TOPIC
is missing) is logged and the entry skipped, as RocketMQ drops a message whose
``messageTimeup`` fails; any other refusal (the store stopping, busy, a full disk) is retried
after `RETRY_S` from the same entry.
"""

from __future__ import annotations

import logging
import sys
import time

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.store_config import BrokerRole
from rmq_mp.errors import StoreError, StoreNotRunningError
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store import schedule
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm import queue_offsets as qo
from shm import schedule_offsets as so
from shm.layout import Role
from shm.pointer_table import now_ms
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.scheduler")

RETRY_S = 0.1
"""After a refused put, as RocketMQ's DELAY_FOR_A_WHILE (100 ms)."""
IDLE_S = 10.0
"""The longest sleep with nothing due: reput wakes the scheduler on a dispatch to the schedule
topic, and the service loop looks at `has_work` every half second besides."""
BATCH = 32
"""Due messages read and put under one lock hold at most."""
GROUP = "SCHEDULE_SERVICE"
"""The group name of the scheduler's reader (it commits nothing)."""


class SchedulerService(ServiceLoop):
    role = "scheduler"

    def on_start(self) -> None:
        self.schedule = self.store.shm.schedule
        self.queues = self.store.shm.queues
        self.levels_ms = self.store.config.delay_levels_ms
        self.levels = min(self.schedule.levels, len(self.levels_ms))
        self.seen_dispatched = [-1] * self.levels
        """Each level's queue end as the last pass saw it: `has_work` when it moved."""
        self.next_due_ms = [so.NONE_DUE] * self.levels
        self.retry_at = 0.0
        self.reader: Consumer | None = None
        self.producer: Producer | None = None

    # ------------------------------------------------------------------ waiting

    def _running(self) -> bool:
        return self.table.get(layout.STATE) == layout.RUNNING and not self._slave()

    def _slave(self) -> bool:
        """A SLAVE delivers nothing: its master does, and the metadata channel raises the levels'
        offsets to the master's (workers/ha_meta.py); once promoted (rmq-admin promote) it does."""
        return self.store.config.broker_role is BrokerRole.SLAVE and self.table.get(
            layout.BROKER_ROLE_NOW
        ) not in (layout.ROLE_CODES["ASYNC_MASTER"], layout.ROLE_CODES["SYNC_MASTER"])

    def _dispatched(self, queue_id: int) -> int:
        slot = self.queues.find(schedule.SCHEDULE_TOPIC, queue_id)
        return -1 if slot < 0 else self.queues.get(slot, qo.DISPATCHED)

    def _earliest_due_ms(self) -> int:
        due = [d for d in self.next_due_ms if d != so.NONE_DUE]
        return min(due) if due else -1

    def interval_s(self) -> float:
        if not self._running():
            return (
                RETRY_S  # deliveries wait for state RUNNING (producers are refused before it), or a promotion
            )
        wait_s = IDLE_S
        if (earliest := self._earliest_due_ms()) >= 0:
            wait_s = min(wait_s, max(0.0, (earliest - now_ms()) / 1000))
        if self.retry_at:
            wait_s = min(wait_s, max(0.0, self.retry_at - time.monotonic()))
        return wait_s

    def has_work(self) -> bool:
        if not self._running():
            return False
        if self.retry_at and time.monotonic() >= self.retry_at:
            return True
        if 0 <= self._earliest_due_ms() <= now_ms():
            return True
        return any(self._dispatched(q) != self.seen_dispatched[q] for q in range(self.levels))

    # ------------------------------------------------------------------ work

    def do_work(self) -> None:
        if not self._running():
            return
        self.retry_at = 0.0
        try:
            for queue_id in range(self.levels):
                if not self._deliver_level(queue_id):
                    self.retry_at = time.monotonic() + RETRY_S
                    return
        except StoreNotRunningError:  # the store began to stop during the pass: nothing lost
            self.retry_at = time.monotonic() + RETRY_S

    def _clients(self) -> tuple[Consumer, Producer]:
        """A reader and a producer of this worker's own, attached as client processes attach
        (they write shared fields in those roles), at the first delayed message: a store that
        never delays one spends no consumer or producer slot (maxConsumerNum, maxProducerNum)."""
        if self.reader is None:
            self.reader = Consumer(RunningStore.attach(self.store.names.base, Role.CONSUMER), GROUP)
        if self.producer is None:
            self.producer = Producer(
                RunningStore.attach(self.store.names.base, Role.PRODUCER, writable_log=True)
            )
        return self.reader, self.producer

    def _deliver_level(self, queue_id: int) -> bool:
        """Deliver what is due in one level's queue; False when a put must be retried."""
        level = schedule.delay_level_of(queue_id)
        dispatched = self._dispatched(queue_id)
        self.seen_dispatched[queue_id] = dispatched
        offset = self.schedule.get(queue_id, so.OFFSET)
        delay_ms = self.levels_ms[queue_id]
        ok = True
        if offset < dispatched:
            reader, producer = self._clients()
        while offset < dispatched:
            entries = reader.entries(schedule.SCHEDULE_TOPIC, queue_id, offset, BATCH)
            if not entries:  # below the queue's minimum (cleaned): RocketMQ moves up to it
                minimum = self.queues.get(self.queues.find(schedule.SCHEDULE_TOPIC, queue_id), qo.MIN_OFFSET)
                if minimum > offset:
                    log.error(
                        "delay level %d: offset %d is below its queue's minimum %d", level, offset, minimum
                    )
                    offset = minimum
                    self._publish(queue_id, offset, 0)
                    continue
                ok = False  # dispatched but not readable yet: looked at again after RETRY_S
                break
            current_ms = now_ms()
            due = 0
            for _phy, _size, tags_code in entries:
                if schedule.correct_deliver_timestamp(current_ms, tags_code, delay_ms) > current_ms:
                    self.next_due_ms[queue_id] = tags_code
                    break
                due += 1
            if due == 0:
                break
            offset, ok = self._deliver(reader, producer, queue_id, offset, due)
            if not ok or due < len(entries):
                break
        if offset >= dispatched:
            self.next_due_ms[queue_id] = so.NONE_DUE
        self.schedule.set(queue_id, so.NEXT_DUE_MS, self.next_due_ms[queue_id])
        return ok

    def _deliver(
        self, reader: Consumer, producer: Producer, queue_id: int, offset: int, count: int
    ) -> tuple[int, bool]:
        """Put the ``count`` due messages from ``offset`` on their real topics; (the offset
        reached, False when a put must be retried)."""
        level = schedule.delay_level_of(queue_id)
        got = reader.pull(schedule.SCHEDULE_TOPIC, queue_id, offset, count)
        if got.status is not GetMessageStatus.FOUND:
            # Unreadable records (skipped and reported by the reader: RocketMQ skips a message
            # it cannot look up) or a queue cleaned below the offset: go on past them. Anything
            # else makes no progress: retried after RETRY_S, never a loop.
            if got.next_begin_offset > offset:
                log.error(
                    "delay level %d: entries %d..%d unreadable (%s); skipped",
                    level, offset, got.next_begin_offset - 1, got.status.name,
                )  # fmt: skip
                self._publish(queue_id, got.next_begin_offset, 0)
                return got.next_begin_offset, True
            return offset, False
        messages = []
        for ext in got.messages:
            try:
                messages.append((ext.queue_offset, schedule.message_timeup(ext)))
            except (KeyError, ValueError) as exc:
                log.error(
                    "delay level %d offset %d: %s has no usable REAL_TOPIC/REAL_QID (%s); dropped",
                    level, ext.queue_offset, ext.msg_id, exc,
                )  # fmt: skip
        results = producer.send_batch([message for _offset, message in messages]) if messages else []
        reached, delivered = got.next_begin_offset, 0
        for (queue_offset, message), result in zip(messages, results, strict=True):
            if result.ok:
                delivered += 1
                continue
            if result.status is PutMessageStatus.MESSAGE_ILLEGAL:
                log.error(
                    "delay level %d offset %d: %s queue %d refused the delivery (%s); dropped",
                    level, queue_offset, message.topic, message.queue_id, result.reason,
                )  # fmt: skip
                continue
            log.warning(
                "delay level %d offset %d: delivery to %s refused (%s: %s); retrying",
                level, queue_offset, message.topic, result.status.name, result.reason,
            )  # fmt: skip
            reached = queue_offset
            break
        self._publish(queue_id, reached, delivered)
        return reached, reached == got.next_begin_offset

    def _publish(self, queue_id: int, offset: int, delivered: int) -> None:
        """The level's progress, after its puts: what delayOffset.json gets at the next persist."""
        if delivered:  # the count before the progress: whoever sees the offset moved sees it counted
            self.schedule.set(queue_id, so.DELIVERED, self.schedule.get(queue_id, so.DELIVERED) + delivered)
        self.schedule.set(queue_id, so.OFFSET, offset)

    def on_exit(self) -> None:
        for client in (self.producer, self.reader):
            if client is not None:
                try:
                    client.close()
                except StoreError:
                    log.exception("closing the scheduler's %s failed", type(client).__name__)


if __name__ == "__main__":
    sys.exit(main(SchedulerService))
