"""Supervisor: owns a running store (BrokerStartup + DefaultMessageStore.start/shutdown).

start:  take the store `lock`; if a crashed run left shared memory, commit what its pool
        buffers hold into the files, then remove it; recover (`MessageStore.open`, which
        writes `abort`); create the pointer table, queue-offset table, flush-request ring,
        waiter table, mlocked pool buffers and every semaphore; publish the descriptor;
        start allocator, committer (pool only), flusher, reput, cleaner, scheduler, ha
        (replication only) in that order, each with a ready handshake; state RUNNING. Delay-level progress comes from
        config/delayOffset.json into the schedule table (`shm.schedule_offsets`).
watch:  heartbeat; restart a dead worker within a second (bounded back-off, counted);
        restart the whole store, stop and start in this process, when a slave's ha worker
        found that its log forks from its master's (the start cuts it there, rmq_mp/store/fork.py);
        persist consumer offsets and topics every flushConsumerOffsetInterval, delay-level
        offsets every flushDelayOffsetInterval (an OSError is logged once, counted in
        CONFIG_PERSIST_FAILURES and retried; the last good file stays).
stop:   (SIGTERM/SIGINT or `run.py stop`) state STOPPING, so producers are refused and parked
        consumers are woken (both attach to the store's next start by themselves); stop
        workers one by one in dependency order (ha first, so a slave's last bytes are still
        flushed and dispatched; the scheduler, whose puts the others must still flush and
        dispatch; then the start is fenced, so no put lands after the final passes; committer,
        flusher, reput, then the rest),
        each running its final pass, escalating to SIGTERM then SIGKILL if one hangs;
        remove `abort` only if dispatch caught up; persist the config files; unlink every
        segment and semaphore and release the lock, even if a step before failed.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from rmq_mp import file_modes
from rmq_mp.config import live
from rmq_mp.config.offsets import ConsumerOffsetManager, DelayOffsetManager
from rmq_mp.config.store_config import IGNORED_PROPERTIES, BrokerRole, FlushDiskType, MessageStoreConfig
from rmq_mp.config.topics import TopicConfig, TopicConfigManager, created_queue_nums
from rmq_mp.errors import ConfigError, ShmAttachError, StoreError, StoreLockedError
from rmq_mp.format.message import DELETE_TOPIC_MARKER
from rmq_mp.paths import StorePaths
from rmq_mp.put import native
from rmq_mp.put.fence import fence_start
from rmq_mp.store import ha_log
from rmq_mp.store.mapped_file import offset_to_file_name, orphaned_temp_files
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.schedule import SCHEDULE_TOPIC, queue_id_of
from rmq_mp.tools.monitoring import OpsMonitor
from shm import layout
from shm import queue_offsets as qo
from shm import schedule_offsets as so
from shm.consume_counts import ConsumeCounts
from shm.layout import Role
from shm.metrics import MetricsTable
from shm.names import ShmNames
from shm.pointer_table import PointerTable, now_ms, pid_alive, process_start_ms
from shm.roles import ROLES, STOP_ORDER
from shm.segment import SharedSegment
from shm.semaphores import acquire
from shm.store_shm import ShmSizes, StoreShm, write_descriptor
from workers import promotion, topic_delete
from workers.spawn import start_worker
from workers.worker_handle import WorkerHandle, replicates

log = logging.getLogger("rmq_mp.supervisor")

READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
RESTART_BACKOFF_S = (0.0, 0.1, 0.25, 0.5, 1.0)
"""Delay before the n-th consecutive restart of a worker; never more than a second."""


def salvage_crashed_run(names: ShmNames, config: MessageStoreConfig) -> int:
    """A supervisor died with its shared memory in place: copy every byte the pool buffers hold
    beyond the committed offset into the files, so no acknowledged ASYNC put is lost (RocketMQ
    loses its write buffer on any JVM crash). Returns the bytes saved."""
    try:
        table = PointerTable.attach(names.pointer_table, Role.CONSUMER)
    except ShmAttachError:
        return 0
    saved = 0
    try:
        if pid_alive(table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS)):
            raise StoreLockedError(
                f"store {config.store_path_root_dir} is already running (supervisor pid {table.get(layout.SUPERVISOR_PID)})"
            )
        size = config.mapped_file_size_commit_log
        committed, wrote = table.get(layout.COMMITTED_POSITION), table.get(layout.WROTE_POSITION)
        for index in range(table.get(layout.POOL_SIZE)):
            file_offset = table.get(layout.pool_file_offset(index))
            start, end = max(committed, file_offset), min(wrote, file_offset + size)
            if file_offset < 0 or end <= start:
                continue
            buffer = SharedSegment.attach(names.pool_buffer(index))
            try:
                path = Path(config.commit_log_dir) / offset_to_file_name(file_offset)
                with path.open("r+b") as f, mmap.mmap(f.fileno(), size) as target:
                    target[start - file_offset : end - file_offset] = buffer.mm[
                        start - file_offset : end - file_offset
                    ]
                    target.flush()
                saved += end - start
                log.warning(
                    "saved %d bytes of pool buffer %d into %s after a crash", end - start, index, path.name
                )
            finally:
                buffer.close()
    finally:
        table.close()
    return saved


WORKER_EXIT_WAIT_S = 10.0
"""How long ending a dead supervisor's start waits for its killed workers to be gone."""


def _worker_pids(names: ShmNames, table: PointerTable) -> list[int]:
    """Live worker processes of this store (by the pids its table lists and their command lines)."""
    pids = []
    for role in ROLES:
        pid = table.get(layout.worker_field(role, "pid"))
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace") if pid else ""
        except OSError:
            continue
        if names.base in cmdline.split("\0") and pid_alive(pid):
            pids.append(pid)
    return pids


def lock_findings(table: PointerTable) -> str:
    """What the store's locks went through, for `run.py stop` to say: locks taken over from a
    dead holder since the start, and a lock held now by a dead process ('' if nothing)."""
    found = []
    put = table.get(layout.LOCK_RECOVERIES)
    if put:
        found.append(f"put lock taken over from a dead producer {put} time(s)")
    flags = table.get(layout.FLAGS_LOCK_RECOVERIES)
    if flags:
        found.append(
            f"flags lock taken over from a dead holder {flags} time(s) (last pid "
            f"{table.get(layout.FLAGS_LOCK_LAST_DEAD_PID)})"
        )
    for name, owner in (("put", layout.PUT_LOCK_OWNER_PID), ("flags", layout.FLAGS_LOCK_OWNER_PID)):
        holder = layout.lock_owner(table.get(owner))
        if holder and not pid_alive(holder):
            found.append(f"{name} lock held now by dead pid {holder} (the next taker takes it over)")
    return "; ".join(found)


def end_dead_start(names: ShmNames, config: MessageStoreConfig, fenced_by: int) -> str:
    """A supervisor died and left its start's shared memory: fence the start (`rmq_mp.put.fence`:
    no producer still attached to it puts any more), kill its workers and wait until they are
    gone (none may write a file the next start recovers), save what its pool buffers hold into
    the files, unlink everything. Returns what it found and did, in one line. `StoreLockedError`
    if the supervisor is alive after all, `FenceRefusedError` if a live producer holds the put
    lock, `StoreError` if a worker outlives its SIGKILL: the start is left as it was."""
    try:
        table = PointerTable.attach(names.pointer_table, Role.CONSUMER)
    except ShmAttachError:
        table = None
    pid = workers = None
    locks = ""
    if table is not None:
        try:
            pid = table.get(layout.SUPERVISOR_PID)
            if pid_alive(pid, table.get(layout.SUPERVISOR_START_MS)):  # not a pid reused since
                raise StoreLockedError(
                    f"store {config.store_path_root_dir} is already running (supervisor pid {pid})"
                )
            workers = _worker_pids(names, table)
            locks = lock_findings(table)
        finally:
            table.close()
    fenced = fence_start(names.base, fenced_by)
    for worker in workers or ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + WORKER_EXIT_WAIT_S
    while alive := [w for w in workers or () if pid_alive(w)]:
        if time.monotonic() >= deadline:
            raise StoreError(
                f"store {config.store_path_root_dir}: worker pid(s) {alive} of the dead supervisor's start "
                f"outlived SIGKILL for {WORKER_EXIT_WAIT_S:g} s; their files may still be written"
            )
        time.sleep(0.01)
    saved = salvage_crashed_run(names, config)
    removed = StoreShm.unlink_all(names)
    return (
        f"supervisor {pid} was not running; "
        f"{fenced.describe() if fenced is not None else 'no start to fence (no producer could attach)'}; "
        f"stopped {len(workers or ())} worker(s), saved {saved} pool byte(s) into the commit log, "
        f"removed {len(removed)} shared object(s)" + (f"; found: {locks}" if locks else "")
    )


class Supervisor:
    def __init__(self, config: MessageStoreConfig) -> None:
        self.config = config = promotion.persisted_role(config)  # rmq-admin promote's, kept
        self.root = Path(config.store_path_root_dir)
        self.names = ShmNames.for_store(str(self.root), config.shm_name)
        self.workers = {role: WorkerHandle(role) for role in self.roles()}
        self.stop_requested = False
        self.reload_requested = False
        self.reload_config: Callable[[], MessageStoreConfig] | None = None
        """How a reload (SIGHUP) re-reads broker.conf (the command line's --conf and --store)."""
        self.on_reloading: Callable[[], object] | None = None
        self.on_reloaded: Callable[[], object] | None = None
        self.store: MessageStore | None = None
        self.shm: StoreShm | None = None
        self.descriptor: SharedSegment | None = None
        self.metrics: MetricsTable | None = None
        self.consume_counts: ConsumeCounts | None = None
        self.ops: OpsMonitor | None = None
        self.offsets: ConsumerOffsetManager | None = None
        self.topics: TopicConfigManager | None = None
        self.delay_offsets: DelayOffsetManager | None = None
        self.last_delay_persist = 0.0
        self.persist_errors: set[tuple[str, int | None, str | None]] = set()
        """Config persist failures already logged: (file, errno, path) while they last."""
        self.final_persist_ok = True
        self.fork_restarts = 0
        """Restarts this supervisor made to cut a log that forks from its master's (`_fork_restart`)."""

    def roles(self) -> list[str]:
        pool = self.config.transient_store_pool_enable
        return [r for r in ROLES if (r != "committer" or pool) and (r != "ha" or replicates(self.config))]

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        log.info("store root %s (storePathRootDir, resolved)", self.root)
        if note := self.config.root_dir_note:
            log.warning("%s", note)
        self._log_settings()
        self.root.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        if looser := file_modes.looser_note(self.root, self.config.store_group_access):
            log.warning("%s", looser)
        if self.names.leftovers():
            found = end_dead_start(self.names, self.config, layout.FENCED_BY_START)
            log.warning("a crashed run's shared memory: %s", found)
        recovery_started = time.monotonic()
        self.store = MessageStore.open(config=self.config)
        recovery_ms = int((time.monotonic() - recovery_started) * 1000)
        log.info("store %s opened and recovered in %d ms", self.root, recovery_ms)
        try:
            self._create_shared_memory()  # from the recovered store, before its files are handed over
            assert self.shm is not None
            self.shm.table.set(layout.RECOVERY_MS, recovery_ms)
            self.store.handover()
            for role in self.workers:
                self._start_worker(self.workers[role])
            self.ops = OpsMonitor(self.config, self.shm.table, self.names)
            self.ops.start()
        except BaseException:
            self.shutdown()
            raise
        assert self.shm is not None
        self.shm.table.set(layout.STATE, layout.RUNNING)
        log.info("store %s running as %s", self.root, self.names.base)
        if native.core is not None:
            log.info("put path: the compiled core, atomic put lock")
        else:
            log.info("put path: the pure-Python reference, semaphore put lock (%s)", native.why_reference)

    def _log_settings(self) -> None:
        """What the store runs with that differs from what broker.conf says, one record each (the
        config itself is loaded before this process's log exists): every RocketMQ effective-value
        adjustment and every broker-only key accepted and ignored."""
        source = self.config.source
        for adjustment in self.config.adjustments:
            log.warning("setting adjusted (%s): %s", source, adjustment)
        for ignored in self.config.ignored_properties:
            why = IGNORED_PROPERTIES.get(
                ignored.split("=", 1)[0], "a feature rmq-mp does not have, set false"
            )
            log.info("setting ignored (%s): %s (%s)", source, ignored, why)

    def _create_shared_memory(self) -> None:
        cfg, store = self.config, self.store
        assert store is not None
        assert store.recovery is not None
        self.shm = shm = StoreShm.create(self.names, shm_sizes(cfg))
        t = shm.table
        t.set(layout.STATE, layout.STARTING)
        t.set(layout.GENERATION, now_ms())
        self.metrics = MetricsTable.create(self.names.metrics, t.get(layout.GENERATION), cfg.max_producer_num)
        self.consume_counts = ConsumeCounts.create(self.names.consume_counts, shm.queues.slots)
        t.set(layout.SUPERVISOR_PID, os.getpid())
        t.set(layout.SUPERVISOR_START_MS, process_start_ms(os.getpid()))
        t.set(layout.SUPERVISOR_HEARTBEAT_MS, now_ms())
        t.set(layout.FILE_SIZE, cfg.mapped_file_size_commit_log)
        t.set(layout.PUT_LOCK_KIND, native.store_lock_kind())
        t.set(layout.FLUSH_DISK_SYNC, int(cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH))
        end = store.max_phy_offset()
        for f in (
            layout.WROTE_POSITION,
            layout.COMMITTED_POSITION,
            layout.FLUSHED_POSITION,
            layout.REPUT_FROM_OFFSET,
        ):
            t.set(f, end)
        t.set(layout.MIN_OFFSET, store.min_phy_offset())
        # A slave serves nothing it has not confirmed as its master's (rmq_mp/store/ha_log.py):
        # the window is capped before any worker or client attaches, until the ha worker compares.
        unconfirmed = ha_log.start_window(cfg, store.paths.root, store.min_phy_offset(), end)
        t.set(layout.HA_UNCONFIRMED_FROM, unconfirmed)
        t.set(layout.FORK_READ_END, unconfirmed)
        t.set(layout.CLEAN_PENDING_OFFSET, -1)  # a file a crashed run left unavailable is back
        t.set(layout.FORK_RESTARTS, self.fork_restarts)
        t.set(layout.CLEAN_LAST_OUTCOME_OFFSET, -1)
        t.set(layout.PHYSIC_MSG_TIMESTAMP, store.checkpoint.physic_msg_timestamp)
        t.set(layout.LOGICS_MSG_TIMESTAMP, store.checkpoint.logics_msg_timestamp)
        t.set(layout.INDEX_MSG_TIMESTAMP, store.checkpoint.index_msg_timestamp)
        t.set(layout.RECOVERY_DROPPED_BYTES, store.recovery.commit_log_bytes_dropped)
        queues = store.all_consume_queues()
        self._check_capacity("maxConsumeQueueNum", len(queues), "consume queues", cfg.max_consume_queue_num)
        for cq in queues:
            slot = shm.queues.find_or_insert(cq.topic, cq.queue_id)
            max_offset = store.topic_queue_table.get((cq.topic, cq.queue_id), 0)
            shm.queues.set(slot, qo.NEXT_OFFSET, max_offset)
            shm.queues.set(slot, qo.DISPATCHED, max_offset)
            shm.queues.set(slot, qo.MIN_OFFSET, cq.min_offset_in_queue())
        self.offsets = store.consumer_offsets  # loaded under the loss policy by MessageStore.open
        entries = sum(len(offsets) for offsets in self.offsets.table.values())
        self._check_capacity(
            "maxConsumerOffsetNum",
            entries,
            "committed offsets in consumerOffset.json",
            cfg.max_consumer_offset_num,
        )
        for key, offsets in self.offsets.table.items():
            for queue_id, offset in offsets.items():
                shm.groups.set(shm.groups.find_or_insert(key, queue_id), qo.COMMITTED, offset)
        self.topics = TopicConfigManager(store.paths.topics)
        if not self.topics.load():
            # Rebuilt from the queues in use at the next persist; settings made by updateTopic
            # may be lost, so it is reported, but it does not stop the store.
            store.reporter.report(
                "topic-configs-lost", str(store.paths.topics), 0, 0, self.topics.last_load.describe()
            )
            self.topics.set_aside()
            self.topics.persist()
        self._load_delay_offsets(store)
        self.last_persist = self.last_delay_persist = time.monotonic()
        failed = 0
        for buffer in shm.pool.buffers:
            reason = buffer.mlock()
            if reason:
                failed += 1
                log.warning("mlock of pool buffer %s failed: %s (continuing unlocked)", buffer.name, reason)
        t.set(layout.POOL_MLOCK_FAILED, failed)
        for index, word in enumerate(live.published_words(cfg)):  # before any worker or client attaches
            t.set(layout.live_setting(index), word)
        self.descriptor = write_descriptor(
            self.names,
            {"root": str(self.root), "properties": cfg.to_properties(), "supervisor_pid": os.getpid()},
        )

    def _load_delay_offsets(self, store: MessageStore) -> None:
        """config/delayOffset.json into the schedule table, each level's offset kept within its
        queue (RocketMQ's schedule service moves an offset below the queue's minimum up to it).
        A missing, damaged or stale file does not stop the store: what is salvaged (or 0) is
        used, which delivers messages again rather than never, and the loss is reported."""
        assert self.shm is not None
        self.delay_offsets = manager = DelayOffsetManager(store.paths.delay_offset)
        if not manager.load():
            store.reporter.report(
                "delay-offsets-lost", str(manager.path), 0, 0,
                f"{manager.last_load.describe()}: delayed messages since the last persist are delivered again",
            )  # fmt: skip
            manager.set_aside()
        table = self.shm.schedule
        levels_ms = self.config.delay_levels_ms
        for level in range(1, table.levels + 1):
            queue_id = queue_id_of(level)
            offset = max(0, manager.table.get(level, 0))
            queue_max = store.topic_queue_table.get((SCHEDULE_TOPIC, queue_id), 0)
            queue_min = 0
            if queue_max:
                queue_min = store.find_consume_queue(SCHEDULE_TOPIC, queue_id).min_offset_in_queue()
            if not queue_min <= offset <= queue_max:
                log.warning(
                    "delay level %d: offset %d from %s is outside its queue [%d, %d]; using %d",
                    level, offset, manager.path.name, queue_min, queue_max, min(max(offset, queue_min), queue_max),
                )  # fmt: skip
                offset = min(max(offset, queue_min), queue_max)
            table.set(level - 1, so.OFFSET, offset)
            table.set(level - 1, so.NEXT_DUE_MS, so.NONE_DUE)
            table.set(level - 1, so.DELAY_MS, levels_ms[level - 1])

    def _check_capacity(self, key: str, needed: int, what: str, capacity: int) -> None:
        """A store that already holds more than a table's configured capacity cannot start."""
        if needed > capacity:
            raise ConfigError(
                f"{self.config.source}: {key} = {capacity}, but the store holds {needed:,} {what}: "
                f"raise {key}"
            )

    def _start_worker(self, handle: WorkerHandle) -> None:
        assert self.shm is not None
        ready = self.shm.semaphore(self.names.ready(handle.role))
        while acquire(ready, 0):
            pass
        self.shm.table.set(layout.worker_field(handle.role, "stop"), 0)
        handle.process = start_worker(handle.role, self.names.base, self.root)
        handle.started_at = time.monotonic()
        self.shm.table.set(layout.worker_field(handle.role, "pid"), handle.process.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not acquire(ready, 0.05):
            self.shm.table.set(layout.SUPERVISOR_HEARTBEAT_MS, now_ms())
            if handle.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker {handle.role} did not become ready (exit code {handle.process.poll()})"
                )

    # ------------------------------------------------------------------ watch

    def request_stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.stop_requested = True

    def request_reload(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.reload_requested = True

    def reload(self) -> None:
        """SIGHUP: re-read broker.conf and apply its live settings (rmq_mp/config/live.py), all
        or none: when a key that needs a restart changed, or the file does not load, one line in
        the log says so and nothing changes. Workers take the new values at their next pass."""
        self.reload_requested = False
        assert self.shm is not None
        t = self.shm.table
        if self.on_reloading is not None:
            self.on_reloading()
        try:
            if self.reload_config is None:
                raise ConfigError("started without a broker.conf to re-read")
            reread = self.reload_config()
            changes, restart = live.reload_plan(self.config, reread)
            if restart:
                log.error("reload refused, nothing applied: %s changed (needs a restart)", "; ".join(restart))
            elif not changes:
                log.info("reload: no setting of %s changed", self.config.source)
            else:
                applied = live.describe(changes, self.config)
                self.config = self.config.replace(**changes)
                for index, word in enumerate(live.published_words(self.config)):
                    t.set(layout.live_setting(index), word)
                t.add(layout.LIVE_SETTINGS_GENERATION, 1)
                for handle in self.workers.values():
                    if handle.process is not None:
                        self.shm.wake(handle.role)
                log.info("reloaded %s: %s", self.config.source, applied)
        except StoreError as exc:
            log.error("reload refused, nothing applied: %s", " ".join(str(exc).split()))
        finally:
            t.add(layout.RELOADS_DONE, 1)
            if self.on_reloaded is not None:
                self.on_reloaded()

    def watch(self) -> None:
        assert self.shm is not None
        t = self.shm.table
        while not self.stop_requested:
            if self.reload_requested:
                self.reload()
            if t.get(layout.PROMOTE_REQUEST):
                promotion.promote(self)
            if t.get(layout.HA_SLAVE_STATE) == layout.SLAVE_FORKED:
                t = self._fork_restart()
            if t.get(layout.TOPIC_DELETE_REQUESTS) != t.get(layout.TOPIC_DELETES_DONE):
                topic_delete.carry_out(
                    self, StorePaths.of(self.config.store_path_root_dir, self.config.commit_log_dir)
                )
            if t.get(layout.TOPIC_DELETE_MARKERS_APPLIED) != t.get(layout.TOPIC_DELETE_MARKERS_FINISHED):
                topic_delete.finish_from_log(  # a delete met in the log (a SLAVE's, mostly)
                    self, StorePaths.of(self.config.store_path_root_dir, self.config.commit_log_dir)
                )
            t.set(layout.SUPERVISOR_HEARTBEAT_MS, now_ms())
            for handle in self.workers.values():
                self._check_worker(handle)
            if self.ops is not None:
                self.ops.tick()
            if (time.monotonic() - self.last_persist) * 1000 >= self.config.flush_consumer_offset_interval:
                self.persist_config()
            if (time.monotonic() - self.last_delay_persist) * 1000 >= self.config.flush_delay_offset_interval:
                self.persist_delay_offsets()
            time.sleep(0.05)

    def _fork_restart(self) -> PointerTable:
        """The ha worker found that this slave's log forks from its master's, set its own bytes
        aside and recorded the cut (`rmq_mp.store.fork`); readers already stop at the fork
        (FORK_READ_END). Restart the store in this process, as an operator's stop and start
        would: a clean stop, then a start whose `MessageStore.open` cuts the log, the queues and
        the index at the fork, recovers, and whose slave catches up from there; attached
        consumers and producers move to the new start by themselves. A kill -9 anywhere in
        between leaves the recorded cut to the next start, which makes it. Returns the new
        start's pointer table."""
        assert self.shm is not None
        fork_offset = self.shm.table.get(layout.HA_SLAVE_FORK_OFFSET)
        log.warning(
            "the log forks from the master's at %d (its own bytes set aside): restarting the store to cut it there",
            fork_offset,
        )
        clean = self.shutdown()
        log.info("store %s stopped %s for the cut", self.root, "cleanly" if clean else "with abort kept")
        self.fork_restarts += 1
        self.start()
        assert self.shm is not None
        return self.shm.table

    def persist_config(self) -> bool:
        """Consumer offsets to consumerOffset.json and auto-created topics to topics.json, when
        changed (BrokerController's periodic persist; `flushConsumerOffsetInterval`). An
        ``OSError`` (a full disk, EIO, a directory in the way) does not stop the store: the last
        good file stays, the failure is logged once per distinct error and counted
        (CONFIG_PERSIST_FAILURES), and the next interval tries again. False if a write failed."""
        assert self.shm is not None
        assert self.offsets is not None
        self.last_persist = time.monotonic()
        table: dict[str, dict[int, int]] = {}
        try:  # a snapshot rmq-admin's deleteSubGroup never splits (flags lock)
            with self.shm.flags_lock("persist consumerOffset.json"):
                for key, queue_id, slot in self.shm.groups.queues():
                    committed = self.shm.groups.get(slot, qo.COMMITTED)
                    if committed >= 0:  # -1: held, never committed; -2 (DELETED): deleted
                        table.setdefault(key, {})[queue_id] = committed
        except ShmAttachError as exc:
            log.warning("%s; postponed", exc)
            return False
        ok = True
        if table != self.offsets.table:
            previous, self.offsets.table = self.offsets.table, table
            if not self._persisted(self.offsets.persist, self.offsets.path):
                self.offsets.table = previous  # still different next time: retried
                ok = False
        queue_counts: dict[str, int] = {}
        for topic, queue_id, slot in self.shm.queues.queues():
            if (
                self.shm.queues.get(slot, qo.NEXT_OFFSET) > 0 and topic != DELETE_TOPIC_MARKER
            ):  # 0: a deleted topic's (workers/topic_delete.py); the marker's is no user topic
                queue_counts[topic] = max(queue_counts.get(topic, 0), queue_id + 1)
        # Under the flags lock, from the file: `rmq-admin updateTopic --name` changes it live.
        assert self.topics is not None
        try:
            with self.shm.flags_lock("persist topics.json"):
                ok &= self._persisted(lambda: self._persist_topics(queue_counts), self.topics.path)
        except ShmAttachError as exc:
            log.warning("%s; postponed", exc)
        return ok

    def persist_delay_offsets(self) -> bool:
        """The schedule table's offsets to delayOffset.json, when changed (ScheduleMessageService's
        persist every flushDelayOffsetInterval; after delivery, so a crash delivers again rather
        than loses). A level is written once it has an offset above 0 or the file had it."""
        assert self.shm is not None
        assert self.delay_offsets is not None
        self.last_delay_persist = time.monotonic()
        manager, schedule = self.delay_offsets, self.shm.schedule
        table = {
            level: offset
            for level in range(1, schedule.levels + 1)
            if (offset := schedule.get(level - 1, so.OFFSET)) > 0 or level in manager.table
        }
        if table == manager.table and manager.path.exists():
            return True
        previous, manager.table = manager.table, table
        if not self._persisted(manager.persist, manager.path):
            manager.table = previous
            return False
        return True

    def _persisted(self, persist: Callable[[], None], path: Path) -> bool:
        """Run one config persist; an OSError is logged (once per distinct error), counted, False."""
        assert self.shm is not None
        try:
            persist()
        except OSError as exc:
            self.shm.table.set(
                layout.CONFIG_PERSIST_FAILURES, self.shm.table.get(layout.CONFIG_PERSIST_FAILURES) + 1
            )
            error = (str(path), exc.errno, exc.filename)
            if error not in self.persist_errors:
                self.persist_errors.add(error)
                log.error(
                    "persist of %s failed: %s; the last good file is kept, retrying every interval", path, exc
                )
            return False
        if any(e[0] == str(path) for e in self.persist_errors):
            self.persist_errors = {e for e in self.persist_errors if e[0] != str(path)}
            log.warning("persist of %s works again", path)
        return True

    def _persist_topics(self, queue_counts: dict[str, int]) -> None:
        """Grow topics.json to the queues in use, from the file as it is now (`rmq-admin
        updateTopic --name` changes it live); flags lock held. A new topic gets
        defaultTopicQueueNums queues, a group's retry or dead-letter topic one (as the broker
        creates them)."""
        assert self.topics is not None
        self.topics.load()
        before = self.topics.counter
        for topic, count in queue_counts.items():
            existing = self.topics.get(topic)
            if existing is None:
                nums = max(count, created_queue_nums(topic, self.config.default_topic_queue_nums))
                self.topics.put(TopicConfig(topic, nums, nums))
            elif count > existing.read_queue_nums:
                self.topics.put(
                    TopicConfig(topic, count, max(count, existing.write_queue_nums), existing.perm)
                )
        if self.topics.counter != before:
            self.topics.persist()

    def _check_worker(self, handle: WorkerHandle) -> None:
        assert self.shm is not None
        assert handle.process is not None
        code = handle.process.poll()
        if code is None:
            if time.monotonic() - handle.started_at > 10:
                handle.consecutive = 0
            return
        now_s = time.monotonic()
        if not handle.restart_at:
            delay = RESTART_BACKOFF_S[min(handle.consecutive, len(RESTART_BACKOFF_S) - 1)]
            handle.restart_at = now_s + delay
            log.warning(
                "worker %s (pid %d) exited with %s; restarting in %.2f s",
                handle.role,
                handle.process.pid,
                code,
                delay,
            )
        if now_s >= handle.restart_at:
            handle.restart_at = 0.0
            handle.consecutive += 1
            handle.restarts += 1
            self.shm.table.set(layout.worker_field(handle.role, "restarts"), handle.restarts)
            try:
                self._start_worker(handle)
            except RuntimeError as exc:
                log.error("restart of %s failed: %s", handle.role, exc)

    # ------------------------------------------------------------------ stop

    def shutdown(self) -> bool:
        """Stop workers in order, then release everything. True if the store stopped cleanly.

        Whatever fails on the way (a worker that will not stop, a file that cannot be removed or
        persisted), every shared segment and semaphore is still unlinked and the lock released:
        a failure is logged and makes the stop unclean, never a leak."""
        clean = False
        try:
            clean = self._stop_service()
        except Exception:
            log.exception("stopping the store failed; releasing its shared memory anyway")
        finally:
            self._release_shared()
            if self.store is not None:
                try:
                    self.store.finish_service(clean=clean)
                finally:
                    self.store = None
        return clean

    def _stop_service(self) -> bool:
        clean = True
        if self.ops is not None:
            self.ops.stop()
        if self.shm is None:
            return clean
        t = self.shm.table
        t.set(layout.STATE, layout.STOPPING)
        self._wake_parked_consumers()
        for role in STOP_ORDER:
            if role == "committer":  # the scheduler's last deliveries are in
                clean &= self._fence_puts()
            handle = self.workers.get(role)
            if handle is not None and handle.process is not None:
                clean &= self._stop_worker(handle)
        readable = t.readable_end()
        caught_up = t.get(layout.REPUT_FROM_OFFSET) >= readable and t.get(layout.FLUSHED_POSITION) >= readable
        if not caught_up:
            log.warning("dispatch or flush did not catch up; keeping abort for recovery next start")
        clean &= caught_up and not (t.get(layout.RUNNING_FLAGS) & 0b11110)
        self._remove_unused_files(t.get(layout.WROTE_POSITION))
        if self.offsets is not None and self.topics is not None:  # both loaded: persist them
            self.final_persist_ok = self.persist_config()
        if self.delay_offsets is not None:  # after the scheduler stopped: its last deliveries
            self.final_persist_ok &= self.persist_delay_offsets()
        if not self.final_persist_ok:
            log.error(
                "config/*.json could not be persisted at stop: offsets committed since the "
                "last good persist are lost (see the error above)"
            )
        t.set(layout.STATE, layout.STOPPED)
        return clean

    def _fence_puts(self) -> bool:
        """Fence this start (`rmq_mp.put.fence`) before the committer's and flusher's final
        passes: a producer that passed the STOPPING check just before it was set cannot put
        after them, into a pool buffer or file nobody commits or flushes any more. False (the
        stop is unclean) when it could not be fenced."""
        try:
            fenced = fence_start(self.names.base, layout.FENCED_BY_SHUTDOWN)
        except StoreError as exc:
            log.error("could not fence the store's puts at stop: %s", exc)
            return False
        if fenced is not None:
            log.info("puts fenced: %s", fenced.describe())
        return True

    def _wake_parked_consumers(self) -> None:
        """Consumers parked in a long poll wake and see the store stopping (nothing else will
        wake them: reput stops), so they attach to its next start or say it stopped, at once
        rather than at their timeout."""
        assert self.shm is not None
        for slot in self.shm.waiters.waiting_slots():
            self.shm.waiter(slot).release()

    def _release_shared(self) -> None:
        """Close and unlink every shared segment and semaphore of this store (each step even if
        one before it fails)."""
        for resource in (self.shm, self.descriptor, self.metrics, self.consume_counts):
            if resource is not None:
                try:
                    resource.close()
                except Exception:
                    log.exception("closing %s failed", type(resource).__name__)
        self.shm = self.descriptor = self.metrics = self.consume_counts = None
        StoreShm.unlink_all(self.names)

    def _remove_unused_files(self, wrote: int) -> None:
        """Files the allocator made ahead that no put reached (AllocateMappedFileService's
        shutdown destroys them too), and the temporaries of a segment creation a kill cut short
        (an allocator, reput or producer killed while the store ran): recovery would remove both
        anyway, but a stopped store is read by other tools too, RocketMQ among them."""
        directory = Path(self.config.commit_log_dir)
        for path in sorted(directory.glob("[0-9]" * 20)):
            if int(path.name) >= wrote:
                path.unlink()
        for root in (directory, self.config.consume_queue_dir):
            for stale in orphaned_temp_files(root) if root.is_dir() else []:
                log.warning(
                    "removed %s: the temporary of a segment creation its process did not finish", stale
                )
                stale.unlink(missing_ok=True)

    def _stop_worker(self, handle: WorkerHandle) -> bool:
        assert self.shm is not None
        assert handle.process is not None
        process = handle.process
        if process.poll() is None:
            self.shm.table.set(layout.worker_field(handle.role, "stop"), 1)
            self.shm.wakeup(handle.role).interrupt()
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    log.warning("worker %s did not stop in time; sending %s", handle.role, sig.name)
                    process.send_signal(sig)
                try:
                    process.wait(STOP_TIMEOUT_S if sig is None else 5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        return process.returncode == 0

    def run(
        self, on_running: Callable[[], None] | None = None, on_stopping: Callable[[], object] | None = None
    ) -> int:
        """Foreground: start, call ``on_running``, watch until SIGTERM/SIGINT, call ``on_stopping``,
        stop. Exit code 0 when the stop was clean and the last config persist worked, else 1."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)  # a SIGHUP during the start waits for it
        self.start()
        if on_running is not None:
            on_running()
        try:
            self.watch()
        finally:
            if on_stopping is not None:
                on_stopping()
            clean = self.shutdown()
        log.info("store %s stopped %s", self.root, "cleanly" if clean else "with abort kept")
        return 0 if clean and self.final_persist_ok else 1


def shm_sizes(config: MessageStoreConfig) -> ShmSizes:
    """The shared tables' capacities that broker.conf sets (each table records its own)."""
    return ShmSizes(
        pool_buffers=config.transient_store_pool_size if config.transient_store_pool_enable else 0,
        pool_buffer_size=config.mapped_file_size_commit_log,
        flush_ring=config.max_sync_flush_request_num,
        waiters=config.max_consumer_num,
        queues=config.max_consume_queue_num,
        groups=config.max_consumer_offset_num,
        delay_levels=len(config.delay_levels_ms),
        replica_ring=(  # a SLAVE's too: promoted to SYNC_MASTER (workers/promotion.py), it needs it
            config.max_sync_flush_request_num if config.broker_role is not BrokerRole.ASYNC_MASTER else 0
        ),
    )
