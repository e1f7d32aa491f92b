"""Typed access to the pointer table (layout in `shm.layout`).

Every process opens the table with its `Role`; `set` refuses a field this role does not write
(shm/layout.py). Values are native-endian signed 64-bit integers at aligned offsets.
"""

from __future__ import annotations

import time

import psutil

from shm import layout
from shm.layout import Field, Role
from shm.segment import SharedSegment


def now_ms() -> int:
    return int(time.time() * 1000)


class PointerTable:
    """One process's view of the table."""

    def __init__(self, segment: SharedSegment, role: Role) -> None:
        self.segment = segment
        self.role = role
        self._buf = segment.mm
        self._words = segment.words
        self._allowed: set[int] = set()
        """Offsets this role was found allowed to write: the writer check stays, but costs one
        set lookup on the put path after the first write of each field."""

    @classmethod
    def create(cls, name: str) -> PointerTable:
        table = cls(SharedSegment.create(name, layout.TABLE_SIZE), Role.SUPERVISOR)
        table.set(layout.MAGIC, layout.MAGIC_VALUE)
        table.set(layout.VERSION, layout.LAYOUT_VERSION)
        table.set(layout.FORK_READ_END, -1)  # no fork: readable_end is not bounded by it
        table.set(layout.HA_UNCONFIRMED_FROM, -1)
        return table

    @classmethod
    def attach(cls, name: str, role: Role) -> PointerTable:
        from rmq_mp.errors import ShmAttachError

        segment = SharedSegment.attach(name)
        table = cls(segment, role)
        if (
            table.get(layout.MAGIC) != layout.MAGIC_VALUE
            or table.get(layout.VERSION) != layout.LAYOUT_VERSION
        ):
            segment.close()
            raise ShmAttachError(f"{name} is not an rmq-mp pointer table of layout {layout.LAYOUT_VERSION}")
        return table

    def get(self, field: Field) -> int:
        return self._words[field.index]

    def set(self, field: Field, value: int) -> None:
        offset = field.index * 8
        if offset not in self._allowed:
            if self.role in field.writers:
                self._allowed.add(offset)
            elif not (self.role is Role.SUPERVISOR and self._words[layout.STATE.index] == layout.STARTING):
                raise PermissionError(
                    f"{self.role.value} may not write {field.name} (writers: "
                    f"{sorted(r.value for r in field.writers)})"
                )
        self._words[field.index] = value

    def words(self, *written: Field) -> memoryview:
        """The table as native 64-bit words, for a hot path that reads many fields and stores
        ``written``, and only those: the writer check runs here, once, instead of on every store
        (a `set` costs about 0.3 us, a word store about 0.03 us; the put path does a dozen per
        record). The view itself cannot refuse a store, so tests/unit/test_writers.py reads each
        caller's code: every word it stores must be among the fields it declared here. The view
        is the segment's; `close` releases it."""
        for field in written:
            if self.role not in field.writers:
                raise PermissionError(f"{self.role.value} may not write {field.name}")
        return self._words

    def add(self, field: Field, delta: int) -> int:
        """Read-modify-write by the field's single writer (or under its lock)."""
        value = self.get(field) + delta
        self.set(field, value)
        return value

    def written_end(self) -> int:
        """Where the CommitLog's bytes are in its files' pages (what a flush may force):
        COMMITTED with the TransientStorePool (a record in a pool buffer is not in the file
        yet), else WROTE."""
        pooled = self._words[layout.POOL_SIZE.index] > 0
        return self._words[(layout.COMMITTED_POSITION if pooled else layout.WROTE_POSITION).index]

    def readable_end(self) -> int:
        """How far a reader (reput, a consumer, a Spark read, the supervisor's clean-stop check)
        may read the CommitLog: FLUSHED under SYNC_FLUSH (RocketMQ 5.3, #8239: a SYNC put is
        acknowledged once flushed, so nothing unflushed is served or dispatched), else
        `written_end`. Never past `FORK_READ_END` while it is set (a slave whose log forks from
        its master's there, or is not yet confirmed as its master's from there, serves nothing of
        that tail). The one rule: every process reads it
        from these words."""
        if self._words[layout.FLUSH_DISK_SYNC.index]:
            end = self._words[layout.FLUSHED_POSITION.index]
        else:
            end = self.written_end()
        fork_end = self._words[layout.FORK_READ_END.index]
        return end if fork_end < 0 else min(end, fork_end)

    def snapshot(self) -> dict[str, int]:
        """Every header field by name (for status and statistics)."""
        return {f.name: self.get(f) for f in layout.FIELDS}

    def close(self) -> None:
        self.segment.close()


def process_start_ms(pid: int) -> int:
    """The start time of process ``pid`` in ms since the epoch (psutil's create_time), 0 when
    there is no such process: recorded beside a pid, it tells that process from a later one the
    kernel gave the same pid."""
    if pid <= 0:
        return 0
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def pid_alive(pid: int, start_ms: int = 0) -> bool:
    """Whether a process exists (a zombie counts as dead) and, when its ``start_ms`` was
    recorded (`process_start_ms`), is still that process: a pid reused by another process is
    dead to its old holder's readers (/proc parsing alone took it for alive)."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if start_ms and int(process.create_time() * 1000) != start_ms:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


PID_START_SLACK_MS = 2000
"""psutil's create_time rests on /proc/stat's whole-second boot time, so a start time read back
may be off by up to a second from the clock the holder read."""


def pid_alive_since(pid: int, since_ms: int) -> bool:
    """Whether ``pid`` is alive and the process that recorded ``since_ms`` about itself (when it
    took a lock, when it joined a group): one started later than that (beyond the clock's slack)
    reuses a dead holder's pid. ``since_ms`` 0 (not recorded) checks the pid alone."""
    if not pid_alive(pid):
        return False
    if since_ms <= 0:
        return True
    started_ms = process_start_ms(pid)
    return not started_ms or started_ms <= since_ms + PID_START_SLACK_MS
