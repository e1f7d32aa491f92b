"""Producer: any local process attaches to a running store by shm name and appends itself.

Mirrors SendMessageProcessor + `CommitLog.putMessage`/`putMessages` (docs/format.md §3):
records are encoded outside the lock into runs (`message_batch.EncodedRun`: consecutive records
of one topic and queue); under the put lock each run gets its queue offsets, physical offsets
and store time patched in and is copied into the pool buffer (ASYNC_FLUSH with the pool) or
into the file (through the shared mapping, or by pwrite: `MappedFile.fill`), in chunks that end
where a file ends (a BLANK record closes the file). Then the committer or flusher is woken and,
under SYNC_FLUSH, the put waits for the flusher to complete its flush request
(FLUSH_DISK_TIMEOUT after `syncFlushTimeout`). A put waits first while dispatch is more than
`maxDispatchLagBytes` behind (back-pressure: reput must keep up). Before the lock, RocketMQ's
checks: a SLAVE refuses puts, and a put lock held over `osPageCacheBusyTimeOutMills` by a live
put answers OS_PAGECACHE_BUSY at once. A SYNC_MASTER put that waits for the store is answered
once a slave acknowledged it (rmq_mp/put/replica_wait.py: PUT_OK, FLUSH_SLAVE_TIMEOUT,
SLAVE_NOT_AVAILABLE; the compiled core waits the same way, rmq_mp/put/_core.c `replica_*`).

- `send`: one message, one run of one record.
- `send_batch(MessageBatch)`: RocketMQ's batch, one run encoded column-wise with numpy and
  stored whole in one file.
- `send_batch([...])`: any messages under one lock hold; consecutive ones of one queue form a
  run. Each keeps its own queue offset and result.

The compiled core (`rmq_mp.put.native`, rmq_mp/put/_core.c) does the common `send` and a plain
`MessageBatch` in one call each, the same way; what it does not take, it hands back before
changing anything shared, and the code here (the reference) does the whole send.

Crash safety: before a chunk changes anything, the put writes a journal (old write position,
intended end, queue slot and old queue offset) into the pointer table; the write position is
the commit point. A producer that dies holding the lock leaves the journal, and the next lock
taker undoes the half-done put (queue offset restored, bytes past the write position zeroed),
so a half-written record is never visible, not to reput and not after recovery.
"""

from __future__ import annotations

import copy
import logging
import os
import struct
import time
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any

from rmq_mp import validators as v
from rmq_mp.config.store_config import BrokerRole
from rmq_mp.errors import (
    FenceRefusedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    OffsetTableFullError,
    ShmAttachError,
)
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.message_batch import (
    UNIQ_KEY_PREFIX,
    EncodedRun,
    MessageBatch,
    Placement,
    UniqKeys,
    properties_text,
)
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus, RunningFlags
from rmq_mp.put import native
from rmq_mp.put.append import PUT_FIELDS, Appender, OnePut
from rmq_mp.put.encoding import SendEncoder, int_or_minus_one, typed_arguments, waits_for_store
from rmq_mp.put.flush_wait import NOT_FLUSHED, RING_FULL
from rmq_mp.put.metrics import PutRecorder
from rmq_mp.put.replica_wait import NO_SLAVE_REASON, NOT_REQUESTED, TIMEOUT_REASON, ReplicaRequests
from rmq_mp.put.replica_wait import RING_FULL as REPLICA_RING_FULL
from rmq_mp.put.results import SendBatchResult, SendResult, SendResultList
from rmq_mp.put.routing import QueueRouter
from rmq_mp.store import schedule
from rmq_mp.store.disk import not_writeable_reason
from rmq_mp.store.put_rules import ENCODE_FAILURES, refused_send
from rmq_mp.store.running_store import (
    REATTACH_WAIT_S,
    START_TIMEOUT_S,
    SUPERVISOR_STALE_MS,
    Instance,
    RunningStore,
)
from shm import flush_requests as fr
from shm import layout
from shm.layout import Role
from shm.metrics import REFERENCE_REASONS
from shm.pointer_table import pid_alive
from shm.put_lock import SLICE_MS, SPIN_NS, AtomicPutLock, HeldPutLock
from shm.semaphores import PutLock, TakeoverGate

log = logging.getLogger("rmq_mp.put.producer")

LOCK_TIMEOUT_S = 3.0
"""How long a put waits for the lock before reporting OS_PAGECACHE_BUSY (never a hang)."""
DISPATCH_WAIT_S = 0.001
"""How often a put held back by maxDispatchLagBytes looks at reput's progress."""

_STATE = layout.STATE.index
_HEARTBEAT = layout.SUPERVISOR_HEARTBEAT_MS.index
_SUPERVISOR_PID = layout.SUPERVISOR_PID.index
_FLAGS = layout.RUNNING_FLAGS.index
_REPUT_FROM = layout.REPUT_FROM_OFFSET.index
_WROTE = layout.WROTE_POSITION.index
_FLUSHED = layout.FLUSHED_POSITION.index
_FENCE = layout.FENCE.index
_FENCERS = {
    layout.FENCED_BY_SHUTDOWN: "its supervisor's shutdown",
    layout.FENCED_BY_STOP: "run.py stop (its supervisor had died)",
    layout.FENCED_BY_START: "a start over its dead supervisor's shared memory",
}
_NATIVE_WORDS = (
    "WROTE_POSITION",
    "JOURNAL_ACTIVE",
    "JOURNAL_WROTE_BEFORE",
    "JOURNAL_WROTE_AFTER",
    "JOURNAL_QUEUE_SLOT",
    "JOURNAL_QUEUE_OFFSET_BEFORE",
    "LAST_STORE_TIMESTAMP",
    "PUT_COUNT",
    "PUT_BYTES",
    "STATE",
    "SUPERVISOR_HEARTBEAT_MS",
    "RUNNING_FLAGS",
    "REPUT_FROM_OFFSET",
    "FLUSH_REQUEST_SEQ",
    "FLUSHED_POSITION",
    "PUT_LOCK_OWNER_PID",
    "PUT_LOCK_SINCE_MS",
)
"""The pointer-table fields the compiled send reads or writes (their indices go to it by name)."""
_PUT_BLOCKERS = int(RunningFlags.put_blockers())
_PUT_OK = PutMessageStatus.PUT_OK
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_QUEUES_EXCEEDED = PutMessageStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
_NO_CORE = REFERENCE_REASONS.index("no_core")
_ITEM = REFERENCE_REASONS.index("item")


_MASTER_CODES = (layout.ROLE_CODES["ASYNC_MASTER"], layout.ROLE_CODES["SYNC_MASTER"])
"""BROKER_ROLE_NOW after a promotion: a slave's producer binds to the store as a master."""


class Producer:
    """Attach with `Producer.attach(name)`. One thread sends through an instance at a time: a
    process may hold several (one per thread), and threads share one through
    `rmq_mp.put.locked.ThreadSafeProducer` (why: that module). A refused send is a result, not
    an exception: `SendResult.raise_for_status` makes it one.

    A producer outlives a restart of its store: a send that finds its store stopping, stopped,
    fenced (`rmq_mp.put.fence`) or its supervisor dead looks whether a newer start of the store runs under the same shm name
    and, if so, attaches to it and sends there (waiting up to `REATTACH_WAIT_S` for one still
    starting); otherwise it is answered SERVICE_NOT_AVAILABLE saying so, and the next send looks
    again."""

    def __init__(self, store: RunningStore) -> None:
        self.uniq = m.UniqueIdGenerator()
        self._round_robin: dict[str, int] = {}
        self._bind(store)

    def _bind(self, store: RunningStore) -> None:
        """Everything that belongs to one start of the store (its shared memory, settings and
        put state); `uniq` and the round robin belong to the producer and outlive a restart."""
        self.store = store
        self.table = store.shm.table
        self.queues = store.shm.queues
        self.ring = store.shm.ring
        self.config = store.config
        self.store_host: m.Host = (self.config.broker_ip1, self.config.listen_port)
        self.born_host: m.Host = ("127.0.0.1", os.getpid() & 0xFFFF)
        self._native: Any = None
        """The compiled send (`rmq_mp.put.native`), or None: every send runs the reference."""
        self._words = self.table.words(*PUT_FIELDS)
        """Pointer-table words for the put path (writer check done once, in `words`)."""
        self.encoder = record.RecordEncoder(
            self.store_host, self.born_host, append_crc=self.config.enabled_append_prop_crc
        )
        self.router = QueueRouter(
            store.paths.topics, self.config.default_topic_queue_nums, self.queues, self._round_robin
        )
        self.encoding = SendEncoder(
            self.encoder,
            self.uniq,
            self.router,
            born_host=self.born_host,
            max_message_size=self.config.max_message_size,
            max_delay_level=len(self.config.delay_levels_ms),
        )
        self.appender = Appender(store, self._words, self.router, self.encoder)
        self.flush_requests = self.appender.flush_requests
        self.lock: HeldPutLock = self._put_lock(store)
        self._msg_id_prefix = (
            (self.encoder.store_ip + struct.pack(">i", self.encoder.store_port)).hex().upper()
        )
        self._max_lag = self.config.max_dispatch_lag_bytes
        self._slave = self.config.broker_role is BrokerRole.SLAVE
        self._accepting_state = -1 if self._slave else layout.RUNNING
        self._sync_master = self.config.broker_role is BrokerRole.SYNC_MASTER
        self._sync = store.sync_flush
        self._acks = self._sync or self._sync_master
        self.replicas = (
            ReplicaRequests(
                store.shm,
                self._words,
                self.config.slave_timeout,
                self.config.ha_slave_fallbehind_max,
                os.getpid(),
            )
            if self._sync_master
            else None
        )
        """SYNC_MASTER: the replica-request ring (rmq_mp/put/replica_wait.py)."""
        self._replica_slot = NOT_REQUESTED
        """The last put's replica request (taken under its lock hold)."""
        self._replica_put_ms = 0
        """A put that waits for the store is answered after more than its append."""
        self._pool = store.pool_enabled
        wake_after_put = self._pool or self._sync or not self.config.flush_commit_log_timed
        self._wake_after_put = (
            store.shm.wakeup("committer" if self._pool else "flusher") if wake_after_put else None
        )
        """RocketMQ's timed ASYNC flusher sleeps its interval whatever happens, so waking it
        would only cost this put a system call."""
        self._wake_reput = None if self._sync or self._pool else store.shm.wakeup("reput")
        """Reput reads what is readable: flushed under SYNC_FLUSH, committed with the pool; the
        flusher or committer wakes it then."""
        self._metrics = PutRecorder(store)
        if native.core is not None and isinstance(self.lock, AtomicPutLock) and not self._slave:
            self._native = native.core.Sender(self._native_settings(store))
            self._native.bind(self._send, self.router.queue_for, self.appender.prefault_ahead)
            self.router.native = self.appender.native = self._native
            # The compiled send, bound on this instance, shadows the `send` method below (which
            # stays the documented entry and the path without the core): one C call per send,
            # no Python frame before it (15-17% of a send, measured by perf).
            vars(self)["send"] = self._native.send_kw
        else:
            vars(self).pop("send", None)

    def _put_lock(self, store: RunningStore) -> HeldPutLock:
        """The put lock the store's supervisor chose (`shm.layout.PUT_LOCK_KIND`)."""
        spin = not self.config.use_reentrant_lock_when_put_message
        busy_ms = self.config.os_page_cache_busy_time_out_mills
        if self.table.get(layout.PUT_LOCK_KIND) == layout.LOCK_ATOMIC:
            if native.lock_core is None:
                raise ShmAttachError(
                    f"store {store.names.base} takes the compiled core's atomic put lock, and this process "
                    f"cannot load the core ({native.why_reference}): rebuild it, or start the store with "
                    f"{native.PURE_ENV}=1"
                )
            return AtomicPutLock(
                native.lock_core, self.table, self.appender.undo_interrupted_put, spin=spin, busy_ms=busy_ms
            )
        return PutLock(
            store.shm.semaphore(store.names.put_lock),
            store.shm.takeover_gate(TakeoverGate.PUT),
            self.table,
            on_takeover=self.appender.undo_interrupted_put,
            spin=spin,
            busy_ms=busy_ms,
        )

    def _native_settings(self, store: RunningStore) -> dict[str, Any]:
        """Everything `_core.Sender` needs, from the layout modules and this producer: the core
        computes no shared-memory offset of its own."""
        names = store.names
        wakes = []
        if self._wake_after_put is not None:
            role = "committer" if self._pool else "flusher"
            wakes.append((layout.worker_field(role, "notified").index, names.wakeup(role)))
        if self._wake_reput is not None:
            wakes.append((layout.worker_field("reput", "notified").index, names.wakeup("reput")))
        settings: dict[str, Any] = {
            "words": {name: getattr(layout, name).index for name in _NATIVE_WORDS},
            "fence_word": _FENCE,
            "accepting_state": self._accepting_state,
            "put_blockers": _PUT_BLOCKERS,
            "supervisor_stale_ms": SUPERVISOR_STALE_MS,
            "max_dispatch_lag_bytes": self._max_lag,
            "pid": self.lock.pid,
            "spin_ns": SLICE_MS * 1_000_000 if self.lock.spin else SPIN_NS,
            "slice_ms": 0 if self.lock.spin else SLICE_MS,
            "max_message_size": self.config.max_message_size,
            "crc_placeholder": record.CRC_PLACEHOLDER if self.encoder.append_crc else b"",
            "sync": int(self._sync),
            "table": self.table.segment.mm,
            "queues": self.queues.segment.mm,
            "uniq_state": self.uniq.state,
            "uniq_prefix": self.uniq.prefix_hex,
            "born_ip": self.encoding.born_ip,
            "born_port": self.encoding.born_port,
            "store_ip": self.encoder.store_ip,
            "store_port": self.encoder.store_port,
            "wakes": wakes,
            "metrics": self._metrics.native_view(),
            "result_type": SendResult,
            "PUT_OK": _PUT_OK,
            "FLUSH_DISK_TIMEOUT": PutMessageStatus.FLUSH_DISK_TIMEOUT,
            "msg_id_prefix": self._msg_id_prefix,
            "ring_full_reason": RING_FULL,
            "not_flushed_reason": NOT_FLUSHED,
            "max_delay_level": len(self.config.delay_levels_ms),
            "reference_word": self._metrics.reference_word,
            "reference_reasons": len(REFERENCE_REASONS),
            "replica": self._native_replica_settings(store),
        }
        if self._sync:
            ring = self.ring
            settings.update(
                ring=ring.segment.mm,
                ring_capacity=ring.capacity,
                ring_base=ring.byte_offset(0, 0),
                ring_slot_size=fr.SLOT_SIZE,
                ring_state=fr.STATE,
                ring_next_offset=fr.NEXT_OFFSET,
                ring_deadline_ms=fr.DEADLINE_MS,
                ring_pid=fr.PID,
                ring_started_ns=fr.STARTED_NS,
                gather_word=layout.FLUSH_GATHER_TICKET.index,
                FREE=fr.FREE,
                WAITING=fr.WAITING,
                DONE_OK=fr.DONE_OK,
                DONE_TIMEOUT=fr.DONE_TIMEOUT,
                ABANDONED=fr.ABANDONED,
                sync_flush_timeout_ms=self.config.sync_flush_timeout,
                flush_done_names=[names.flush_done(i) for i in range(ring.capacity)],
            )
        return settings

    def _native_replica_settings(self, store: RunningStore) -> dict[str, Any] | None:
        """SYNC_MASTER: the replica-request ring as the core's `replica_*` functions use it."""
        if self.replicas is None:
            return None
        ring = self.replicas.ring
        return {
            "ring": ring.segment.mm,
            "capacity": ring.capacity,
            "base": ring.byte_offset(0, 0),
            "slot_size": fr.SLOT_SIZE,
            "state": fr.STATE,
            "next_offset": fr.NEXT_OFFSET,
            "deadline_ms": fr.DEADLINE_MS,
            "pid": fr.PID,
            "FREE": fr.FREE,
            "WAITING": fr.WAITING,
            "DONE_OK": fr.DONE_OK,
            "DONE_TIMEOUT": fr.DONE_TIMEOUT,
            "ABANDONED": fr.ABANDONED,
            "stale_ms": fr.STALE_MS,
            "seq_word": layout.HA_REQUEST_SEQ.index,
            "acked_word": layout.HA_ACKED_OFFSET.index,
            "connections_word": layout.HA_CONNECTIONS.index,
            "timeout_ms": self.replicas.timeout_ms,
            "fallbehind_max": self.replicas.fallbehind_max,
            "done_names": [store.names.replica_done(i) for i in range(ring.capacity)],
            "wake_address": store.names.ha_wake,
            "SLAVE_NOT_AVAILABLE": PutMessageStatus.SLAVE_NOT_AVAILABLE,
            "FLUSH_SLAVE_TIMEOUT": PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
            "no_slave_reason": NO_SLAVE_REASON,
            "timeout_reason": TIMEOUT_REASON,
            "ring_full_reason": REPLICA_RING_FULL,
            "count": self.replicas.count,
        }

    @classmethod
    def attach(cls, name: str | os.PathLike[str], *, start_timeout_s: float = START_TIMEOUT_S) -> Producer:
        """Attach to the running store ``name`` (shm name or store directory); one still starting
        is waited for up to ``start_timeout_s`` (`StoreNotRunningError` after it), so that no
        send is refused for a start that was about to finish."""
        store = RunningStore.attach(name, Role.PRODUCER, writable_log=True, start_timeout_s=start_timeout_s)
        try:
            return cls(store)
        except BaseException:
            store.close()
            raise

    def _reattach(self, why: str, *, promoted: bool = False) -> str:
        """After a refusal ``why`` that says the store stopped or its supervisor died: attach to
        a newer start of the store under the same shm name, if there is one. '' once attached
        (the caller looks at the new store's state again), else ``why`` and what to expect."""
        names = self.store.names
        instance = Instance.of(names)
        if instance is None or (instance.generation == self.table.get(layout.GENERATION) and not promoted):
            return f"{why}; this producer attaches again by itself at a send once the store runs again"
        try:
            store = RunningStore.attach(
                names.base, Role.PRODUCER, writable_log=True, start_timeout_s=REATTACH_WAIT_S
            )
        except ShmAttachError as exc:
            return f"{why}; attaching to its new start failed ({exc}); the next send tries again"
        old, old_native = self.store, self._native
        try:
            self._bind(store)
        except ShmAttachError as exc:
            store.close()
            self._bind(old)
            return f"{why}; its new start cannot be used here: {exc}"
        if old_native is not None:
            old_native.close()
        old.close()
        log.info("producer reattached to store %s (start %d)", names.base, self.table.get(layout.GENERATION))
        return ""

    def close(self) -> None:
        """Detach (again: a no-op). The compiled send goes first: it holds views of the shared
        segments, and nothing may reach it once closed."""
        self.appender.set_file(None)
        if self.replicas is not None:
            self.replicas.close()
        if self._native is not None:
            self._native.close()
            self._native = self.appender.native = self.router.native = None
            vars(self).pop("send", None)
        self.store.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ API

    def send(
        self,
        topic: str,
        body: m.Body,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        flag: int = 0,
    ) -> SendResult:
        """Store one message; the result's status is RocketMQ's PutMessageStatus. A message the
        store refuses (topic over 127 UTF-8 bytes, queue id outside 0..2^31-1 or outside the
        topic's queues, properties or body too long) is answered MESSAGE_ILLEGAL with the reason
        and nothing stored; an argument of the wrong type raises `InvalidArgumentTypeError`
        (`rmq_mp.validators`).

        With the compiled core (`rmq_mp.put.native`), a producer's ``send`` is the core's own,
        bound in `_bind`: it sends the common message in one call and hands anything else to
        `_send`, the reference, which is all this method does."""
        self._metrics.reference(_NO_CORE)
        return self._send(topic, body, tags, keys, properties, queue_id, flag, queue_id is not None)

    def _send(
        self,
        topic: str,
        body: m.Body,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: Any,
        flag: int,
        named: bool,
    ) -> SendResult:
        """`send` in Python: the reference the compiled core is tested against. ``named``: the
        caller gave ``queue_id`` (a rotated one, or None to rotate here, is not checked)."""
        started_ns = time.perf_counter_ns()  # CLOCK_MONOTONIC, as the flusher reads it
        self.appender.flush_requests.started_ns = started_ns
        born_ms = time.time_ns() // 1_000_000
        uniq = self.uniq.next_id(born_ms)
        wait = True
        try:
            # Three type tests are all the common send pays (a wrong type raises before any value
            # is judged); anything else wrong surfaces as an exception of the encode, diagnosed
            # then (`refused_send`).
            if type(body) is not bytes or type(flag) is not int or (named and type(queue_id) is not int):
                body, queue_id, flag = typed_arguments(body, queue_id, flag)
            if queue_id is None:
                queue_id = self.router.queue_for(topic, None)
            if properties or tags or keys:
                v.check_properties(tags, keys, properties)
                text = properties_text(properties, tags, keys, uniq)
                if properties:
                    uniq = properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
                    wait = waits_for_store(properties)
            else:
                text = f"{UNIQ_KEY_PREFIX}{uniq}"
            if named and not self.router.known(topic, queue_id):  # after every type check
                self.router.check(topic, queue_id)
            real_topic, real_queue_id = topic, queue_id
            if properties and (delay := properties.get(m.PROPERTY_DELAY_TIME_LEVEL)) is not None:
                delayed = schedule.delayed_put(topic, queue_id, 0, delay, text, self.encoding.max_delay_level)
                if delayed is not None:
                    topic, queue_id, text = delayed
            self.lock.last_hold_ns = -1
            data = self.encoding.record(topic, body, queue_id, flag, born_ms, text)
        except RecordRejected as exc:
            v.topic_problem(topic)  # a wrong type raises first (the others were checked above)
            result = SendResult(exc.status, int_or_minus_one(queue_id), -1, -1, uniq, exc.reason)
        except InvalidArgumentError:
            raise
        except ENCODE_FAILURES as exc:
            reason = refused_send(exc, v.send_problem(topic, body, queue_id, flag, tags, keys, properties))
            result = SendResult(_ILLEGAL, int_or_minus_one(queue_id), -1, -1, uniq, reason)
        else:
            result = self._put_one(topic, queue_id, data, uniq, wait, born_ms)
            if (
                topic != real_topic or queue_id != real_queue_id
            ):  # delayed: the sender's queue, as RocketMQ's broker answers
                result.queue_id = real_queue_id
                self._learn_delayed_topic(real_topic)
        self._metrics.record(started_ns, 1, result.status is not _PUT_OK, self.lock.last_hold_ns)
        return result

    def _learn_delayed_topic(self, topic: str) -> None:
        """After the reference stored a delayed send: the core learns its topic's queue limit, so
        that it takes the next delayed send to it (the send's own queue holds nothing of it, so
        no put there ever teaches the core that queue; each such send was the reference's)."""
        if self._native is not None and topic != m.SCHEDULE_TOPIC and not v.topic_problem(topic):
            self._native.learn_topic(topic, self.encoder.topic_field(topic), self.router.limit(topic))

    def send_batch(self, messages: MessageBatch | Iterable[m.Message | Mapping[str, Any]]) -> SendBatchResult:
        """Store many messages: a `MessageBatch` (RocketMQ's batch: one topic and queue, whole in
        one file, one put-lock hold), or any `Message`s and ``send`` keyword dicts, each with its
        own queue offset. Results come in the order given. With the compiled core, keyword dicts
        are each stored as `send` stores them (a lock hold each, as RocketMQ's producer sends
        them); the reference holds the lock once for the whole call."""
        why = _ITEM
        if type(messages) is MessageBatch and self._native is not None and type(messages.topic) is str:
            queue_id = messages.queue_id
            if queue_id is None:
                queue_id = self.router.queue_for(messages.topic, None)
            result = self._send_batch_natively(messages, queue_id)
            if result is not None:
                return result
            why = self._native.why
            if messages.queue_id is None:  # rotated once: the reference stores it on that queue
                # (a copy, not `replace`: its checks would raise for a DELAY set on the batch
                # since it was made, which the put refuses, MESSAGE_ILLEGAL, as RocketMQ does)
                messages = copy.copy(messages)
                object.__setattr__(messages, "queue_id", queue_id)
        elif (
            self._native is not None
            and not isinstance(messages, (MessageBatch, str, bytes, Mapping))
            and isinstance(messages, Iterable)
        ):
            items = messages if type(messages) is list else list(messages)
            if not items:
                return SendResultList([])
            return self._send_items_natively(items)
        if isinstance(messages, MessageBatch) and isinstance(messages.bodies, Sized):
            self._metrics.reference(_NO_CORE if self._native is None else why, len(messages.bodies))
        elif self._native is None and isinstance(messages, Sized):
            self._metrics.reference(_NO_CORE, len(messages))
        return self._send_batch_reference(messages)

    def _send_batch_reference(
        self,
        messages: MessageBatch | Iterable[m.Message | Mapping[str, Any]],
        *,
        started_ns: int = 0,
        done: Sequence[SendResult] = (),
    ) -> SendBatchResult:
        """`send_batch` in Python: the reference. ``done``: results of the call's messages the
        core sent first (since ``started_ns``), counted in this call's one metrics observation."""
        started_ns = started_ns or time.perf_counter_ns()
        born_ms = int(time.time() * 1000)
        if isinstance(messages, MessageBatch):
            runs = [self.encoding.batch(messages, born_ms)] if messages.bodies else []
        elif isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping)):
            runs = self.encoding.runs(messages, born_ms)
        else:
            raise InvalidArgumentTypeError(
                f"send_batch takes a MessageBatch or an iterable of Message or send keyword dicts, "
                f"not {type(messages).__name__}"
            )
        self.lock.last_hold_ns = -1
        pending = [run for run in runs if run.pending]
        if pending:
            self.appender.flush_requests.started_ns = started_ns
            self._put(pending, born_ms)
            self._acknowledge(pending)
        result = SendBatchResult(runs, self._msg_id_prefix)
        failures = result.failures + sum(1 for r in done if r.status is not _PUT_OK)
        self._metrics.record(started_ns, len(result) + len(done), failures, self.lock.last_hold_ns)
        return result

    def _send_items_natively(self, items: list[Any]) -> SendBatchResult:
        """`send_batch` of a list: the compiled core sends its keyword dicts one by one (each
        as `send`, on its own queue) up to the first it does not take; the reference the rest."""
        assert self._native is not None
        started_ns = time.perf_counter_ns()
        done = self._native.send_items(items)
        while (
            len(done) < len(items) and self._native.why == _ITEM and isinstance(items[len(done)], m.Message)
        ):
            sent = self._put_message_natively(items[len(done)])
            if sent is None:
                break
            done.append(sent)
            if len(done) < len(items):
                done += self._native.send_items(items[len(done) :])
        if len(done) == len(items):
            return SendResultList(done)
        rest = items[len(done) :]
        rotated = self._native.rotated
        if rotated is not None and isinstance(rest[0], dict):  # the round robin moved on for it
            rest[0] = {**rest[0], "queue_id": rotated}
        self._metrics.reference(self._native.why, len(rest))
        tail = self._send_batch_reference(rest, started_ns=started_ns, done=done)
        return tail if not done else SendResultList(done + list(tail))

    def _put_message_natively(self, message: m.Message) -> SendResult | None:
        """A `Message` (as given: its born host and time, flags, properties; a DELAY rewritten)
        encoded by the reference's encoder and put by the compiled core; a refusal answered as
        the reference answers it; None, nothing stored, for what the core's put does not take."""
        assert self._native is not None
        run = self.encoding.message(message)
        uniq = run.uniq_keys[0] if run.uniq_keys else ""
        if not run.pending:
            return SendBatchResult((run,), self._msg_id_prefix)[0]
        got = self._native.put_encoded(run.topic, run.queue_id, run.data, run.wait_flush)
        if got is None:
            return None
        status, reason, queue_offset, phy_offset = got
        return SendResult(
            status, run.answer_queue_id, queue_offset, phy_offset, uniq, reason, self._msg_id_prefix
        )

    def _send_batch_natively(self, batch: MessageBatch, queue_id: int) -> SendBatchResult | None:
        """`send_batch` of a `MessageBatch` (bodies a list or tuple of buffers, per-message keys,
        common tags and properties; a known queue, fitting the current file) on ``queue_id`` by
        the compiled core; None otherwise, with nothing stored."""
        assert self._native is not None
        got = self._native.send_batch(
            batch.topic, batch.bodies, batch.tags, batch.keys, batch.properties, queue_id, batch.flag
        )
        if got is None:
            return None
        status, reason, queue_offset, phy_offset, born_ms, first, record_size, ends = got
        count = len(batch.bodies)
        run = EncodedRun(
            batch.topic,
            queue_id,
            b"",  # the records went from the core's buffer to the log; results need their sizes only
            count=count,
            record_size=record_size if ends is None else 0,
            ends=ends,
            uniq_keys=[given] * count
            if (given := (batch.properties or {}).get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)) is not None
            else UniqKeys(self.uniq.prefix_at(born_ms), first, count),
            whole=True,
        )
        run.place(Placement(0, count, status, reason, phy_offset, queue_offset))
        return SendBatchResult((run,), self._msg_id_prefix)

    # ------------------------------------------------------------------ put (the lock around the appender)

    def _refusal(self, now_ms: int, *, reattach: bool = True) -> tuple[PutMessageStatus, str] | None:
        """Why no put may happen now (RocketMQ's checks before taking the lock), or None. A store
        that stopped or lost its supervisor is replaced by a newer start of it when there is one
        (`_reattach`), and the checks run again there."""
        w = self._words
        if w[_STATE] != self._accepting_state:  # never equal on a slave: no extra test per put
            if self._slave and w[_STATE] == layout.RUNNING:
                if (  # rmq-admin promote made this store a master: bind to it as one, send there
                    reattach
                    and self.table.get(layout.BROKER_ROLE_NOW) in _MASTER_CODES
                    and not self._reattach("store promoted to master", promoted=True)
                ):
                    return self._refusal(now_ms, reattach=False)
                return (
                    PutMessageStatus.SERVICE_NOT_AVAILABLE,
                    "message store is in slave mode (brokerRole=SLAVE)",
                )
            why = f"store is not running ({self.store.instance.state_name})"
            if reattach and not (why := self._reattach(why)):
                return self._refusal(now_ms, reattach=False)
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, why
        if w[_FENCE]:  # a dead supervisor's start, fenced by a stop or start (state still RUNNING)
            why = fenced_reason(self.table)
            if reattach and not (why := self._reattach(why)):
                return self._refusal(now_ms, reattach=False)
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, why
        if now_ms - w[_HEARTBEAT] > SUPERVISOR_STALE_MS and not pid_alive(w[_SUPERVISOR_PID]):
            # A stale heartbeat alone may be a busy machine; a dead supervisor means nobody runs the store.
            why = "store supervisor is dead"
            if reattach and not (why := self._reattach(why)):
                return self._refusal(now_ms, reattach=False)
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, why
        flags = w[_FLAGS] & _PUT_BLOCKERS
        if flags:
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, not_writeable_reason(
                flags, w[layout.DISK_USED_PERMILLE.index], self.config
            )
        if self._max_lag and w[_WROTE] - w[_REPUT_FROM] > self._max_lag:
            return self._wait_for_dispatch()
        return None

    def _fenced_under_lock(self) -> tuple[PutMessageStatus, str] | None:
        """Right after the put lock is taken: None, or (the lock released) the refusal of a put
        to a fenced start. The fence is set under this lock (`fence`), so no put that passed
        `_refusal` before it can land after the fencer's hold."""
        if not self._words[_FENCE]:
            return None
        self.lock.release()
        return PutMessageStatus.SERVICE_NOT_AVAILABLE, (
            f"{fenced_reason(self.table)}; this producer attaches to the store's next start by itself at a send"
        )

    def fence(self, fenced_by: int, wait_s: float) -> int:
        """Fence this start of the store (`rmq_mp.put.fence`): under the put lock (taken over
        from a dead holder, whose half-done put is undone), FENCE is set, after which no put of
        any producer of this start lands. A live holder that keeps the lock ``wait_s`` raises
        `FenceRefusedError` naming its pid. Returns the number of dead holders taken over."""
        lock = self.lock
        recovered = self.table.get(layout.LOCK_RECOVERIES)
        lock.busy_ms = 1 << 40  # a fencer waits for a long hold instead of calling it busy
        if not lock.acquire(wait_s):
            holder = layout.lock_owner(self.table.get(layout.PUT_LOCK_OWNER_PID))
            raise FenceRefusedError(
                f"store {self.store.names.base}: producer pid {holder} holds the put lock of start "
                f"{self.table.get(layout.GENERATION)} (mid-put, stopped or hung) after {wait_s:g} s: its "
                f"files may still be written; let it go on (SIGCONT) or kill it, then run this again"
            )
        try:
            if not self.table.get(layout.FENCE):
                self.table.set(layout.FENCE_PID, os.getpid())
                self.table.set(layout.FENCE_MS, time.time_ns() // 1_000_000)
                self.table.set(layout.FENCE, fenced_by)
        finally:
            lock.release()
        return self.table.get(layout.LOCK_RECOVERIES) - recovered

    def _wait_for_dispatch(self) -> tuple[PutMessageStatus, str] | None:
        """Back-pressure: the log is more than maxDispatchLagBytes ahead of reput, so consumers
        would see new records ever later and a crash would replay ever more. Wait for reput to
        catch up (None), or give up after LOCK_TIMEOUT_S with the reason (reput stuck or gone)."""
        w = self._words
        self._wake_workers()
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while (lag := w[_WROTE] - w[_REPUT_FROM]) > self._max_lag:
            if time.monotonic() >= deadline:
                return PutMessageStatus.OS_PAGECACHE_BUSY, (
                    f"dispatch is {lag} bytes behind the commit log, more than maxDispatchLagBytes "
                    f"{self._max_lag}: reput is not keeping up"
                )
            time.sleep(DISPATCH_WAIT_S)
        return None

    def _put(self, runs: Sequence[EncodedRun], now_ms: int) -> None:
        """Append ``runs`` in one lock hold; each run records its placements."""
        self._replica_slot = NOT_REQUESTED
        refusal = self._refusal(now_ms)
        if refusal is None and not self.lock.acquire(LOCK_TIMEOUT_S):
            refusal = PutMessageStatus.OS_PAGECACHE_BUSY, self.lock.refusal
        if refusal is None:
            refusal = self._fenced_under_lock()
        if refusal is not None:
            for run in runs:
                run.place(Placement(0, run.count, *refusal))
            return
        try:
            self.appender.append(runs, self.lock.acquired_ms)
            if self.replicas is not None and any(run.wait_flush for run in runs):
                self._request_replica()
        finally:
            self.lock.release()
        self._wake_workers()
        self.appender.prefault_ahead()

    def _request_replica(self) -> None:
        """SYNC_MASTER, put lock held: a replica request for everything this hold wrote."""
        assert self.replicas is not None
        self._replica_put_ms = self.lock.acquired_ms
        self._replica_slot = self.replicas.request(self._words[_WROTE], self._replica_put_ms)

    def _wake_workers(self) -> None:
        """After a put: the committer or flusher (if it waits for puts) and reput (ASYNC)."""
        if self._wake_after_put is not None:
            self._wake_after_put.wakeup()
            if self._sync:
                self.appender.flush_requests.wake_gather(self._wake_after_put)
        if self._wake_reput is not None:
            self._wake_reput.wakeup()

    def _put_one(
        self, topic: str, queue_id: int, data: bytearray, uniq: str, wait: bool, now_ms: int
    ) -> SendResult:
        """`send`'s put: `_put` of a one-record run, flattened for the common case
        (`Appender.append_one`); anything else goes the run path."""
        refusal = self._refusal(now_ms)
        if refusal is not None:
            return SendResult(refusal[0], queue_id, -1, -1, uniq, refusal[1], self._msg_id_prefix)
        if not self.lock.acquire(LOCK_TIMEOUT_S):
            return SendResult(PutMessageStatus.OS_PAGECACHE_BUSY, queue_id, -1, -1, uniq, self.lock.refusal)
        if (fenced := self._fenced_under_lock()) is not None:
            return SendResult(fenced[0], queue_id, -1, -1, uniq, fenced[1], self._msg_id_prefix)
        self._replica_slot = NOT_REQUESTED
        run = None
        try:
            put = self.appender.append_one(topic, queue_id, data, wait, self.lock.acquired_ms)
            if put is None:  # a new file or a reservation first
                run = EncodedRun(
                    topic, queue_id, data, count=1, record_size=len(data), uniq_keys=(uniq,), wait_flush=wait
                )
                self.appender.append((run,), self.lock.acquired_ms)
            if self.replicas is not None and wait:
                self._request_replica()
        except OffsetTableFullError as exc:  # raised before anything changed
            return SendResult(_QUEUES_EXCEEDED, queue_id, -1, -1, uniq, str(exc), self._msg_id_prefix)
        finally:
            self.lock.release()
        self._wake_workers()
        self.appender.prefault_ahead()
        if put is None:
            assert run is not None
            self._acknowledge((run,))
            return self._result_of(run)
        result = SendResult(
            _PUT_OK, queue_id, put.queue_offset, put.phy_offset, uniq, "", self._msg_id_prefix
        )
        if self._acks and wait:
            self._acknowledge_one(result, put)
        return result

    def _result_of(self, run: EncodedRun) -> SendResult:
        """The result of a one-record run."""
        p = run.placements[0]
        uniq = run.uniq_keys[0] if run.uniq_keys else ""
        return SendResult(
            p.status, run.queue_id, p.queue_offset, p.phy_offset, uniq, p.reason, self._msg_id_prefix
        )

    # ------------------------------------------------------------------ SYNC_FLUSH

    def _acknowledge(self, runs: Sequence[EncodedRun]) -> None:
        """After the put: what the runs that wait for the store were promised. Under SYNC_FLUSH
        their flush; as SYNC_MASTER a slave's acknowledgement (a flush failure is reported
        first, as RocketMQ's handleDiskFlush before handleHA)."""
        if self._sync:
            self._await_flush(runs)
        if self.replicas is not None and any(run.wait_flush for run in runs):
            status, reason = self.replicas.outcome(self._replica_slot, self._replica_put_ms)
            if status is not _PUT_OK:
                for run in runs:
                    if run.wait_flush:
                        run.answer_stored(status, reason)

    def _acknowledge_one(self, result: SendResult, put: OnePut) -> None:
        """`_acknowledge` for the one record of `_put_one`, by the same rules."""
        failure = self.flush_requests.failure(put.ring_slot) if self._sync else ""
        if failure:
            result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
            result.reason = failure
        elif self._sync:
            flushed = self._words[_FLUSHED]
            assert flushed >= put.end_offset, f"acknowledged {put.end_offset} above flushed {flushed}"
        if self.replicas is not None:
            status, reason = self.replicas.outcome(self._replica_slot, self._replica_put_ms)
            if result.status is _PUT_OK and status is not _PUT_OK:
                result.status, result.reason = status, reason

    def _await_flush(self, runs: Sequence[EncodedRun]) -> None:
        """Wait for the request of this lock hold; its runs' stored chunks become
        FLUSH_DISK_TIMEOUT if it was not completed in time."""
        failure = {
            slot: self.flush_requests.failure(slot) for slot in {run.flush_slot for run in runs} if slot >= 0
        }
        flushed = self._words[_FLUSHED]
        for run in runs:
            if run.flush_slot < 0:
                continue
            if failure[run.flush_slot]:
                run.answer_stored(PutMessageStatus.FLUSH_DISK_TIMEOUT, failure[run.flush_slot])
                continue
            for p in run.placements:
                if p.status is _PUT_OK:
                    end = p.phy_offset + run.end(p.first + p.records - 1) - run.start(p.first)
                    assert flushed >= end, f"acknowledged {end} above flushed {flushed}"


def fenced_reason(table: Any) -> str:
    """Why a fenced start takes no put: which start, fenced by whom (`layout.FENCE`)."""
    who = _FENCERS.get(table.get(layout.FENCE), f"fence {table.get(layout.FENCE)}")
    return (
        f"store start {table.get(layout.GENERATION)} was fenced by {who} (pid "
        f"{table.get(layout.FENCE_PID)}) and takes no more puts"
    )
