"""Member table: the live members of every consumer group (RocketMQ's ConsumerManager, whose
ConsumerGroupInfo the broker keeps from client heartbeats), for clustering rebalance.

``maxConsumerNum`` slots: member slot *i* belongs to the consumer holding consumer-table
(waiter) slot *i* (shm/waiters.py), so a member's wake semaphore is that slot's and no second
claim is needed. A consumer joins when it first subscribes and leaves at close; a member whose
pid is gone counts as gone at once (readers check the pid) and its slot is cleared by the first
member that notices (`reap`), or reclaimed with the consumer slot.

Header (after `slot_table`'s capacity word):

    word field          writer
       1 high_water     joiners, under the flags lock: every member slot in use lies below it,
                        so a scan reads only the slots ever used (first-touch pages: a store of
                        65,536 consumer slots with four members touches one page)
       2 version        joiners, leavers and reapers, under the flags lock: +1 at every join,
                        leave, death noticed and queue released; members compare it at each
                        poll and at each wake to know a rebalance is due

Slot layout (native int64 words, then the two names):

    off field           writer
      0 pid             the member, under the flags lock (0: no member; set last on join,
                        cleared first on leave); a reaper clears a dead pid, under the lock
      8 heartbeat_ms    the member: wall clock of its last rebalance check (at least every
                        rebalance_interval_ms while it polls; operators' view, not liveness:
                        the pid is)
     16 model           the member at join: MODEL_CLUSTERING or MODEL_BROADCASTING
     24 group_length    the member at join (before pid)
     32 client_length   the member at join (before pid)
     40 joined_ms       the member at join
     48 group           UTF-8, GROUP_BYTES reserved (a group is at most 255 characters)
    304 client id       ASCII, CLIENT_BYTES reserved
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from shm.layout import Lock, Role
from shm.slot_table import H_USED, SlotTable, Writers, check_slot_layout

PID, HEARTBEAT_MS, MODEL, GROUP_LENGTH, CLIENT_LENGTH, JOINED_MS = 0, 8, 16, 24, 32, 40
GROUP_OFFSET, GROUP_BYTES = 48, 256
CLIENT_OFFSET, CLIENT_BYTES = 304, 128
SLOT_SIZE = CLIENT_OFFSET + CLIENT_BYTES
H_HIGH_WATER, H_VERSION = H_USED, 2
MODEL_CLUSTERING, MODEL_BROADCASTING = 0, 1


@dataclass(frozen=True, slots=True)
class Member:
    slot: int
    pid: int
    group: str
    client_id: str
    model: int
    heartbeat_ms: int
    joined_ms: int


class MemberTable(SlotTable):
    SLOT_SIZE = SLOT_SIZE
    FIELDS: ClassVar[dict[str, int]] = {
        "pid": PID,
        "heartbeat_ms": HEARTBEAT_MS,
        "model": MODEL,
        "group_length": GROUP_LENGTH,
        "client_length": CLIENT_LENGTH,
        "joined_ms": JOINED_MS,
    }
    WRITERS: ClassVar[dict[str, Writers]] = {
        "pid": Writers(Role.CONSUMER, lock=Lock.FLAGS),
        "heartbeat_ms": Writers(Role.CONSUMER),
        "model": Writers(Role.CONSUMER, lock=Lock.FLAGS),
        "group_length": Writers(Role.CONSUMER, lock=Lock.FLAGS),
        "client_length": Writers(Role.CONSUMER, lock=Lock.FLAGS),
        "joined_ms": Writers(Role.CONSUMER, lock=Lock.FLAGS),
    }
    HEADER_WRITERS: ClassVar[dict[int, Writers]] = {
        H_HIGH_WATER: Writers(Role.CONSUMER, lock=Lock.FLAGS),
        H_VERSION: Writers(Role.CONSUMER, lock=Lock.FLAGS),
    }

    @property
    def version(self) -> int:
        return int(self._words[H_VERSION])

    def bump(self) -> int:
        """Count a change (flags lock held); returns the new version."""
        version = int(self._words[H_VERSION]) + 1
        self.set_header(H_VERSION, version)
        return version

    @property
    def high_water(self) -> int:
        return int(self._words[H_HIGH_WATER])

    def join(self, slot: int, pid: int, group: str, client_id: str, model: int, now_ms: int) -> int:
        """Register the consumer of ``slot`` (flags lock held): names first, pid last, so a
        lock-free reader sees a member whole or not at all. Returns the new version."""
        group_raw, client_raw = group.encode("utf-8"), client_id.encode("ascii")
        if len(group_raw) > GROUP_BYTES or len(client_raw) > CLIENT_BYTES:
            raise ValueError(f"group of {len(group_raw)} bytes or client id of {len(client_raw)} too long")
        self.set(slot, PID, 0)
        start = self.byte_offset(slot, GROUP_OFFSET)
        self._buf[start : start + len(group_raw)] = group_raw
        start = self.byte_offset(slot, CLIENT_OFFSET)
        self._buf[start : start + len(client_raw)] = client_raw
        self.set(slot, GROUP_LENGTH, len(group_raw))
        self.set(slot, CLIENT_LENGTH, len(client_raw))
        self.set(slot, MODEL, model)
        self.set(slot, JOINED_MS, now_ms)
        self.set(slot, HEARTBEAT_MS, now_ms)
        self.set(slot, PID, pid)
        if slot >= self.high_water:
            self.set_header(H_HIGH_WATER, slot + 1)
        return self.bump()

    def leave(self, slot: int) -> int:
        """Clear the member of ``slot`` (flags lock held); returns the new version."""
        self.set(slot, PID, 0)
        return self.bump()

    def member(self, slot: int) -> Member | None:
        """The member of ``slot``, or None for a free slot (lock-free: a torn read of a member
        joining or leaving shows as a pid mismatch, so the pid is read before and after)."""
        pid = self.get(slot, PID)
        if not pid:
            return None
        group_start = self.byte_offset(slot, GROUP_OFFSET)
        client_start = self.byte_offset(slot, CLIENT_OFFSET)
        group = bytes(self._buf[group_start : group_start + self.get(slot, GROUP_LENGTH)])
        client = bytes(self._buf[client_start : client_start + self.get(slot, CLIENT_LENGTH)])
        found = Member(
            slot, pid, group.decode("utf-8", errors="replace"), client.decode("ascii", errors="replace"),
            self.get(slot, MODEL), self.get(slot, HEARTBEAT_MS), self.get(slot, JOINED_MS),
        )  # fmt: skip
        return found if self.get(slot, PID) == pid else None

    def members(self, alive: Callable[[int, int], bool], group: str | None = None) -> list[Member]:
        """Live members (of ``group``, or all), by slot; a dead pid's member is left out.
        ``alive(pid, joined_ms)``: `shm.pointer_table.pid_alive_since` (a pid reused by a process
        started after the member joined is not that member)."""
        found = []
        for slot in range(min(self.high_water, self.slots)):
            member = self.member(slot)
            if (
                member is not None
                and (group is None or member.group == group)
                and alive(member.pid, member.joined_ms)
            ):
                found.append(member)
        return found

    def dead(self, alive: Callable[[int, int], bool]) -> list[Member]:
        """Members whose process is gone without leaving (a reaper clears them)."""
        return [
            m
            for slot in range(min(self.high_water, self.slots))
            if (m := self.member(slot)) is not None and not alive(m.pid, m.joined_ms)
        ]


check_slot_layout(
    "MemberTable", SLOT_SIZE, MemberTable.FIELDS, writers=MemberTable.WRITERS, tail_from=GROUP_OFFSET
)
