"""What a deleted topic's tombstone (rmq_mp/config/deleted_topics.py) asks of the queue files:
the topic's queues that still hold records from before the delete are removed, files and
directory, so the next dispatch of the topic starts a new queue at offset 0.

Used by recovery (a start finishing a delete a crash cut short) and by reput (a running store's
delete, and a restarted reput's). Idempotent: a queue of the topic re-created after the delete
holds only records at or above the tombstone's offset, and is kept.
"""

from __future__ import annotations

import contextlib
import logging
import shutil

from rmq_mp.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from rmq_mp.store.recovery import _queue_head

log = logging.getLogger(__name__)


def is_old_queue(cq: ConsumeQueue, bound: int) -> bool:
    """The queue holds no entry, or entries from before the delete (its first one below ``bound``:
    a queue is dispatched in log order, and reput drops the old queue before it dispatches a new
    record of the topic, so a queue is never both)."""
    head = _queue_head(cq)
    return head is None or head[1] < bound


def remove_old_queues(cq_table: ConsumeQueueTable, bounds: dict[str, int]) -> list[tuple[str, int]]:
    """Remove every queue of a deleted topic that is old (`is_old_queue`), with its directory
    (and the topic's, once empty); returns the (topic, queue id) removed."""
    removed: list[tuple[str, int]] = []
    for topic, bound in bounds.items():
        queues = cq_table.queues.get(topic, {})
        for queue_id, cq in sorted(queues.items()):
            if not is_old_queue(cq, bound):
                continue
            cq.destroy_files()
            cq.close()
            del queues[queue_id]
            shutil.rmtree(cq.mfq.store_dir, ignore_errors=True)
            removed.append((topic, queue_id))
        if not queues:
            cq_table.queues.pop(topic, None)
            with contextlib.suppress(OSError):
                (cq_table.root / topic).rmdir()  # what is not a queue directory stays
    if removed:
        log.info("deleted topics: removed %d old queue(s): %s", len(removed), removed[:8])
    return removed
