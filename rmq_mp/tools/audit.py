"""Per-queue content digests, defined as in the RocketMQ 4.9.8 fixtures' ``*.queues.txt``.

For each non-empty queue, read entry by entry from min to max offset and fetch each message from
the commit log; sha256 over (int64 BE queue offset, int32 BE body length, body) per message. A
mismatch is an entry whose message cannot be read or names another topic, queue id or queue
offset. The total digest is the sha256 of ``<topic>/<queueId>=<hex>\\n`` lines in Java topic order.
Used by compatibility tests, `rmq-admin`, and later the Spark audit job.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from rmq_mp.errors import StoreError
from rmq_mp.progress import progress
from rmq_mp.store.message_store import MessageStore

_DIGEST_HEAD = struct.Struct(">qi")


@dataclass(frozen=True, slots=True)
class QueueDigest:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    count: int
    sha256: str
    mismatches: int

    def line(self) -> str:
        return (
            f"QUEUE topic={self.topic} queueId={self.queue_id} minOffset={self.min_offset} "
            f"maxOffset={self.max_offset} count={self.count} sha256={self.sha256}"
        )


def queue_digests(store: MessageStore) -> Iterator[QueueDigest]:
    """Digests of every non-empty queue, in Java topic order then queue id (a progress bar over
    the entries when stderr is a terminal)."""
    queues = [s for topic in store.topics() for s in store.queue_status(topic) if s.max_offset > s.min_offset]
    total = sum(s.max_offset - s.min_offset for s in queues)
    with progress("audit: queue digests", total=total) as bar:
        for status in queues:
            topic = status.topic
            cq = store.find_consume_queue(topic, status.queue_id)
            h = hashlib.sha256()
            count = mismatches = 0
            for queue_offset in range(status.min_offset, status.max_offset):
                bar.advance()
                entry = cq.get_entry(queue_offset)
                try:
                    if entry is None:
                        raise StoreError("no entry")
                    msg = store.look_message_by_offset(entry[0])
                except StoreError:
                    mismatches += 1
                    continue
                if (msg.topic, msg.queue_id, msg.queue_offset) != (topic, status.queue_id, queue_offset):
                    mismatches += 1
                    continue
                h.update(_DIGEST_HEAD.pack(queue_offset, len(msg.body)))
                h.update(msg.body)
                count += 1
            yield QueueDigest(
                topic, status.queue_id, status.min_offset, status.max_offset, count, h.hexdigest(), mismatches
            )


def digest_report(store: MessageStore) -> list[str]:
    """The ``queues.txt`` lines: one QUEUE line per non-empty queue, then TOTAL."""
    digests = list(queue_digests(store))
    total = hashlib.sha256(
        "".join(f"{d.topic}/{d.queue_id}={d.sha256}\n" for d in digests).encode("utf-8")
    ).hexdigest()
    lines = [d.line() for d in digests]
    lines.append(
        f"TOTAL messages={sum(d.count for d in digests)} mismatches={sum(d.mismatches for d in digests)} "
        f"digest={total}"
    )
    return lines
