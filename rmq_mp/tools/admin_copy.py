"""`rmq-admin copyLog --store SRC|--name SRC --to DIR`: refill an empty store with another's whole
commit log (issue 32 point 3: an empty master refilled from its slave).

Over RocketMQ's HA wire an empty slave gets only the file holding its master's end (a first
report of 0 means that, and offset 0 cannot be asked for otherwise; docs/replication.md). So a
master that lost its disk gets its log back out of band: this copies every commit-log file of
the source (a stopped store, or a running one: its files are read as they are, a torn last
record is cut by the destination's recovery), whole and byte for byte, and its config/ files
(group offsets, topics, subscription groups, delay progress), into DIR, which must hold no
commit-log data and not be running. The destination's first start rebuilds ConsumeQueues and
index from the log (it has none). Start it as a slave of the source (it compares its tail with
the master's first, workers/ha_fork.py, then follows), and promote it once caught up.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from rmq_mp import file_modes
from rmq_mp.errors import StoreError, StoreLockedError
from rmq_mp.paths import StorePaths, fsync_dir


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "copyLog",
        parents=[common],
        help="copy this store's whole commit log and config/ into an empty store directory",
    )
    p.add_argument("--to", type=Path, required=True, help="the empty store directory to fill")


def _source_paths(args: argparse.Namespace) -> StorePaths:
    if args.name:
        from rmq_mp.store.running_store import resolve_names
        from shm.store_shm import read_descriptor

        descriptor = read_descriptor(resolve_names(args.name))
        commit_log_dir = descriptor["properties"].get("storePathCommitLog") or None
        return StorePaths.of(descriptor["root"], commit_log_dir)
    return StorePaths.of(args.store)


def _segments(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit())


def _refuse_unless_empty(target: StorePaths) -> None:
    """The destination holds no commit-log byte and no store runs on it (its lock is free)."""
    for name in _segments(target.commit_log):
        with open(target.commit_log / name, "rb") as f:
            while chunk := f.read(8 << 20):
                if chunk.count(0) != len(chunk):
                    raise StoreError(
                        f"{target.root} already holds commit-log data ({name}): copyLog fills only an "
                        f"empty store; move its files away first"
                    )
    if target.lock.exists():
        fd = os.open(target.lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StoreLockedError(f"{target.root} is in use by a running store: stop it first") from exc
        finally:
            os.close(fd)


def copy_log(source: StorePaths, target: StorePaths) -> list[str]:
    """Copy the source's commit-log segments and config files into ``target``; the names copied."""
    names = _segments(source.commit_log)
    if not names:
        raise StoreError(f"{source.root}: no commit-log file to copy")
    _refuse_unless_empty(target)
    for name in _segments(target.commit_log):  # empty files the destination made ahead
        (target.commit_log / name).unlink()
    target.commit_log.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
    for name in names:
        tmp = target.commit_log / f".{name}.tmp{os.getpid()}"
        shutil.copyfile(source.commit_log / name, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target.commit_log / name)
    fsync_dir(target.commit_log)
    copied = [f"commitlog/{name}" for name in names]
    if source.config.is_dir():
        target.config.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        for entry in sorted(source.config.iterdir()):
            if entry.is_file() and ".tmp" not in entry.name:
                shutil.copyfile(entry, target.config / entry.name)
                copied.append(f"config/{entry.name}")
        fsync_dir(target.config)
    fsync_dir(target.root)
    return copied


def copy_log_command(args: argparse.Namespace) -> int:
    source = _source_paths(args)
    target = StorePaths.of(args.to)
    copied = copy_log(source, target)
    print(f"copied {len(copied)} files from {source.root} to {target.root}")
    return 0


COMMANDS = {"copyLog": copy_log_command}
