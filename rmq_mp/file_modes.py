"""Who may read a store: the modes of its directories, files and shared memory, in one place.

A store holds every message in the clear, so it is private to its owner by default: directories
0700, files and shared memory 0600 (RocketMQ has no such setting; its files follow the JVM's
umask, usually 0644). `storeGroupAccess` opens it to the owner's group: ``read`` (0750/0640) or
``write`` (0770/0660, which a producer or consumer in the group needs to attach: both write
shared memory).

Two mechanisms, so that no file is missed, whoever writes it:

* `apply` sets the process umask. Every entry point calls it (``run.py``, each worker, rmq-admin,
  rmq-spark, a library `MessageStore`), and a child process inherits it, so files created by code
  that names no mode (logs, ``config/*.json``, a worker written later) get the store's modes too.
* The store's own ``os.open``/``mkdir`` calls pass `file_mode()` / `dir_mode()`, and the shared
  memory `shm_mode()`, so those stay private even in a process whose umask is looser. What a
  client process writes into the store (a broadcasting consumer's progress, a Spark executor's
  rebuilt queues) goes through `make_dirs` / `create_private`, which set the modes outright:
  such a process keeps the user's umask.

`looser_than` lists what in a store directory is more open than configured, for the one line the
supervisor logs at start and ``run.py status`` shows: a store written before (0644) is reported,
never refused or changed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

ACCESS_VALUES: Final = ("none", "read", "write")
"""`storeGroupAccess`'s values: what the owner's group may do with the store."""

_GROUP_BITS: Final = {"none": 0o000, "read": 0o050, "write": 0o070}
"""The group bits of a directory for each access (a file gets them without execute)."""

_access = "none"
"""This process's `storeGroupAccess`, set by `apply`; private until then."""


def _check(access: str) -> str:
    if access not in _GROUP_BITS:
        raise ValueError(f"storeGroupAccess must be one of {', '.join(ACCESS_VALUES)}, got {access!r}")
    return access


def dir_mode(access: str | None = None) -> int:
    """A directory's mode: the owner's rwx, and the group's for `storeGroupAccess`."""
    return 0o700 | _GROUP_BITS[_check(access or _access)]


def file_mode(access: str | None = None) -> int:
    """A file's mode (and a shared-memory segment's or semaphore's): 0600 plus the group's."""
    return 0o600 | (_GROUP_BITS[_check(access or _access)] & 0o060)


shm_mode = file_mode


def umask_for(access: str) -> int:
    """The umask that leaves exactly `dir_mode(access)` / `file_mode(access)` of 0777 / 0666."""
    return 0o777 & ~dir_mode(access)


def apply(access: str) -> None:
    """Make this process create everything with `access`'s modes: the umask (inherited by the
    processes it starts) and the explicit modes of `file_mode` / `dir_mode`."""
    global _access
    _access = _check(access)
    os.umask(umask_for(access))


def inherited() -> str:
    """The access a parent's umask gave this process (a worker started by the supervisor); a
    umask that is none of them (a process started by hand) counts as private."""
    current = os.umask(0o077)
    os.umask(current)
    return next((a for a in ACCESS_VALUES if umask_for(a) == current), "none")


def current() -> str:
    """The access `apply` last set in this process."""
    return _access


def make_dirs(path: Path, root: Path) -> None:
    """``path`` and every missing directory between it and ``root`` (which must exist), each
    `dir_mode()` whatever this process's umask. ``Path.mkdir(mode, parents=True)`` gives the
    mode to the last directory only and the umask's to its parents: a client process (a
    broadcasting consumer, a Spark executor) made ``broadcastOffsets/<clientId>`` 0755 under a
    0700 store."""
    missing: list[Path] = []
    at = path
    while at != root and not at.is_dir():
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, dir_mode())
        except FileExistsError:
            continue  # another process's, or a file in the way: what follows raises on it
        os.chmod(directory, dir_mode())  # the umask may have taken group bits storeGroupAccess gives


def create_private(path: Path) -> int:
    """``path`` opened for writing, created or emptied, with `file_mode()` whatever this process's
    umask or the mode a file left there had: a descriptor the caller closes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode())
    try:
        os.fchmod(fd, file_mode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def looser_than(root: str | os.PathLike[str], access: str) -> tuple[int, list[str]]:
    """Entries under `root` (itself included, links not followed) more open than `access`
    allows: their count and the first few, as ``path mode``."""
    allowed_dir, allowed_file = dir_mode(access), file_mode(access)
    count, examples = 0, list[str]()
    root = Path(root)
    for directory, dirs, files in os.walk(root):
        for path in [Path(directory)] + [Path(directory) / f for f in sorted(files)]:
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # deleted meanwhile (the cleaner)
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            allowed = allowed_dir if stat.S_ISDIR(st.st_mode) else allowed_file
            if stat.S_IMODE(st.st_mode) & ~allowed:
                count += 1
                if len(examples) < 3:
                    examples.append(
                        f"{path.relative_to(root) if path != root else path} {stat.S_IMODE(st.st_mode):04o}"
                    )
        dirs.sort()
    return count, examples


def looser_note(root: str | os.PathLike[str], access: str) -> str | None:
    """One line naming what under `root` is more open than `storeGroupAccess` allows, or None."""
    count, examples = looser_than(root, access)
    if not count:
        return None
    return (
        f"{count} store file(s) more open than storeGroupAccess={access} allows "
        f"(dirs {dir_mode(access):04o}, files {file_mode(access):04o}), e.g. {', '.join(examples)}; "
        f"chmod -R go-rwx (or the group's bits) to close them"
    )
