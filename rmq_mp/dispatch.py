"""Dispatch: what reput (and recovery) does with each CommitLog record.

Mirrors `CommitLogDispatcherBuildConsumeQueue` and `CommitLogDispatcherBuildIndex`: a NOT or
COMMIT record gets a ConsumeQueue entry; every record but a ROLLBACK has its keys indexed.
Both are idempotent under re-dispatch, which is what lets recovery replay a range safely.
"""

from __future__ import annotations

from collections.abc import Callable

from rmq_mp.checkpoint import StoreCheckpoint
from rmq_mp.consume_queue import ConsumeQueue
from rmq_mp.errors import StoreError
from rmq_mp.index_service import IndexService
from rmq_mp.message import is_dispatchable
from rmq_mp.record import DispatchRequest


class Dispatcher:
    """Applies one DispatchRequest to the ConsumeQueue and the index."""

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
