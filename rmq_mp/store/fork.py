"""What a slave whose log forks from its master's keeps (workers/ha_fork.py finds the fork).

`set_aside` copies every commit-log file holding bytes from the fork offset C on into a dated
folder inside the store, ``diverged/<UTC time>-<C>/commitlog/`` (whole segments, byte for byte,
the bytes below C in the first one being shared with the master), with ``fork.json`` naming the
range only this store had, its master and when; then it records the cut still to make
(``forkCut.json`` in the store root, written atomically, after the copies are durable). Nothing
is deleted here. The cut is made when the store next opens (`MessageStore._start`, before
recovery; the supervisor restarts the store for it as soon as the ha worker has recorded the
cut, and readers stop at the fork until then: `FORK_READ_END`): the commit log, the ConsumeQueues and the index are cut at C by
recovery's own truncation code (`recovery.cut_at`), recovery then runs as after a crash (the
queue offsets follow the cut queues) and the record of the cut is removed once the store is
flushed. So the set-aside records are served by no start of the store after the one that found
the fork, and a crash anywhere in between cuts again at the same offset.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rmq_mp import file_modes
from rmq_mp.paths import StorePaths, fsync_dir
from rmq_mp.store.mapped_file import offset_to_file_name

log = logging.getLogger(__name__)

DIVERGED_DIR = "diverged"
"""Inside the store root: one folder per fork found."""
PENDING_CUT = "forkCut.json"
"""In the store root while a cut is still to make."""


@dataclass(frozen=True, slots=True)
class PendingCut:
    fork_offset: int
    end: int
    folder: str


def _write_json(path: Path, content: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def set_aside(paths: StorePaths, fork_offset: int, end: int, file_size: int, master: str) -> Path:
    """Copy this store's log from the file holding ``fork_offset`` to ``end`` into a dated folder
    and record the cut at ``fork_offset``; returns the folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = paths.root / DIVERGED_DIR / f"{stamp}-{fork_offset}"
    target = folder / "commitlog"
    target.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
    names = []
    for offset in range(fork_offset - fork_offset % file_size, end, file_size):
        name = offset_to_file_name(offset)
        shutil.copyfile(paths.commit_log / name, target / name)
        with open(target / name, "rb") as f:
            os.fsync(f.fileno())
        names.append(name)
    fsync_dir(target)
    _write_json(
        folder / "fork.json",
        {
            "fork_offset": fork_offset,
            "end": end,
            "only_here": f"commit-log bytes [{fork_offset}, {end}) were this store's only: its "
            f"master {master} holds other records from {fork_offset}",
            "master": master,
            "found_at": stamp,
            "files": names,
        },
    )
    fsync_dir(folder.parent)
    _write_json(
        paths.root / PENDING_CUT,
        {"fork_offset": fork_offset, "end": end, "folder": str(folder.relative_to(paths.root))},
    )
    return folder


def pending_cut(root: Path) -> PendingCut | None:
    """The cut a fork left to make at the next start, if any."""
    try:
        content = json.loads((root / PENDING_CUT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return PendingCut(int(content["fork_offset"]), int(content["end"]), str(content["folder"]))


def clear_pending_cut(root: Path) -> None:
    (root / PENDING_CUT).unlink(missing_ok=True)
    fsync_dir(root)
