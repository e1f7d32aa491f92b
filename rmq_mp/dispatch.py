"""Dispatch: what reput (and recovery) does with each CommitLog record.

Mirrors `CommitLogDispatcherBuildConsumeQueue` and `CommitLogDispatcherBuildIndex`: a NOT or
COMMIT record gets a ConsumeQueue entry; every record but a ROLLBACK has its keys indexed.
Both are idempotent under re-dispatch, which is what lets recovery replay a range safely.

`dispatch` takes one record (`record.check_record`'s request); `dispatch_batch` takes the
columns of many (`record_batch.RecordBatch`) and leaves the same bytes in the same files: each
queue's entries are appended per queue in blocks, the index keys in blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rmq_mp.checkpoint import StoreCheckpoint
from rmq_mp.consume_queue import ConsumeQueue
from rmq_mp.errors import StoreError
from rmq_mp.index_service import IndexService
from rmq_mp.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, is_dispatchable
from rmq_mp.record import DispatchRequest
from rmq_mp.record_batch import RecordBatch


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """The last record of a batch that went to one queue (what reput publishes per queue)."""

    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp: int


class Dispatcher:
    """Applies DispatchRequests (one, or a batch) to the ConsumeQueue and the index."""

    def __init__(
        self,
        find_consume_queue: Callable[[str, int], ConsumeQueue],
        index_service: IndexService | None,
        checkpoint: StoreCheckpoint,
    ) -> None:
        self.find_consume_queue = find_consume_queue
        self.index_service = index_service
        self.checkpoint = checkpoint
        self.dispatched = 0

    def dispatch(self, req: DispatchRequest) -> None:
        if is_dispatchable(req.sys_flag):
            cq = self.find_consume_queue(req.topic, req.queue_id)
            if not cq.put_message_position_info(
                phy_offset=req.phy_offset,
                size=req.size,
                tags_code=req.tags_code,
                queue_offset=req.queue_offset,
            ):
                raise StoreError(f"consume queue {req.topic}/{req.queue_id} cannot be written")
            self.checkpoint.logics_msg_timestamp = req.store_timestamp
        if self.index_service is not None:
            self.index_service.build_index(req)
        self.dispatched += 1

    def dispatch_batch(self, batch: RecordBatch) -> list[QueueProgress]:
        """`dispatch` of every record of ``batch``, in order; returns, per queue written, its
        last record. Queues are independent files, so each takes its records as one block; the
        index takes its keys after them. (If a queue cannot be written, the StoreError leaves
        earlier queues of the batch written, where one at a time would have stopped at the
        record: re-dispatch from the same offset completes either.)"""
        n = len(batch)
        if n == 0:
            return []
        transaction = batch.sys_flag & TRANSACTION_ROLLBACK_TYPE
        rows = np.flatnonzero((transaction == 0) | (transaction == TRANSACTION_COMMIT_TYPE))
        progress: list[QueueProgress] = []
        if len(rows):
            topic_index, queue_ids = batch.topic_index[rows], batch.queue_id[rows]
            queue_span = int(queue_ids.max()) + 1
            if int(queue_ids.min()) >= 0 and (int(topic_index.max()) + 1) * queue_span <= 1 << 16:
                queue_key = (topic_index * queue_span + queue_ids).astype(np.uint16)  # radix-sorted
            else:
                queue_key = (topic_index << 32) | (queue_ids & 0xFFFFFFFF)
            order = np.argsort(queue_key, kind="stable")
            sorted_keys = queue_key[order]
            bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
            for group in np.split(rows[order], bounds):
                first = int(group[0])
                topic = batch.topics[int(batch.topic_index[first])]
                queue_id = int(batch.queue_id[first])
                cq = self.find_consume_queue(topic, queue_id)
                if not cq.put_position_infos(
                    phy_offset=batch.phy_offset[group],
                    size=batch.size[group],
                    tags_code=batch.tags_code[group],
                    queue_offset=batch.queue_offset[group],
                ):
                    raise StoreError(f"consume queue {topic}/{queue_id} cannot be written")
                last = int(group[-1])
                progress.append(
                    QueueProgress(
                        topic, queue_id, int(batch.queue_offset[last]), int(batch.store_timestamp[last])
                    )
                )
            self.checkpoint.logics_msg_timestamp = int(batch.store_timestamp[rows[-1]])
        if self.index_service is not None:
            self.index_service.build_index_batch(batch)
        self.dispatched += n
        return progress
