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
put answers OS_PAGECACHE_BUSY at once; a SYNC_MASTER, having no slave, answers puts that wait
for the store SLAVE_NOT_AVAILABLE once stored.

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

import dataclasses
import logging
import os
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rmq_mp import validators as v
from rmq_mp.config.store_config import BrokerRole
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError, OffsetTableFullError, ShmAttachError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.message_batch import (
    UNIQ_KEY_PREFIX,
    EncodedRun,
    MessageBatch,
    Placement,
    UniqKeys,
    encode_uniform,
    join_records,
    properties_text,
)
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus, RunningFlags
from rmq_mp.put import native
from rmq_mp.put.encoding import (
    ENCODE_FAILURES,
    bodies_as_bytes,
    checked_batch,
    int_or_minus_one,
    joined,
    refused_send,
    same_kind,
    typed_arguments,
    waits_for_store,
)
from rmq_mp.put.flush_wait import NOT_FLUSHED, RING_FULL, FlushRequests
from rmq_mp.put.metrics import PutRecorder
from rmq_mp.put.results import SendBatchResult, SendResult
from rmq_mp.store import schedule
from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.disk import not_writeable_reason
from rmq_mp.store.mapped_file import OS_PAGE_SIZE, MappedFile
from rmq_mp.store.running_store import (
    REATTACH_WAIT_S,
    START_TIMEOUT_S,
    SUPERVISOR_STALE_MS,
    Instance,
    RunningStore,
)
from shm import flush_requests as fr
from shm import layout
from shm import queue_offsets as qo
from shm.layout import Role
from shm.pointer_table import pid_alive
from shm.put_lock import SLICE_MS, SPIN_NS, AtomicPutLock
from shm.semaphores import PutLock

log = logging.getLogger("rmq_mp.put.producer")

LOCK_TIMEOUT_S = 3.0
"""How long a put waits for the lock before reporting OS_PAGECACHE_BUSY (never a hang)."""
POOL_WAIT_S = 1.0
"""How long a put waits for a free pool buffer before reporting OS_PAGECACHE_BUSY."""
DISPATCH_WAIT_S = 0.001
"""How often a put held back by maxDispatchLagBytes looks at reput's progress."""
TOPICS_RECHECK_S = 1.0
"""How often a send without a queue id looks whether config/topics.json changed."""

_PUT_FIELDS = (
    layout.WROTE_POSITION,
    layout.JOURNAL_ACTIVE,
    layout.JOURNAL_WROTE_BEFORE,
    layout.JOURNAL_WROTE_AFTER,
    layout.JOURNAL_QUEUE_SLOT,
    layout.JOURNAL_QUEUE_OFFSET_BEFORE,
    layout.LAST_STORE_TIMESTAMP,
    layout.PUT_COUNT,
    layout.PUT_BYTES,
    layout.FLUSH_REQUEST_SEQ,
)
"""The pointer-table fields the put path writes (all under the put lock) by word index."""
_WROTE = layout.WROTE_POSITION.index
_J_ACTIVE = layout.JOURNAL_ACTIVE.index
_J_BEFORE = layout.JOURNAL_WROTE_BEFORE.index
_J_AFTER = layout.JOURNAL_WROTE_AFTER.index
_J_SLOT = layout.JOURNAL_QUEUE_SLOT.index
_J_QUEUE_OFFSET = layout.JOURNAL_QUEUE_OFFSET_BEFORE.index
_LAST_STORE_TS = layout.LAST_STORE_TIMESTAMP.index
_PUT_COUNT = layout.PUT_COUNT.index
_PUT_BYTES = layout.PUT_BYTES.index
_STATE = layout.STATE.index
_HEARTBEAT = layout.SUPERVISOR_HEARTBEAT_MS.index
_SUPERVISOR_PID = layout.SUPERVISOR_PID.index
_FLAGS = layout.RUNNING_FLAGS.index
_REPUT_FROM = layout.REPUT_FROM_OFFSET.index
_FLUSH_SEQ = layout.FLUSH_REQUEST_SEQ.index
_FLUSHED = layout.FLUSHED_POSITION.index
_ALLOCATED = layout.ALLOCATED_UNTIL.index
RESERVE_OWN_BYTES = 1 << 20
"""What a put reserves for itself past its end when it finds itself beyond ALLOCATED_UNTIL (the
allocator fell behind): a MiB, so a put racing ahead pays one posix_fallocate a MiB."""
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
_CREATE_FAILED = PutMessageStatus.CREATE_MAPEDFILE_FAILED
_NO_SLAVE = "stored, but no slave has it: rmq-mp has no replication (brokerRole=SYNC_MASTER)"
_ITEM_FIELDS = frozenset(("topic", "body", "tags", "keys", "properties", "queue_id", "flag"))
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_QUEUES_EXCEEDED = PutMessageStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
"""A send to a queue the full queue-offset table has no room for (RocketMQ's status for too many
consume queues); the reason names maxConsumeQueueNum."""
_OWN_STORE_TIMESTAMP_POSITION = record.store_timestamp_position(0)
"""Where STORETIMESTAMP sits in this producer's own records (IPv4 born host)."""


class Producer:
    """Attach with `Producer.attach(name)`; one instance per process (not thread-safe).

    A producer outlives a restart of its store: a send that finds its store stopping, stopped
    or its supervisor dead looks whether a newer start of the store runs under the same shm name
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
        self.pool = store.shm.pool
        self.config = store.config
        self.store_host: m.Host = (self.config.broker_ip1, self.config.listen_port)
        self.born_host: m.Host = ("127.0.0.1", os.getpid() & 0xFFFF)
        self._native: Any = None
        """The compiled send (`rmq_mp.put.native`), or None: every send runs the reference."""
        self.lock: PutLock | AtomicPutLock = self._put_lock(store)
        self._words = self.table.words(*_PUT_FIELDS)
        """Pointer-table words for the put path (writer check done once, in `words`)."""
        self._file: tuple[MappedFile, Any] | None = None
        """The segment being written and its pool buffer (None without a pool): a file keeps
        its buffer until it is full and wholly committed, so this stays valid until we roll.
        Set by `_set_file`, which tells the compiled send."""
        self.encoder = record.RecordEncoder(self.store_host, self.born_host)
        self._born_ip, self._born_port = m.parse_host(self.born_host)
        self._msg_id_prefix = (
            (self.encoder.store_ip + struct.pack(">i", self.encoder.store_port)).hex().upper()
        )
        self._max_message_size = self.config.max_message_size
        self._max_delay_level = len(self.config.delay_levels_ms)
        self._max_lag = self.config.max_dispatch_lag_bytes
        self._slave = self.config.broker_role is BrokerRole.SLAVE
        self._accepting_state = -1 if self._slave else layout.RUNNING
        self._sync_master = self.config.broker_role is BrokerRole.SYNC_MASTER
        self._sync = store.sync_flush
        self._acks = self._sync or self._sync_master
        """A put that waits for the store is answered after more than its append."""
        self._pool = store.pool_enabled
        self._topics = TopicConfigManager(store.paths.topics)
        self._topics_checked_s = -TOPICS_RECHECK_S
        self._topics_mtime_ns = -1
        self._queue_limits: dict[str, int] = {}
        """Topic -> `_queue_limit`, until topics.json changes."""
        self._flush_until = -1
        """End offset the current lock hold's SYNC flush request must cover (-1: none)."""
        self._slots: dict[tuple[str, int], tuple[int, int]] = {}
        """(topic, queue id) -> (queue-offset-table slot, word of its next offset)."""
        self._queue_words = self.queues.words
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
        self.flush_requests = FlushRequests(
            store.shm, self._words, self.config.sync_flush_timeout, self.lock.pid
        )
        self._reserved_until = 0
        """Commit-log offset below which, from the write position on, blocks are known reserved
        (ALLOCATED_UNTIL or this producer's own reservation): a put ending below it writes
        without a system call, one ending above goes through `_reserve`."""
        if (
            native.core is not None
            and isinstance(self.lock, AtomicPutLock)
            and not self._slave
            and not self._sync_master
        ):
            self._native = native.core.Sender(self._native_settings(store))
            self._native.bind(self._send, self._queue_for)
            # The compiled send, bound on this instance, shadows the `send` method below (which
            # stays the documented entry and the path without the core): one C call per send,
            # no Python frame before it (15-17% of a send, measured by perf).
            vars(self)["send"] = self._native.send_kw
        else:
            vars(self).pop("send", None)

    def _put_lock(self, store: RunningStore) -> PutLock | AtomicPutLock:
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
                native.lock_core, self.table, self._undo_interrupted_put, spin=spin, busy_ms=busy_ms
            )
        return PutLock(
            store.shm.semaphore(store.names.put_lock),
            store.shm.semaphore(store.names.put_lock_takeover),
            self.table,
            on_takeover=self._undo_interrupted_put,
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
            "accepting_state": self._accepting_state,
            "put_blockers": _PUT_BLOCKERS,
            "supervisor_stale_ms": SUPERVISOR_STALE_MS,
            "max_dispatch_lag_bytes": self._max_lag,
            "pid": self.lock.pid,
            "spin_ns": SLICE_MS * 1_000_000 if self.lock.spin else SPIN_NS,
            "slice_ms": 0 if self.lock.spin else SLICE_MS,
            "max_message_size": self._max_message_size,
            "sync": int(self._sync),
            "table": self.table.segment.mm,
            "queues": self.queues.segment.mm,
            "uniq_state": self.uniq.state,
            "uniq_prefix": self.uniq.prefix_hex,
            "born_ip": self._born_ip,
            "born_port": self._born_port,
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
                FREE=fr.FREE,
                WAITING=fr.WAITING,
                DONE_OK=fr.DONE_OK,
                DONE_TIMEOUT=fr.DONE_TIMEOUT,
                ABANDONED=fr.ABANDONED,
                sync_flush_timeout_ms=self.config.sync_flush_timeout,
                flush_done_names=[names.flush_done(i) for i in range(ring.capacity)],
            )
        return settings

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

    def _reattach(self, why: str) -> str:
        """After a refusal ``why`` that says the store stopped or its supervisor died: attach to
        a newer start of the store under the same shm name, if there is one. '' once attached
        (the caller looks at the new store's state again), else ``why`` and what to expect."""
        names = self.store.names
        instance = Instance.of(names)
        if instance is None or instance.generation == self.table.get(layout.GENERATION):
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
        self._set_file(None)
        if self._native is not None:
            self._native.close()  # its views of the shared segments first
            self._native = None
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
        body: bytes,
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
        return self._send(topic, body, tags, keys, properties, queue_id, flag, queue_id is not None)

    def _send(
        self,
        topic: str,
        body: bytes,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: Any,
        flag: int,
        named: bool,
    ) -> SendResult:
        """`send` in Python: the reference the compiled core is tested against. ``named``: the
        caller gave ``queue_id`` (a rotated one, or None to rotate here, is not checked)."""
        started_ns = time.perf_counter_ns()
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
                queue_id = self._queue_for(topic, None)
            if properties or tags or keys:
                v.check_properties(tags, keys, properties)
                text = properties_text(properties, tags, keys, uniq)
                if properties:
                    uniq = properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
                    wait = waits_for_store(properties)
            else:
                text = f"{UNIQ_KEY_PREFIX}{uniq}"
            if named and not self._known_queue(topic, queue_id):  # after every type check
                self._check_queue_id(topic, queue_id)
            real_queue_id = queue_id
            if properties and (delay := properties.get(m.PROPERTY_DELAY_TIME_LEVEL)) is not None:
                delayed = schedule.delayed_put(topic, queue_id, 0, delay, text, self._max_delay_level)
                if delayed is not None:
                    topic, queue_id, text = delayed
            self.lock.last_hold_ns = -1
            data = self._encode(topic, body, queue_id, flag, born_ms, text)
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
            if queue_id != real_queue_id:  # delayed: the sender's queue, as RocketMQ's broker answers
                result.queue_id = real_queue_id
        self._metrics.record(started_ns, 1, result.status is not _PUT_OK, self.lock.last_hold_ns)
        return result

    def send_batch(self, messages: MessageBatch | Iterable[m.Message | Mapping[str, Any]]) -> SendBatchResult:
        """Store many messages under one put-lock hold: a `MessageBatch` (RocketMQ's batch: one
        topic and queue, whole in one file), or any `Message`s and ``send`` keyword dicts, each
        with its own queue offset. Results come in the order given."""
        if (
            type(messages) is MessageBatch
            and self._native is not None
            and messages.keys is None
            and not messages.properties
            and type(messages.topic) is str
        ):
            queue_id = messages.queue_id
            if queue_id is None:
                queue_id = self._queue_for(messages.topic, None)
            result = self._send_batch_natively(messages, queue_id)
            if result is not None:
                return result
            if messages.queue_id is None:  # rotated once: the reference stores it on that queue
                messages = dataclasses.replace(messages, queue_id=queue_id)
        started_ns = time.perf_counter_ns()
        born_ms = int(time.time() * 1000)
        if isinstance(messages, MessageBatch):
            runs = [self._encode_batch(messages, born_ms)] if messages.bodies else []
        elif isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping)):
            runs = self._encode_runs(messages, born_ms)
        else:
            raise InvalidArgumentTypeError(
                f"send_batch takes a MessageBatch or an iterable of Message or send keyword dicts, "
                f"not {type(messages).__name__}"
            )
        self.lock.last_hold_ns = -1
        pending = [run for run in runs if run.pending]
        if pending:
            self._put(pending, born_ms)
            self._acknowledge(pending)
        result = SendBatchResult(runs, self._msg_id_prefix)
        self._metrics.record(started_ns, len(result), result.failures, self.lock.last_hold_ns)
        return result

    def _send_batch_natively(self, batch: MessageBatch, queue_id: int) -> SendBatchResult | None:
        """`send_batch` of a plain `MessageBatch` (no keys or properties of its own, bytes
        bodies, a known queue, fitting the current file) on ``queue_id`` by the compiled core;
        None otherwise, with nothing stored."""
        assert self._native is not None
        got = self._native.send_batch(batch.topic, batch.bodies, batch.tags, queue_id, batch.flag)
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
            uniq_keys=UniqKeys(self.uniq.prefix_at(born_ms), first, count),
            whole=True,
        )
        run.place(Placement(0, count, status, reason, phy_offset, queue_offset))
        return SendBatchResult((run,), self._msg_id_prefix)

    # ------------------------------------------------------------------ encode (outside the lock)

    def _queue_for(self, topic: str, queue_id: int | None) -> int:
        """``queue_id`` (checked by `_check_queue_id` once every type is checked), or the next of
        the topic's write queues in round robin (as RocketMQ's client rotates over the topic's
        route): its writeQueueNums in config/topics.json, or defaultTopicQueueNums for a topic
        not there yet."""
        if queue_id is not None:
            return queue_id
        turn = self._round_robin.get(topic, 0)
        self._round_robin[topic] = turn + 1
        return turn % self._write_queue_nums(topic)

    def _reload_topics(self, *, now: bool = False) -> None:
        """Re-read topics.json when it changed (`rmq-admin updateTopic`, the supervisor's saves of
        auto-created topics), looked at no more than every TOPICS_RECHECK_S unless ``now``."""
        monotonic = time.monotonic()
        if now or monotonic - self._topics_checked_s >= TOPICS_RECHECK_S:
            self._topics_checked_s = monotonic
            try:
                mtime_ns = self._topics.path.stat().st_mtime_ns
            except FileNotFoundError:
                mtime_ns = 0
            if mtime_ns != self._topics_mtime_ns:
                self._topics_mtime_ns = mtime_ns
                self._topics.load()
                self._queue_limits.clear()
                if self._native is not None:
                    self._native.forget_topics()
            if self._native is not None:
                self._native.fresh_until_ns = int((monotonic + TOPICS_RECHECK_S) * 1e9)

    def _write_queue_nums(self, topic: str) -> int:
        """The topic's writeQueueNums from topics.json, defaultTopicQueueNums for a new topic."""
        self._reload_topics()
        found = self._topics.get(topic)
        return (
            found.write_queue_nums
            if found is not None and found.write_queue_nums > 0
            else (self.config.default_topic_queue_nums)
        )

    def _known_queue(self, topic: str, queue_id: int) -> bool:
        """Whether ``queue_id`` is one of the topic's queues by the limit cached for it (a dict
        lookup and a clock read a send); False sends it to `_check_queue_id`. The cache is
        dropped whenever topics.json changed, looked at every TOPICS_RECHECK_S."""
        if (
            queue_id < self._queue_limits.get(topic, 0)
            and time.monotonic() - self._topics_checked_s < TOPICS_RECHECK_S
        ):
            return True
        return queue_id < self._queue_limit(topic)

    def _queue_limit(self, topic: str) -> int:
        """Queue ids below this are the topic's: max(writeQueueNums, readQueueNums) as RocketMQ's
        `AbstractSendMessageProcessor.msgCheck` bounds them, or defaultTopicQueueNums for a topic
        not configured yet (the supervisor auto-creates it so, as autoCreateTopicEnable does)."""
        self._reload_topics()
        found = self._topics.get(topic)
        limit = (
            self.config.default_topic_queue_nums
            if found is None
            else max(found.write_queue_nums, found.read_queue_nums)
        )
        self._queue_limits[topic] = limit
        return limit

    def _check_queue_id(self, topic: str, queue_id: int) -> None:
        """`RecordRejected` (MESSAGE_ILLEGAL) for a queue id the topic does not have."""
        if problem := self._queue_id_problem(topic, queue_id):
            raise RecordRejected(_ILLEGAL, problem)

    def _queue_id_problem(self, topic: str, queue_id: int) -> str:
        """Why a queue id at or past `_queue_limit` is refused, naming the topic's queue counts;
        '' if topics.json changed meanwhile or the queue exists already (a store RocketMQ wrote,
        whose topics.json the supervisor grows at its next persist). A send never grows a topic:
        RocketMQ's broker refuses such a queue id too. A queue id or topic the store cannot hold
        at all is left to `_encode`, which names that first."""
        if v.queue_id_problem(queue_id) or v.topic_problem(topic) or self.queues.find(topic, queue_id) >= 0:
            return ""
        self._reload_topics(now=True)
        found = self._topics.get(topic)
        if found is None:
            nums = self.config.default_topic_queue_nums
            if queue_id < nums:
                return ""
            return (
                f"queue id {queue_id} is illegal: topic {topic} is not configured yet and is created "
                f"with defaultTopicQueueNums = {nums} queues (0..{nums - 1}); `rmq-admin updateTopic "
                f"-w N` creates it with more"
            )
        if queue_id < max(found.write_queue_nums, found.read_queue_nums):
            return ""
        return (
            f"queue id {queue_id} is illegal: topic {topic} has writeQueueNums = "
            f"{found.write_queue_nums} (readQueueNums = {found.read_queue_nums}); `rmq-admin "
            f"updateTopic -w N` gives it more queues"
        )

    def _encode(
        self, topic: str, body: bytes, queue_id: int, flag: int, born_ms: int, text: str
    ) -> bytearray:
        """One record as this producer sends it; `RecordRejected` for what the store refuses,
        in RocketMQ's order of checks (topic, queue, properties, body)."""
        topic_field = self.encoder.topic_field(topic)
        if queue_id < 0:
            raise RecordRejected(_ILLEGAL, f"queue id {queue_id} is negative")
        props = text.encode("utf-8")
        if len(props) > record.MAX_PROPERTIES_BYTES:
            problem = record.properties_problem(text)
            raise RecordRejected(_ILLEGAL, problem[1] if problem else "properties too long")
        if len(body) > self._max_message_size:
            raise RecordRejected(_ILLEGAL, record.body_problem(len(body), self._max_message_size))
        return self.encoder.encode_own(topic_field, body, queue_id, flag, born_ms, props)

    def _encode_item(
        self,
        topic: str,
        body: bytes,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        flag: int,
        born_ms: int,
    ) -> EncodedRun:
        """A run of the one message a keyword dict of `send_batch` describes (checked as `send`
        checks its arguments)."""
        uniq = self.uniq.next_id(born_ms)
        try:
            if (
                type(body) is not bytes
                or type(flag) is not int
                or (queue_id is not None and type(queue_id) is not int)
            ):
                body, queue_id, flag = typed_arguments(body, queue_id, flag)
            named = queue_id is not None
            queue_id = self._queue_for(topic, queue_id)
            if properties or tags or keys:
                v.check_properties(tags, keys, properties)
            if named and not self._known_queue(topic, queue_id):  # after every type check
                self._check_queue_id(topic, queue_id)
            text = properties_text(properties, tags, keys, uniq)
            if properties:
                uniq = properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
                if (delay := properties.get(m.PROPERTY_DELAY_TIME_LEVEL)) is not None:
                    delayed = schedule.delayed_put(topic, queue_id, 0, delay, text, self._max_delay_level)
                    if delayed is not None:
                        topic, queue_id, text = delayed
            data = self._encode(topic, body, queue_id, flag, born_ms, text)
        except RecordRejected as exc:
            v.topic_problem(topic)  # a wrong type raises first (the others were checked above)
            return EncodedRun.refused(
                topic, int_or_minus_one(queue_id), 1, exc.status, exc.reason, uniq_keys=(uniq,)
            )
        except InvalidArgumentError:
            raise
        except ENCODE_FAILURES as exc:
            reason = refused_send(exc, v.send_problem(topic, body, queue_id, flag, tags, keys, properties))
            return EncodedRun.refused(
                topic, int_or_minus_one(queue_id), 1, _ILLEGAL, reason, uniq_keys=(uniq,)
            )
        return EncodedRun(
            topic,
            queue_id,
            data,
            count=1,
            record_size=len(data),
            uniq_keys=(uniq,),
            wait_flush=waits_for_store(properties),
        )

    def _encode_message(self, message: m.Message) -> EncodedRun:
        """A run of one `Message`, stored as given (its born host, time, flags, properties)."""
        try:
            uniq = message.properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
            text = message.stored_properties()
            problem = record.validate_message(
                message, max_message_size=self._max_message_size, properties_text=text
            )
            if problem is None and not self._known_queue(message.topic, message.queue_id):
                queue_problem = self._queue_id_problem(message.topic, message.queue_id)
                problem = (_ILLEGAL, queue_problem) if queue_problem else None
            if problem is None:
                message = schedule.delayed_message(message, text, self._max_delay_level)
                data = self.encoder.encode_message(message, message.properties_string)
        except InvalidArgumentError:
            raise
        except RecordRejected as exc:
            problem = (exc.status, exc.reason)
        except (*ENCODE_FAILURES, AttributeError) as exc:
            problem = (_ILLEGAL, refused_send(exc, v.message_problem(message)))
            uniq = ""
        if problem is not None:  # PROPERTIES_SIZE_EXCEEDED too: the broker answers MESSAGE_ILLEGAL
            v.message_problem(message)  # a wrong type raises first, as for a send
            return EncodedRun.refused(
                message.topic, int_or_minus_one(message.queue_id), 1, _ILLEGAL, problem[1], uniq_keys=(uniq,)
            )
        return EncodedRun(
            message.topic,
            message.queue_id,
            data,
            count=1,
            record_size=len(data),
            sys_flag=record.sys_flag_of(data),
            uniq_keys=(uniq,),
            wait_flush=waits_for_store(message.properties),
        )

    def _encode_runs(self, items: Iterable[m.Message | Mapping[str, Any]], born_ms: int) -> list[EncodedRun]:
        """One run of one record per item, then consecutive records of one queue (and one kind:
        queue or not, host family, flush wait) joined into one run."""
        singles: list[EncodedRun] = []
        for index, item in enumerate(items):
            if isinstance(item, m.Message):
                singles.append(self._encode_message(item))
                continue
            if type(item) is not dict and not isinstance(item, Mapping):
                raise InvalidArgumentTypeError(
                    f"send_batch item {index} is a {type(item).__name__}, not a Message or a dict of send's arguments"
                )
            if not _ITEM_FIELDS.issuperset(item):
                raise InvalidArgumentTypeError(
                    f"send_batch items take {sorted(_ITEM_FIELDS)}, not {sorted(set(item) - _ITEM_FIELDS, key=str)}"
                )
            try:
                topic, body = item["topic"], item["body"]
            except KeyError:
                raise InvalidArgumentTypeError(
                    f"send_batch item {index} needs a 'topic' and a 'body'"
                ) from None
            singles.append(
                self._encode_item(
                    topic,
                    body,
                    item.get("tags"),
                    item.get("keys"),
                    item.get("properties"),
                    item.get("queue_id"),
                    item.get("flag", 0),
                    born_ms,
                )
            )
        runs: list[EncodedRun] = []
        group: list[EncodedRun] = []
        for single in singles:
            if group and not (single.pending and same_kind(group[0], single)):
                runs.append(joined(group))
                group = []
            if single.pending:
                group.append(single)
            else:
                runs.append(single)
        if group:
            runs.append(joined(group))
        return runs

    def _encode_batch(self, batch: MessageBatch, born_ms: int) -> EncodedRun:
        """A `MessageBatch` as one run: one numpy array when the bodies have one length and no
        message has keys of its own, else its records joined."""
        batch = checked_batch(batch)
        count = len(batch.bodies)
        queue_id = self._queue_for(batch.topic, None) if batch.queue_id is None else batch.queue_id
        first = self.uniq.take(count)
        uniq_prefix = f"{self.uniq.prefix_hex}{self.uniq.time_hex(born_ms)}"
        given_uniq = (batch.properties or {}).get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        uniq_keys: Sequence[str] = [given_uniq] * count if given_uniq else UniqKeys(uniq_prefix, first, count)
        if batch.properties and (problem := schedule.batch_delay_problem(batch.properties)):
            # MessageBatch refuses a delay when made; one set on it since is refused here.
            return EncodedRun.refused(batch.topic, queue_id, count, _ILLEGAL, problem, uniq_keys=uniq_keys)
        try:
            if batch.queue_id is not None and not self._known_queue(batch.topic, queue_id):
                self._check_queue_id(batch.topic, queue_id)
            if batch.keys is None:
                head = properties_text(batch.properties, batch.tags, None, "" if given_uniq else uniq_prefix)
                rows = self._encode_uniform(batch, queue_id, born_ms, head, -1 if given_uniq else first)
                if rows is not None:
                    return EncodedRun(
                        batch.topic,
                        queue_id,
                        rows,
                        count=count,
                        record_size=rows.shape[1],
                        uniq_keys=uniq_keys,
                        whole=True,
                        wait_flush=waits_for_store(batch.properties),
                    )
            encoded = [
                self._encode(
                    batch.topic,
                    body if type(body) is bytes else v.body_bytes(body, "MessageBatch body"),
                    queue_id,
                    batch.flag,
                    born_ms,
                    properties_text(
                        batch.properties, batch.tags, batch.keys[i] if batch.keys else None, uniq_keys[i]
                    ),
                )
                for i, body in enumerate(batch.bodies)
            ]
        except RecordRejected as exc:  # RocketMQ stores a batch whole or not at all
            bodies_as_bytes(batch.bodies)  # a wrong type raises first, as for `send`
            return EncodedRun.refused(
                batch.topic, queue_id, count, exc.status, exc.reason, uniq_keys=uniq_keys
            )
        except InvalidArgumentError:
            raise
        except ENCODE_FAILURES as exc:
            bodies = bodies_as_bytes(batch.bodies)
            if bodies is not batch.bodies:  # buffers, not bytes: encoded again as their bytes
                return self._encode_batch(dataclasses.replace(batch, bodies=bodies), born_ms)
            reason = refused_send(
                exc,
                v.send_problem(batch.topic, b"", queue_id, batch.flag, batch.tags, None, batch.properties),
            )
            return EncodedRun.refused(batch.topic, queue_id, count, _ILLEGAL, reason, uniq_keys=uniq_keys)
        data, ends = join_records(encoded)
        return EncodedRun(
            batch.topic,
            queue_id,
            data,
            count=count,
            ends=ends,
            uniq_keys=uniq_keys,
            whole=True,
            wait_flush=waits_for_store(batch.properties),
        )

    def _encode_uniform(
        self, batch: MessageBatch, queue_id: int, born_ms: int, head: str, uniq_counter: int
    ) -> np.ndarray | None:
        """`encode_uniform` after the checks `_encode` makes per record, made once."""
        topic_field = self.encoder.topic_field(batch.topic)
        if problem := v.queue_id_problem(queue_id) or v.flag_problem(batch.flag):
            raise RecordRejected(_ILLEGAL, problem)
        props = head.encode("utf-8")
        if len(props) + 4 > record.MAX_PROPERTIES_BYTES:
            return None  # per record: `_encode` gives the exact refusal
        return encode_uniform(
            self.encoder,
            topic_field,
            batch.bodies,
            queue_id=queue_id,
            flag=batch.flag,
            born_timestamp=born_ms,
            born_ip=self._born_ip,
            born_port=self._born_port,
            properties_head=props,
            uniq_counter=uniq_counter,
            max_body_size=self._max_message_size,
        )

    # ------------------------------------------------------------------ put (under the lock)

    def _refusal(self, now: int, *, reattach: bool = True) -> tuple[PutMessageStatus, str] | None:
        """Why no put may happen now (RocketMQ's checks before taking the lock), or None. A store
        that stopped or lost its supervisor is replaced by a newer start of it when there is one
        (`_reattach`), and the checks run again there."""
        w = self._words
        if w[_STATE] != self._accepting_state:  # never equal on a slave: no extra test per put
            if self._slave and w[_STATE] == layout.RUNNING:
                return (
                    PutMessageStatus.SERVICE_NOT_AVAILABLE,
                    "message store is in slave mode (brokerRole=SLAVE)",
                )
            why = f"store is not running ({self.store.instance.state_name})"
            if reattach and not (why := self._reattach(why)):
                return self._refusal(now, reattach=False)
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, why
        if now - w[_HEARTBEAT] > SUPERVISOR_STALE_MS and not pid_alive(w[_SUPERVISOR_PID]):
            # A stale heartbeat alone may be a busy machine; a dead supervisor means nobody runs the store.
            why = "store supervisor is dead"
            if reattach and not (why := self._reattach(why)):
                return self._refusal(now, reattach=False)
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, why
        flags = w[_FLAGS] & _PUT_BLOCKERS
        if flags:
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, not_writeable_reason(
                flags, w[layout.DISK_USED_PERMILLE.index], self.config
            )
        if self._max_lag and w[_WROTE] - w[_REPUT_FROM] > self._max_lag:
            return self._wait_for_dispatch()
        return None

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

    def _put(self, runs: Sequence[EncodedRun], now: int) -> None:
        """Append ``runs`` in one lock hold; each run records its placements."""
        refusal = self._refusal(now)
        if refusal is None and not self.lock.acquire(LOCK_TIMEOUT_S):
            refusal = PutMessageStatus.OS_PAGECACHE_BUSY, self.lock.refusal
        if refusal is not None:
            for run in runs:
                run.place(Placement(0, run.count, *refusal))
            return
        try:
            self._append_locked(runs)
        finally:
            self.lock.release()
        self._wake_workers()

    def _append_locked(self, runs: Sequence[EncodedRun]) -> None:
        """The put lock's work for ``runs``: place them, count them, ask for their flush."""
        w = self._words
        store_ts = self.lock.acquired_ms  # one store time per lock hold, as RocketMQ's batch put
        self._flush_until = -1
        count = size = 0
        for run in runs:
            appended, appended_bytes = self._append_run(run, store_ts)
            count += appended
            size += appended_bytes
        if count:
            w[_LAST_STORE_TS] = store_ts
            w[_PUT_COUNT] += count
            w[_PUT_BYTES] += size
        if self._flush_until >= 0:
            self._request_flush(runs)

    def _wake_workers(self) -> None:
        """After a put: the committer or flusher (if it waits for puts) and reput (ASYNC)."""
        if self._wake_after_put is not None:
            self._wake_after_put.wakeup()
        if self._wake_reput is not None:
            self._wake_reput.wakeup()

    def _append_run(self, run: EncodedRun, store_ts: int) -> tuple[int, int]:
        """Place ``run`` from the write position on, chunk by chunk: as many whole records as fit
        before the file's end, a BLANK record, and on in the next file (a `whole` run starts in a
        new file rather than split). Returns (records, bytes) appended."""
        w = self._words
        first = appended = appended_bytes = 0
        while first < run.count:
            wrote = w[_WROTE]
            try:
                mf = self._target_file(wrote)
            except OSError as exc:  # the allocator fell behind and the disk refused a new file
                reason = f"cannot create the commit-log file at {wrote}: {exc}"
                run.place(Placement(first, run.count - first, _CREATE_FAILED, reason))
                break
            if mf is None:
                if self.config.fast_fail_if_no_buffer_in_store_pool:
                    status, reason = (
                        _CREATE_FAILED,
                        "no free TransientStorePool buffer (fastFailIfNoBufferInStorePool)",
                    )
                else:
                    status, reason = PutMessageStatus.OS_PAGECACHE_BUSY, "no free TransientStorePool buffer"
                run.place(Placement(first, run.count - first, status, reason))
                break
            position = mf.wrote_position
            fit = run.fit(first, mf.file_size - position - record.END_FILE_MIN_BLANK_LENGTH)
            if fit == 0 or (run.whole and first == 0 and fit < run.count and position > 0):
                size = run.end(first) - run.start(first)
                if size + record.END_FILE_MIN_BLANK_LENGTH > mf.file_size:  # no file can hold it
                    reason = f"append failed: MESSAGE_SIZE_EXCEEDED (a record of {size} bytes)"
                    run.place(Placement(first, 1, _ILLEGAL, reason))
                    first += 1
                    continue
                # The blank record; with a pool buffer the committer copies zeros to the file's end.
                reason = self._reserve(mf, mf.file_from_offset + mf.file_size)
                if reason:
                    run.place(Placement(first, run.count - first, _CREATE_FAILED, reason))
                    break
                self._end_file(mf, wrote)
                continue
            end = wrote + run.end(first + fit - 1) - run.start(first)
            if end > self._reserved_until:
                reason = self._reserve(mf, end)
                if reason:
                    run.place(Placement(first, run.count - first, _CREATE_FAILED, reason))
                    break
            try:
                appended_bytes += self._append_chunk(run, first, fit, mf, wrote, store_ts)
            except OffsetTableFullError as exc:  # raised before the chunk changed anything
                run.place(Placement(first, run.count - first, _QUEUES_EXCEEDED, str(exc)))
                break
            appended += fit
            first += fit
        return appended, appended_bytes

    def _append_chunk(
        self, run: EncodedRun, first: int, count: int, mf: MappedFile, wrote: int, store_ts: int
    ) -> int:
        """Records ``[first, first + count)`` of ``run`` at ``wrote``; returns bytes."""
        size = run.end(first + count - 1) - run.start(first)
        slot, next_word = self._queue_slot(run.topic, run.queue_id) if run.dispatchable else (-1, -1)
        queue_offset = self._queue_words[next_word] if slot >= 0 else -1
        run.patch(first, count, queue_offset=queue_offset, phy_offset=wrote, store_timestamp=store_ts)
        self._write_chunk(
            mf, run.chunk(first, count), wrote, wrote + size, slot, next_word, queue_offset, count
        )
        run.place(Placement(first, count, _PUT_OK, "", wrote, max(queue_offset, 0)))
        if self._sync and run.wait_flush:
            self._flush_until = wrote + size
        return size

    def _write_chunk(
        self,
        mf: MappedFile,
        data: Any,
        wrote: int,
        end: int,
        slot: int,
        next_word: int,
        queue_offset: int,
        count: int,
    ) -> None:
        """Copy patched records into the log at ``wrote``, journalled: the journal first, then
        the bytes, the queue's next offset, and the write position, which is the commit point."""
        w = self._words
        w[_J_BEFORE] = wrote
        w[_J_AFTER] = end
        w[_J_SLOT] = slot
        w[_J_QUEUE_OFFSET] = queue_offset
        w[_J_ACTIVE] = 1
        mf.fill(wrote - mf.file_from_offset, data)
        if slot >= 0:
            self._queue_words[next_word] = queue_offset + count
        w[_WROTE] = end
        w[_J_ACTIVE] = 0

    def _queue_slot(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(queue-offset-table slot, word index of its next offset), inserting it if new (put
        lock held); `OffsetTableFullError` when the table holds maxConsumeQueueNum queues."""
        key = (topic, queue_id)
        found = self._slots.get(key)
        if found is None:
            slot = self.queues.find_or_insert(topic, queue_id)
            found = self._slots[key] = (slot, self.queues.word_index(slot, qo.NEXT_OFFSET))
        if self._native is not None:
            limit = self._queue_limits.get(topic)
            if limit is not None and queue_id < limit:  # a queue the compiled send may put to
                self._native.learn(topic, self.encoder.topic_field(topic), limit, queue_id, *found)
        return found

    def _put_one(
        self, topic: str, queue_id: int, data: bytearray, uniq: str, wait: bool, now: int
    ) -> SendResult:
        """`send`'s put: `_put` of a one-record run, flattened for the common case (the record
        fits the current file, which this producer has mapped already); anything else goes the
        run path. Profiled: the run machinery was a third of a send."""
        refusal = self._refusal(now)
        if refusal is not None:
            return SendResult(refusal[0], queue_id, -1, -1, uniq, refusal[1], self._msg_id_prefix)
        cached = self._file
        if cached is None:
            return self._put_one_as_run(topic, queue_id, data, uniq, wait, now)
        w = self._words
        if not self.lock.acquire(LOCK_TIMEOUT_S):
            return SendResult(PutMessageStatus.OS_PAGECACHE_BUSY, queue_id, -1, -1, uniq, self.lock.refusal)
        run = None
        try:
            wrote = w[_WROTE]
            mf = cached[0]
            size = len(data)
            if (
                0 <= wrote - mf.file_from_offset <= mf.file_size - size - record.END_FILE_MIN_BLANK_LENGTH
                and wrote + size <= self._reserved_until
            ):
                mf.write_buffer = cached[1]
                store_ts = self.lock.acquired_ms
                try:
                    slot, next_word = self._queue_slot(topic, queue_id)
                except OffsetTableFullError as exc:
                    return SendResult(_QUEUES_EXCEEDED, queue_id, -1, -1, uniq, str(exc), self._msg_id_prefix)
                queue_offset = self._queue_words[next_word]
                record.OFFSETS.pack_into(data, record.POS_QUEUE_OFFSET, queue_offset, wrote)
                record.TIMESTAMP.pack_into(data, _OWN_STORE_TIMESTAMP_POSITION, store_ts)
                end = wrote + size
                self._write_chunk(mf, data, wrote, end, slot, next_word, queue_offset, 1)
                w[_LAST_STORE_TS] = store_ts
                w[_PUT_COUNT] += 1
                w[_PUT_BYTES] += size
                ring_slot = self.flush_requests.request(end, store_ts) if self._sync and wait else -1
            else:  # a new file or a reservation first
                run = EncodedRun(
                    topic, queue_id, data, count=1, record_size=size, uniq_keys=(uniq,), wait_flush=wait
                )
                self._append_locked((run,))
        finally:
            self.lock.release()
        self._wake_workers()
        if run is not None:
            self._acknowledge((run,))
            return self._result_of(run)
        result = SendResult(_PUT_OK, queue_id, queue_offset, wrote, uniq, "", self._msg_id_prefix)
        if self._acks and wait:  # `_acknowledge`, for one record
            failure = self.flush_requests.failure(ring_slot) if self._sync else ""
            if failure:
                result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
                result.reason = failure
            elif self._sync:
                flushed = w[_FLUSHED]
                assert flushed >= end, f"acknowledged {end} above flushed {flushed}"
            if self._sync_master and result.status is _PUT_OK:
                result.status = PutMessageStatus.SLAVE_NOT_AVAILABLE
                result.reason = _NO_SLAVE
        return result

    def _put_one_as_run(
        self, topic: str, queue_id: int, data: bytearray, uniq: str, wait: bool, now: int
    ) -> SendResult:
        run = EncodedRun(
            topic, queue_id, data, count=1, record_size=len(data), uniq_keys=(uniq,), wait_flush=wait
        )
        self._put((run,), now)
        self._acknowledge((run,))
        return self._result_of(run)

    def _result_of(self, run: EncodedRun) -> SendResult:
        """The result of a one-record run."""
        p = run.placements[0]
        uniq = run.uniq_keys[0] if run.uniq_keys else ""
        return SendResult(
            p.status, run.queue_id, p.queue_offset, p.phy_offset, uniq, p.reason, self._msg_id_prefix
        )

    def _reserve(self, mf: MappedFile, end: int) -> str:
        """Make sure the log's blocks from the write position to ``end`` (inside ``mf``) are
        reserved before anything is written there: below ALLOCATED_UNTIL they are (the common
        case once per allocator top-up); else this producer reserves up to RESERVE_OWN_BYTES past
        ``end`` itself. '' or why the disk refused (the put is CREATE_MAPEDFILE_FAILED)."""
        w = self._words
        allocated = w[_ALLOCATED]
        if end <= allocated:
            self._set_reserved_until(allocated)
            return ""
        wrote = w[_WROTE]
        file_end = mf.file_from_offset + mf.file_size
        start = max(allocated, self._reserved_until, wrote - wrote % OS_PAGE_SIZE, mf.file_from_offset)
        mark = min(file_end, -(-(end + RESERVE_OWN_BYTES) // OS_PAGE_SIZE) * OS_PAGE_SIZE)
        try:
            mf.reserve_range(start - mf.file_from_offset, mark - mf.file_from_offset)
        except OSError as exc:
            return f"cannot reserve disk blocks for the commit log at {start}-{mark}: {exc}"
        self._set_reserved_until(mark)
        return ""

    def _set_reserved_until(self, offset: int) -> None:
        self._reserved_until = offset
        if self._native is not None:
            self._native.reserved_until = offset

    def _end_file(self, mf: MappedFile, wrote: int) -> None:
        """Close the current file with a BLANK record, journalled like an append."""
        w = self._words
        w[_J_BEFORE] = wrote
        w[_J_AFTER] = mf.file_from_offset + mf.file_size
        w[_J_SLOT] = -1
        w[_J_ACTIVE] = 1
        CommitLog.end_file(mf)
        w[_WROTE] = mf.file_from_offset + mf.file_size
        w[_J_ACTIVE] = 0
        self._set_file(None)

    def _target_file(self, wrote: int) -> MappedFile | None:
        """The segment at the write position, its positions synced and its pool buffer attached."""
        cached = self._file
        if cached is not None:
            mf, buffer = cached
            position = wrote - mf.file_from_offset
            if 0 <= position < mf.file_size:
                mf.wrote_position = position
                mf.write_buffer = buffer
                return mf
        mf = self.store.commit_log.file_at(wrote)
        # A new file: a producer never reads back, and a mapping of a full file would pin its
        # disk space once the cleaner deletes it.
        self.store.commit_log.release_before(mf.file_from_offset)
        mf.wrote_position = wrote - mf.file_from_offset
        if self._pool:
            index = self.pool.buffer_for(mf.file_from_offset)
            if index < 0:
                index = self._borrow_buffer(mf.file_from_offset)
                if index < 0:
                    return None
            mf.write_buffer = self.pool.buffers[index].mm
        if self._sync:
            mf.pwrite_min_bytes = 0
        self._set_file((mf, mf.write_buffer))
        return mf

    def _set_file(self, cached: tuple[MappedFile, Any] | None) -> None:
        self._file = cached
        core = self._native
        if core is None:
            return
        if cached is None:
            core.set_file(None, False, -1, 0, 0, 0)
            return
        mf, buffer = cached
        dest = buffer if buffer is not None else mf.mapping
        core.set_file(dest, buffer is None, mf.fd, mf.file_from_offset, mf.file_size, mf.pwrite_min_bytes)

    def _borrow_buffer(self, file_offset: int) -> int:
        """A free pool buffer for a new file, waiting boundedly for the committer to return one
        (the lock is held; the committer returns buffers without it when we are waiting), or not
        at all with fastFailIfNoBufferInStorePool."""
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            index = self.pool.borrow(file_offset)
            if index >= 0 or self.config.fast_fail_if_no_buffer_in_store_pool or time.monotonic() >= deadline:
                return index
            self.store.shm.wake("committer")
            time.sleep(0.005)

    def _undo_interrupted_put(self) -> None:
        """Called with the lock taken over from a dead owner: roll its half-done put back."""
        t = self.table
        self._set_file(None)  # the undo below may detach the cached file's pool buffer
        if not t.get(layout.JOURNAL_ACTIVE):
            return
        wrote = t.get(layout.WROTE_POSITION)
        if wrote == t.get(layout.JOURNAL_WROTE_BEFORE):
            slot = t.get(layout.JOURNAL_QUEUE_SLOT)
            if slot >= 0:
                self.queues.set(slot, qo.NEXT_OFFSET, t.get(layout.JOURNAL_QUEUE_OFFSET_BEFORE))
            end = t.get(layout.JOURNAL_WROTE_AFTER)
            mf = self._target_file(wrote)
            if mf is not None and end > wrote:
                stop = min(end - mf.file_from_offset, mf.file_size)
                start = wrote - mf.file_from_offset
                mf.fill(start, bytes(stop - start))  # the pool buffer, or the file without a pool
                if mf.write_buffer is not None:  # and the file itself, in case bytes reached it
                    mf.write_buffer = None
                    mf.fill(start, bytes(stop - start))
        t.set(layout.JOURNAL_ACTIVE, 0)

    # ------------------------------------------------------------------ SYNC_FLUSH

    def _request_flush(self, runs: Sequence[EncodedRun]) -> None:
        """One group-commit request for every record of this lock hold that waits for disk (it
        ends at ``_flush_until``): a batch of 100 takes one ring slot, not 100, so concurrent SYNC
        batches never fill the ring."""
        slot = self.flush_requests.request(self._flush_until, self.lock.acquired_ms)
        for run in runs:
            if not run.wait_flush:
                continue
            if slot >= 0:
                run.flush_slot = slot
            else:
                run.answer_stored(PutMessageStatus.FLUSH_DISK_TIMEOUT, RING_FULL)

    def _acknowledge(self, runs: Sequence[EncodedRun]) -> None:
        """After the put: what the runs that wait for the store were promised. Under SYNC_FLUSH
        their flush; as SYNC_MASTER a slave's copy, which rmq-mp never has (RocketMQ with no
        slave connected answers SLAVE_NOT_AVAILABLE; a flush failure is reported first)."""
        if self._sync:
            self._await_flush(runs)
        if self._sync_master:
            for run in runs:
                if run.wait_flush:
                    run.answer_stored(PutMessageStatus.SLAVE_NOT_AVAILABLE, _NO_SLAVE)

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
