"""Deleted topics: `config/deletedTopics.json`, the tombstones `rmq-admin deleteTopic` leaves.

RocketMQ 4.9.8's deleteTopic (AdminBrokerProcessor.deleteTopic -> TopicConfigManager
.deleteTopicConfig, DefaultMessageStore.cleanUnusedTopic) drops the topic's config, its
ConsumeQueues and its topicQueueTable entries, and leaves its records in the commit log. Its
reput never re-reads them only because it restarts from the queues' furthest end; records of the
topic past every other queue's end, or an abnormal recovery's replay, bring the topic back. Here
every rebuild of queues from the log (reput, recovery, the rebuild of a queue whose files are
missing) skips a deleted topic's records below the write position the delete took
(``phy_offset``), so the topic stays gone across any restart and a send to the same name after
it starts a new topic at queue offset 0, whose records lie above that position.

File (rmq-mp's own; RocketMQ has none)::

    {"deletedTopics": {"<topic>": {"phyOffset": X, "state": "requested" | "pending" | "done"}}}

``state`` is how far the delete got, so a crash at any point is finished at the next start:

- ``requested``: rmq-admin asked a running store's supervisor (nothing changed yet; phyOffset
  the topic's last delete's, -1 none: a marker met in the log at or below it is that delete's).
  A start that finds one finishes it: it appends the delete's marker (a master) and takes its
  offset, else the recovered log's end, as ``phyOffset``.
- ``pending``: the supervisor appended the delete's marker record (rmq_mp/format/topic_marker.py)
  at ``phyOffset`` under the put lock and reset the queues' next offsets, or reput or recovery
  met a marker with no tombstone at or past it (a SLAVE replicating its master's delete); the
  topic's group offsets, its topics.json entry and its old queue files may still be there. The
  supervisor (workers/topic_delete.py) or the next start removes them.
- ``done``: all of that is gone and consumerOffset.json was written without the offsets; the
  tombstone only filters the log, and is dropped once the log's first byte reaches phyOffset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmq_mp.config.config_manager import ConfigManager, dumps, loads

REQUESTED, PENDING, DONE = "requested", "pending", "done"
STATES = (REQUESTED, PENDING, DONE)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """One deleted topic: its records below ``phy_offset`` are not the topic any more."""

    topic: str
    phy_offset: int
    state: str

    def to_json(self) -> dict[str, Any]:
        return {"phyOffset": self.phy_offset, "state": self.state}


class DeletedTopics(ConfigManager):
    """``config/deletedTopics.json``: tombstones by topic (written under the store's flags lock
    while it runs, by the supervisor or rmq-admin; by the opener of a stopped store)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[str, Tombstone] = {}

    def encode(self) -> str:
        return dumps({"deletedTopics": {t: s.to_json() for t, s in sorted(self.table.items())}})

    def decode(self, text: str) -> None:
        data = loads(text)
        entries = data.get("deletedTopics") if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            raise TypeError('expected {"deletedTopics": {topic: {...}}}')
        table: dict[str, Tombstone] = {}
        for topic, entry in entries.items():
            if not isinstance(entry, dict):
                raise TypeError(f"deletedTopics[{topic!r}]: expected an object")
            phy, state = entry.get("phyOffset"), entry.get("state")
            if isinstance(phy, bool) or not isinstance(phy, int) or state not in STATES:
                raise ValueError(f"deletedTopics[{topic!r}]: phyOffset {phy!r}, state {state!r}")
            table[str(topic)] = Tombstone(str(topic), phy, str(state))
        self.table = table

    def reset(self) -> None:
        self.table = {}

    def bounds(self) -> dict[str, int]:
        """Topic -> commit-log offset below which its records are dropped (the dispatch filter);
        a ``requested`` delete drops nothing yet."""
        return {t: s.phy_offset for t, s in self.table.items() if s.state != REQUESTED}

    def set(self, topic: str, phy_offset: int, state: str) -> None:
        self.table = {**self.table, topic: Tombstone(topic, phy_offset, state)}

    def prune(self, min_phy_offset: int) -> list[str]:
        """Drop done tombstones whose records the log no longer holds; the topics dropped."""
        gone = [t for t, s in self.table.items() if s.state == DONE and s.phy_offset <= min_phy_offset]
        if gone:
            self.table = {t: s for t, s in self.table.items() if t not in gone}
        return gone
