"""ServiceLoop: the one shape every worker process has (RocketMQ's ServiceThread).

    start: attach to the store's shared memory in the worker's role, `nice()` and the scheduling
           policy (`idle_scheduled()`, `batch_scheduled`), `on_start()`, post the
           ready semaphore (the supervisor's start handshake), state READY;
    loop:  at least `min_pass_interval_s()` after the last pass began, unless `has_work()`, wait
           on the wakeup semaphore with a timeout of `interval_s()`; `do_work()`, heartbeat;
    stop:  when the supervisor sets this worker's stop flag, or dies (the parent pid changes): `final_pass()`
           (RocketMQ's shutdown retries), state STOPPED, exit.

A worker runs as ``python -m workers.<role> <shm-name> <store-dir>`` (forked from the supervisor
with that command line written over its own, or executed: workers/spawn.py), so `ps` shows its
role and store, and names its thread ``rmq-<role>`` for `top`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import resource
import signal
import sys
import time
from typing import ClassVar

from rmq_mp import file_modes
from rmq_mp.logs import setup_process_logging
from rmq_mp.store.running_store import RunningStore, live_settings
from shm import layout
from shm.layout import Role
from shm.pointer_table import now_ms
from shm.semaphores import spin_until

log = logging.getLogger("rmq_mp.worker")

_PR_SET_NAME = 15
STOP_CHECK_S = 0.5


def set_thread_name(name: str) -> None:
    """What `top` and `ps -o comm` show (15 bytes)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


CAP_SYS_NICE = 23


def can_leave_sched_idle(nice: int) -> bool:
    """Whether this process, once SCHED_IDLE, could return to SCHED_OTHER at ``nice``. Linux
    treats SCHED_IDLE as nice 20, so leaving it is a priority raise: allowed with CAP_SYS_NICE,
    else only where RLIMIT_NICE permits that nice value (20 - nice <= the limit, which is 0 by
    default: an unprivileged process never leaves it)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or 20 - nice <= soft:
        return True
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except OSError:
        pass
    return False


class ServiceLoop:
    role: ClassVar[str]
    writable_log: ClassVar[bool] = False
    batch_scheduled: ClassVar[bool] = False
    """Run under SCHED_BATCH: a worker that copies in bulk behind the producers, whose wake must
    not preempt the producer that woke it. Under SCHED_OTHER the kernel put a woken worker on the
    waker's CPU and switched to it at once (measured, the realistic bench row: 4,750 of 4,800
    committer wakes preempted the producer, 85 ms of a 315 ms run); a SCHED_BATCH task that
    wakes runs on an idle CPU at once, else when the running task's slice ends."""

    def __init__(self, store: RunningStore) -> None:
        self.store = store
        self.table = store.shm.table
        self.wakeup = store.shm.wakeup(self.role)
        self._field = {name: layout.worker_field(self.role, name) for name in layout.WORKER_FIELDS}
        self.supervisor_pid = self.table.get(layout.SUPERVISOR_PID)
        self._settings_generation = self.table.get(layout.LIVE_SETTINGS_GENERATION)
        """The reloads `store.config` reflects (RunningStore.attach applied those before it)."""
        self._pass_started = 0.0
        """time.monotonic() when the last `do_work` began (`min_pass_interval_s`)."""

    # ------------------------------------------------------------------ hooks

    def interval_s(self) -> float:
        raise NotImplementedError

    def on_start(self) -> None:
        """Open what the worker needs before it reports ready."""

    def spin_s(self) -> float:
        """After a pass, poll `has_work` this long before sleeping: for a worker on the latency
        path whose next work usually comes sooner than a sleeping process wakes."""
        return 0.0

    def nice(self) -> int:
        """The nice value to run at (0: the default), for a worker off the latency path whose CPU
        bursts delay those on it. Only ever raised (an unprivileged process cannot lower it)."""
        return 0

    def idle_scheduled(self) -> bool:
        """Run under SCHED_IDLE: a worker off the latency path whose passes must give way at
        once to any task woken beside it (a CPU running only SCHED_IDLE tasks counts as idle
        when the kernel places a woken task). Takes precedence over `batch_scheduled`."""
        return False

    def min_pass_interval_s(self) -> float:
        """Passes start at least this far apart: a worker whose work comes in bursts and costs
        mostly per pass (reput under SYNC_FLUSH) does more of it per pass, for less CPU."""
        return 0.0

    def has_work(self) -> bool:
        """Whether `do_work` has something to do now, from a few shared words: checked after the
        worker arms its wakeup flag, so a wake that came during the last pass is not lost. A
        worker that answers False relies on its interval for such wakes."""
        return False

    def do_work(self) -> None:
        raise NotImplementedError

    def on_settings(self) -> None:
        """A reload changed live settings: `store.config` holds them; refresh what was derived
        from the old ones."""

    def final_pass(self) -> None:
        """Work left at stop (flush, commit, dispatch), bounded."""

    def on_exit(self) -> None:
        """Release resources."""

    # ------------------------------------------------------------------ loop

    def stopping(self) -> bool:
        """The supervisor asked this worker to stop (in dependency order), or died."""
        return bool(self.table.get(self._field["stop"])) or os.getppid() != self.supervisor_pid

    def set_state(self, state: int) -> None:
        self.table.set(self._field["state"], state)

    def heartbeat(self) -> None:
        self.table.set(self._field["heartbeat_ms"], now_ms())

    def run(self) -> int:
        set_thread_name(f"rmq-{self.role}")
        if (nice := self.nice()) > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        if self.idle_scheduled():
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError as exc:  # a sandbox that refuses it: the nice value alone, as before
                log.warning("%s: SCHED_IDLE refused (%s): running at nice %d", self.role, exc, nice)
        elif self.batch_scheduled:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        self.set_state(layout.W_STARTING)
        self.on_start()
        self.set_state(layout.W_READY)
        self.heartbeat()
        self.store.shm.semaphore(self.store.names.ready(self.role)).release()
        try:
            while not self.stopping():
                if self._wait():
                    self._work_once()
            self.set_state(layout.W_STOPPING)
            self.final_pass()
            self.set_state(layout.W_STOPPED)
        finally:
            self.on_exit()
        return 0

    def _wait(self) -> bool:
        """Wait for a wakeup or the interval, in slices short enough to notice a stop request or
        a dead supervisor within half a second. False when it is time to stop."""
        resume_at = self._pass_started + self.min_pass_interval_s()
        while (pause_s := resume_at - time.monotonic()) > 0:  # the whole pause, in stop-check slices
            if self.stopping():
                return False
            time.sleep(min(pause_s, STOP_CHECK_S))
        if spin_until(self.has_work, self.spin_s()):
            return not self.stopping()
        deadline = time.monotonic() + self.interval_s()
        while True:
            remaining = deadline - time.monotonic()
            if (
                self.wakeup.wait(max(0.0, min(remaining, STOP_CHECK_S)), self.has_work)
                or remaining <= STOP_CHECK_S
            ):
                return not self.stopping()
            if self.stopping():
                return False

    def _take_live_settings(self) -> None:
        """After a reload (LIVE_SETTINGS_GENERATION moved): the live settings into `store.config`."""
        generation = self.table.get(layout.LIVE_SETTINGS_GENERATION)
        if generation != self._settings_generation:
            self._settings_generation = generation
            self.store.config = live_settings(self.store.config, self.table)
            self.on_settings()
            log.info("%s: took the reloaded settings (generation %d)", self.role, generation)

    def _work_once(self) -> None:
        self._take_live_settings()
        self._pass_started = time.monotonic()
        try:
            self.do_work()
        except Exception:
            self.table.add(self._field["errors"], 1)
            log.exception("%s: work failed", self.role)
            time.sleep(0.1)
        self.table.add(self._field["work_count"], 1)
        self.table.set(self._field["last_work_ms"], now_ms())
        self.heartbeat()


def main(service_class: type[ServiceLoop]) -> int:
    """Entry point of ``python -m workers.<role> <shm-name> <store-dir>``."""
    file_modes.apply(file_modes.inherited())  # the supervisor's umask, until the store's own is read
    setup_process_logging(sys.argv[2], service_class.role)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when workers stop
    store = RunningStore.attach(
        sys.argv[1], Role(service_class.role), writable_log=service_class.writable_log
    )
    file_modes.apply(store.config.store_group_access)
    try:
        return service_class(store).run()
    finally:
        store.close()
