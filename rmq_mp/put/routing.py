"""Which queue a send goes to, and which queue ids a topic has (RocketMQ's client routing and
the broker's `msgCheck`), from config/topics.json, re-read when it changes.

The producer asks it outside the put lock; the compiled send keeps its own copy of the limits,
learned from `limits` and dropped (`forget_topics`) whenever topics.json changes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rmq_mp import validators as v
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus
from shm.queue_offsets import QueueOffsetTable

TOPICS_RECHECK_S = 1.0
"""How often a send without a queue id looks whether config/topics.json changed."""


class QueueRouter:
    """The queue ids of a producer's topics, for one start of the store."""

    def __init__(
        self,
        topics_path: Path,
        default_queue_nums: int,
        queues: QueueOffsetTable,
        round_robin: dict[str, int],
    ) -> None:
        self._topics = TopicConfigManager(topics_path)
        self.default_queue_nums = default_queue_nums
        """defaultTopicQueueNums: the queues a topic not in topics.json is created with."""
        self.queues = queues
        self._round_robin = round_robin
        """Topic -> sends so far without a queue id: the producer's, kept across restarts."""
        self._checked_s = -TOPICS_RECHECK_S
        self._mtime_ns = -1
        self.limits: dict[str, int] = {}
        """Topic -> `limit`, until topics.json changes."""
        self._write_nums: dict[str, int] = {}
        """Topic -> `write_queue_nums`, until topics.json changes."""
        self.native: Any = None
        """The compiled send, told when topics.json changed (None: the reference only)."""

    def queue_for(self, topic: str, queue_id: int | None) -> int:
        """``queue_id`` (checked by `check` once every type is checked), or the next of
        the topic's write queues in round robin (as RocketMQ's client rotates over the topic's
        route): its writeQueueNums in config/topics.json, or defaultTopicQueueNums for a topic
        not there yet."""
        if queue_id is not None:
            return queue_id
        turn = self._round_robin.get(topic, 0)
        self._round_robin[topic] = turn + 1
        # the cached count while topics.json needs no look (what `write_queue_nums` would
        # answer then): a rotated send paid 322 ns here, 2/3 of a plain send (bench/NOTES.md)
        nums = self._write_nums.get(topic)
        if nums is None or time.monotonic() - self._checked_s >= TOPICS_RECHECK_S:
            nums = self._write_nums[topic] = self.write_queue_nums(topic)
        return turn % nums

    def reload(self, *, now: bool = False) -> None:
        """Re-read topics.json when it changed (`rmq-admin updateTopic`, the supervisor's saves of
        auto-created topics), looked at no more than every TOPICS_RECHECK_S unless ``now``."""
        monotonic = time.monotonic()
        if now or monotonic - self._checked_s >= TOPICS_RECHECK_S:
            self._checked_s = monotonic
            try:
                mtime_ns = self._topics.path.stat().st_mtime_ns
            except FileNotFoundError:
                mtime_ns = 0
            if mtime_ns != self._mtime_ns:
                self._mtime_ns = mtime_ns
                self._topics.load()
                self.limits.clear()
                self._write_nums.clear()
                if self.native is not None:
                    self.native.forget_topics()
            if self.native is not None:
                self.native.fresh_until_ns = int((monotonic + TOPICS_RECHECK_S) * 1e9)

    def write_queue_nums(self, topic: str) -> int:
        """The topic's writeQueueNums from topics.json, defaultTopicQueueNums for a new topic."""
        self.reload()
        found = self._topics.get(topic)
        return (
            found.write_queue_nums
            if found is not None and found.write_queue_nums > 0
            else self.default_queue_nums
        )

    def known(self, topic: str, queue_id: int) -> bool:
        """Whether ``queue_id`` is one of the topic's queues by the limit cached for it (a dict
        lookup and a clock read a send); False sends it to `check`. The cache is
        dropped whenever topics.json changed, looked at every TOPICS_RECHECK_S."""
        if queue_id < self.limits.get(topic, 0) and time.monotonic() - self._checked_s < TOPICS_RECHECK_S:
            return True
        return queue_id < self.limit(topic)

    def limit(self, topic: str) -> int:
        """Queue ids below this are the topic's: max(writeQueueNums, readQueueNums) as RocketMQ's
        `AbstractSendMessageProcessor.msgCheck` bounds them, or defaultTopicQueueNums for a topic
        not configured yet (the supervisor auto-creates it so, as autoCreateTopicEnable does)."""
        self.reload()
        found = self._topics.get(topic)
        limit = (
            self.default_queue_nums if found is None else max(found.write_queue_nums, found.read_queue_nums)
        )
        self.limits[topic] = limit
        return limit

    def check(self, topic: str, queue_id: int) -> None:
        """`RecordRejected` (MESSAGE_ILLEGAL) for a queue id the topic does not have."""
        if problem := self.problem(topic, queue_id):
            raise RecordRejected(PutMessageStatus.MESSAGE_ILLEGAL, problem)

    def problem(self, topic: str, queue_id: int) -> str:
        """Why a queue id at or past `limit` is refused, naming the topic's queue counts;
        '' if topics.json changed meanwhile or the queue exists already (a store RocketMQ wrote,
        whose topics.json the supervisor grows at its next persist). A send never grows a topic:
        RocketMQ's broker refuses such a queue id too. A queue id or topic the store cannot hold
        at all is left to the encoder, which names that first."""
        if v.queue_id_problem(queue_id) or v.topic_problem(topic) or self.queues.find(topic, queue_id) >= 0:
            return ""
        self.reload(now=True)
        found = self._topics.get(topic)
        if found is None:
            nums = self.default_queue_nums
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
