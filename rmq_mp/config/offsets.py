"""Consumer-group offsets, `config/consumerOffset.json`, and delay-level offsets,
`config/delayOffset.json` (RocketMQ's ConsumerOffsetManager and ScheduleMessageService files).

``consumerOffset.json``: ``{"offsetTable": {"<topic>@<group>": {<queueId>: <offset>}}}``, where
the offset is the next queue offset the group will consume and ``@`` is RocketMQ's
TOPIC_GROUP_SEPARATOR (topic and group names cannot contain it: RocketMQ allows only
``[%|a-zA-Z0-9_-]``). ``delayOffset.json``: ``{"offsetTable": {<delayLevel>: <offset>}}``, the
progress of each delay level through SCHEDULE_TOPIC_XXXX queue ``level - 1``; RocketMQ stores ship
one, so it is read here, and rewritten unchanged if asked. Layout, parse and crash-safe writes:
`rmq_mp.config.config_manager` (docs/format.md §14.1).

The supervisor owns both files: it loads them at start, keeps the live offsets in shared memory
(`shm/queue_offsets.py`) and persists them every ``flushConsumerOffsetInterval`` ms and at stop.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rmq_mp.config.config_manager import ConfigManager, dumps, loads

TOPIC_GROUP_SEPARATOR = "@"
JAVA_LONG_MAX = (1 << 63) - 1

_SALVAGE_ENTRY = re.compile(r'"((?:[^"\\\x00-\x1f]|\\.)*)"[ \t\r\n]*:[ \t\r\n]*\{([^{}]*)\}')
"""One ``"topic@group":{...}`` map with no brace inside: what `salvage` can still trust."""
_SALVAGE_QUEUE = re.compile(
    r'[ \t\r\n]*"?(0|[1-9][0-9]{0,9})"?[ \t\r\n]*:[ \t\r\n]*"?(-?[0-9]{1,19})"?[ \t\r\n]*'
)


_SALVAGE_LEVEL = re.compile(
    r'[{,][ \t\r\n]*"?([1-9][0-9]{0,9})"?[ \t\r\n]*:[ \t\r\n]*"?([0-9]{1,19})"?[ \t\r\n]*(?=[,}\n])'
)
"""One ``level:offset`` pair of delayOffset.json's offsetTable (bare or quoted key)."""


def _int(value: Any, what: str) -> int:
    """A Java int/long from the file: a JSON integer, or a quoted one (gson quotes map keys)."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise TypeError(f"{what}: expected an integer, got {value!r}")


def _offset_table(data: Any) -> dict[Any, Any]:
    """``data["offsetTable"]``: a JSON object; absent means empty (fastjson keeps the default)."""
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object, got {type(data).__name__}")
    table = data.get("offsetTable", {})
    if not isinstance(table, dict):
        raise TypeError(f"offsetTable: expected an object, got {type(table).__name__}")
    return table


class ConsumerOffsetManager(ConfigManager):
    """``config/consumerOffset.json``: ``table[topic@group][queue_id] = next offset to consume``.

    `table` is a plain attribute: the supervisor replaces it wholesale with what shared memory
    holds before a `persist`.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[str, dict[int, int]] = {}

    @staticmethod
    def key(group: str, topic: str) -> str:
        """The table key, ``topic@group``."""
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    # ---------------------------------------------------------------- ConfigManager

    def encode(self) -> str:
        return dumps({"offsetTable": self.table})

    def decode(self, text: str) -> None:
        table: dict[str, dict[int, int]] = {}
        for key, queues in _offset_table(loads(text)).items():
            if not isinstance(key, str) or not isinstance(queues, dict):
                raise TypeError(f'offsetTable[{key!r}]: expected "topic@group": {{queueId: offset}}')
            table[key] = {
                _int(q, f"{key} queue id"): _int(o, f"{key} queue {q} offset") for q, o in queues.items()
            }
        self.table = table

    def reset(self) -> None:
        self.table = {}

    def salvage(self, texts: list[str]) -> str:
        """Every ``"topic@group":{queueId:offset,...}`` map that is still whole in any of
        ``texts``, whatever surrounds it; a queue entry that does not read as two integers is
        dropped. Where the texts (or a repeated key in one) disagree the lower offset wins: a
        consumer then sees some messages again rather than skipping any."""
        table: dict[str, dict[int, int]] = {}
        dropped = 0
        for text in texts:
            for match in _SALVAGE_ENTRY.finditer(text):
                try:
                    key = json.loads(f'"{match.group(1)}"')
                except ValueError:
                    dropped += 1
                    continue
                topic, group = self._split(key)
                if not topic or not group or TOPIC_GROUP_SEPARATOR not in key:
                    continue  # not an offset map ("offsetTable" around a cut, or noise)
                queues = table.setdefault(key, {})
                body = match.group(2)
                for item in body.split(",") if body.strip() else []:
                    queue = _SALVAGE_QUEUE.fullmatch(item)
                    offset = int(queue.group(2)) if queue else None
                    if queue is None or offset is None or not -1 <= offset <= JAVA_LONG_MAX:
                        dropped += 1
                        continue
                    queue_id = int(queue.group(1))
                    queues[queue_id] = min(queues.get(queue_id, offset), offset)
        self.table = {key: queues for key, queues in table.items() if queues}
        if not self.table:
            return ""
        offsets = sum(len(queues) for queues in self.table.values())
        groups = self.groups()
        shown = ", ".join(groups[:8]) + (f" and {len(groups) - 8} more" if len(groups) > 8 else "")
        return f"{offsets} offset(s) of {len(groups)} group(s) ({shown})" + (
            f", {dropped} unreadable entry(ies) dropped" if dropped else ""
        )

    # ---------------------------------------------------------------- offsets

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``offset`` as the group's next offset in the queue (RocketMQ ``commitOffset``)."""
        for name, value in (("group", group), ("topic", topic)):
            if not value or TOPIC_GROUP_SEPARATOR in value:
                raise ValueError(f"{name} {value!r}: must be non-empty and contain no '@'")
        if queue_id < 0:
            raise ValueError(f"queue_id {queue_id}: must be >= 0")
        self.table.setdefault(self.key(group, topic), {})[queue_id] = offset

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's next offset in the queue; -1 when it has none (as RocketMQ)."""
        return self.table.get(self.key(group, topic), {}).get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        """``{queue_id: offset}`` for the group and topic (a copy; empty when unknown)."""
        return dict(sorted(self.table.get(self.key(group, topic), {}).items()))

    def groups(self) -> list[str]:
        """Every group with an offset, sorted."""
        return sorted({self._split(key)[1] for key in self.table})

    def topics_of_group(self, group: str) -> list[str]:
        """The topics the group has offsets for, sorted (RocketMQ ``whichTopicByConsumer``)."""
        return sorted(topic for topic, g in map(self._split, self.table) if g == group)

    def remove_group(self, group: str) -> list[str]:
        """Forget every offset of the group (RocketMQ ``removeOffset``); the topics it had."""
        removed = self.topics_of_group(group)
        for topic in removed:
            del self.table[self.key(group, topic)]
        return removed

    @staticmethod
    def _split(key: str) -> tuple[str, str]:
        topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
        return topic, group


class DelayOffsetManager(ConfigManager):
    """``config/delayOffset.json``: ``table[delay_level] = offset`` in SCHEDULE_TOPIC_XXXX queue
    ``delay_level - 1``, the next offset the scheduler delivers (workers/scheduler.py). The
    supervisor loads it at start into shared memory (`shm.schedule_offsets`) and persists what
    the scheduler reached every ``flushDelayOffsetInterval`` and at stop."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[int, int] = {}

    def encode(self) -> str:
        return dumps({"offsetTable": self.table})

    def decode(self, text: str) -> None:
        self.table = {
            _int(level, "delay level"): _int(offset, f"delay level {level} offset")
            for level, offset in _offset_table(loads(text)).items()
        }

    def reset(self) -> None:
        self.table = {}

    def salvage(self, texts: list[str]) -> str:
        """Every ``level:offset`` pair still readable in ``texts``; where they disagree the lower
        offset wins (a message delivered twice rather than never)."""
        table: dict[int, int] = {}
        for text in texts:
            for match in _SALVAGE_LEVEL.finditer(text):
                level, offset = int(match.group(1)), int(match.group(2))
                if 0 <= offset <= JAVA_LONG_MAX:
                    table[level] = min(table.get(level, offset), offset)
        self.table = table
        return f"{len(table)} delay level offset(s)" if table else ""

    def offset_of(self, delay_level: int) -> int:
        """The level's offset; -1 when the file has none (as RocketMQ's queryOffset)."""
        return self.table.get(delay_level, -1)
