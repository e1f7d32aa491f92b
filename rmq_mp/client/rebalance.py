"""Rebalance: a consumer group's members share each subscribed topic's queues (RocketMQ's
RebalanceImpl with AllocateMessageQueueAveragely, MessageModel.CLUSTERING).

Membership lives in shared memory (shm/members.py): a consumer joins at its first subscribe,
leaves at close, and counts as gone the moment its pid does. Every change bumps the member
table's version and posts the parked members of the group, so a long poll notices at once.

Ownership protocol (the owner word of each topic@group/queue in the group-offset table,
shm/queue_offsets.py ``OWNER``; claims and releases under the flags lock):

1. Each member allocates, from the same inputs, the sorted live member ids and the topic's
   sorted queue ids, its share with `allocate_averagely` (RocketMQ's algorithm exactly).
2. A queue it no longer gets is released (owner word from its own value to 0) and dropped: a
   later `commit` of it is ignored, as RocketMQ ignores the offset of a dropped ProcessQueue.
   Its last commit stays the group's offset. The version is bumped and the group posted, so
   the queue's new owner retries at once.
3. A queue it gets is claimed only when its owner word is 0 or names a dead pid (or a member
   slot that pid no longer holds); then it reads from the committed offset, read after the
   claim, under the same lock as the previous owner's release (a queue the group never
   committed gets its entry with committed offset -1, which the supervisor does not persist,
   and starts at ``from_offsets`` or 0). A queue still held by a live
   member waits for that member's release (step 2) at its next poll.

So no queue is read by two members at once; messages read but not committed before the
queue moved are read again by the new owner (at-least-once, as RocketMQ).

Time bound, stated and tested (tests/integration/test_consumer_groups.py): after a join or a
clean leave, every member moves its queues at its next `poll` (at once if it is parked in
one); after a death, within ``rebalance_interval_ms`` (a parked member wakes that often to look
for dead pids, as a death posts nothing: RocketMQ's RebalanceService likewise runs every
``rocketmq.client.rebalance.waitInterval``, 20 s) plus the next poll of each member.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.errors import InvalidArgumentError
from shm import members as mb
from shm import queue_offsets as qo
from shm.pointer_table import now_ms, pid_alive_since
from shm.store_shm import StoreShm

REBALANCE_INTERVAL_MS = 1000
"""How often a member looks for dead members (and retries claims) when nothing posted it."""


class MessageModel(enum.Enum):
    """RocketMQ's MessageModel: CLUSTERING shares the queues among the group's members,
    BROADCASTING gives every member every message, with progress of its own."""

    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"

    @property
    def code(self) -> int:
        return mb.MODEL_CLUSTERING if self is MessageModel.CLUSTERING else mb.MODEL_BROADCASTING


def allocate_averagely(current_cid: str, mq_all: Sequence[int], cid_all: Sequence[str]) -> list[int]:
    """AllocateMessageQueueAveragely.allocate: the contiguous share of ``mq_all`` (sorted) for
    ``current_cid`` among ``cid_all`` (sorted); the first ``len(mq_all) % len(cid_all)`` members
    get one queue more. An id not among the members gets nothing (RocketMQ logs and returns an
    empty list)."""
    if current_cid not in cid_all or not mq_all:
        return []
    index = cid_all.index(current_cid)
    mod = len(mq_all) % len(cid_all)
    if len(mq_all) <= len(cid_all):
        average_size = 1
    elif mod > 0 and index < mod:
        average_size = len(mq_all) // len(cid_all) + 1
    else:
        average_size = len(mq_all) // len(cid_all)
    start_index = index * average_size if mod > 0 and index < mod else index * average_size + mod
    range_ = min(average_size, len(mq_all) - start_index)
    return [mq_all[(start_index + i) % len(mq_all)] for i in range(range_)]


class Rebalance:
    """One member's side of the protocol, for one start of the store (a restarted store has a
    fresh member table and owner words: the consumer makes a new `Rebalance`)."""

    def __init__(
        self, shm: StoreShm, group: str, client_id: str, model: MessageModel, slot: int, interval_ms: int,
        topics_path: Path,
    ) -> None:  # fmt: skip
        self.shm = shm
        self.topics_path = topics_path
        self.members = shm.members
        self.groups = shm.groups
        self.group = group
        self.client_id = client_id
        self.model = model
        self.slot = slot
        self.interval_s = interval_ms / 1000
        self.pid = os.getpid()
        self.me = qo.owner_word(self.pid, slot)
        self.owned: dict[str, dict[int, int]] = {}
        """topic -> {queue id: group-table slot} of the queues this member holds."""
        self.joined = False
        self._seen_version = -1
        self._seen_queues = -1
        self._next_check = 0.0
        self._topic_files: tuple[int, dict[str, int]] = (-1, {})

    # ------------------------------------------------------------------ membership

    def join(self) -> None:
        """Register as a live member (flags lock). `InvalidArgumentError` when a live member of
        the group already uses this client id: RocketMQ's allocation needs them distinct."""
        with self.shm.flags_lock("join the consumer group"):
            for m in self.members.members(pid_alive_since, self.group):
                if m.client_id == self.client_id and m.slot != self.slot:
                    raise InvalidArgumentError(
                        f"client id {self.client_id!r} is in use by another live member of group "
                        f"{self.group!r} (pid {m.pid}): give each consumer its own"
                    )
            self.members.join(self.slot, self.pid, self.group, self.client_id, self.model.code, now_ms())
        self.joined = True
        self._post_group()

    def leave(self) -> None:
        """Release every owned queue and leave the group (a clean close); its members rebalance
        at once."""
        if not self.joined:
            return
        with self.shm.flags_lock("leave the consumer group"):
            for queues in self.owned.values():
                for group_slot in queues.values():
                    if self.groups.get(group_slot, qo.OWNER) == self.me:
                        self.groups.set(group_slot, qo.OWNER, 0)
            self.owned.clear()
            if self.members.get(self.slot, mb.PID) == self.pid:
                self.members.leave(self.slot)
        self.joined = False
        self._post_group()

    def _post_group(self) -> None:
        """Wake every other live member of the group (a parked poll re-reads the version)."""
        for m in self.members.members(pid_alive_since, self.group):
            if m.slot != self.slot:
                self.shm.waiter(m.slot).release()

    def due(self) -> bool:
        """Whether a rebalance is due: membership or ownership changed, a queue appeared, or the
        interval to look for dead members passed. Three word reads and a clock read."""
        return (
            self.members.version != self._seen_version
            or self.shm.queues.used != self._seen_queues
            or time.monotonic() >= self._next_check
        )

    def may_release(self) -> bool:
        """Whether the next rebalance may take queues from this member: the members or the
        queues changed (a death found by the interval's look only gives queues). A push consumer
        commits and lets its orderly batches finish first."""
        return self.members.version != self._seen_version or self.shm.queues.used != self._seen_queues

    def request(self) -> None:
        """Rebalance at the next poll (a topic was subscribed)."""
        self._next_check = 0.0

    def seconds_to_check(self) -> float:
        return max(self._next_check - time.monotonic(), 0.0)

    # ------------------------------------------------------------------ rebalance

    def run(
        self, topics: Sequence[str], on_claim: Callable[[str, int, int, bool], None]
    ) -> list[tuple[str, int]]:
        """Allocate, release and claim for ``topics``. ``on_claim(topic, queue, committed,
        known)`` gets each newly claimed queue's committed offset (``known`` False for a queue
        the group never committed). Returns the queues released."""
        version = self.members.version
        self._seen_queues = self.shm.queues.used
        self.members.set(self.slot, mb.HEARTBEAT_MS, now_ms())
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + self.interval_s
            if self._reap():
                version = self.members.version
        if self.model is not MessageModel.CLUSTERING:
            self._seen_version = version
            return []
        cids = sorted(
            m.client_id
            for m in self.members.members(pid_alive_since, self.group)
            if m.model == mb.MODEL_CLUSTERING
        )
        plan = {
            topic: set(allocate_averagely(self.client_id, self.queue_ids(topic), cids)) for topic in topics
        }
        released: list[tuple[str, int]] = []
        claims: list[tuple[str, int]] = []
        for topic in set(self.owned) | set(topics):
            mine = plan.get(topic, set())
            held = self.owned.setdefault(topic, {})
            released += [(topic, q) for q in held if q not in mine]
            claims += [(topic, q) for q in sorted(mine) if q not in held]
        if not released and not claims:
            self._seen_version = version
            return []
        claimed: list[tuple[str, int, int, bool]] = []
        with self.shm.flags_lock("rebalance the consumer group"):
            for topic, queue_id in released:
                group_slot = self.owned[topic].pop(queue_id)
                if self.groups.get(group_slot, qo.OWNER) == self.me:
                    self.groups.set(group_slot, qo.OWNER, 0)
            key_of = {topic: ConsumerOffsetManager.key(self.group, topic) for topic, _q in claims}
            for topic, queue_id in claims:
                group_slot = self.groups.find(key_of[topic], queue_id)
                if group_slot < 0:  # an entry for the owner word alone: -1, nothing committed
                    group_slot = self.groups.find_or_insert(key_of[topic], queue_id)
                    self.groups.set(group_slot, qo.COMMITTED, -1)
                elif not self._free(self.groups.get(group_slot, qo.OWNER)):
                    continue
                self.groups.set(group_slot, qo.OWNER, self.me)
                self.owned[topic][queue_id] = group_slot
                committed = self.groups.get(group_slot, qo.COMMITTED)
                claimed.append((topic, queue_id, committed, committed >= 0))
            if released:
                bumped = self.members.bump()
                version = bumped if bumped == version + 1 else version
        self._seen_version = version
        if released:
            self._post_group()
        for topic, queue_id, committed, known in claimed:
            on_claim(topic, queue_id, committed, known)
        return released

    def _free(self, owner: int) -> bool:
        """An owner word a claimer may take: free, or its member is gone (pid dead, or its member
        slot no longer that pid's)."""
        if owner == 0:
            return True
        pid, slot = qo.owner_of(owner)
        if self.members.get(slot, mb.PID) != pid:
            return True
        return not pid_alive_since(pid, self.members.get(slot, mb.JOINED_MS))

    def _reap(self) -> bool:
        """Clear the members whose process died without leaving, and post their groups."""
        dead = self.members.dead(pid_alive_since)
        if not dead:
            return False
        with self.shm.flags_lock("reap dead consumer-group members"):
            for m in dead:
                if self.members.get(m.slot, mb.PID) == m.pid and not pid_alive_since(m.pid, m.joined_ms):
                    self.members.leave(m.slot)
        for group in {m.group for m in dead}:
            for m in self.members.members(pid_alive_since, group):
                if m.slot != self.slot:
                    self.shm.waiter(m.slot).release()
        return True

    def queue_ids(self, topic: str) -> list[int]:
        """The topic's queues to allocate, sorted: its readQueueNums in config/topics.json (as
        RocketMQ's route data) and every queue the queue-offset table holds."""
        ids = {queue_id for queue_id, _slot in self.shm.queues.queues_of(topic)}
        ids.update(range(self._read_queue_nums(topic)))
        return sorted(ids)

    def _read_queue_nums(self, topic: str) -> int:
        """readQueueNums of ``topic`` in topics.json (0 when absent or unreadable), re-read only
        when the file changed; read-only: the supervisor owns the file."""
        path = self.topics_path
        try:
            mtime = path.stat().st_mtime_ns
            if mtime != self._topic_files[0]:
                table = json.loads(path.read_text("utf-8")).get("topicConfigTable", {})
                self._topic_files = (
                    mtime,
                    {
                        name: int(c.get("readQueueNums", 0))
                        for name, c in table.items()
                        if isinstance(c, dict)
                    },
                )
        except (OSError, ValueError, AttributeError, TypeError):
            return 0
        return self._topic_files[1].get(topic, 0)
