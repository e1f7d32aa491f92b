"""The store directory layout (rocketmq-format.md §1), in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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
    def topics(self) -> Path:
        return self.config / "topics.json"
