"""The store directory layout (docs/format.md §1), in one place, and the check that every
path in it is of the kind the store needs before anything is opened."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rmq_mp.errors import ConfigError, StorePathError

CONFIG_FILES = ("consumerOffset.json", "topics.json", "delayOffset.json", "deletedTopics.json")
"""The `config/` files rmq-mp reads or writes; each with ``.bak``, ``.tmp`` and ``.bak.tmp``."""
PSEUDO_FILESYSTEMS = frozenset(
    ("proc", "sysfs", "devpts", "devtmpfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
     "pstore", "bpf", "configfs", "fusectl", "mqueue", "efivarfs", "binfmt_misc", "autofs", "rpc_pipefs")
)  # fmt: skip
"""Kernel interfaces that look like directories but cannot hold a store's files."""


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable (the directory entry itself)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class StorePaths:
    """Every path under a store root. ``commit_log`` may live elsewhere (storePathCommitLog)."""

    root: Path
    commit_log: Path

    @classmethod
    def of(cls, root: str | Path, commit_log: str | Path | None = None) -> StorePaths:
        root = Path(root)
        return cls(root=root, commit_log=Path(commit_log) if commit_log else root / "commitlog")

    @property
    def consume_queue(self) -> Path:
        return self.root / "consumequeue"

    @property
    def index(self) -> Path:
        return self.root / "index"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def abort(self) -> Path:
        return self.root / "abort"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def consumer_offset(self) -> Path:
        return self.config / "consumerOffset.json"

    @property
    def delay_offset(self) -> Path:
        return self.config / "delayOffset.json"

    @property
    def topics(self) -> Path:
        return self.config / "topics.json"

    @property
    def promotion(self) -> Path:
        """The role `rmq-admin promote` gave (workers/promotion.py); `rmq-admin demote` retires it."""
        return self.config / "promotion.json"

    @property
    def deleted_topics(self) -> Path:
        """rmq-admin deleteTopic's tombstones (rmq_mp/config/deleted_topics.py)."""
        return self.config / "deletedTopics.json"

    @property
    def config_checksums(self) -> Path:
        """`rmq_mp.config.config_manager.ConfigChecksums`: outside config/, so a lost config/ shows."""
        return self.root / "configChecksum.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def check_kinds(self) -> None:
        """Raise `StorePathError` naming the first path that is a file where the store needs a
        directory or the reverse (or `ConfigError` for a root on a pseudo-filesystem), before
        anything is opened: otherwise a commit-log directory that is a file reads as an empty
        log, and recovery would cut the queues to match. Lists only directories recovery lists
        anyway (commitlog/, index/, consumequeue/ two levels deep)."""
        root = self.root
        fs_type = filesystem_type(root)
        if fs_type in PSEUDO_FILESYSTEMS:
            raise ConfigError(
                f"storePathRootDir {root} is on a {fs_type} pseudo-filesystem, which cannot hold a store"
            )
        if root.exists() and not root.is_dir():
            raise StorePathError(f"storePathRootDir {root} is a file, not a directory")
        for directory in (self.commit_log, self.consume_queue, self.index, self.config, self.logs):
            _need_dir(directory)
        files = [self.checkpoint, self.abort, self.lock, self.config_checksums]
        for name in CONFIG_FILES:
            files += [self.config / f"{name}{suffix}" for suffix in ("", ".bak", ".tmp", ".bak.tmp")]
        for path in files:
            if path.is_dir():
                raise StorePathError(f"{path} is a directory; the store keeps a file there")
        for directory, what in ((self.commit_log, "a commit-log file"), (self.index, "an index file")):
            for entry in _entries(directory):
                if entry.is_dir():
                    raise StorePathError(f"{entry.path} is a directory; {what} belongs there")
        for topic in _entries(self.consume_queue):
            if not topic.is_dir():
                raise StorePathError(
                    f"{topic.path} is a file; a topic's consume-queue directory belongs there"
                )
            for queue in _entries(Path(topic.path)):
                if not queue.is_dir():
                    raise StorePathError(
                        f"{queue.path} is a file; a queue's consume-queue directory belongs there"
                    )


def _need_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise StorePathError(f"{path} is a file; the store keeps a directory there")


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorePathError(f"{directory}: cannot list: {exc.strerror or exc}") from exc


def filesystem_type(path: Path) -> str:
    """The type (``ext4``, ``proc``, ...) of the mount holding ``path`` or its nearest existing
    ancestor, from /proc/self/mounts; '' when unknown."""
    try:
        mounts = Path("/proc/self/mounts").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    target = os.path.realpath(path)
    best, fs_type = "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fs_type = point, fields[2]
    return fs_type
