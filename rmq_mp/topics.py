"""Topic configs: `config/topics.json` (RocketMQ's TopicConfigManager).

``{"dataVersion": {"counter": N, "timestamp": ms}, "topicConfigTable": {"<topic>": {...}}}``, bean
fields in fastjson's alphabetical order. The service records every auto-created topic here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmq_mp.config_manager import ConfigManager

PERM_READ_WRITE = 6


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
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
    def from_json(cls, data: dict[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(data["topicName"]),
            read_queue_nums=int(data["readQueueNums"]),
            write_queue_nums=int(data["writeQueueNums"]),
            perm=int(data.get("perm", PERM_READ_WRITE)),
            topic_filter_type=str(data.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=int(data.get("topicSysFlag", 0)),
            order=bool(data.get("order", False)),
        )


class TopicConfigManager(ConfigManager):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[str, TopicConfig] = {}
        self.counter = 0
        self.timestamp = 0

    def encode(self) -> Any:
        return {
            "dataVersion": {"counter": self.counter, "timestamp": self.timestamp},
            "topicConfigTable": {name: tc.to_json() for name, tc in sorted(self.table.items())},
        }

    def encode_empty(self) -> Any:
        return {"dataVersion": {"counter": 0, "timestamp": 0}, "topicConfigTable": {}}

    def decode(self, data: Any) -> None:
        table = {str(k): TopicConfig.from_json(v) for k, v in data["topicConfigTable"].items()}
        version = data.get("dataVersion", {})
        self.table, self.counter, self.timestamp = (
            table,
            int(version.get("counter", 0)),
            int(version.get("timestamp", 0)),
        )

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def put(self, config: TopicConfig) -> None:
        if self.table.get(config.topic_name) != config:
            self.table[config.topic_name] = config
            self.counter += 1
            self.timestamp = int(time.time() * 1000)

    def topics(self) -> list[str]:
        return sorted(self.table)

    def create_if_absent(self, topic: str, queue_nums: int) -> TopicConfig:
        existing = self.table.get(topic)
        if existing is None:
            existing = TopicConfig(topic, queue_nums, queue_nums)
            self.put(existing)
        return existing
