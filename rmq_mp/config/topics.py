"""Topic configs: `config/topics.json` (RocketMQ's TopicConfigManager and TopicConfig).

File (4.9's TopicConfigSerializeWrapper; bean fields alphabetical, as fastjson writes them)::

    {"dataVersion": {"counter": N, "timestamp": ms},
     "topicConfigTable": {"<topic>": {"order": false, "perm": 6, "readQueueNums": 4,
                                      "topicFilterType": "SINGLE_TAG", "topicName": "<topic>",
                                      "topicSysFlag": 0, "writeQueueNums": 4}}}

``dataVersion`` is RocketMQ's DataVersion: every change increments ``counter`` and sets
``timestamp`` to the wall clock in ms. 5.x files also carry ``dataVersion.stateVersion`` and a
per-topic ``attributes`` map; those are read past and not written back. Unlike RocketMQ's
constructor, this manager does not pre-create system topics (TBW102, SELF_TEST_TOPIC, …): it
records the topics the store has. Layout, parse and crash-safe writes: `rmq_mp.config.config_manager`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmq_mp.config.config_manager import ConfigManager, dumps, loads
from rmq_mp.format import message as m
from rmq_mp.format.message import SCHEDULE_TOPIC

PERM_WRITE = 1 << 1
PERM_READ = 1 << 2
PERM_INHERIT = 1 << 0
PERM_READ_WRITE = PERM_READ | PERM_WRITE
"""6, RocketMQ's default for a new topic (PermName)."""

_SALVAGE_BEAN = re.compile(r'"((?:[^"\\\x00-\x1f]|\\.)*)"[ \t\r\n]*:[ \t\r\n]*(\{[^{}]*\})')
"""One ``"topic":{...}`` bean with no brace inside (a 5.x ``attributes`` map is lost with it)."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


SCHEDULE_TOPIC_QUEUE_NUM = 18
"""Queues RocketMQ's TopicConfigManager gives SCHEDULE_TOPIC_XXXX (a system topic)."""


def created_queue_nums(topic: str, default_topic_queue_nums: int) -> int:
    """The queues a topic gets when a put creates it (autoCreateTopicEnable): the system
    SCHEDULE_TOPIC_XXXX its 18, a group's retry or dead-letter topic one (as the broker's
    consumerSendMsgBack creates them), any other defaultTopicQueueNums."""
    if topic == SCHEDULE_TOPIC:
        return SCHEDULE_TOPIC_QUEUE_NUM
    if single_queue_topic(topic):
        return RETRY_QUEUE_NUMS
    return default_topic_queue_nums


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic's RocketMQ TopicConfig: snake_case here, camelCase in the file."""

    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.topic_name, str) or not self.topic_name:
            raise ValueError(f"topic_name {self.topic_name!r}: must be a non-empty string")
        for name in ("read_queue_nums", "write_queue_nums", "perm", "topic_sys_flag"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} {value!r}: must be an integer >= 0")
        if not isinstance(self.order, bool):
            raise ValueError(f"order {self.order!r}: must be a bool")
        if not isinstance(self.topic_filter_type, str):
            raise ValueError(f"topic_filter_type {self.topic_filter_type!r}: must be a string")

    def to_json(self) -> dict[str, Any]:
        """The bean as fastjson writes it (field order does not matter: `dumps` sorts)."""
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, name: str | None = None) -> TopicConfig:
        """Read a bean; ``name`` (the map key) stands in for a missing ``topicName``. Missing
        fields take TopicConfig's Java defaults; unknown ones (5.x ``attributes``) are ignored."""
        if not isinstance(data, dict):
            raise TypeError(f"topic {name!r}: expected an object, got {type(data).__name__}")
        topic_name: Any = data.get("topicName", name)
        if name is not None and topic_name != name:
            raise ValueError(f"topicConfigTable key {name!r} holds topicName {topic_name!r}")
        return cls(
            topic_name=topic_name,
            read_queue_nums=data.get("readQueueNums", 16),
            write_queue_nums=data.get("writeQueueNums", 16),
            perm=data.get("perm", PERM_READ_WRITE),
            topic_filter_type=data.get("topicFilterType", "SINGLE_TAG"),
            topic_sys_flag=data.get("topicSysFlag", 0),
            order=data.get("order", False),
        )


class TopicConfigManager(ConfigManager):
    """``config/topics.json``: topic configs plus a DataVersion bumped on every change."""

    def __init__(self, path: Path, *, clock_ms: Callable[[], int] = _now_ms) -> None:
        super().__init__(path)
        self.table: dict[str, TopicConfig] = {}
        self.counter = 0
        """DataVersion.counter: changes since the file was created."""
        self.timestamp_ms = 0
        """DataVersion.timestamp: wall-clock ms of the last change."""
        self._clock_ms = clock_ms

    # ---------------------------------------------------------------- ConfigManager

    def encode(self) -> str:
        return dumps(
            {
                "dataVersion": {"counter": self.counter, "timestamp": self.timestamp_ms},
                "topicConfigTable": {name: tc.to_json() for name, tc in self.table.items()},
            }
        )

    def decode(self, text: str) -> None:
        data = loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        configs = data.get("topicConfigTable", {})
        version = data.get("dataVersion", {})
        if not isinstance(configs, dict) or not isinstance(version, dict):
            raise TypeError("topicConfigTable and dataVersion must be objects")
        table = {str(name): TopicConfig.from_json(bean, name=str(name)) for name, bean in configs.items()}
        counter, timestamp_ms = version.get("counter", 0), version.get("timestamp", 0)
        for field, value in (("counter", counter), ("timestamp", timestamp_ms)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"dataVersion.{field}: expected an integer, got {value!r}")
        self.table, self.counter, self.timestamp_ms = table, counter, timestamp_ms

    def reset(self) -> None:
        self.table, self.counter, self.timestamp_ms = {}, 0, 0

    def salvage(self, texts: list[str]) -> str:
        """Every topic bean still whole and valid, with its ``topicName``, in any of ``texts``
        (the newest text wins); the data version restarts past the highest counter found, so the
        next change is newer."""
        table: dict[str, TopicConfig] = {}
        counter = 0
        for text in texts:
            for match in _SALVAGE_BEAN.finditer(text):
                try:
                    name = json.loads(f'"{match.group(1)}"')
                    bean = loads(match.group(2))
                    if name == "dataVersion":
                        counter = max(counter, int(bean.get("counter", 0)))
                    elif name not in table and isinstance(bean, dict) and "topicName" in bean:
                        table[name] = TopicConfig.from_json(bean, name=name)
                except (ValueError, TypeError, AttributeError):
                    continue
        self.table, self.counter, self.timestamp_ms = table, counter + 1, self._clock_ms()
        return f"{len(table)} topic config(s) ({', '.join(sorted(table)[:8])})" if table else ""

    # ---------------------------------------------------------------- topics

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def put(self, config: TopicConfig) -> bool:
        """Add or replace the topic's config; True (and a new data version) if that changed it."""
        if self.table.get(config.topic_name) == config:
            return False
        self.table[config.topic_name] = config
        self.counter += 1
        self.timestamp_ms = self._clock_ms()
        return True

    def topics(self) -> list[str]:
        return sorted(self.table)

    def create_if_absent(self, topic: str, queue_nums: int) -> TopicConfig:
        """The topic's config, first creating it with ``queue_nums`` read and write queues and
        RocketMQ's defaults (perm 6, SINGLE_TAG) if there is none."""
        existing = self.table.get(topic)
        if existing is None:
            existing = TopicConfig(topic, queue_nums, queue_nums)
            self.put(existing)
        return existing


RETRY_QUEUE_NUMS = 1
"""subscriptionGroupConfig.retryQueueNums (default 1): a retry topic has one queue."""


DLQ_QUEUE_NUMS = 1
"""MixAll.DLQ_NUMS_PER_GROUP: a dead-letter topic has one queue."""


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(m.RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(m.DLQ_GROUP_TOPIC_PREFIX)


def single_queue_topic(topic: str) -> bool:
    """A group's retry and dead-letter topics are created with one queue, as the broker creates
    them (`createTopicInSendMessageBackMethod`), not with defaultTopicQueueNums."""
    return is_retry_topic(topic) or is_dlq_topic(topic)
