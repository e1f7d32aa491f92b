"""RunningStore: what any process gets by attaching to a running store by shm name.

The supervisor publishes the store root and its effective settings in a descriptor segment;
attaching reads it, opens the shared memory and semaphores in the caller's role, and maps the
CommitLog. Producers, consumers and workers all start here.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from rmq_mp.config import live
from rmq_mp.config.store_config import BrokerRole, FlushDiskType, MessageStoreConfig
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError, ShmAttachError, StoreNotRunningError
from rmq_mp.paths import StorePaths
from rmq_mp.store.shared_log import SharedCommitLog
from shm import layout
from shm.layout import Role
from shm.names import ShmNames, valid_base
from shm.pointer_table import PointerTable, pid_alive
from shm.store_shm import StoreShm, read_descriptor


def resolve_names(name: str | os.PathLike[str]) -> ShmNames:
    """A shm name (``rmq_…`` or ``/rmq_…``) or a store directory (default shmName) to names.
    `InvalidArgumentTypeError` for neither a str nor a path; `StoreNotRunningError` for a path
    with no directory; `InvalidArgumentError` for a name that could be neither (the shmName
    rule: 1-64 letters, digits, '_', '-' or '.'), which never reaches the system calls."""
    if not isinstance(name, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            f"a store is named by its shm name or its directory (str or path), not {type(name).__name__}"
        )
    text = os.fspath(name)
    if not isinstance(text, str):
        raise InvalidArgumentTypeError(f"a store name is text, not {type(text).__name__}")
    if "\0" not in text and os.path.isdir(text):
        return ShmNames.for_store(text)
    base = text[1:] if text.startswith("/") else text
    if valid_base(base):
        return ShmNames(base)
    if "/" in text and "\0" not in text:
        raise StoreNotRunningError(f"store {text} is not running: no such store directory")
    raise InvalidArgumentError(
        f"{text!r} is neither a store directory nor a shm name (1-64 letters, digits, '_', '-' or '.')"
    )


START_TIMEOUT_S = 60.0
"""How long `Producer.attach` and `Consumer.attach` wait for a store that is still starting."""
REATTACH_WAIT_S = 3.0
"""How long a send or read waits for a newer start of its store to finish starting (RocketMQ's
client gives a send 3 s, sendMsgTimeout)."""
SUPERVISOR_STALE_MS = 3000
"""A supervisor heartbeat older than this makes a put or read check that the supervisor exists."""
START_POLL_S = 0.01
"""How often an attach waiting for a starting store looks at its state word."""
_STATE_NAMES = {layout.STARTING: "starting", layout.RUNNING: "running", layout.STOPPING: "stopping",
                layout.STOPPED: "stopped"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Instance:
    """One start of a store, as its pointer table says: which start (GENERATION, the start time
    in ms) and how far it is."""

    generation: int
    state: int
    supervisor_pid: int

    @property
    def state_name(self) -> str:
        return _STATE_NAMES.get(self.state, f"state {self.state}")

    @property
    def starting(self) -> bool:
        """Its supervisor is alive and has not finished starting (a table only just created has
        no pid yet)."""
        return self.state == layout.STARTING and (self.supervisor_pid == 0 or pid_alive(self.supervisor_pid))

    @classmethod
    def of(cls, names: ShmNames) -> Instance | None:
        """The instance now holding the store's name (None: none), read from its pointer table
        alone: cheap enough to ask at every refused send."""
        try:
            table = PointerTable.attach(names.pointer_table, Role.CONSUMER)
        except ShmAttachError:
            return None
        try:
            return cls(
                table.get(layout.GENERATION), table.get(layout.STATE), table.get(layout.SUPERVISOR_PID)
            )
        finally:
            table.close()


def wait_until_started(names: ShmNames, timeout_s: float, shown: str) -> None:
    """Return once the store named is past STARTING (or not there at all); a store still starting
    after ``timeout_s`` raises `StoreNotRunningError` saying so, so that nobody attaches to a
    store whose puts would all be refused."""
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool):
        raise InvalidArgumentTypeError(
            f"start_timeout_s must be a number of seconds, not {type(timeout_s).__name__}"
        )
    if not 0 <= timeout_s < math.inf:
        raise InvalidArgumentError(f"start_timeout_s {timeout_s!r} must be a finite number of seconds >= 0")
    deadline = time.monotonic() + timeout_s
    while (instance := Instance.of(names)) is not None and instance.starting:
        if time.monotonic() >= deadline:
            raise StoreNotRunningError(
                f"store {shown} is still starting after {timeout_s:g} s (supervisor pid "
                f"{instance.supervisor_pid}): wait longer (start_timeout_s) or see its logs/supervisor.log"
            )
        time.sleep(START_POLL_S)


def live_settings(config: MessageStoreConfig, table: PointerTable) -> MessageStoreConfig:
    """``config`` (the descriptor's, as the store started) with the live settings a reload has
    applied since (rmq_mp/config/live.py); itself until the first reload."""
    if not table.get(layout.LIVE_SETTINGS_GENERATION):
        return config
    return live.with_words(
        config, [table.get(layout.live_setting(i)) for i in range(len(live.PUBLISHED_KEYS))]
    )


def promoted_role(config: MessageStoreConfig, table: PointerTable) -> MessageStoreConfig:
    """``config`` with the brokerRole a live promotion gave this start (BROKER_ROLE_NOW,
    `rmq-admin promote`); itself when there was none."""
    code = table.get(layout.BROKER_ROLE_NOW)
    for name, value in layout.ROLE_CODES.items():
        if value == code and config.broker_role.value != name:
            return config.replace(broker_role=BrokerRole(name))
    return config


@dataclass
class RunningStore:
    names: ShmNames
    config: MessageStoreConfig
    paths: StorePaths
    shm: StoreShm
    commit_log: SharedCommitLog

    @classmethod
    def attach(
        cls,
        name: str | os.PathLike[str],
        role: Role,
        *,
        writable_log: bool = False,
        start_timeout_s: float | None = None,
    ) -> RunningStore:
        """Attach in ``role``. With ``start_timeout_s`` (producers and consumers), a store still
        starting is waited for that long first (`wait_until_started`); workers attach while their
        store starts and pass None."""
        names = resolve_names(name)
        if start_timeout_s is not None:
            wait_until_started(names, start_timeout_s, os.fspath(name))
        try:
            descriptor = read_descriptor(names)
            shm = StoreShm.attach(names, role)
        except ShmAttachError as exc:
            if "not allowed" in str(exc):
                raise
            hint = (
                "; a store whose broker.conf sets shmName is attached by that name"
                if os.path.isdir(os.fspath(name))
                else ""
            )
            raise StoreNotRunningError(f"store {os.fspath(name)} is not running ({exc}){hint}") from exc
        config = MessageStoreConfig.from_properties(descriptor["properties"], source=f"shm {names.base}")
        config = promoted_role(live_settings(config, shm.table), shm.table)
        paths = StorePaths.of(descriptor["root"], config.commit_log_dir)
        commit_log = SharedCommitLog(
            paths.commit_log,
            config.mapped_file_size_commit_log,
            writable=writable_log,
            delay_level_ms=list(config.delay_levels_ms),
        )
        return cls(names, config, paths, shm, commit_log)

    @property
    def instance(self) -> Instance:
        """This attachment's instance as its (possibly since unlinked) pointer table says."""
        t = self.shm.table
        return Instance(t.get(layout.GENERATION), t.get(layout.STATE), t.get(layout.SUPERVISOR_PID))

    @property
    def table(self) -> PointerTable:
        return self.shm.table

    @property
    def sync_flush(self) -> bool:
        return self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH

    @property
    def pool_enabled(self) -> bool:
        return self.shm.table.get(layout.POOL_SIZE) > 0

    def readable_end(self) -> int:
        """How far readers may go: `PointerTable.readable_end`, the one rule."""
        return self.shm.table.readable_end()

    def sync_log(self, readable_end: int | None = None, *, keep_from: int = -1) -> int:
        """Map the readable commit log; returns its end. ``keep_from``: a consumer's hold, which
        keeps a file the cleaner made unavailable (but may not delete yet) readable to it."""
        end = self.readable_end() if readable_end is None else readable_end
        min_offset = self.shm.table.get(layout.MIN_OFFSET)
        if 0 <= keep_from < min_offset:
            try:
                self.commit_log.sync_positions(min_offset=keep_from, readable_end=end)
                return end
            except FileNotFoundError:
                pass  # deleted (forcibly) before this process mapped it: gone for us too
        self.commit_log.sync_positions(min_offset=min_offset, readable_end=end)
        return end

    def close(self) -> None:
        self.commit_log.close()
        self.shm.close()
