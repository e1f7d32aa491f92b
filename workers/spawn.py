"""How the supervisor starts a worker process: forked from itself, or executed afresh.

A worker is ``python -m workers.<role> <shm-name> <store-dir>``. Executed afresh, each one
imports numpy, the store and its own module again: about 0.25 s of CPU a worker, 1.8 s for a
store's seven processes (measured on this project's 2-core machines), the larger part of a
store's start and of the test suite's time. The supervisor has imported all of it already, so it
forks instead: the child drops what it inherited (signal handlers, logging handlers, every file
descriptor above stderr: the store's `lock` flock above all, which must not outlive the
supervisor in a worker), writes the worker's command line and its environment (the supervisor's
now, without ``NOTIFY_SOCKET``, which it took) over what /proc shows of its own, so that `ps` and
the store's checks by command line see exactly what an executed worker shows, and runs the
worker's module as ``__main__``, as ``-m`` would.

Forking is safe here because the supervisor forks only before other threads exist and after
`MessageStore.handover` unmapped the store's files (a worker must not keep a file the cleaner
deletes mapped). It executes afresh instead when another thread runs (the metrics endpoint's) or
its own command line is too short to hold the worker's (with the interpreter named by its
basename: ``python3 run.py start`` with the default conf is), and always with
``RMQ_EXEC_WORKERS=1`` in its environment (a diagnosis's switch; `python -m bench.start`
compares the two).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn, Protocol

CHECKOUT = Path(__file__).resolve().parents[1]


class WorkerProcess(Protocol):
    """What the supervisor uses of a worker process (`subprocess.Popen`'s names)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class ForkedProcess:
    """A forked child, with `subprocess.Popen`'s poll/wait/send_signal (reaped by whoever asks)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen.wait: `subprocess.TimeoutExpired` when ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay_s = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay_s if deadline is None else min(delay_s, max(0.0, deadline - time.monotonic())))
            delay_s = min(delay_s * 2, 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def worker_command(role: str, shm_name: str, store_dir: Path) -> list[str]:
    """The command line of a worker, executed or forked."""
    return [sys.executable, "-m", f"workers.{role}", shm_name, str(store_dir)]


def start_worker(role: str, shm_name: str, store_dir: Path) -> WorkerProcess:
    """Start one worker: forked when this process can (see the module docstring), else executed."""
    args = worker_command(role, shm_name, store_dir)
    areas = _proc_areas()
    if areas is None or threading.active_count() > 1 or os.environ.get("RMQ_EXEC_WORKERS") == "1":
        return subprocess.Popen(args, cwd=CHECKOUT)
    (arg_start, arg_end), (env_start, env_end) = areas
    # The interpreter by its full path where the supervisor's command line has the room, else by
    # its name (`ps` shows the same role and store); executed where even that does not fit.
    for argv0 in (sys.executable, os.path.basename(sys.executable)):
        title = b"".join(os.fsencode(arg) + b"\0" for arg in (argv0, *args[1:]))
        if len(title) <= arg_end - arg_start:
            break
    environment = b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in os.environ.items())
    if len(title) > arg_end - arg_start or len(environment) > env_end - env_start:
        return subprocess.Popen(args, cwd=CHECKOUT)
    module = f"workers.{role}"
    __import__(module)  # once per supervisor: every later fork has it
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _run_forked(module, args, [(areas[0], title), (areas[1], environment)])
    return ForkedProcess(pid, args)


def _proc_areas() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """[start, end) of this process's command line and of its environment in its memory
    (/proc/self/stat's arg_start, arg_end, env_start, env_end), which /proc/<pid>/cmdline and
    /proc/<pid>/environ read; None where the kernel does not say."""
    try:
        stat = Path("/proc/self/stat").read_text()
        fields = [int(field) for field in stat[stat.rindex(")") + 2 :].split()[45:49]]  # fields 48-51
    except (OSError, ValueError):
        return None
    if len(fields) != 4 or not 0 < fields[0] < fields[1] or not 0 < fields[2] < fields[3]:
        return None
    return (fields[0], fields[1]), (fields[2], fields[3])


def _run_forked(module: str, args: list[str], proc_text: list[tuple[tuple[int, int], bytes]]) -> NoReturn:
    """The child: shed the supervisor's state, take the worker's command line and environment,
    run it, exit without the supervisor's atexit handlers or `finally` blocks (os._exit)."""
    code = 1
    try:
        gc.freeze()  # the supervisor's objects: never collected here, so none is finalized twice
        logging.getLogger().handlers.clear()  # the supervisor's; their files close below
        for signum in signal.valid_signals():
            with contextlib.suppress(OSError, ValueError, TypeError):
                if callable(signal.getsignal(signum)):
                    signal.signal(signum, signal.SIG_DFL)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        for key, value in os.environ.items():  # libc's copies move to its heap: the area is free
            os.putenv(key, value)
        for (start, end), text in proc_text:
            ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)
        sys.argv = [module, *args[3:]]
        sys.modules.pop(module, None)  # run afresh as __main__, as -m does (runpy warns otherwise)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)
