"""`can_leave_sched_idle` against the kernel: reput goes SCHED_IDLE under SYNC_FLUSH only where
it can leave it again when behind, and Linux lets an unprivileged process (RLIMIT_NICE 0, no
CAP_SYS_NICE) into SCHED_IDLE but never out. Each case runs in a forked child that sets itself
up (as root: also as an unprivileged user), asks the function, then tries the switch for real."""

from __future__ import annotations

import os

import pytest

from workers.service import can_leave_sched_idle

NOBODY = 65534


def ask_then_try(nice: int, uid: int | None) -> tuple[bool, bool]:
    """(what can_leave_sched_idle said, whether leaving SCHED_IDLE worked), in a child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        answer = "??"
        try:
            # The nice value first, while privileged: a run started at nice 10 (a niced CI) could not
            # go back to 0 once unprivileged.
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            said = can_leave_sched_idle(nice)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            try:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                left = True
            except PermissionError:
                left = False
            answer = f"{int(said)}{int(left)}"
        finally:
            os.write(write, answer.encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    assert answer != "??", "the child failed before it could answer"
    return answer[0] == "1", answer[1] == "1"


@pytest.mark.parametrize("nice", [0, 19])
def test_the_answer_is_what_the_kernel_does(nice: int) -> None:
    said, left = ask_then_try(nice, None)
    assert said == left
    if os.geteuid() != 0:
        return
    assert said  # root has CAP_SYS_NICE
    said, left = ask_then_try(nice, NOBODY)
    assert (said, left) == (False, False)  # an unprivileged reput would stay SCHED_IDLE for good
