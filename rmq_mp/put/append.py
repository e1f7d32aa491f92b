"""The put lock's work: journal, copy, queue offset and write position (the commit point), the
file and pool buffer at the write position, and the undo of a dead holder's half-done put.

Only `Producer` calls it, with the put lock held (`append`, `append_one`, `reserve`) or just
taken over from a dead holder (`undo_interrupted_put`). Crash safety is the journal protocol of
`shm.put_journal` (journal, bytes, queue offset, write position: the commit point), so a
half-written record is never visible, not to reput and not after recovery. The compiled core
follows the same protocol under the same lock (rmq_mp/put/_core.c); `set_file`,
`_set_reserved_until` and `_queue_slot` keep it told of this process's file, reservation and
learned queues.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from rmq_mp.errors import OffsetTableFullError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.message_batch import EncodedRun, Placement
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.flush_wait import RING_FULL, FlushRequests
from rmq_mp.put.routing import QueueRouter
from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.mapped_file import OS_PAGE_SIZE, MappedFile
from rmq_mp.store.running_store import RunningStore
from shm import layout, transient_pool
from shm import put_journal as journal
from shm import queue_offsets as qo
from shm.pointer_table import pid_alive

log = logging.getLogger("rmq_mp")

POOL_WAIT_S = 1.0
"""How long a put waits for a free pool buffer before reporting OS_PAGECACHE_BUSY."""
RESERVE_OWN_BYTES = 1 << 20
"""What a put reserves for itself past its end when it finds itself beyond ALLOCATED_UNTIL (the
allocator fell behind): a MiB, so a put racing ahead pays one posix_fallocate a MiB."""
PUT_FIELDS = (
    *journal.FIELDS,
    layout.LAST_STORE_TIMESTAMP,
    layout.PUT_COUNT,
    layout.PUT_BYTES,
    layout.FLUSH_REQUEST_SEQ,
)
"""The pointer-table fields the put path writes (all under the put lock), by word index."""
_WROTE = layout.WROTE_POSITION.index
_LAST_STORE_TS = layout.LAST_STORE_TIMESTAMP.index
_PUT_COUNT = layout.PUT_COUNT.index
_PUT_BYTES = layout.PUT_BYTES.index
_ALLOCATED = layout.ALLOCATED_UNTIL.index
_PUT_OK = PutMessageStatus.PUT_OK
_CREATE_FAILED = PutMessageStatus.CREATE_MAPEDFILE_FAILED
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_NEVER = sys.maxsize
_QUEUES_EXCEEDED = PutMessageStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
"""A send to a queue the full queue-offset table has no room for (RocketMQ's status for too many
consume queues); the reason names maxConsumeQueueNum."""


class OnePut(NamedTuple):
    """Where `Appender.append_one` put a record."""

    queue_offset: int
    phy_offset: int
    end_offset: int
    ring_slot: int
    """Its SYNC flush request's slot (-1: none)."""


class Appender:
    """One producer's appends to one start of the store (see the module docstring)."""

    def __init__(
        self, store: RunningStore, words: memoryview, router: QueueRouter, encoder: record.RecordEncoder
    ) -> None:
        self.store = store
        self.table = store.shm.table
        self.queues = store.shm.queues
        self.pool = store.shm.pool
        self.config = store.config
        self._words = words
        """Pointer-table words of PUT_FIELDS and the few it reads (writer check done once, in `words`)."""
        self.router = router
        self.encoder = encoder
        self._sync = store.sync_flush
        self._pool = store.pool_enabled
        self.flush_requests = FlushRequests(store.shm, words, self.config.sync_flush_timeout, os.getpid())
        self.native: Any = None
        """The compiled send (`rmq_mp.put.native`), told of the file, reservation and queues."""
        self._file: tuple[MappedFile, Any] | None = None
        """The segment being written and its pool buffer (None without a pool): a file keeps
        its buffer until it is full and wholly committed, so this stays valid until we roll.
        Set by `set_file`, which tells the compiled send."""
        self._flush_until = -1
        """End offset the current lock hold's SYNC flush request must cover (-1: none)."""
        self._slots: dict[tuple[str, int], tuple[int, int]] = {}
        """(topic, queue id) -> (queue-offset-table slot, word of its next offset)."""
        self._queue_words = self.queues.writable_words(qo.NEXT_OFFSET)
        self._reserved_until = 0
        """Commit-log offset below which, from the write position on, blocks are known reserved
        (ALLOCATED_UNTIL or this producer's own reservation): a put ending below it writes
        without a system call, one ending above goes through `reserve`."""
        self._populated_until = 0
        """Position in the cached file's pool buffer up to which this process's mapping of it
        is populated (`prefault_ahead`)."""
        self._prefault_at = _NEVER
        """Commit-log offset from which the write position calls for `prefault_ahead` again."""

    def append(self, runs: Sequence[EncodedRun], store_ts: int) -> None:
        """The put lock's work for ``runs``: place them, count them, ask for their flush.
        ``store_ts``: the hold's one store time (as RocketMQ's batch put)."""
        self._flush_until = -1
        count = size = 0
        for run in runs:
            appended, appended_bytes = self._append_run(run, store_ts)
            count += appended
            size += appended_bytes
        self._count(store_ts, count, size)
        if self._flush_until >= 0:
            self._request_flush(runs, store_ts)

    def append_one(
        self, topic: str, queue_id: int, data: bytearray, wait: bool, store_ts: int
    ) -> OnePut | None:
        """`append` of one record, flattened for `send`'s common case (the record fits the file
        this producer has mapped, inside its reservation; profiled, the run machinery was a
        third of a send): where it went, or None with nothing changed (the caller takes the run
        path: a new file or a reservation first). `OffsetTableFullError` before any change."""
        cached = self._file
        if cached is None:
            return None
        mf = cached[0]
        wrote = self._words[_WROTE]
        size = len(data)
        if not (
            0 <= wrote - mf.file_from_offset <= mf.file_size - size - record.END_FILE_MIN_BLANK_LENGTH
            and wrote + size <= self._reserved_until
        ):
            return None
        mf.write_buffer = cached[1]
        slot, next_word = self._queue_slot(topic, queue_id)
        queue_offset = self._queue_words[next_word]
        record.patch_record(
            data, 0, queue_offset, wrote, store_ts, 0, crc=self.encoder.append_crc
        )  # IPv4 born
        end = wrote + size
        self._write_chunk(mf, data, wrote, end, slot, next_word, queue_offset, 1)
        self._count(store_ts, 1, size)
        ring_slot = self.flush_requests.request(end, store_ts) if self._sync and wait else -1
        return OnePut(queue_offset, wrote, end, ring_slot)

    def _count(self, store_ts: int, count: int, size: int) -> None:
        """The store's put counters, after records were appended (lock held)."""
        if count:
            w = self._words
            w[_LAST_STORE_TS] = store_ts
            w[_PUT_COUNT] += count
            w[_PUT_BYTES] += size

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
                reason = self.reserve(mf, mf.file_from_offset + mf.file_size)
                if reason:
                    run.place(Placement(first, run.count - first, _CREATE_FAILED, reason))
                    break
                self._end_file(mf, wrote)
                continue
            end = wrote + run.end(first + fit - 1) - run.start(first)
            if end > self._reserved_until:
                reason = self.reserve(mf, end)
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
        run.patch(
            first, count, queue_offset=queue_offset, phy_offset=wrote, store_timestamp=store_ts,
            crc=self.encoder.append_crc,
        )  # fmt: skip
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
        """Copy patched records into the log at ``wrote``, journalled (`shm.put_journal`): the
        journal first, then the bytes, the queue's next offset, and the write position, which is
        the commit point."""
        w = self._words
        journal.begin(w, wrote, end, slot, queue_offset)
        mf.fill(wrote - mf.file_from_offset, data)
        if slot >= 0:
            self._queue_words[next_word] = queue_offset + count
        journal.commit(w, end)

    def _queue_slot(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(queue-offset-table slot, word index of its next offset), inserting it if new (put
        lock held); `OffsetTableFullError` when the table holds maxConsumeQueueNum queues."""
        key = (topic, queue_id)
        found = self._slots.get(key)
        if found is None:
            slot = self.queues.find_or_insert(topic, queue_id)
            found = self._slots[key] = (slot, self.queues.word_index(slot, qo.NEXT_OFFSET))
        if self.native is not None:
            limit = self.router.limits.get(topic)
            if limit is None and topic == m.SCHEDULE_TOPIC:  # a delayed send's queue: one per level
                limit = len(self.config.delay_levels_ms)
            if limit is not None and queue_id < limit:  # a queue the compiled send may put to
                self.native.learn(topic, self.encoder.topic_field(topic), limit, queue_id, *found)
        return found

    def reserve(self, mf: MappedFile, end: int) -> str:
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
        if self.native is not None:
            self.native.reserved_until = offset

    def _end_file(self, mf: MappedFile, wrote: int) -> None:
        """Close the current file with a BLANK record, journalled like an append."""
        end = mf.file_from_offset + mf.file_size
        journal.begin(self._words, wrote, end, -1, -1)
        CommitLog.end_file(mf)
        journal.commit(self._words, end)
        self.set_file(None)

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
        self.set_file((mf, mf.write_buffer))
        return mf

    def set_file(self, cached: tuple[MappedFile, Any] | None) -> None:
        self._file = cached
        self._populated_until = 0
        pooled = cached is not None and cached[1] is not None
        self._set_prefault_at(cached[0].file_from_offset if cached is not None and pooled else _NEVER)
        core = self.native
        if core is None:
            return
        if cached is None:
            core.set_file(None, False, -1, 0, 0, 0)
            return
        mf, buffer = cached
        dest = buffer if buffer is not None else mf.mapping
        core.set_file(dest, buffer is None, mf.fd, mf.file_from_offset, mf.file_size, mf.pwrite_min_bytes)

    def prefault_ahead(self) -> None:
        """After a put, off the put lock: once the write position is within half of
        `transient_pool.PREFAULT_BYTES` of what this process's mapping of the cached pool buffer
        has populated, populate the next stretch (`transient_pool.prefault`), so that sends
        do not each take the page faults of the buffer's fresh pages. The compiled send calls
        this when its put ends at or past ``prefault_at``; the reference after every put."""
        cached = self._file
        wrote = self._words[_WROTE]
        if wrote < self._prefault_at or cached is None or cached[1] is None:
            return
        mf, buffer = cached
        try:
            self._populated_until, due = transient_pool.prefault(
                buffer, wrote - mf.file_from_offset, self._populated_until
            )
        except OSError as exc:  # a kernel before 5.14: the sends take the faults instead
            log.debug("pool buffer prefault unavailable: %s", exc)
            self._set_prefault_at(_NEVER)
            return
        self._set_prefault_at(mf.file_from_offset + due)

    def _set_prefault_at(self, offset: int) -> None:
        self._prefault_at = offset
        if self.native is not None:
            self.native.prefault_at = offset

    def _borrow_buffer(self, file_offset: int) -> int:
        """A free pool buffer for a new file, waiting boundedly for the committer to return one
        (the lock is held; the committer returns buffers without it when we are waiting), or not
        at all with fastFailIfNoBufferInStorePool."""
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            index = self.pool.borrow(file_offset)
            if index >= 0 or self.config.fast_fail_if_no_buffer_in_store_pool or time.monotonic() >= deadline:
                return index
            if not pid_alive(self.table.get(layout.SUPERVISOR_PID)):
                return -1  # no committer will return one: hold the lock no longer (a fencer waits for it)
            self.store.shm.wake("committer")
            time.sleep(0.005)

    def undo_interrupted_put(self) -> None:
        """Called with the lock taken over from a dead owner: roll its half-done put back."""
        self.set_file(None)  # the undo below may detach the cached file's pool buffer
        put = journal.interrupted(self.table)
        if put is not None:
            if put.queue_slot >= 0:
                self.queues.set(put.queue_slot, qo.NEXT_OFFSET, put.queue_offset)
            mf = self._target_file(put.wrote)
            if mf is not None and put.end > put.wrote:
                stop = min(put.end - mf.file_from_offset, mf.file_size)
                start = put.wrote - mf.file_from_offset
                mf.fill(start, bytes(stop - start))  # the pool buffer, or the file without a pool
                if mf.write_buffer is not None:  # and the file itself, in case bytes reached it
                    mf.write_buffer = None
                    mf.fill(start, bytes(stop - start))
        journal.close(self.table)

    def _request_flush(self, runs: Sequence[EncodedRun], store_ts: int) -> None:
        """One group-commit request for every record of this lock hold that waits for disk (it
        ends at ``_flush_until``): a batch of 100 takes one ring slot, not 100, so concurrent SYNC
        batches never fill the ring."""
        slot = self.flush_requests.request(self._flush_until, store_ts)
        for run in runs:
            if not run.wait_flush:
                continue
            if slot >= 0:
                run.flush_slot = slot
            else:
                run.answer_stored(PutMessageStatus.FLUSH_DISK_TIMEOUT, RING_FULL)
