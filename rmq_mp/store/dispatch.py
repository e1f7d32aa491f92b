"""Dispatch: what reput (and recovery) does with each CommitLog record.

Mirrors `CommitLogDispatcherBuildConsumeQueue` and `CommitLogDispatcherBuildIndex`: a NOT or
COMMIT record gets a ConsumeQueue entry; every record but a ROLLBACK has its keys indexed.
Both are idempotent under re-dispatch, which is what lets recovery replay a range safely.

`dispatch` takes one record (`record.check_record`'s request); `dispatch_batch` takes the
columns of many (`record_batch.RecordBatch`) and leaves the same bytes in the same files: each
queue's entries are appended per queue in blocks, the index keys in blocks.

A deleteTopic marker (rmq_mp/format/topic_marker.py) is handed to `on_marker` before it or any
record after it is dispatched, a batch split there.

Faults: by default a queue or index that cannot be written raises (recovery stops there). With
``isolate`` (reput) it is quarantined instead: its records are skipped from then on, the fault
is kept in `faults` for the caller, and every other queue and the index go on. The caller
brings a quarantined queue back with `dispatch_queue` over the records it missed (idempotence
makes the overlap harmless), and the index with `IndexService.build_index_batch`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import numpy as np

from rmq_mp.errors import StoreError
from rmq_mp.format import topic_marker
from rmq_mp.format.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, is_dispatchable
from rmq_mp.format.record import DispatchRequest
from rmq_mp.format.record_batch import RecordBatch, RecordRows
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.index_service import IndexService


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """The last record of a batch that went to one queue (what reput publishes per queue)."""

    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp: int


INDEX_KEY = ("", -1)
"""The quarantine key of the index (a queue's is its (topic, queue id))."""


@dataclass(frozen=True, slots=True)
class DispatchFault:
    """A queue (or the index: ``key`` INDEX_KEY) that refused a record, in isolating mode."""

    key: tuple[str, int]
    phy_offset: int
    """The first record it did not take (a re-dispatch from here completes it)."""
    end_offset: int
    """End of the records of that call it did not take."""
    store_timestamp: int
    """Store time of the record at ``phy_offset``."""
    error: Exception


class Dispatcher:
    """Applies DispatchRequests (one, or a batch) to the ConsumeQueue and the index."""

    def __init__(
        self,
        find_consume_queue: Callable[[str, int], ConsumeQueue],
        index_service: IndexService | None,
        checkpoint: StoreCheckpoint,
        *,
        isolate: bool = False,
    ) -> None:
        self.find_consume_queue = find_consume_queue
        self.index_service = index_service
        self.checkpoint = checkpoint
        self.dispatched = 0
        self.isolate = isolate
        self.quarantined: set[tuple[str, int]] = set()
        """Queues (and INDEX_KEY) skipped until the caller releases them (isolating mode)."""
        self.faults: list[DispatchFault] = []
        """Faults since the caller last took them (`take_faults`)."""
        self.dropped: dict[str, int] = {}
        """Deleted topics (rmq_mp/config/deleted_topics.py): a record of one below its offset
        gets no queue entry (it is no longer the topic's). Its keys are still indexed."""
        self.on_marker: Callable[[int], Collection[str]] | None = None
        """Called with a deleteTopic marker's commit-log offset (rmq_mp/format/topic_marker.py)
        before the marker or anything after it is dispatched: the owner applies the delete (its
        tombstone, `dropped`, the old queues), so the records after it start the topic anew;
        returns the topics it names."""

    def drops(self, topic: str, phy_offset: int) -> bool:
        """Whether a record of ``topic`` at ``phy_offset`` belongs to a deleted topic."""
        bound = self.dropped.get(topic)
        return bound is not None and phy_offset < bound

    def take_faults(self) -> list[DispatchFault]:
        faults, self.faults = self.faults, []
        return faults

    def _fault(self, key: tuple[str, int], phy: int, end: int, timestamp: int, exc: Exception) -> None:
        if not self.isolate:
            raise exc
        self.quarantined.add(key)
        self.faults.append(DispatchFault(key, phy, end, timestamp, exc))

    def dispatch(self, req: DispatchRequest) -> None:
        if req.topic == topic_marker.TOPIC and self.on_marker is not None:
            self.on_marker(req.phy_offset)
        if is_dispatchable(req.sys_flag):
            key = (req.topic, req.queue_id)
            if key not in self.quarantined and not (self.dropped and self.drops(req.topic, req.phy_offset)):
                try:
                    cq = self.find_consume_queue(req.topic, req.queue_id)
                    if not cq.put_message_position_info(
                        phy_offset=req.phy_offset,
                        size=req.size,
                        tags_code=req.tags_code,
                        queue_offset=req.queue_offset,
                    ):
                        raise StoreError(f"consume queue {req.topic}/{req.queue_id} cannot be written")
                except Exception as exc:
                    self._fault(key, req.phy_offset, req.phy_offset + req.size, req.store_timestamp, exc)
            self.checkpoint.logics_msg_timestamp = req.store_timestamp
        if self.index_service is not None and INDEX_KEY not in self.quarantined:
            try:
                self.index_service.build_index(req)
            except Exception as exc:
                self._fault(INDEX_KEY, req.phy_offset, req.phy_offset + req.size, req.store_timestamp, exc)
        self.dispatched += 1

    def dispatch_batch(self, batch: RecordBatch) -> list[QueueProgress]:
        """`dispatch` of every record of ``batch``, in order; returns, per queue written, its
        last record. Queues are independent files, so each takes its records as one block; the
        index takes its keys after them. (If a queue cannot be written, the StoreError leaves
        earlier queues of the batch written, where one at a time would have stopped at the
        record: re-dispatch from the same offset completes either. Isolating, the other queues
        and the index are written and the queue is quarantined.)"""
        if self.on_marker is not None and (markers := topic_marker.rows(batch)):
            progress: list[QueueProgress] = []
            for start, stop in zip([0, *markers], [*markers, len(batch)], strict=True):
                if start == stop:
                    continue
                if start in markers:  # what went before to the topics it deleted is not theirs now
                    deleted = self.on_marker(int(batch.phy_offset[start]))
                    progress = [p for p in progress if p.topic not in deleted]
                progress += self._dispatch_batch(batch.slice(start, stop))
            return progress
        return self._dispatch_batch(batch)

    def _dispatch_batch(self, batch: RecordBatch) -> list[QueueProgress]:
        n = len(batch)
        if n == 0:
            return []
        progress: list[QueueProgress] = []
        quarantined = self.quarantined
        last_row = -1
        for topic, queue_id, group in self._queue_groups(batch):
            last_row = max(last_row, int(group[-1]))
            if quarantined and (topic, queue_id) in quarantined:
                continue
            try:
                done = self._put_group(topic, queue_id, batch, group)
            except Exception as exc:
                first = int(group[0])
                end = int(batch.phy_offset[group[-1]] + batch.size[group[-1]])
                self._fault(
                    (topic, queue_id),
                    int(batch.phy_offset[first]),
                    end,
                    int(batch.store_timestamp[first]),
                    exc,
                )
                continue
            progress.append(done)
        if last_row >= 0:
            self.checkpoint.logics_msg_timestamp = int(batch.store_timestamp[last_row])
        if self.index_service is not None and INDEX_KEY not in quarantined:
            try:
                self.index_service.build_index_batch(batch)
            except Exception as exc:
                end = int(batch.phy_offset[-1] + batch.size[-1])
                self._fault(INDEX_KEY, int(batch.phy_offset[0]), end, int(batch.store_timestamp[0]), exc)
        self.dispatched += n
        return progress

    def dispatch_rows(self, rows: RecordRows) -> list[QueueProgress] | None:
        """`dispatch_batch` of a few records as Python lists (reput's small passes), with the
        same bytes, faults and result; None, nothing done, when they hold a deleteTopic marker
        (the caller dispatches them as a batch)."""
        topics = rows.topics
        if self.on_marker is not None and topic_marker.TOPIC in topics:
            marker = topics.index(topic_marker.TOPIC)
            if marker in rows.topic_index:
                return None
        groups: dict[tuple[int, int], list[int]] = {}
        for row, (sys_flag, topic_index, queue_id) in enumerate(
            zip(rows.sys_flag, rows.topic_index, rows.queue_id, strict=True)
        ):
            if is_dispatchable(sys_flag):
                groups.setdefault((topic_index, queue_id), []).append(row)
        progress: list[QueueProgress] = []
        quarantined, dropped = self.quarantined, self.dropped
        phy, size, store_timestamp = rows.phy_offset, rows.size, rows.store_timestamp
        last_row = -1
        for (topic_index, queue_id), group in sorted(groups.items(), key=_queue_order):
            topic = topics[topic_index]
            if dropped and topic in dropped:
                group = [r for r in group if phy[r] >= dropped[topic]]
                if not group:
                    continue
            last_row = max(last_row, group[-1])
            if quarantined and (topic, queue_id) in quarantined:
                continue
            try:
                cq = self.find_consume_queue(topic, queue_id)
                if not cq.put_position_rows(
                    phy_offset=[phy[r] for r in group],
                    size=[size[r] for r in group],
                    tags_code=[rows.tags_code[r] for r in group],
                    queue_offset=[rows.queue_offset[r] for r in group],
                ):
                    raise StoreError(f"consume queue {topic}/{queue_id} cannot be written")
            except Exception as exc:
                first, last = group[0], group[-1]
                self._fault(
                    (topic, queue_id), phy[first], phy[last] + size[last], store_timestamp[first], exc
                )
                continue
            last = group[-1]
            progress.append(QueueProgress(topic, queue_id, rows.queue_offset[last], store_timestamp[last]))
        if last_row >= 0:
            self.checkpoint.logics_msg_timestamp = store_timestamp[last_row]
        if self.index_service is not None and INDEX_KEY not in quarantined:
            try:
                self.index_service.build_index_rows(rows)
            except Exception as exc:
                self._fault(INDEX_KEY, phy[0], phy[-1] + size[-1], store_timestamp[0], exc)
        self.dispatched += len(rows)
        return progress

    def dispatch_queue(self, batch: RecordBatch, topic: str, queue_id: int) -> QueueProgress | None:
        """The records of ``batch`` that go to one queue, and nothing else (catching up a
        quarantined queue); its last record, None when it has none. Raises what the queue raises."""
        for group_topic, group_queue_id, group in self._queue_groups(batch):
            if group_topic == topic and group_queue_id == queue_id:
                return self._put_group(topic, queue_id, batch, group)
        return None

    def _queue_groups(self, batch: RecordBatch) -> Iterator[tuple[str, int, np.ndarray]]:
        """(topic, queue id, rows in log order) of each queue ``batch`` has records for."""
        transaction = batch.sys_flag & TRANSACTION_ROLLBACK_TYPE
        rows = np.flatnonzero((transaction == 0) | (transaction == TRANSACTION_COMMIT_TYPE))
        if not len(rows):
            return
        topic_index, queue_ids = batch.topic_index[rows], batch.queue_id[rows]
        queue_span = int(queue_ids.max()) + 1
        if int(queue_ids.min()) >= 0 and (int(topic_index.max()) + 1) * queue_span <= 1 << 16:
            queue_key = (topic_index * queue_span + queue_ids).astype(np.uint16)  # radix-sorted
        else:
            queue_key = (topic_index << 32) | (queue_ids & 0xFFFFFFFF)
        order = np.argsort(queue_key, kind="stable")
        sorted_keys = queue_key[order]
        bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
        dropped = self.dropped
        for group in np.split(rows[order], bounds):
            first = int(group[0])
            topic = batch.topics[int(batch.topic_index[first])]
            if dropped and topic in dropped:
                group = group[batch.phy_offset[group] >= dropped[topic]]
                if not len(group):
                    continue
                first = int(group[0])
            yield topic, int(batch.queue_id[first]), group

    def _put_group(self, topic: str, queue_id: int, batch: RecordBatch, group: np.ndarray) -> QueueProgress:
        cq = self.find_consume_queue(topic, queue_id)
        if not cq.put_position_infos(
            phy_offset=batch.phy_offset[group],
            size=batch.size[group],
            tags_code=batch.tags_code[group],
            queue_offset=batch.queue_offset[group],
        ):
            raise StoreError(f"consume queue {topic}/{queue_id} cannot be written")
        last = int(group[-1])
        return QueueProgress(topic, queue_id, int(batch.queue_offset[last]), int(batch.store_timestamp[last]))


def _queue_order(item: tuple[tuple[int, int], list[int]]) -> tuple[int, int]:
    """The order `_queue_groups` takes queues in (its radix key's, queue ids as unsigned)."""
    (topic_index, queue_id), _rows = item
    return topic_index, queue_id & 0xFFFFFFFF
