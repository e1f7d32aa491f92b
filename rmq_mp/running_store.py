"""RunningStore: what any process gets by attaching to a running store by shm name.

The supervisor publishes the store root and its effective settings in a descriptor segment;
attaching reads it, opens the shared memory and semaphores in the caller's role, and maps the
CommitLog. Producers, consumers and workers all start here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rmq_mp.config import FlushDiskType, MessageStoreConfig
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError, ShmAttachError, StoreNotRunningError
from rmq_mp.paths import StorePaths
from rmq_mp.shared_log import SharedCommitLog
from shm import layout
from shm.layout import Role
from shm.names import ShmNames, valid_base
from shm.pointer_table import PointerTable
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


@dataclass
class RunningStore:
    names: ShmNames
    config: MessageStoreConfig
    paths: StorePaths
    shm: StoreShm
    commit_log: SharedCommitLog

    @classmethod
    def attach(cls, name: str | os.PathLike[str], role: Role, *, writable_log: bool = False) -> RunningStore:
        names = resolve_names(name)
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
        paths = StorePaths.of(descriptor["root"], config.commit_log_dir)
        commit_log = SharedCommitLog(
            paths.commit_log,
            config.mapped_file_size_commit_log,
            writable=writable_log,
            delay_level_ms=list(config.delay_levels_ms),
        )
        return cls(names, config, paths, shm, commit_log)

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
        """How far readers may go: flushed under SYNC_FLUSH (RocketMQ 5.3, #8239), committed with
        the pool, else written."""
        t = self.shm.table
        if self.sync_flush:
            return t.get(layout.FLUSHED_POSITION)
        return t.get(layout.COMMITTED_POSITION if self.pool_enabled else layout.WROTE_POSITION)

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
