"""A FUSE passthrough filesystem whose fsync fails on demand: a real EIO for fault tests.

    python -m tests.faultfs <backing dir> <mount point>

Every operation passes through to the backing directory, except that fsync/fdatasync return
EIO while the file ``<backing dir>/.fail-fsync`` exists, and take the milliseconds written in
``<backing dir>/.slow-fsync`` longer while that file exists (a slow disk). The kernel then reports the failure to
the caller of fsync/fdatasync exactly as a failing disk would. Needs libfuse2 and fusepy.

One way it is not a real file system: libfuse's high-level API renames an open file that a
rename replaces out of the way first (or, with ``hard_remove``, fails its open), so a reader
racing ``os.replace`` can get ENOENT. Tests read what the store wrote through the backing
directory.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any

from fuse import FUSE, FuseOSError, Operations


class FaultFS(Operations):
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.switch = os.path.join(self.root, ".fail-fsync")
        self.slow = os.path.join(self.root, ".slow-fsync")

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def access(self, path: str, mode: int) -> None:
        if not os.access(self._full(path), mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._full(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._full(path), uid, gid)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self._full(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {key: getattr(st, key) for key in keys}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._full(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._full(path))

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._full(path))
        keys = (
            "f_bavail",
            "f_bfree",
            "f_blocks",
            "f_bsize",
            "f_favail",
            "f_ffree",
            "f_files",
            "f_flag",
            "f_frsize",
            "f_namemax",
        )
        return {key: getattr(st, key) for key in keys}

    def unlink(self, path: str) -> None:
        os.unlink(self._full(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._full(old), self._full(new))

    def link(self, target: str, name: str) -> None:
        os.link(self._full(name), self._full(target))

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        os.utime(self._full(path), times)

    def open(self, path: str, flags: int) -> int:
        return os.open(self._full(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return os.open(self._full(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, length: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, length, offset)

    def write(self, path: str, buf: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, buf, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        os.truncate(self._full(path), length)

    def flush(self, path: str, fh: int) -> None:
        pass

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        if os.path.exists(self.switch):
            raise FuseOSError(errno.EIO)
        try:
            with open(self.slow, encoding="ascii") as f:
                time.sleep(int(f.read().strip() or 0) / 1000)
        except FileNotFoundError:
            pass
        os.fdatasync(fh) if datasync else os.fsync(fh)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        if os.path.exists(self.switch):
            raise FuseOSError(errno.EIO)


if __name__ == "__main__":
    FUSE(FaultFS(sys.argv[1]), sys.argv[2], foreground=True, nothreads=False, attr_timeout=0, entry_timeout=0)
