"""The member table (shm/members.py) against a plain model: joins, leaves, a dead pid left out,
scans bounded by the high-water word, the version counting every change."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from shm import members as mb
from shm.layout import Role
from shm.members import MemberTable
from shm.pointer_table import now_ms, pid_alive_since, process_start_ms
from shm.segment import SharedSegment


@pytest.fixture
def table() -> Iterator[MemberTable]:
    name = f"/rmqtest_members_{os.getpid()}_{time.monotonic_ns()}"
    created = MemberTable.create(name, 1024)
    member = MemberTable.attach(name, Role.CONSUMER)  # consumers write it
    try:
        yield member
    finally:
        member.close()
        created.close()
        SharedSegment.unlink(name)


def test_members_join_leave_and_a_dead_pid_is_left_out(table: MemberTable) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    now = now_ms()
    assert table.version == 0
    assert table.join(3, os.getpid(), "g" * 255, "127.0.0.1@1#0", mb.MODEL_CLUSTERING, now) == 1
    table.join(0, os.getpid(), "other", "c", mb.MODEL_BROADCASTING, now)
    table.join(5, dead_pid, "g" * 255, "dead", mb.MODEL_CLUSTERING, now)
    assert table.high_water == 6, "scans read slots 0..5 only"
    live = table.members(pid_alive_since, "g" * 255)
    assert [(m.slot, m.client_id, m.model) for m in live] == [(3, "127.0.0.1@1#0", mb.MODEL_CLUSTERING)]
    assert [m.client_id for m in table.dead(pid_alive_since)] == ["dead"]
    assert [m.group for m in table.members(pid_alive_since)] == ["other", "g" * 255]
    assert table.leave(3) == 4, "three joins and a leave"
    assert table.member(3) is None
    assert table.members(pid_alive_since, "g" * 255) == []


def test_a_name_longer_than_its_field_is_refused(table: MemberTable) -> None:
    with pytest.raises(ValueError, match="too long"):
        table.join(0, os.getpid(), "g", "c" * (mb.CLIENT_BYTES + 1), mb.MODEL_CLUSTERING, 0)
    assert table.member(0) is None


def test_a_member_whose_pid_now_runs_a_later_process_is_dead(table: MemberTable) -> None:
    """A member's process died and the kernel gave its pid to a process started since: that
    process is not the member (its start is after the join), so the member is reaped, not kept."""
    started = process_start_ms(os.getpid())
    table.join(1, os.getpid(), "g", "joined-before-this-process", mb.MODEL_CLUSTERING, started - 60_000)
    table.join(2, os.getpid(), "g", "this-process", mb.MODEL_CLUSTERING, now_ms())
    assert [m.client_id for m in table.members(pid_alive_since, "g")] == ["this-process"]
    assert [m.client_id for m in table.dead(pid_alive_since)] == ["joined-before-this-process"]
