"""ProcessQueue: one queue's messages a push consumer has pulled and not yet finished.

RocketMQ's client keeps one per assigned queue. The pull thread puts messages in, in queue
order; consume threads take them out when their listener is done. The offset the group may
commit is the lowest one still in flight (or the pull's next offset when none is): a crash then
hands the next owner what was being consumed again, and never skips what was not consumed.
Orderly consumption also takes messages out in order and puts a batch back to consume it again.
Every method holds the queue's lock: the pull thread and any consume thread call them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import NamedTuple

from rmq_mp.format.message import MessageExt


class MessageQueue(NamedTuple):
    """A queue of a topic (RocketMQ's MessageQueue, whose broker is always this store)."""

    topic: str
    queue_id: int


class ProcessQueue:
    def __init__(self, mq: MessageQueue, next_offset: int, *, orderly: bool = False) -> None:
        self.mq = mq
        self.orderly = orderly
        self._lock = threading.Lock()
        self._in_flight: dict[int, MessageExt] = {}
        """queue_offset -> message, in queue order (put in order; removals keep it)."""
        self._started_ms: dict[int, int] = {}
        """queue_offset -> when a listener got it: the consume timeout's clock."""
        self._to_take: deque[MessageExt] = deque()
        """Orderly: messages not yet handed to the listener, in order."""
        self._next_offset = next_offset
        """The pull's next offset: what is committed once nothing is in flight."""
        self.dropped = False
        """Set when the queue moved to another member: results for it are thrown away."""
        self.consuming = False
        """Orderly: a consume thread is working through this queue (at most one is)."""
        self.suspended_until_s = 0.0
        """Orderly: monotonic time before which the queue is not consumed (after a SUSPEND)."""

    def put(self, msgs: list[MessageExt], next_offset: int) -> None:
        """Messages of one poll, in queue order, and the poll's next offset for the queue."""
        with self._lock:
            for msg in msgs:
                self._in_flight[msg.queue_offset] = msg
            if self.orderly:
                self._to_take.extend(msgs)
            self._next_offset = max(self._next_offset, next_offset)

    def advance(self, next_offset: int) -> None:
        """The pull moved past messages the tag filter left out."""
        with self._lock:
            self._next_offset = max(self._next_offset, next_offset)

    def started(self, msgs: list[MessageExt]) -> None:
        now_ms = _now_ms()
        with self._lock:
            for msg in msgs:
                self._started_ms.setdefault(msg.queue_offset, now_ms)

    def remove(self, msgs: list[MessageExt]) -> list[MessageExt]:
        """Done with ``msgs``; returns those that were still in flight (a timed-out message was
        taken out already and sent back: its late result must not count twice)."""
        with self._lock:
            removed = []
            for msg in msgs:
                if self._in_flight.pop(msg.queue_offset, None) is not None:
                    removed.append(msg)
                self._started_ms.pop(msg.queue_offset, None)
            return removed

    def commit_offset(self) -> int:
        """The offset the group may commit: nothing below it is still being consumed."""
        with self._lock:
            for offset in self._in_flight:
                return offset
            return self._next_offset

    def count(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def expired(self, timeout_ms: int) -> list[MessageExt]:
        """Messages a listener has had longer than ``timeout_ms`` (oldest first)."""
        deadline = _now_ms() - timeout_ms
        with self._lock:
            return [
                self._in_flight[o]
                for o, t in self._started_ms.items()
                if t <= deadline and o in self._in_flight
            ]

    # ------------------------------------------------------------------ orderly

    def take(self, batch_size: int) -> list[MessageExt]:
        """Orderly: the next messages in queue order (none while another batch is out)."""
        with self._lock:
            n = min(batch_size, len(self._to_take))
            return [self._to_take.popleft() for _ in range(n)]

    def take_again(self, msgs: list[MessageExt]) -> None:
        """Orderly: ``msgs`` (the last batch taken) go back in front, to be consumed again."""
        with self._lock:
            self._to_take.extendleft(reversed(msgs))

    def waiting(self) -> int:
        """Orderly: messages not yet handed to a listener."""
        with self._lock:
            return len(self._to_take)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
