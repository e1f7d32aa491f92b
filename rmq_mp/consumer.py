"""Consumer: any local process reads a running store by queue and offset, with long polling.

Mirrors PullMessageProcessor + `getMessage` (rocketmq-format.md §12) and the broker's
PullRequestHoldService: `pull` reads ConsumeQueue entries and CommitLog records straight from the
shared files, bounded by what reput has dispatched (the queue-offset table), so it never sees a
record beyond the visibility limit (the flushed offset under SYNC_FLUSH). With ``timeout_s`` it
parks in the waiter table and reput wakes it on the first dispatch past its offset: no polling
loop. `subscribe` + `poll` iterate topics with tag expressions (``"TagA || TagB"``, ``"*"``), and
`commit` records the group's offsets in shared memory; the supervisor persists them to
`config/consumerOffset.json`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from rmq_mp import validators as v
from rmq_mp.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from rmq_mp.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ShmAttachError,
    StoreError,
    StoreNotRunningError,
)
from rmq_mp.mapping_pool import process_pool
from rmq_mp.message import MessageExt
from rmq_mp.message_store import offset_status, read_queue
from rmq_mp.offsets import ConsumerOffsetManager
from rmq_mp.read_damage import ReadSkips, shm_counter
from rmq_mp.reporter import Reporter
from rmq_mp.running_store import REATTACH_WAIT_S, START_TIMEOUT_S, SUPERVISOR_STALE_MS, Instance, RunningStore
from rmq_mp.status import GetMessageResult, GetMessageStatus
from shm import layout
from shm import queue_offsets as qo
from shm import waiters as wt
from shm.layout import Role
from shm.pointer_table import now_ms, pid_alive
from shm.semaphores import acquire, spin_until, try_acquire

log = logging.getLogger("rmq_mp.consumer")

PARK_SPIN_S = 0.0002
"""A long poll watches its queue this long before sleeping: a wake by reput costs 50-70 us."""
READ_ATTEMPTS = 3
SHORT_POLLING_S = 1.0
MAX_TIMEOUT_S = v.JAVA_LONG_MAX // 1000
"""The longest wait a pull or poll accepts: RocketMQ's timeouts are Java longs of milliseconds."""
PARK_MAX_S = 60.0
"""The longest one semaphore wait of a park (posix_ipc gives up at once on a deadline past what
a timespec holds): a longer timeout parks again, as after any wakeup that brought nothing."""
"""With longPollingEnable=false, how long a pull that found nothing sleeps before it looks again
(RocketMQ's BrokerConfig shortPollingTimeMills): new messages do not wake it."""
"""Reads retried when the cleaner deletes a file under them (each retry sees a higher minimum)."""

GetResult = GetMessageResult
"""What `pull` returns: status, messages, next_begin_offset, min_offset, max_offset."""


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """RocketMQ's subscription expression: ``*`` (or empty) for all, else ``A || B``."""
    expression = expression.strip()
    if expression in ("", "*"):
        return None
    return frozenset(t.strip() for t in expression.split("||") if t.strip())


@dataclass
class Subscription:
    topic: str
    tags: frozenset[str] | None
    next_offsets: dict[int, int] = field(default_factory=dict)


class Consumer:
    """Attach with `Consumer.attach(name, group)`. An instance is not thread-safe: use one per
    thread (each takes one of `maxConsumerNum` slots until `close`), as many as you like in a
    process; the threads share the process's queue-file mappings (mapping_pool.py).

    Arguments are checked as RocketMQ's client checks them (`rmq_mp.validators`): the group by
    `Validators.checkGroup`, queue ids as Java ints, offsets as Java longs; a wrong one raises
    `InvalidArgumentError` (`InvalidArgumentTypeError` for a wrong type) before anything is read
    or written."""

    def __init__(self, store: RunningStore, group: str) -> None:
        v.check_group(group)
        self.group = group
        self.reporter = Reporter()
        """Records this consumer skipped rather than serve (rmq_mp/read_damage.py)."""
        self.subscriptions: dict[str, Subscription] = {}
        self._checked_topics: set[str] = set()
        """Topics `pull` has checked already: a pull of one of them pays a set lookup."""
        self.committed: dict[tuple[str, int], int] = {}
        self._holds: list[int] = []
        self._waiter_slot = -1
        self._bind(store)

    def _bind(self, store: RunningStore) -> None:
        """Everything that belongs to one start of the store (its shared memory and a slot in its
        consumer table); subscriptions, their next offsets and `committed` belong to the consumer
        and outlive a restart."""
        self.store = store
        self.queues = store.shm.queues
        self.waiters = store.shm.waiters
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._pool = process_pool(store.config.max_open_consume_queue_files)
        """Shared by every consumer of the process: the queue files all of them read stay
        within ``maxOpenConsumeQueueFiles`` mappings (mapping_pool.py)."""
        self.skips = ReadSkips(self.reporter, publish=shm_counter(store.shm))
        self._waiter_slot = self._claim_waiter_slot()
        self._waiter_sem = store.shm.waiter(self._waiter_slot)

    @classmethod
    def attach(
        cls, name: str | os.PathLike[str], group: str, *, start_timeout_s: float = START_TIMEOUT_S
    ) -> Consumer:
        """Attach to the running store ``name`` (shm name or store directory) as ``group``, a
        name `Validators.checkGroup` accepts (checked first: a refused group attaches nothing).
        A store still starting is waited for up to ``start_timeout_s``."""
        v.check_group(group)
        return cls(RunningStore.attach(name, Role.CONSUMER, start_timeout_s=start_timeout_s), group)

    def _check_running(self) -> None:
        """At every call that reads or commits: the store this consumer is attached to still
        runs (one word read, and a clock read), or a newer start of it is attached to in its
        place (`_reattach`)."""
        table = self.store.table
        if table.get(layout.STATE) != layout.RUNNING or (
            now_ms() - table.get(layout.SUPERVISOR_HEARTBEAT_MS) > SUPERVISOR_STALE_MS
            and not pid_alive(table.get(layout.SUPERVISOR_PID))
        ):
            self._reattach()

    def _reattach(self) -> None:
        """The store stopped or its supervisor died: attach to a newer start of it under the
        same shm name, keeping subscriptions and their next offsets (`StoreNotRunningError`
        when there is none yet: a later call looks again)."""
        names = self.store.names
        current = self.store.instance
        why = (
            "its supervisor is dead"
            if current.state == layout.RUNNING
            else f"it is not running ({current.state_name})"
        )
        instance = Instance.of(names)
        if instance is None or instance.generation == current.generation:
            raise StoreNotRunningError(
                f"store {names.base}: {why}; this consumer attaches again by itself at a call once "
                f"the store runs again"
            )
        store = RunningStore.attach(names.base, Role.CONSUMER, start_timeout_s=REATTACH_WAIT_S)
        self._release()
        try:
            self._bind(store)
        except ShmAttachError as exc:
            raise StoreNotRunningError(
                f"store {names.base} started again, but this consumer could not attach: {exc}"
            ) from exc
        log.info(
            "consumer of %s reattached to store %s (start %d)", self.group, names.base, instance.generation
        )

    def _claim_waiter_slot(self) -> int:
        """A consumer-table slot of our own: free, or left by a dead consumer (under the flags
        lock). Raises ShmAttachError naming maxConsumerNum when every slot has a live consumer."""
        try:
            with self.store.shm.flags_lock("register the consumer"):
                for slot in self.waiters.claimable_slots(pid_alive):
                    self.waiters.set(slot, wt.WAITING, 0)
                    self.waiters.set(slot, wt.HOLD, wt.NO_HOLD)
                    self.waiters.set(slot, wt.PID, os.getpid())
                    return slot
        except BaseException:
            self.store.close()
            raise
        self.store.close()
        raise ShmAttachError(
            f"{self.waiters.capacity} consumers are attached to this store already "
            f"(maxConsumerNum = {self.waiters.capacity}): close some, or raise maxConsumerNum"
        )

    def close(self) -> None:
        """Give the consumer-table slot back and unmap; a second close does nothing (a `with`
        block that closed it already)."""
        self._release()

    def _release(self) -> None:
        """Give this start's consumer-table slot back, unmap its queues and shared memory."""
        if self._waiter_slot < 0:
            return
        self.waiters.set(self._waiter_slot, wt.WAITING, 0)
        self.waiters.set(self._waiter_slot, wt.HOLD, wt.NO_HOLD)
        self.waiters.set(self._waiter_slot, wt.PID, 0)
        self._waiter_slot = -1
        for cq in self._cqs.values():
            cq.close()
        self.store.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reads

    def _offsets(self, topic: str, queue_id: int) -> tuple[int, int, int]:
        """(queue-table slot, min offset, dispatched max offset); slot -1 for an unknown queue."""
        slot = self.queues.find(topic, queue_id)
        if slot < 0:
            return -1, 0, 0
        return slot, self.queues.get(slot, qo.MIN_OFFSET), self.queues.get(slot, qo.DISPATCHED)

    def _queue_view(self, topic: str, queue_id: int, min_offset: int, max_offset: int) -> ConsumeQueue:
        """A read-only ConsumeQueue whose files and positions cover ``[min, max)``."""
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        if cq is None:
            cq = self._cqs[key] = ConsumeQueue(
                topic, queue_id, self.store.paths.consume_queue,
                self.store.config.mapped_file_size_consume_queue, writable=False, reporter=self.reporter,
                pool=self._pool,
            )  # fmt: skip
        end = max_offset * CQ_STORE_UNIT_SIZE
        cq.min_logic_offset = min_offset * CQ_STORE_UNIT_SIZE
        cq.mfq.drop_files_before(cq.min_logic_offset)
        if end > cq.min_logic_offset:
            cq.mfq.ensure_range(cq.min_logic_offset, end - 1)
        for mf in cq.mfq.files:
            mf.committed_position = max(0, min(end - mf.file_from_offset, mf.file_size))
        return cq

    def entries(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Up to ``max_count`` ConsumeQueue entries (phy offset, size, tags code) of one queue
        from ``offset``, within what reput dispatched and one queue file: for a reader that
        decides by the tags code before it reads records (the scheduler: a delivery time)."""
        self._check_running()
        slot, min_offset, max_offset = self._offsets(topic, queue_id)
        if slot < 0 or not min_offset <= offset < max_offset:
            return []
        cq = self._queue_view(topic, queue_id, min_offset, max_offset)
        return list(cq.entries(offset, min(max_count, max_offset - offset)))

    def pull(
        self, topic: str, queue_id: int, offset: int, max_msgs: int = 32, *, timeout_s: float = 0.0,
        tags: frozenset[str] | None = None,
    ) -> GetResult:  # fmt: skip
        """Messages of one queue from ``offset``. With ``timeout_s`` > 0 and nothing new, wait
        (long polling) until reput dispatches past ``offset`` or the timeout passes.

        As the store's getMessage: an offset below the queue's minimum (negative included) is
        OFFSET_TOO_SMALL, above its maximum OFFSET_OVERFLOW_BADLY, a queue nothing was written to
        NO_MESSAGE_IN_QUEUE. A record that must not be served (its body CRC fails, or its entry
        does not point at its record) is skipped and reported to `reporter` and the store's
        ``read_skipped_records``, and the next offset is past it (NO_MATCHED_MESSAGE when the
        pull found nothing else: `read_queue`). `InvalidArgumentError`, as RocketMQ's pull consumer and broker
        refuse them: a topic the store cannot hold, a queue id outside 0..2^31-1, an offset
        beyond a Java long, ``max_msgs`` < 1 ("maxNums <= 0"), a ``timeout_s`` that is negative,
        NaN or infinite; wrong types too."""
        if (
            type(topic) is not str
            or topic not in self._checked_topics
            or type(queue_id) is not int
            or type(offset) is not int
            or type(max_msgs) is not int
            or not 0 <= queue_id <= v.JAVA_INT_MAX
            or max_msgs < 1
            or not _LONG_MIN <= offset <= v.JAVA_LONG_MAX
            or (tags is not None and type(tags) is not frozenset)
        ):
            topic, queue_id, offset, max_msgs, tags = self._pull_arguments(
                topic, queue_id, offset, max_msgs, tags
            )
        if (
            type(timeout_s) is not float and type(timeout_s) is not int
        ) or not 0 <= timeout_s <= MAX_TIMEOUT_S:
            timeout_s = _seconds(timeout_s, "timeout_s")
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_running()
            result = self._read(topic, queue_id, offset, max_msgs, tags)
            waiting_for_new = result.status in (
                GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            ) or (result.status is GetMessageStatus.NO_MATCHED_MESSAGE and result.next_begin_offset >= result.max_offset)  # fmt: skip
            remaining = deadline - time.monotonic()
            if not waiting_for_new or remaining <= 0:
                return result
            watch_offset = (
                max(offset, result.next_begin_offset)
                if result.status is GetMessageStatus.NO_MATCHED_MESSAGE
                else offset
            )
            self._park(topic, queue_id, watch_offset, remaining)
            if result.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset

    def _pull_arguments(
        self, topic: object, queue_id: object, offset: object, max_msgs: object, tags: object
    ) -> tuple[str, int, int, int, frozenset[str] | None]:
        """`pull`'s arguments checked one by one (the slow path: only when the quick test of
        `pull` failed), normalised (numpy integers to int, a set of tags to a frozenset)."""
        checked = v.check_get(topic, queue_id, offset, max_msgs, tags)
        self._checked_topics.add(checked[0])
        return checked

    def _read(
        self, topic: str, queue_id: int, offset: int, max_msgs: int, tags: frozenset[str] | None
    ) -> GetResult:
        for attempt in range(READ_ATTEMPTS):
            slot, min_offset, max_offset = self._offsets(topic, queue_id)
            if slot < 0:
                return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
            decided = offset_status(offset, min_offset, max_offset)
            if decided is not None:  # nothing to read (a caught-up long poll): no file touched
                return decided
            try:
                cq = self._queue_view(topic, queue_id, min_offset, max_offset)
                first = cq.get_entry(offset) if min_offset <= offset < max_offset else None
                with self.hold_from(first[0] if first else -1):
                    self.store.sync_log(keep_from=min(self._holds, default=-1))
                    return read_queue(cq, self.store.commit_log, self.store.config, offset=offset,
                                      max_msgs=max_msgs, min_offset=min_offset, max_offset=max_offset,
                                      skips=self.skips, tags=tags)  # fmt: skip
            except FileNotFoundError:
                # The cleaner deleted a queue or log file between our reading the minimum offsets
                # and mapping it: read the new minimum and try again.
                if attempt == READ_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    @contextmanager
    def hold_from(self, phy_offset: int) -> Iterator[None]:
        """Keep the commit-log files from ``phy_offset`` on disk while this block reads them
        (RocketMQ's `MappedFile.hold()`, across processes). The cleaner deletes a held file only
        after `destroyMapedFileIntervalForcibly`, and even then this process's mapping of it stays
        valid until released: nobody ever reads freed memory. ``-1`` holds nothing."""
        if phy_offset < 0:
            yield
            return
        self._holds.append(phy_offset)
        self.waiters.set(self._waiter_slot, wt.HOLD, min(self._holds))
        try:
            yield
        finally:
            self._holds.remove(phy_offset)
            self.waiters.set(self._waiter_slot, wt.HOLD, min(self._holds, default=wt.NO_HOLD))

    def _park(
        self, topic: str, queue_id: int, offset: int, timeout_s: float, any_queue: bool = False
    ) -> None:
        """Register in our waiter slot, re-check (no lost wakeup) for PARK_SPIN_S, then sleep until
        woken or timeout. With longPollingEnable=false: sleep SHORT_POLLING_S (or the timeout)
        without registering, as RocketMQ's short polling. At most `PARK_MAX_S`: the caller
        parks again while its deadline is ahead."""
        timeout_s = min(timeout_s, PARK_MAX_S)
        if not self.store.config.long_polling_enable:
            time.sleep(min(timeout_s, SHORT_POLLING_S))
            return
        slot = -1 if any_queue else self.queues.find(topic, queue_id)
        w = self.waiters
        while try_acquire(self._waiter_sem):  # drop stale posts
            pass
        w.set(self._waiter_slot, wt.QUEUE_SLOT, slot)
        w.set(self._waiter_slot, wt.OFFSET, offset)
        w.set(self._waiter_slot, wt.WAITING, 1)
        if not any_queue:
            slot_now = self.queues.find(topic, queue_id)
            if slot_now != slot:  # the queue appeared meanwhile: wait for any dispatch instead
                w.set(self._waiter_slot, wt.QUEUE_SLOT, -1)
            elif slot_now >= 0 and spin_until(
                lambda: self.queues.get(slot_now, qo.DISPATCHED) > offset, min(PARK_SPIN_S, timeout_s)
            ):
                w.set(self._waiter_slot, wt.WAITING, 0)
                return
        acquire(self._waiter_sem, timeout_s)
        w.set(self._waiter_slot, wt.WAITING, 0)

    # ------------------------------------------------------------------ subscriptions

    def subscribe(
        self, topic: str, expression: str = "*", *, from_offsets: dict[int, int] | None = None
    ) -> None:
        """Consume ``topic``'s queues from the group's committed offsets (or 0), tag-filtered.
        `InvalidArgumentError` for a topic the group cannot keep offsets for, or bad offsets."""
        v.check_topic(topic, with_offsets=True)
        if not isinstance(expression, str):
            raise InvalidArgumentTypeError(
                f"expression must be a str ('*' or 'TagA || TagB'), not {type(expression).__name__}"
            )
        starts = _queue_offsets(from_offsets or {}, "from_offsets")
        sub = Subscription(topic, parse_tag_expression(expression))
        self._check_running()
        groups = self.store.shm.groups
        for queue_id, slot in groups.queues_of(self._offset_key(topic)):
            sub.next_offsets[queue_id] = groups.get(slot, qo.COMMITTED)
        sub.next_offsets.update(starts)
        self.subscriptions[topic] = sub

    def committed_offset(self, topic: str, queue_id: int) -> int:
        """The group's committed offset for a queue, -1 when it has none (as RocketMQ)."""
        v.check_topic(topic, with_offsets=True)
        queue_id = v.check_queue_id(queue_id)
        self._check_running()
        groups = self.store.shm.groups
        slot = groups.find(self._offset_key(topic), queue_id)
        return groups.get(slot, qo.COMMITTED) if slot >= 0 else -1

    def _topic_queues(self, topic: str) -> list[int]:
        return [queue_id for queue_id, _slot in self.queues.queues_of(topic)]

    def poll(self, timeout_s: float = 1.0, max_msgs: int = 32) -> list[MessageExt]:
        """The next messages of any subscribed queue; waits up to ``timeout_s`` when there are none."""
        if not self.subscriptions:
            raise StoreError("poll() before subscribe()")
        timeout_s = _seconds(timeout_s, "timeout_s")
        max_msgs = v.integer(max_msgs, "max_msgs")
        if max_msgs < 1:
            raise InvalidArgumentError(
                f"max_msgs {max_msgs}: maxNums <= 0 (a poll asks for at least one message)"
            )
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_running()
            batch: list[MessageExt] = []
            for sub in self.subscriptions.values():
                for queue_id in self._topic_queues(sub.topic):
                    offset = sub.next_offsets.get(queue_id, 0)
                    result = self._read(sub.topic, queue_id, offset, max_msgs - len(batch), sub.tags)
                    if result.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                         GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                                         GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.MESSAGE_WAS_REMOVING):  # fmt: skip
                        sub.next_offsets[queue_id] = result.next_begin_offset
                    batch.extend(result.messages)
                    if len(batch) >= max_msgs:
                        return batch
            remaining = deadline - time.monotonic()
            if batch or remaining <= 0:
                return batch
            self._park("", 0, 0, remaining, any_queue=True)

    def __iter__(self) -> Iterator[MessageExt]:
        """Messages of the subscriptions until a poll of one second finds none."""
        while batch := self.poll(1.0):
            yield from batch

    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        """Record the group's consumed offsets: the next offsets of every subscribed queue, or the
        ``{(topic, queue_id): next_offset}`` given. The supervisor persists them to
        `config/consumerOffset.json` every `flushConsumerOffsetInterval` ms and at stop.

        Every entry is checked before any is recorded (all or nothing): a topic the store cannot
        hold or one with '@' (consumerOffset.json's ``topic@group`` separator), a queue id outside
        0..2^31-1, an offset that is negative or beyond a Java long raise `InvalidArgumentError`."""
        if offsets is None:
            offsets = {
                (s.topic, q): o for s in self.subscriptions.values() for q, o in s.next_offsets.items()
            }
        else:
            offsets = _commit_offsets(offsets)
        self._check_running()  # never into the table of a store that stopped: it is not persisted
        groups = self.store.shm.groups
        keys = [(self._offset_key(topic), queue_id) for topic, queue_id in offsets]
        slots = [groups.find(key, queue_id) for key, queue_id in keys]
        if min(slots, default=0) < 0:  # new entries: all or nothing (a full table refuses the commit)
            with self.store.shm.flags_lock("register group offsets"):
                slots = groups.find_or_insert_all(keys)
        for (queue, offset), slot in zip(offsets.items(), slots, strict=True):
            groups.set(slot, qo.COMMITTED, offset)
            self.committed[queue] = offset
        return dict(self.committed)

    def _offset_key(self, topic: str) -> str:
        return ConsumerOffsetManager.key(self.group, topic)


_LONG_MIN = -v.JAVA_LONG_MAX - 1


def _seconds(value: object, what: str) -> float:
    """A duration argument: an int or a float (not a bool), from 0 to `MAX_TIMEOUT_S`; NaN, an
    infinity or a negative wait is `InvalidArgumentError` (as `queue.Queue.get` refuses one)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgumentTypeError(
            f"{what} must be a number of seconds, not {type(value).__name__} ({value!r})"
        )
    if not 0 <= value <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(
            f"{what} {value!r} must be a finite number of seconds from 0 to {MAX_TIMEOUT_S} "
            f"(Long.MAX_VALUE milliseconds)"
        )
    return value


def _queue_offsets(offsets: object, what: str) -> dict[int, int]:
    """``{queue_id: offset}`` checked: queue ids in 0..2^31-1, offsets in 0..Long.MAX_VALUE."""
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentTypeError(
            f"{what} must be a dict of queue id to offset, not {type(offsets).__name__}"
        )
    return {
        v.check_queue_id(queue_id, f"{what} queue id"): v.check_offset(offset, f"{what}[{queue_id!r}]")
        for queue_id, offset in offsets.items()
    }


def _commit_offsets(offsets: object) -> dict[tuple[str, int], int]:
    """`commit`'s ``{(topic, queue_id): offset}``, every entry checked before any is used."""
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentTypeError(
            f"commit takes a dict of (topic, queue_id) to offset, not {type(offsets).__name__}"
        )
    checked: dict[tuple[str, int], int] = {}
    for key, offset in offsets.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise InvalidArgumentTypeError(f"commit keys are (topic, queue_id) pairs, not {key!r}")
        topic = v.check_topic(key[0], with_offsets=True)
        queue_id = v.check_queue_id(key[1])
        checked[(topic, queue_id)] = v.check_offset(offset, f"offset of {topic!r} queue {queue_id}")
    return checked
