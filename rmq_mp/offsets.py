"""Consumer-group offsets: `config/consumerOffset.json` (RocketMQ's ConsumerOffsetManager).

``{"offsetTable": {"<topic>@<group>": {<queueId>: <next offset to consume>}}}`` with RocketMQ's
``@`` separator and unquoted integer queue ids. Also reads `config/delayOffset.json`
(``{"offsetTable": {<delayLevel>: <offset>}}``), which RocketMQ stores ship.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rmq_mp.config_manager import ConfigManager

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(ConfigManager):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[str, dict[int, int]] = {}

    def encode(self) -> Any:
        return {"offsetTable": {key: dict(sorted(q.items())) for key, q in sorted(self.table.items())}}

    def encode_empty(self) -> Any:
        return {"offsetTable": {}}

    def decode(self, data: Any) -> None:
        table = {str(k): {int(q): int(o) for q, o in v.items()} for k, v in data["offsetTable"].items()}
        self.table = table

    @staticmethod
    def key(group: str, topic: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.table.setdefault(self.key(group, topic), {})[queue_id] = offset

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's next offset for the queue, -1 when unknown (as RocketMQ)."""
        return self.table.get(self.key(group, topic), {}).get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(self.key(group, topic), {}))

    def groups(self) -> list[str]:
        return sorted({k.rpartition(TOPIC_GROUP_SEPARATOR)[2] for k in self.table})

    def topics_of_group(self, group: str) -> list[str]:
        return sorted(k.rpartition(TOPIC_GROUP_SEPARATOR)[0] for k in self.table if k.endswith(f"@{group}"))


class DelayOffsetManager(ConfigManager):
    """Read-mostly view of `config/delayOffset.json` (ScheduleMessageService's offsets)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[int, int] = {}

    def encode(self) -> Any:
        return {"offsetTable": dict(sorted(self.table.items()))}

    def encode_empty(self) -> Any:
        return {"offsetTable": {}}

    def decode(self, data: Any) -> None:
        self.table = {int(k): int(v) for k, v in data["offsetTable"].items()}
