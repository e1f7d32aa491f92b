"""Process identity by pid and start time (psutil): a pid the kernel gave to another process
is not its old holder; a zombie is dead; a reaped process is gone."""

from __future__ import annotations

import os
import subprocess
import sys

from shm.pointer_table import pid_alive, process_start_ms


def test_a_pid_with_its_start_time_is_that_process_only() -> None:
    me = os.getpid()
    started = process_start_ms(me)
    assert started > 0
    assert pid_alive(me)
    assert pid_alive(me, started)
    assert not pid_alive(me, started - 1)  # the same pid, another start: a reused pid
    assert not pid_alive(0)
    assert not pid_alive(-1)


def test_zombie_and_reaped_processes_are_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start_ms(child.pid)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not pid_alive(child.pid)
    assert not pid_alive(child.pid, started)
    child.wait()
    assert not pid_alive(child.pid)
    assert process_start_ms(child.pid) == 0
