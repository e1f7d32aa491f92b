"""Consumer: any local process reads a running store by queue and offset, with long polling.

Mirrors PullMessageProcessor + `getMessage` (docs/format.md §12) and the broker's
PullRequestHoldService: `pull` reads ConsumeQueue entries and CommitLog records straight from the
shared files, bounded by what reput has dispatched (the queue-offset table), so it never sees a
record beyond the visibility limit (the flushed offset under SYNC_FLUSH). With ``timeout_s`` it
parks in the waiter table and reput wakes it on the first dispatch past its offset: no polling
loop. `subscribe` + `poll` iterate topics with tag expressions (``"TagA || TagB"``, ``"*"``), and
`commit` records the group's offsets in shared memory; the supervisor persists them to
`config/consumerOffset.json`.

A consumer group's members (every `Consumer` attached with one group, in any process) share the
queues of what they subscribe (MessageModel.CLUSTERING, the default: rmq_mp/client/rebalance.py says
what a rebalance guarantees and how soon), or each read everything with progress of its own
(MessageModel.BROADCASTING: rmq_mp/client/local_offsets.py). `pull` names its queue and stays outside
the group's rebalancing (RocketMQ's pull/assign consumer).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial

from rmq_mp import validators as v
from rmq_mp.client.local_offsets import LocalFileOffsetStore, check_client_id
from rmq_mp.client.rebalance import REBALANCE_INTERVAL_MS, MessageModel, Rebalance
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.config.store_config import BrokerRole
from rmq_mp.errors import (
    CorruptFileError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ShmAttachError,
    StoreError,
    StoreNotRunningError,
    StoreReadOnlyError,
)
from rmq_mp.format.message import RETRY_GROUP_TOPIC_PREFIX, MessageExt
from rmq_mp.format.queue_entry import PRE_BLANK_SIZE
from rmq_mp.outcomes import GetMessageResult, GetMessageStatus
from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.mapping_pool import process_pool
from rmq_mp.store.message_store import offset_status, queue_end_below, read_queue
from rmq_mp.store.read_damage import ReadSkips, shm_counter
from rmq_mp.store.reporter import Reporter
from rmq_mp.store.running_store import (
    REATTACH_WAIT_S,
    START_TIMEOUT_S,
    SUPERVISOR_STALE_MS,
    Instance,
    RunningStore,
    promoted_role,
)
from shm import layout
from shm import queue_offsets as qo
from shm import waiters as wt
from shm.consume_counts import ConsumeCounts
from shm.layout import Role
from shm.pointer_table import now_ms, pid_alive, pid_alive_since
from shm.semaphores import acquire, spin_until, try_acquire

log = logging.getLogger("rmq_mp.client.consumer")

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


class ConsumeFromWhere(enum.Enum):
    """RocketMQ's ConsumeFromWhere: where a queue starts for a group that never committed an
    offset for it (a committed offset always wins). FIRST: the queue's first message. LAST: the
    queue's end when the member first reads it (what is sent from then on), except on a retry
    topic (from its start). TIMESTAMP: the message stored nearest ``consume_timestamp_ms``
    (`Consumer.search_offset`), except on a retry topic (its end). As RebalancePushImpl's
    computePullFromWhere; rmq-mp's default stays FIRST (RocketMQ's is LAST), as before.

    Deviation: RocketMQ 4.9's broker answers a new group's offset query with 0 while the queue's
    minimum is 0 and its first message is still within memory (ConsumerManageProcessor,
    checkInDiskByConsumeOffset), so LAST reads a young queue from its start there; rmq-mp keeps
    the client's rule alone: LAST means what is sent from now on."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


CONSUME_TIMESTAMP_AGO_MS = 30 * 60 * 1000
"""RocketMQ's default consumeTimestamp: half an hour before the consumer was made."""


class QueueNotAssignedError(StoreError):
    """A seek or position of a queue this member does not read now (RocketMQ's lite pull
    consumer: "The message queue is not in assigned list, may be rebalancing"; Kafka's
    IllegalStateException): under CLUSTERING only the queues in `Consumer.assignment`."""


@dataclass
class Subscription:
    topic: str
    tags: frozenset[str] | None
    next_offsets: dict[int, int] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    """``from_offsets``: where a queue the group never committed starts (else 0)."""


_CLIENT_SEQ = itertools.count()

QueueListener = Callable[[str, list[int], list[int]], None]
"""``(topic, released queue ids, claimed queue ids)``: `Consumer.set_queue_listener`."""


def default_client_id() -> str:
    """RocketMQ's ``ip@instanceName`` with the instance name it picks by default (the pid and a
    distinguishing number): unique per Consumer object. A store is reached over shared memory,
    so the address is the loopback one."""
    return f"127.0.0.1@{os.getpid()}#{next(_CLIENT_SEQ)}"


class Consumer:
    """Attach with `Consumer.attach(name, group)`. An instance is not thread-safe: use one per
    thread (each takes one of `maxConsumerNum` slots until `close`), as many as you like in a
    process; the threads share the process's queue-file mappings (mapping_pool.py).

    Arguments are checked as RocketMQ's client checks them (`rmq_mp.validators`): the group by
    `Validators.checkGroup`, queue ids as Java ints, offsets as Java longs; a wrong one raises
    `InvalidArgumentError` (`InvalidArgumentTypeError` for a wrong type) before anything is read
    or written.

    `commit` may be called from other threads while one thread polls (a push consumer's workers
    do): the two share a lock around the group's ownership state."""

    def __init__(
        self, store: RunningStore, group: str, *, message_model: MessageModel = MessageModel.CLUSTERING,
        client_id: str | None = None, rebalance_interval_ms: int = REBALANCE_INTERVAL_MS,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_timestamp_ms: int | None = None,
    ) -> None:  # fmt: skip
        v.check_group(group)
        self.consume_from_where, self.consume_timestamp_ms = check_consume_from_where(
            consume_from_where, consume_timestamp_ms
        )
        self._paused: set[tuple[str, int]] = set()
        if not isinstance(message_model, MessageModel):
            raise InvalidArgumentTypeError(
                f"message_model must be a MessageModel, not {type(message_model).__name__}"
            )
        self.message_model = message_model
        self.client_id = default_client_id() if client_id is None else check_client_id(client_id)
        self.rebalance_interval_ms = v.integer(rebalance_interval_ms, "rebalance_interval_ms")
        if not 1 <= self.rebalance_interval_ms <= v.JAVA_INT_MAX:
            raise InvalidArgumentError(f"rebalance_interval_ms {rebalance_interval_ms} must be 1..2^31-1")
        self._lock = threading.RLock()
        self._rr = 0
        self.before_rebalance: Callable[[], None] | None = None
        """Called in the polling thread, inside `poll`, before a rebalance that may release
        queues (the members or the queues changed): a push consumer commits its progress and
        lets its orderly batches finish there, so the next holder starts where it stopped."""
        self.after_rebalance: Callable[[], None] | None = None
        """Called right after that rebalance (the push consumer's orderly batches go on)."""
        self._claimed: list[tuple[str, int]] = []
        self.queue_listener: QueueListener | None = None
        """`set_queue_listener`."""
        self._lost: set[tuple[str, int]] = set()
        """Queues this member held and lost to a rebalance, until it holds them again: their
        commits are ignored (RocketMQ's dropped ProcessQueue)."""
        self.group = group
        self.reporter = Reporter()
        """Records this consumer skipped rather than serve (rmq_mp/store/read_damage.py)."""
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
        self._deletes_seen = store.table.get(layout.TOPIC_DELETES_APPLIED)
        """Reput's count of applied topic deletes when `_cqs` was last valid (rmq-admin deleteTopic)."""
        self._pool = process_pool(store.config.max_open_consume_queue_files)
        """Shared by every consumer of the process: the queue files all of them read stay
        within ``maxOpenConsumeQueueFiles`` mappings (mapping_pool.py)."""
        self.skips = ReadSkips(self.reporter, publish=shm_counter(store.shm))
        self.consume_counts = ConsumeCounts.attach(store.names.consume_counts, Role.CONSUMER)
        """Messages received per queue slot, summed per topic by the metrics (rmq_topic_consumed)."""
        self._consumed: dict[int, int] = {}
        """Received but not yet added to `consume_counts` (its lock was busy)."""
        self._waiter_slot = self._claim_waiter_slot()
        self._waiter_sem = store.shm.waiter(self._waiter_slot)
        self.rebalance = Rebalance(
            store.shm, self.group, self.client_id, self.message_model, self._waiter_slot,
            self.rebalance_interval_ms, store.paths.topics,
        )  # fmt: skip
        """This start's membership and queue ownership (a restarted store has fresh ones: the
        consumer joins again at its next poll, and claims its queues from the committed offsets)."""
        self.local_offsets = LocalFileOffsetStore(store.paths.root, self.client_id, self.group)
        """Broadcasting progress (unused under clustering)."""

    @classmethod
    def attach(
        cls, name: str | os.PathLike[str], group: str, *, message_model: MessageModel = MessageModel.CLUSTERING,
        client_id: str | None = None, rebalance_interval_ms: int = REBALANCE_INTERVAL_MS,
        start_timeout_s: float = START_TIMEOUT_S,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_timestamp_ms: int | None = None,
    ) -> Consumer:  # fmt: skip
        """Attach to the running store ``name`` (shm name or store directory) as ``group``, a
        name `Validators.checkGroup` accepts (checked first: a refused group attaches nothing).
        A store still starting is waited for up to ``start_timeout_s``.

        ``message_model``: CLUSTERING (each queue of a subscribed topic read by one live member
        of the group at a time) or BROADCASTING (every member reads everything; progress per
        ``client_id``). ``client_id`` names this member (default ``127.0.0.1@<pid>#<n>``,
        unique per Consumer object); the group's members are allocated queues in the order of
        their sorted ids, and a broadcasting member restarted with the same id resumes.
        ``rebalance_interval_ms``: how often a member looks for dead members (module
        rmq_mp.client.rebalance)."""
        v.check_group(group)
        if client_id is not None:
            check_client_id(client_id)
        store = RunningStore.attach(name, Role.CONSUMER, start_timeout_s=start_timeout_s)
        try:
            return cls(
                store, group, message_model=message_model, client_id=client_id,
                rebalance_interval_ms=rebalance_interval_ms, consume_from_where=consume_from_where,
                consume_timestamp_ms=consume_timestamp_ms,
            )  # fmt: skip
        except InvalidArgumentError:
            store.close()
            raise

    def _refuse_on_a_slave(self) -> None:
        """A SLAVE's group offsets are its master's, followed over the metadata channel
        (workers/ha_meta.py): a commit there would be neither the master's nor kept by it, so it
        is refused; reading is not. A promoted slave takes commits (rmq-admin promote)."""
        store = self.store
        if (
            store.config.broker_role is BrokerRole.SLAVE
            and promoted_role(store.config, store.table).broker_role is BrokerRole.SLAVE
        ):
            raise StoreReadOnlyError(
                f"store {store.names.base} is a SLAVE: its group offsets are its master's "
                f"({store.config.ha_master_meta_address or 'no metadata channel'}); commit on the master"
            )

    def _check_running(self) -> None:
        """At every call that reads or commits: the store this consumer is attached to still
        runs (two word reads, and a clock read), or a newer start of it is attached to in its
        place (`_reattach`). A start whose supervisor was killed keeps saying RUNNING, with a
        heartbeat that looks fresh for SUPERVISOR_STALE_MS; the next start (or `run.py stop`)
        fences it first (rmq_mp/put/fence.py), so a commit made after that is the next start's,
        not lost with the dead one's memory."""
        table = self.store.table
        if (
            table.get(layout.STATE) != layout.RUNNING
            or table.get(layout.FENCE) != layout.FENCE_OPEN  # ended by a stop or a start over it
            or (
                now_ms() - table.get(layout.SUPERVISOR_HEARTBEAT_MS) > SUPERVISOR_STALE_MS
                and not pid_alive(table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS))
            )
        ):
            self._reattach()

    def _raise_if_stopped(self, exc: ShmAttachError) -> None:
        """An attach inside a call that failed because the store stopped (or its supervisor died)
        after the call's `_check_running`: `StoreNotRunningError`, as that check would have
        raised, so that a caller riding restarts waits it out. Anything else is left to raise."""
        table = self.store.table
        if isinstance(exc, StoreNotRunningError) or (
            table.get(layout.STATE) == layout.RUNNING
            and pid_alive(table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS))
        ):
            return
        raise StoreNotRunningError(
            f"store {self.store.names.base} stopped during this call ({exc}); this consumer attaches "
            f"again by itself at a call once the store runs again"
        ) from exc

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
                for slot in self.waiters.claimable_slots(pid_alive_since):
                    self.waiters.set(slot, wt.WAITING, 0)
                    self.waiters.set(slot, wt.HOLD, wt.NO_HOLD)
                    self.waiters.set(slot, wt.JOINED_MS, now_ms())  # with the pid: who holds it
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
        """Leave the group (its queues go to the other members at once: what was not committed
        is read again by them), give the consumer-table slot back and unmap; a second close
        does nothing (a `with` block that closed it already)."""
        self._release()

    def _release(self) -> None:
        """Leave the group, give this start's consumer-table slot back, unmap its queues and
        shared memory."""
        if self._waiter_slot < 0:
            return
        with self._lock:
            try:
                self.rebalance.leave()
            except ShmAttachError as exc:  # a dead holder kept the flags lock: pids tell the rest
                log.warning("consumer %s of %s left without releasing: %s", self.client_id, self.group, exc)
        self.waiters.set(self._waiter_slot, wt.WAITING, 0)
        self.waiters.set(self._waiter_slot, wt.HOLD, wt.NO_HOLD)
        self.waiters.set(self._waiter_slot, wt.PID, 0)
        self._waiter_slot = -1
        for cq in self._cqs.values():
            cq.close()
        with contextlib.suppress(ShmAttachError):  # a dead holder kept the flags lock: counts lost
            self._publish_consumed(wait=True)
        self.consume_counts.close()
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
        deletes = self.store.table.get(layout.TOPIC_DELETES_APPLIED)
        if deletes != self._deletes_seen:  # a topic was deleted: its queue files are new ones
            self._deletes_seen = deletes
            for old in self._cqs.values():
                old.close()
            self._cqs.clear()
        cq = self._cqs.get(key)
        if cq is None:
            cq = self._cqs[key] = ConsumeQueue(
                topic, queue_id, self.store.paths.consume_queue,
                self.store.config.mapped_file_size_consume_queue, writable=False, reporter=self.reporter,
                pool=self._pool,
            )  # fmt: skip
        cq.set_read_window(min_offset, max_offset)
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
        table = self.store.table
        while True:
            fork_read_end = table.get(layout.FORK_READ_END)
            result = self._read_below(topic, queue_id, offset, max_msgs, tags, fork_read_end)
            if table.get(layout.FORK_READ_END) == fork_read_end:
                return result
            # The slave found its fork while we read: what we read may be past it (read again).

    def _read_below(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        tags: frozenset[str] | None,
        fork_read_end: int,
    ) -> GetResult:
        """One read of a queue, its window ending at ``fork_read_end`` (-1: none)."""
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
                    result = read_queue(cq, self.store.commit_log, self.store.config, offset=offset,
                                        max_msgs=max_msgs, min_offset=min_offset, max_offset=max_offset,
                                        skips=self.skips, tags=tags,
                                        fork_read_end=fork_read_end)  # fmt: skip
                if result.messages:
                    self._consumed[slot] = self._consumed.get(slot, 0) + len(result.messages)
                    self._publish_consumed(wait=False)
                return result
            except FileNotFoundError as exc:
                # The cleaner deleted a queue or log file between our reading the minimum offsets
                # and mapping it: read the new minimum and try again.
                if attempt == READ_ATTEMPTS - 1:
                    raise CorruptFileError(
                        f"{exc.filename}: missing, though the store says queue {topic}/{queue_id} holds "
                        f"[{min_offset}, {max_offset}) (deleted while the store runs?); a restart "
                        "rebuilds the queue from the commit log"
                    ) from exc
        raise AssertionError("unreachable")

    def _publish_consumed(self, *, wait: bool) -> None:
        """Add what this consumer received to the shared per-queue counts, under the flags lock:
        without waiting on a pull (a busy lock, the supervisor persisting offsets, leaves them
        for the next pull), waiting at close."""
        if not self._consumed:
            return
        if wait:
            with self.store.shm.flags_lock("count consumed messages"):
                self._add_consumed()
            return
        lock = self.store.shm.semaphore(self.store.names.flags_lock)
        if try_acquire(lock):
            try:
                self._add_consumed()
            finally:
                lock.release()

    def _add_consumed(self) -> None:
        """Caller holds the flags lock."""
        for slot, messages in self._consumed.items():
            self.consume_counts.add(slot, messages)
        self._consumed.clear()

    def hold_from(self, phy_offset: int) -> _Hold:
        """Keep the commit-log files from ``phy_offset`` on disk while this block reads them
        (RocketMQ's `MappedFile.hold()`, across processes). The cleaner deletes a held file only
        after `destroyMapedFileIntervalForcibly`, and even then this process's mapping of it stays
        valid until released: nobody ever reads freed memory. ``-1`` holds nothing."""
        return _Hold(self, phy_offset)

    def _park(
        self, topic: str, queue_id: int, offset: int, timeout_s: float, any_queue: bool = False,
        wake_if: Callable[[], bool] | None = None,
    ) -> None:  # fmt: skip
        """Register in our waiter slot, re-check (no lost wakeup) for PARK_SPIN_S, then sleep until
        woken or timeout. With longPollingEnable=false: sleep SHORT_POLLING_S (or the timeout)
        without registering, as RocketMQ's short polling. At most `PARK_MAX_S`: the caller
        parks again while its deadline is ahead."""
        timeout_s = min(timeout_s, PARK_MAX_S)
        # A forked slave's queues hold entries past its read window until its restart: a wait
        # on them would wake at once, so it polls as short polling does until then.
        if not self.store.config.long_polling_enable or self.store.table.get(layout.FORK_READ_END) >= 0:
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
        if wake_if is None or not wake_if():  # checked after registering: no lost rebalance post
            acquire(self._waiter_sem, timeout_s)
        w.set(self._waiter_slot, wt.WAITING, 0)

    # ------------------------------------------------------------------ subscriptions

    def subscribe(
        self, topic: str, expression: str = "*", *, from_offsets: dict[int, int] | None = None
    ) -> None:
        """Consume ``topic``, tag-filtered. Under CLUSTERING the first subscribe joins the group
        (shm/members.py) and `poll` reads only the queues this member is allocated, each from
        the group's committed offset (``from_offsets`` for a queue the group never committed,
        else 0); under BROADCASTING every queue, from this member's own progress
        (`LocalFileOffsetStore`), else ``from_offsets``, else 0. `InvalidArgumentError` for a
        topic the group cannot keep offsets for, or bad offsets."""
        v.check_topic(topic, with_offsets=True)
        if not isinstance(expression, str):
            raise InvalidArgumentTypeError(
                f"expression must be a str ('*' or 'TagA || TagB'), not {type(expression).__name__}"
            )
        starts = _queue_offsets(from_offsets or {}, "from_offsets")
        self._check_running()
        with self._lock:
            sub = Subscription(topic, parse_tag_expression(expression), starts=starts)
            old = self.subscriptions.get(topic)
            if self.message_model is MessageModel.BROADCASTING:
                self.local_offsets.load()
                sub.next_offsets.update(starts)
                sub.next_offsets.update(self.local_offsets.offsets_of(topic))
            else:  # where a queue starts once held; a queue held restarts from the group's offset
                groups = self.store.shm.groups
                sub.next_offsets.update(starts)
                for queue_id, group_slot in self.rebalance.owned.get(topic, {}).items():
                    committed = groups.get(group_slot, qo.COMMITTED)
                    if committed >= 0:  # (an rmq-admin resetOffsetByTime is picked up here)
                        sub.next_offsets[queue_id] = committed
                    elif old is not None and queue_id in old.next_offsets:
                        sub.next_offsets[queue_id] = old.next_offsets[queue_id]
            self.subscriptions[topic] = sub
            self.rebalance.request()

    def committed_offset(self, topic: str, queue_id: int) -> int:
        """The group's committed offset for a queue (a broadcasting member's own), -1 when it
        has none (as RocketMQ)."""
        v.check_topic(topic, with_offsets=True)
        queue_id = v.check_queue_id(queue_id)
        if self.message_model is MessageModel.BROADCASTING:
            return self.local_offsets.offsets_of(topic).get(queue_id, -1)
        self._check_running()
        groups = self.store.shm.groups
        slot = groups.find(self._offset_key(topic), queue_id)
        offset = groups.get(slot, qo.COMMITTED) if slot >= 0 else -1
        return -1 if offset == qo.DELETED else offset  # deleted (deleteSubGroup, deleteTopic): none

    def assignment(self) -> dict[str, list[int]]:
        """The queues this member reads, by subscribed topic: under CLUSTERING those it holds
        now (it changes only inside `poll`, and at `close`), under BROADCASTING every queue."""
        with self._lock:
            if self.message_model is MessageModel.BROADCASTING:
                return {t: self._topic_queues(t) for t in self.subscriptions}
            return {t: sorted(self.rebalance.owned.get(t, {})) for t in self.subscriptions}

    def owns(self, topic: str, queue_id: int) -> bool:
        """Whether this member holds the queue now (a push consumer drops what it fetched from a
        queue it lost: its commit would be ignored, and the new owner reads it again)."""
        if self.message_model is MessageModel.BROADCASTING:
            return topic in self.subscriptions
        return queue_id in self.rebalance.owned.get(topic, {})

    # ------------------------------------------------------------------ positions

    def _start_offset(self, topic: str, queue_id: int) -> int:
        """Where a queue the group never committed starts (`ConsumeFromWhere`)."""
        where = self.consume_from_where
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        retry = topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        end = self.max_offset(topic, queue_id)  # within a slave's read window
        if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return 0 if retry else end
        return end if retry else self.search_offset(topic, queue_id, self.consume_timestamp_ms)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The queue's first offset still stored (MQAdmin.minOffset; 0 for an unknown queue)."""
        topic, queue_id = v.check_topic(topic), v.check_queue_id(queue_id)
        self._check_running()
        return self._offsets(topic, queue_id)[1]

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's end: one past its last dispatched message, what a pull can reach
        (MQAdmin.maxOffset; 0 for an unknown queue). On a slave whose read window ends short of
        its log (`FORK_READ_END`: a fork not cut yet, a log not yet confirmed as its master's),
        its first entry at or past the window's end, where a pull stops too."""
        topic, queue_id = v.check_topic(topic), v.check_queue_id(queue_id)
        self._check_running()
        for attempt in range(READ_ATTEMPTS):
            slot, low, high = self._offsets(topic, queue_id)
            read_end = self.store.table.get(layout.FORK_READ_END)
            if slot < 0 or read_end < 0 or low >= high:
                return high
            try:
                cq = self._queue_view(topic, queue_id, low, high)
                return queue_end_below(low, high, partial(_entry_phy, cq), read_end)
            except FileNotFoundError:  # the cleaner deleted a queue file meanwhile: read the offsets again
                if attempt == READ_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _queues_or_assignment(self, queues: Iterable[tuple[str, int]] | None) -> list[tuple[str, int]]:
        if queues is None:
            return [(t, q) for t, ids in self.assignment().items() for q in ids]
        return [_queue_key(key) for key in queues]

    def beginning_offsets(
        self, queues: Iterable[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], int]:
        """`min_offset` of each ``(topic, queue_id)`` (default: the queues this member reads)."""
        return {(t, q): self.min_offset(t, q) for t, q in self._queues_or_assignment(queues)}

    def end_offsets(self, queues: Iterable[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """`max_offset` of each ``(topic, queue_id)`` (default: the queues this member reads):
        Kafka's end_offsets."""
        return {(t, q): self.max_offset(t, q) for t, q in self._queues_or_assignment(queues)}

    def _timed_search(self, topic: str, queue_id: int, timestamp_ms: int, nearest: bool) -> int | None:
        """`search_offset` (``nearest``) or `offsets_for_times`' search, over the files as they
        are, each read under a hold (the cleaner may delete a file under it: read again)."""
        for attempt in range(READ_ATTEMPTS):
            slot, low, high = self._offsets(topic, queue_id)
            if slot < 0 or low >= high:
                return 0 if nearest else None
            try:
                cq = self._queue_view(topic, queue_id, low, high)
                first = cq.get_entry(low)
                with self.hold_from(first[0] if first else -1):
                    self.store.sync_log(keep_from=min(self._holds, default=-1))
                    log = self.store.commit_log
                    if nearest:
                        return cq.offset_in_queue_by_time(timestamp_ms, log)

                    return _first_at_or_after(cq, log, low, high, timestamp_ms)
            except FileNotFoundError:
                if attempt == READ_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """RocketMQ's MQAdmin.searchOffset (the store's getOffsetInQueueByTime): the offset of
        the message stored nearest ``timestamp_ms`` (ms since the epoch; the later of two equally
        near), 0 for an empty queue. CONSUME_FROM_TIMESTAMP starts there."""
        topic, queue_id = v.check_topic(topic), v.check_queue_id(queue_id)
        timestamp_ms = v.check_offset(timestamp_ms, "timestamp_ms")
        self._check_running()
        found = self._timed_search(topic, queue_id, timestamp_ms, nearest=True)
        assert found is not None
        return found

    def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int | None]:
        """Kafka's offsets_for_times: for each ``(topic, queue_id): timestamp_ms``, the first
        offset whose message was stored at or after that time, None where every stored message
        is older (or the queue is empty)."""
        if not isinstance(timestamps, Mapping):
            raise InvalidArgumentTypeError(
                f"offsets_for_times takes a dict of (topic, queue_id) to ms, not {type(timestamps).__name__}"
            )
        checked = {_queue_key(k): v.check_offset(t, f"timestamp of {k!r}") for k, t in timestamps.items()}
        self._check_running()
        return {key: self._timed_search(key[0], key[1], t, nearest=False) for key, t in checked.items()}

    def _read_queue_key(self, topic: object, queue_id: object) -> tuple[Subscription, int]:
        """A queue this member reads now (`assignment`), or `QueueNotAssignedError`."""
        topic = v.check_topic(topic, with_offsets=True)
        queue_id = v.check_queue_id(queue_id)
        sub = self.subscriptions.get(topic)
        if sub is None or queue_id not in self.assignment().get(topic, []):
            raise QueueNotAssignedError(
                f"{topic!r} queue {queue_id} is not among the queues this member reads now "
                f"({self.assignment()}): subscribe first, and under CLUSTERING wait for a poll "
                f"to claim it (or the group gave it to another member)"
            )
        return sub, queue_id

    def position(self, topic: str, queue_id: int) -> int:
        """The offset the next `poll` reads from this queue (Kafka's position): after a `seek`
        the offset sought, else where polls got to, else the group's committed offset, else
        where `consume_from_where` starts it. The queue must be one this member reads."""
        sub, queue_id = self._read_queue_key(topic, queue_id)
        with self._lock:
            offset = sub.next_offsets.get(queue_id)
            if offset is not None:
                return offset
            start = self._start_offset(sub.topic, queue_id)
            if self.consume_from_where is not ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                sub.next_offsets[queue_id] = start  # what the next poll reads, as reported
            return start

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """The next `poll` reads this queue from ``offset`` (RocketMQ's lite pull consumer
        seek; Kafka's seek). Nothing is committed until `commit`. The queue must be one this
        member reads now (`QueueNotAssignedError`), the offset within its stored range
        ``min_offset..max_offset`` (`InvalidArgumentError`, as RocketMQ's "Seek offset
        illegal"). A rebalance that takes the queue away drops the seek with it."""
        sub, queue_id = self._read_queue_key(topic, queue_id)
        offset = v.check_offset(offset, "offset")
        self._check_running()
        _slot, low, high = self._offsets(sub.topic, queue_id)
        if not low <= offset <= high:
            raise InvalidArgumentError(
                f"seek offset {offset} of {sub.topic!r} queue {queue_id} is outside its stored "
                f"range {low}..{high}"
            )
        with self._lock:
            sub.next_offsets[queue_id] = offset

    def _sought_queues(self, topic: str, queue_id: int | None) -> list[int]:
        if queue_id is not None:
            return [self._read_queue_key(topic, queue_id)[1]]
        if v.check_topic(topic, with_offsets=True) not in self.subscriptions:
            raise QueueNotAssignedError(f"topic {topic!r} is not subscribed")
        return self.assignment().get(topic, [])

    def seek_to_begin(self, topic: str, queue_id: int | None = None) -> None:
        """`seek` the queue (default: every queue of ``topic`` this member reads) to its
        `min_offset` (RocketMQ's seekToBegin; Kafka's seek_to_beginning)."""
        for q in self._sought_queues(topic, queue_id):
            self.seek(topic, q, self.min_offset(topic, q))

    seek_to_beginning = seek_to_begin

    def seek_to_end(self, topic: str, queue_id: int | None = None) -> None:
        """`seek` to the queue's `max_offset`: only what is sent from now on is read."""
        for q in self._sought_queues(topic, queue_id):
            self.seek(topic, q, self.max_offset(topic, q))

    def seek_to_time(self, topic: str, timestamp_ms: int, queue_id: int | None = None) -> None:
        """`seek` to the first message stored at or after ``timestamp_ms`` (ms since the
        epoch; `offsets_for_times`), or to the end where every message is older: replaying from
        a time without stopping the group (no `resetOffsetByTime`)."""
        timestamp_ms = v.check_offset(timestamp_ms, "timestamp_ms")
        queues = self._sought_queues(topic, queue_id)
        found = self.offsets_for_times({(topic, q): timestamp_ms for q in queues})
        for q in queues:
            offset = found[(topic, q)]
            self.seek(topic, q, self.max_offset(topic, q) if offset is None else offset)

    def lag(self, queues: Iterable[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """Messages not yet read by this member, per queue (default: the queues it reads):
        `max_offset` less `position` (Kafka's consumer lag; rmq-admin consumerProgress gives the
        group's, from the committed offsets)."""
        out = {}
        for t, q in self._queues_or_assignment(queues):
            out[(t, q)] = max(0, self.max_offset(t, q) - self.position(t, q))
        return out

    def pause(self, queues: Iterable[tuple[str, int]]) -> None:
        """`poll` reads nothing from these ``(topic, queue_id)`` until `resume` (RocketMQ's lite
        pull and Kafka's pause). A paused queue stays this member's: under CLUSTERING nobody
        else reads it meanwhile. Any queue may be named, held or not (a rebalance keeps the
        pause)."""
        keys = [_queue_key(key) for key in queues]
        with self._lock:
            self._paused.update(keys)

    def resume(self, queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Undo `pause` for these queues (default: all)."""
        with self._lock:
            if queues is None:
                self._paused.clear()
            else:
                self._paused.difference_update(_queue_key(key) for key in queues)

    def paused(self) -> set[tuple[str, int]]:
        """The queues `pause` holds back (Kafka's paused)."""
        with self._lock:
            return set(self._paused)

    def _topic_queues(self, topic: str) -> list[int]:
        return [queue_id for queue_id, _slot in self.queues.queues_of(topic)]

    def _on_claim(self, topic: str, queue_id: int, committed: int, known: bool) -> None:
        """A queue newly held: read it from the group's committed offset (lock held)."""
        self._lost.discard((topic, queue_id))
        self._claimed.append((topic, queue_id))
        sub = self.subscriptions[topic]
        if known:
            sub.next_offsets[queue_id] = committed
        elif queue_id in sub.starts:
            sub.next_offsets[queue_id] = sub.starts[queue_id]
        else:  # from 0, and nothing to commit for it until a poll reads it
            sub.next_offsets.pop(queue_id, None)
        # (a `from_offsets` start also sits in next_offsets before the queue is held: overwritten)

    def set_queue_listener(self, listener: QueueListener | None) -> None:
        """RocketMQ's MessageQueueListener (`messageQueueChanged`): ``listener(topic, released,
        claimed)`` runs in the polling thread, inside `poll`, after a rebalance changed this
        member's queues of ``topic`` (queue ids, sorted), before anything is read from the
        claimed ones. A released queue's commits are ignored from then on (its new holder reads
        what was not committed): a push consumer drops the messages it still has from it."""
        self.queue_listener = listener

    def _polled_queues(self) -> list[tuple[Subscription, int]]:
        """The (subscription, queue) pairs a poll reads, after a rebalance when one is due: a
        member joins the group at its first poll."""
        changes: dict[str, tuple[list[int], list[int]]] = {}
        try:
            return self._rebalanced(changes)
        finally:
            if changes and self.queue_listener is not None:
                for topic, (released, claimed) in sorted(changes.items()):
                    self.queue_listener(topic, sorted(released), sorted(claimed))

    def _rebalanced(self, changes: dict[str, tuple[list[int], list[int]]]) -> list[tuple[Subscription, int]]:
        """`_polled_queues` under the lock; fills ``changes`` (topic -> (released, claimed))."""
        with self._lock:
            if self.message_model is MessageModel.BROADCASTING:
                if not self.rebalance.joined:
                    self.rebalance.join()
                if self.rebalance.due():
                    self.rebalance.run([], self._on_claim)
                return [
                    (sub, q) for sub in self.subscriptions.values() for q in self._topic_queues(sub.topic)
                ]
            if not self.rebalance.joined:
                self.rebalance.join()
            if self.rebalance.due():
                before = self.before_rebalance
                hooked = before is not None and self.rebalance.may_release()
                if before is not None and hooked:
                    before()
                self._claimed.clear()
                try:
                    released = self.rebalance.run(list(self.subscriptions), self._on_claim)
                finally:
                    if hooked and self.after_rebalance is not None:
                        self.after_rebalance()
                for topic, queue_id in self._claimed:
                    changes.setdefault(topic, ([], []))[1].append(queue_id)
                for topic, queue_id in released:  # dropped: its commits are ignored from now on
                    changes.setdefault(topic, ([], []))[0].append(queue_id)
                    self._lost.add((topic, queue_id))
                    if topic in self.subscriptions:
                        self.subscriptions[topic].next_offsets.pop(queue_id, None)
            owned = self.rebalance.owned
            return [(sub, q) for sub in self.subscriptions.values() for q in sorted(owned.get(sub.topic, {}))]

    def poll(self, timeout_s: float = 1.0, max_msgs: int = 32) -> list[MessageExt]:
        """The next messages of the queues this member reads (`assignment`); waits up to
        ``timeout_s`` when there are none. A long poll also ends its wait when the group
        changes (a member joins, leaves or dies, a queue is released), moves its queues and
        reads on. Queues are visited round-robin from one poll to the next, so a backlog in one
        does not starve the others."""
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
            try:
                pairs = self._polled_queues()
            except ShmAttachError as exc:  # a semaphore of the group's members gone with the store
                self._raise_if_stopped(exc)
                raise
            start = self._rr % len(pairs) if pairs else 0
            for sub, queue_id in pairs[start:] + pairs[:start]:
                if (sub.topic, queue_id) in self._paused:
                    continue
                offset = sub.next_offsets.get(queue_id)
                if offset is None:  # never committed, no start given: consume_from_where
                    offset = self._start_offset(sub.topic, queue_id)
                    if self.consume_from_where is not ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                        sub.next_offsets[queue_id] = offset  # the end or a time: fixed once read
                result = self._read(sub.topic, queue_id, offset, max_msgs - len(batch), sub.tags)
                if result.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                     GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                                     GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.MESSAGE_WAS_REMOVING):  # fmt: skip
                    sub.next_offsets[queue_id] = result.next_begin_offset
                batch.extend(result.messages)
                if len(batch) >= max_msgs:
                    self._rr += 1
                    return batch
            self._rr += 1
            remaining = deadline - time.monotonic()
            if batch or remaining <= 0:
                return batch
            self._park(
                "", 0, 0, min(remaining, max(self.rebalance.seconds_to_check(), 0.001)), any_queue=True,
                wake_if=self.rebalance.due,
            )  # fmt: skip

    def __iter__(self) -> Iterator[MessageExt]:
        """Messages of the subscriptions until a poll of one second finds none."""
        while batch := self.poll(1.0):
            yield from batch

    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        """Record the group's consumed offsets: the next offsets of every queue this member reads,
        or the ``{(topic, queue_id): next_offset}`` given. The supervisor persists them to
        `config/consumerOffset.json` every `flushConsumerOffsetInterval` ms and at stop.

        Under CLUSTERING a queue this member held and lost to a rebalance is left out (as
        RocketMQ drops the offset of a removed ProcessQueue): its new owner's progress is never
        set back. (An offset given for a queue it never held is recorded: the assign-style use
        of `pull`.) Under BROADCASTING the offsets are this member's own, written to its
        `LocalFileOffsetStore` file, not the group's. Returns every offset this consumer
        committed so far.

        Every entry is checked before any is recorded (all or nothing): a topic the store cannot
        hold or one with '@' (consumerOffset.json's ``topic@group`` separator), a queue id outside
        0..2^31-1, an offset that is negative or beyond a Java long raise `InvalidArgumentError`."""
        given = None if offsets is None else _commit_offsets(offsets)
        with self._lock:
            if given is None:
                given = {(t, q): o for t, s in self.subscriptions.items() for q, o in s.next_offsets.items()}
                if self.message_model is MessageModel.CLUSTERING:  # the queues held, not the starts
                    owned = self.rebalance.owned
                    given = {(t, q): o for (t, q), o in given.items() if q in owned.get(t, {})}
            if self.message_model is MessageModel.BROADCASTING:
                for (topic, queue_id), offset in given.items():
                    self.local_offsets.update(topic, queue_id, offset)
                    self.committed[(topic, queue_id)] = offset
                self.local_offsets.persist()
                return dict(self.committed)
            given = {key: offset for key, offset in given.items() if key not in self._lost}
            self._check_running()  # never into the table of a store that stopped: it is not persisted
            self._refuse_on_a_slave()
            groups = self.store.shm.groups
            keys = [(self._offset_key(topic), queue_id) for topic, queue_id in given]
            slots = [groups.find(key, queue_id) for key, queue_id in keys]
            if min(slots, default=0) < 0:  # new entries: all or nothing (a full table refuses the commit)
                with self.store.shm.flags_lock("register group offsets"):
                    slots = groups.find_or_insert_all(keys)
            for (queue, offset), slot in zip(given.items(), slots, strict=True):
                groups.set(slot, qo.COMMITTED, offset)
                self.committed[queue] = offset
            return dict(self.committed)

    def _offset_key(self, topic: str) -> str:
        return ConsumerOffsetManager.key(self.group, topic)


_LONG_MIN = -v.JAVA_LONG_MAX - 1


class _Hold:
    """`Consumer.hold_from`'s context: a class, not a generator, since every pull takes one
    (1.2 -> 0.4 us an enter and exit)."""

    __slots__ = ("consumer", "phy_offset")

    def __init__(self, consumer: Consumer, phy_offset: int) -> None:
        self.consumer = consumer
        self.phy_offset = phy_offset

    def __enter__(self) -> None:
        if self.phy_offset >= 0:
            c = self.consumer
            c._holds.append(self.phy_offset)
            c.waiters.set(c._waiter_slot, wt.HOLD, min(c._holds))

    def __exit__(self, *exc: object) -> None:
        if self.phy_offset >= 0:
            c = self.consumer
            c._holds.remove(self.phy_offset)
            c.waiters.set(c._waiter_slot, wt.HOLD, min(c._holds, default=wt.NO_HOLD))


def _entry_phy(cq: ConsumeQueue, offset: int) -> int:
    """The commit-log offset of a queue's entry (0 where there is none: below any window)."""
    return (cq.get_entry(offset) or (0,))[0]


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


def _first_at_or_after(
    cq: ConsumeQueue, log: CommitLog, low: int, high: int, timestamp_ms: int
) -> int | None:
    """The first offset in ``[low, high)`` whose message was stored at or after ``timestamp_ms``
    (store times grow along a queue), None when none was; an entry whose record is gone counts
    as older."""

    def time_at(offset: int) -> int:
        entry = cq.get_entry(offset)
        if entry is None or not 0 < entry[1] < PRE_BLANK_SIZE:
            return -1
        return log.store_timestamp_at(entry[0], entry[1])

    if time_at(high - 1) < timestamp_ms:
        return None
    while low < high:
        mid = (low + high) // 2
        if time_at(mid) >= timestamp_ms:
            high = mid
        else:
            low = mid + 1
    return low


def _queue_key(key: object) -> tuple[str, int]:
    """A ``(topic, queue_id)`` argument, checked."""
    if not isinstance(key, tuple) or len(key) != 2:
        raise InvalidArgumentTypeError(f"a queue is a (topic, queue_id) pair, not {key!r}")
    return v.check_topic(key[0], with_offsets=True), v.check_queue_id(key[1])


def check_consume_from_where(where: object, timestamp_ms: object) -> tuple[ConsumeFromWhere, int]:
    """``consume_from_where`` and ``consume_timestamp_ms`` (None: half an hour ago), checked."""
    if not isinstance(where, ConsumeFromWhere):
        raise InvalidArgumentTypeError(
            f"consume_from_where must be a ConsumeFromWhere, not {type(where).__name__}"
        )
    if timestamp_ms is None:
        return where, max(0, int(time.time() * 1000) - CONSUME_TIMESTAMP_AGO_MS)
    return where, v.check_offset(timestamp_ms, "consume_timestamp_ms")


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
