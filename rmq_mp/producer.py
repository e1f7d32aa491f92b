"""Producer: any local process attaches to a running store by shm name and appends itself.

Mirrors SendMessageProcessor + `CommitLog.putMessage` (rocketmq-format.md §3): encode outside the
lock; under the put lock assign the queue offset, patch offsets and store time, append through
`CommitLog.append_to` into the pool buffer (ASYNC_FLUSH with the pool) or straight into the
shared file mapping; then wake the committer or flusher and, under SYNC_FLUSH, wait for the
flusher to complete this put's flush request (FLUSH_DISK_TIMEOUT after `syncFlushTimeout`).

Crash safety of the put: before changing anything the put writes a journal (old write position,
intended end, queue slot and old queue offset) into the pointer table; the write position is the
commit point. A producer that dies holding the lock leaves the journal, and the next lock taker
undoes the half-done put (queue offset restored, bytes past the write position zeroed), so a
half-written record is never visible, not to reput and not after recovery.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rmq_mp import message as m
from rmq_mp import record
from rmq_mp.commit_log import AppendMessageResult
from rmq_mp.disk import not_writeable_reason
from rmq_mp.mapped_file import MappedFile
from rmq_mp.put_metrics import timed_send
from rmq_mp.running_store import RunningStore
from rmq_mp.status import AppendMessageStatus, PutMessageStatus, RunningFlags
from shm import flush_requests as fr
from shm import layout
from shm import queue_offsets as qo
from shm.layout import Role
from shm.pointer_table import now_ms, pid_alive
from shm.semaphores import PutLock, acquire

LOCK_TIMEOUT_S = 3.0
"""How long a put waits for the lock before reporting OS_PAGECACHE_BUSY (never a hang)."""
POOL_WAIT_S = 1.0
"""How long a put waits for a free pool buffer before reporting OS_PAGECACHE_BUSY."""
SUPERVISOR_STALE_MS = 3000
"""A supervisor heartbeat older than this makes a put check that the supervisor process exists."""


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
)
"""The pointer-table fields the put path writes (all under the put lock) by word index."""
_WANTS_FLUSH = -2
"""`_Pending.ring_slot` of a SYNC record waiting for its lock hold's flush request."""
_WROTE = layout.WROTE_POSITION.index
_J_ACTIVE = layout.JOURNAL_ACTIVE.index
_J_BEFORE = layout.JOURNAL_WROTE_BEFORE.index
_J_AFTER = layout.JOURNAL_WROTE_AFTER.index
_J_SLOT = layout.JOURNAL_QUEUE_SLOT.index
_J_QUEUE_OFFSET = layout.JOURNAL_QUEUE_OFFSET_BEFORE.index
_LAST_STORE_TS = layout.LAST_STORE_TIMESTAMP.index
_PUT_COUNT = layout.PUT_COUNT.index
_PUT_BYTES = layout.PUT_BYTES.index


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of one send. ``msg_id`` is the store's offset msgId; ``uniq_key`` the client id."""

    status: PutMessageStatus
    msg_id: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    commit_log_offset: int = -1
    uniq_key: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@dataclass(slots=True)
class _Pending:
    message: m.Message
    encoded: bytearray
    sys_flag: int
    result: SendResult | None = None
    end_offset: int = 0
    ring_slot: int = -1


class Producer:
    """Attach with `Producer.attach(name)`; one instance per process (not thread-safe)."""

    def __init__(self, store: RunningStore) -> None:
        self.store = store
        self.table = store.shm.table
        self.queues = store.shm.queues
        self.ring = store.shm.ring
        self.pool = store.shm.pool
        self.config = store.config
        self.store_host: m.Host = (self.config.broker_ip1, self.config.listen_port)
        self._store_ip, self._store_port = m.parse_host(self.store_host)
        self.lock = PutLock(
            store.shm.semaphore(store.names.put_lock),
            store.shm.semaphore(store.names.put_lock_takeover),
            self.table,
            on_takeover=self._undo_interrupted_put,
        )
        self._words = self.table.words(*_PUT_FIELDS)
        """Pointer-table words for the put path (writer check done once, in `words`)."""
        self._file: tuple[MappedFile, Any] | None = None
        """The segment being written and its pool buffer (None without a pool): a file keeps
        its buffer until it is full and wholly committed, so this stays valid until we roll."""
        self._wake_flusher_or_committer = (
            store.pool_enabled or store.sync_flush or not self.config.flush_commit_log_timed
        )
        """RocketMQ's timed ASYNC flusher sleeps its interval whatever happens, so waking it
        would only cost this put a system call."""
        self.uniq = m.UniqueIdGenerator()
        self._round_robin: dict[str, itertools.count[int]] = {}
        self.born_host: m.Host = ("127.0.0.1", os.getpid() & 0xFFFF)

    @classmethod
    def attach(cls, name: str | os.PathLike[str]) -> Producer:
        """Attach to the running store ``name`` (shm name or store directory)."""
        return cls(RunningStore.attach(name, Role.PRODUCER, writable_log=True))

    def close(self) -> None:
        self._file = None
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
        """Store one message; the result's status is RocketMQ's PutMessageStatus."""
        return self.send_batch(
            [
                dict(
                    topic=topic,
                    body=body,
                    tags=tags,
                    keys=keys,
                    properties=properties,
                    queue_id=queue_id,
                    flag=flag,
                )
            ]
        )[0]

    @timed_send
    def send_batch(self, messages: Iterable[m.Message | Mapping[str, Any]]) -> list[SendResult]:
        """Store many messages under one put-lock hold (each keeps its own queue offset)."""
        pending: list[_Pending] = []
        for item in messages:
            message = item if isinstance(item, m.Message) else self._build(**item)
            pending.append(self._encode(message))
        todo = [p for p in pending if p.result is None]
        if todo:
            self._put(todo, self._run_of_one_queue(todo))
        if self.store.sync_flush:
            self._await_flush([p for p in todo if p.ring_slot >= 0])
        return [p.result or SendResult(PutMessageStatus.UNKNOWN_ERROR) for p in pending]

    # ------------------------------------------------------------------ encode (outside the lock)

    def _build(
        self,
        *,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        flag: int = 0,
    ) -> m.Message:
        props = dict(properties or {})
        if tags:
            props[m.PROPERTY_TAGS] = tags
        if keys:
            props[m.PROPERTY_KEYS] = keys if isinstance(keys, str) else m.KEY_SEPARATOR.join(keys)
        props.setdefault(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, self.uniq.next_id())
        if queue_id is None:
            counter = self._round_robin.setdefault(topic, itertools.count())
            queue_id = next(counter) % self.config.default_topic_queue_nums
        return m.Message(
            topic=topic,
            body=bytes(body),
            flag=flag,
            properties=props,
            queue_id=queue_id,
            born_timestamp=now_ms(),
            born_host=self.born_host,
        )

    def _encode(self, message: m.Message) -> _Pending:
        props = m.properties_to_string(message.properties)
        problem = record.validate_message(
            message, max_message_size=self.config.max_message_size, properties_text=props
        )
        if problem is not None:
            p = _Pending(message, bytearray(), 0)
            status = problem[0]
            if status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED:  # the broker answers MESSAGE_ILLEGAL
                status = PutMessageStatus.MESSAGE_ILLEGAL
            p.result = SendResult(status, queue_id=message.queue_id, reason=problem[1])
            return p
        encoded, sys_flag = record.encode_record_flag(message, self.store_host, props)
        return _Pending(message, encoded, sys_flag)

    # ------------------------------------------------------------------ put (under the lock)

    def _refuse(self, todo: list[_Pending], status: PutMessageStatus, reason: str) -> None:
        for p in todo:
            p.result = SendResult(status, queue_id=p.message.queue_id, reason=reason)

    def _run_of_one_queue(self, todo: list[_Pending]) -> tuple[bytearray, Any] | None:
        """RocketMQ's MessageBatch shape (one topic, one queue, IPv4 born hosts) under ASYNC
        flush: joined outside the lock so the put lock appends it with one journal entry, one
        numpy patch and one copy. None for anything else (appended record by record)."""
        if len(todo) < 2 or self.store.sync_flush:
            return None
        first = todo[0].message
        for p in todo:
            if (
                p.message.topic != first.topic
                or p.message.queue_id != first.queue_id
                or not m.is_dispatchable(p.sys_flag)
                or p.sys_flag & m.BORNHOST_V6_FLAG
            ):
                return None
        return record.join_run([p.encoded for p in todo])

    def _put(self, todo: list[_Pending], run: tuple[bytearray, Any] | None = None) -> None:
        t = self.table
        if t.get(layout.STATE) != layout.RUNNING:
            return self._refuse(
                todo, PutMessageStatus.SERVICE_NOT_AVAILABLE, "store is not running (stopping)"
            )
        stale = now_ms() - t.get(layout.SUPERVISOR_HEARTBEAT_MS) > SUPERVISOR_STALE_MS
        if stale and not pid_alive(t.get(layout.SUPERVISOR_PID)):
            # A stale heartbeat alone may be a busy machine; a dead supervisor means nobody runs the store.
            return self._refuse(todo, PutMessageStatus.SERVICE_NOT_AVAILABLE, "store supervisor is dead")
        flags = t.get(layout.RUNNING_FLAGS) & RunningFlags.put_blockers()
        if flags:
            reason = not_writeable_reason(flags, t.get(layout.DISK_USED_PERMILLE), self.config)
            return self._refuse(todo, PutMessageStatus.SERVICE_NOT_AVAILABLE, reason)
        if not self.lock.acquire(LOCK_TIMEOUT_S):
            return self._refuse(todo, PutMessageStatus.OS_PAGECACHE_BUSY, "put lock busy")
        w = self._words
        try:
            store_ts = now_ms()  # one store time per lock hold, as RocketMQ's batch put
            count = size_bytes = 0
            if run is not None and self._append_run(todo, *run, store_ts):
                count, size_bytes, todo = len(todo), len(run[0]), []
            for p in todo:
                p.result = result = self._append_one(p, store_ts)
                if result.commit_log_offset >= 0:  # appended (PUT_OK, or a SYNC ring-full timeout)
                    count += 1
                    size_bytes += len(p.encoded)
            if self.store.sync_flush:
                self._request_flush([p for p in todo if p.ring_slot == _WANTS_FLUSH])
            if count:
                w[_LAST_STORE_TS] = store_ts
                w[_PUT_COUNT] += count
                w[_PUT_BYTES] += size_bytes
        finally:
            self.lock.release()
        if self._wake_flusher_or_committer:
            self.store.shm.wake("committer" if self.store.pool_enabled else "flusher")
        if not self.store.sync_flush:
            self.store.shm.wake("reput")

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
        if self.store.pool_enabled:
            index = self.pool.buffer_for(mf.file_from_offset)
            if index < 0:
                index = self._borrow_buffer(mf.file_from_offset)
                if index < 0:
                    return None
            mf.write_buffer = self.pool.buffers[index].mm
        self._file = (mf, mf.write_buffer)
        return mf

    def _borrow_buffer(self, file_offset: int) -> int:
        """A free pool buffer for a new file, waiting boundedly for the committer to return one
        (the lock is held; the committer returns buffers without it when we are waiting)."""
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            index = self.pool.borrow(file_offset)
            if index >= 0 or time.monotonic() >= deadline:
                return index
            self.store.shm.wake("committer")
            time.sleep(0.005)

    def _append_run(self, todo: list[_Pending], joined: bytearray, starts: Any, store_ts: int) -> bool:
        """Append a `_run_of_one_queue` run as one put: one journal entry covers it (one queue
        slot, one byte range), the write position moves once. False, with nothing changed, when
        the run does not fit in the current file (the caller then rolls record by record)."""
        w = self._words
        wrote = w[_WROTE]
        try:
            mf = self._target_file(wrote)
        except OSError:
            return False  # record by record, where each gets CREATE_MAPEDFILE_FAILED
        if mf is None or mf.wrote_position + len(joined) + record.END_FILE_MIN_BLANK_LENGTH > mf.file_size:
            return False
        first = todo[0].message
        slot = self.queues.find_or_insert(first.topic, first.queue_id)
        queue_offset = self.queues.get(slot, qo.NEXT_OFFSET)
        end = wrote + len(joined)
        w[_J_BEFORE] = wrote
        w[_J_AFTER] = end
        w[_J_SLOT] = slot
        w[_J_QUEUE_OFFSET] = queue_offset
        w[_J_ACTIVE] = 1
        record.patch_run(
            joined, starts, queue_offset=queue_offset, phy_offset=wrote, store_timestamp=store_ts
        )
        mf.append(joined)
        mf.last_store_timestamp = store_ts
        self.queues.set(slot, qo.NEXT_OFFSET, queue_offset + len(todo))
        w[_WROTE] = end  # the commit point
        w[_J_ACTIVE] = 0
        ip, port, uniq = self._store_ip, self._store_port, m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        for i, (p, start) in enumerate(zip(todo, starts.tolist(), strict=True)):
            phy = wrote + start
            p.end_offset = end
            p.result = SendResult(
                PutMessageStatus.PUT_OK,
                msg_id=m.create_message_id(ip, port, phy),
                queue_id=first.queue_id,
                queue_offset=queue_offset + i,
                commit_log_offset=phy,
                uniq_key=p.message.properties.get(uniq, ""),
            )
        return True

    def _append_one(self, p: _Pending, store_ts: int) -> SendResult:
        w = self._words
        message = p.message
        dispatchable = m.is_dispatchable(p.sys_flag)
        for _ in range(2):
            wrote = w[_WROTE]
            try:
                mf = self._target_file(wrote)
            except OSError as exc:  # the allocator fell behind and the disk refused a new file
                return SendResult(
                    PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                    queue_id=message.queue_id,
                    reason=f"cannot create the commit-log file at {wrote}: {exc}",
                )
            if mf is None:
                return SendResult(
                    PutMessageStatus.OS_PAGECACHE_BUSY,
                    queue_id=message.queue_id,
                    reason="no free TransientStorePool buffer",
                )
            slot = self.queues.find_or_insert(message.topic, message.queue_id) if dispatchable else -1
            queue_offset = self.queues.get(slot, qo.NEXT_OFFSET) if slot >= 0 else 0
            # The journal, then the append; the write position below is the commit point.
            w[_J_BEFORE] = wrote
            w[_J_AFTER] = wrote + max(len(p.encoded), record.END_FILE_MIN_BLANK_LENGTH)
            w[_J_SLOT] = slot
            w[_J_QUEUE_OFFSET] = queue_offset
            w[_J_ACTIVE] = 1
            result: AppendMessageResult = self.store.commit_log.append_to(
                mf, p.encoded, sys_flag=p.sys_flag, queue_offset=queue_offset, store_timestamp=store_ts
            )
            if result.status is AppendMessageStatus.END_OF_FILE:
                w[_WROTE] = mf.file_from_offset + mf.file_size
                w[_J_ACTIVE] = 0
                self._file = None
                continue
            if result.status is not AppendMessageStatus.PUT_OK:
                w[_J_ACTIVE] = 0
                return SendResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    queue_id=message.queue_id,
                    reason=f"append failed: {result.status.name}",
                )
            if slot >= 0:
                self.queues.set(slot, qo.NEXT_OFFSET, queue_offset + 1)
            end = result.phy_offset + result.wrote_bytes
            w[_WROTE] = end  # the commit point
            w[_J_ACTIVE] = 0
            p.end_offset = end
            if (
                self.store.sync_flush
                and message.properties.get(m.PROPERTY_WAIT_STORE_MSG_OK, "true") == "true"
            ):
                p.ring_slot = _WANTS_FLUSH  # one request per lock hold covers it: `_request_flush`
            return SendResult(
                PutMessageStatus.PUT_OK,
                msg_id=m.create_message_id(self._store_ip, self._store_port, result.phy_offset),
                queue_id=message.queue_id,
                queue_offset=queue_offset,
                commit_log_offset=result.phy_offset,
                uniq_key=message.properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ""),
            )
        return SendResult(
            PutMessageStatus.UNKNOWN_ERROR, queue_id=message.queue_id, reason="file roll failed"
        )

    def _undo_interrupted_put(self) -> None:
        """Called with the lock taken over from a dead owner: roll its half-done put back."""
        t = self.table
        self._file = None  # the undo below may detach the cached file's pool buffer
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

    def _request_flush(self, wanting: list[_Pending]) -> None:
        """One group-commit request for every record of this lock hold that waits for disk (the
        last one's end covers the others): a batch of 100 takes one ring slot, not 100, so
        concurrent SYNC batches never fill the ring."""
        if not wanting:
            return
        slot = self._flush_request(max(p.end_offset for p in wanting))
        for p in wanting:
            p.ring_slot = slot
            if slot < 0 and p.result is not None:
                p.result = replace(
                    p.result, status=PutMessageStatus.FLUSH_DISK_TIMEOUT, reason="flush request ring full"
                )

    def _flush_request(self, end_offset: int) -> int:
        """Take a ring slot for a group-commit request (put lock held); -1 if the ring is full."""
        ring = self.ring
        for _ in range(ring.capacity):
            ticket = self.table.add(layout.FLUSH_REQUEST_SEQ, 1)
            slot = ticket % ring.capacity
            state = ring.get(slot, fr.STATE)
            # A DONE_* slot belongs to its waiter until the waiter frees it (shm/flush_requests.py);
            # taking it earlier let that waiter's FREE overwrite the new request. Past its deadline
            # (+1 s) its waiter has read it or given up, so it may be taken whatever it says.
            if state == fr.FREE or (state != fr.WAITING and ring.get(slot, fr.DEADLINE_MS) + 1000 < now_ms()):
                ring.set(slot, fr.NEXT_OFFSET, end_offset)
                ring.set(slot, fr.DEADLINE_MS, now_ms() + self.config.sync_flush_timeout)
                ring.set(slot, fr.PID, os.getpid())
                ring.set(slot, fr.STATE, fr.WAITING)
                return slot
        return -1

    def _await_flush(self, waiting: list[_Pending]) -> None:
        """Wait for each request's completion; the flusher (or its watcher) completes them."""
        if not waiting:
            return
        timeout_s = self.config.sync_flush_timeout / 1000
        deadline = time.monotonic() + timeout_s
        outcome: dict[int, int] = {}
        for ring_slot in dict.fromkeys(p.ring_slot for p in waiting):
            sem = self.store.shm.semaphore(self.store.names.flush_done(ring_slot))
            while True:
                state = self.ring.get(ring_slot, fr.STATE)
                if state in (fr.DONE_OK, fr.DONE_TIMEOUT):
                    self.ring.set(ring_slot, fr.STATE, fr.FREE)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:  # the flusher is not answering (stopped, or dead)
                    self.ring.set(ring_slot, fr.STATE, fr.ABANDONED)
                    state = fr.DONE_TIMEOUT
                    break
                acquire(sem, remaining)
            outcome[ring_slot] = state
        for p in waiting:
            if outcome[p.ring_slot] != fr.DONE_OK and p.result is not None:
                p.result = SendResult(
                    PutMessageStatus.FLUSH_DISK_TIMEOUT,
                    p.result.msg_id,
                    p.result.queue_id,
                    p.result.queue_offset,
                    p.result.commit_log_offset,
                    p.result.uniq_key,
                    "not flushed within syncFlushTimeout",
                )
        for p in waiting:
            if p.result is not None and p.result.ok:
                flushed = self.table.get(layout.FLUSHED_POSITION)
                assert flushed >= p.end_offset, f"acknowledged {p.end_offset} above flushed {flushed}"
