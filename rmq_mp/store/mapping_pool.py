"""A per-process bound on open ConsumeQueue mappings: idle files are unmapped and reopened on use.

A store with 12,000 queues would otherwise hold a mapping and two file descriptors per queue file
in every process that touches them (reput, each consumer, a read-only `MessageStore`): Linux
allows 65,530 mappings per process (``vm.max_map_count``) and ``RLIMIT_NOFILE`` is usually far
lower. A `PooledMappedFile` keeps its positions and its place in its `MappedFileQueue` while
released; only its mapping and descriptor go. Any use of the file (every method of
`MappedFile` reaches the bytes through ``_mm`` or ``_fd``, which are properties here) maps it
again, and opening one file past the bound releases the least recently used others.

Why this is safe:

- Closing a shared mapping loses nothing: written pages stay in the page cache (dirty until
  written back), and every later mapping or read of the file sees them. Durability is the
  flush's business: `PooledMappedFile.flush` fdatasyncs the inode through a descriptor of its
  own, mapped or not, so a released file's positions still move to durable exactly as before.
- A mapping in use is never closed: one that anything else references (a reader's ``buf``, a
  numpy view of it, a generator over its entries) is skipped, so the bound is exceeded only by
  the mappings pinned at that moment. The pool's lock makes the check and the close one step
  against other threads' `_mm` look-ups.
- A file the cleaner deleted cannot be mapped again: its reopen raises FileNotFoundError, which
  readers already handle (the consumer retries from the new minimum offset); its flush has
  nothing left to make durable. Files are only ever deleted from the head of a queue, below
  every reader's minimum, and never recreated under the same name while a store is running.

The commit log's and index's files are few and large and stay plain `MappedFile`s.
"""

from __future__ import annotations

import logging
import mmap
import os
import resource
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from rmq_mp.store.mapped_file import MappedFile, close_mapping

log = logging.getLogger(__name__)

DEFAULT_MAX_OPEN_FILES = 8192
"""``maxOpenConsumeQueueFiles``' default: 8,192 mappings and about as many descriptors."""
_PINNED_REFS = 3
"""References to a mapping while the pool looks at it: the file's, the pool's local and
`sys.getrefcount`'s argument. More means someone is reading through it."""


class MappingPool:
    """Open `PooledMappedFile`s of a process, least recently used first, at most ``max_open``
    (plus those pinned by a reader when the bound is reached)."""

    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, got {max_open}")
        self.max_open = max_open
        self.lock = threading.RLock()
        """Reentrant: `MappedFile.__init__` reads ``_fd`` while the pool opens the file."""
        self._open: OrderedDict[PooledMappedFile, None] = OrderedDict()
        self.reopens = 0
        """Files mapped again after a release (what a too small bound costs)."""
        self.releases = 0

    def __len__(self) -> int:
        return len(self._open)

    def _touch(self, mf: PooledMappedFile) -> None:
        """Under ``lock``: ``mf`` is open and was just used."""
        try:
            self._open.move_to_end(mf)
        except KeyError:
            self._open[mf] = None
            self._shrink(keep=mf)

    def make_room(self, coming: PooledMappedFile) -> None:
        """Under ``lock``: before ``coming`` maps its file, release down to one below the bound,
        so the process never holds more than the bound even for a moment."""
        self._shrink(keep=coming, limit=self.max_open - 1)

    def _shrink(self, keep: PooledMappedFile, limit: int | None = None) -> None:
        """Under ``lock``: release least recently used files until at most ``limit`` (the bound)
        stay open besides ``keep``, skipping pinned ones (moved to the recent end, so the next
        scan starts past them)."""
        limit = self.max_open if limit is None else limit
        others = len(self._open) - (keep in self._open)
        pinned: list[PooledMappedFile] = []
        while others - len(pinned) > limit:
            candidates = (f for f in self._open if f is not keep and f not in pinned)
            victim = next(candidates, None)
            if victim is None:
                break
            if victim._release():
                del self._open[victim]
                self.releases += 1
                others -= 1
            else:
                pinned.append(victim)
        for mf in pinned:
            self._open.move_to_end(mf)

    def _forget(self, mf: PooledMappedFile) -> None:
        with self.lock:
            self._open.pop(mf, None)

    def release_all(self) -> int:
        """Release every open file not in use (tests, and a process going idle). Returns how many."""
        with self.lock:
            released = [mf for mf in self._open if mf._release()]
            for mf in released:
                del self._open[mf]
            self.releases += len(released)
            return len(released)


_pools: dict[int, MappingPool] = {}
_pools_lock = threading.Lock()


def effective_max_open(configured: int) -> int:
    """``configured``, but at most half the soft ``RLIMIT_NOFILE`` (an open file costs one
    descriptor, mmap's own duplicate, and the file's when something writes by descriptor)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft // 2))


def process_pool(max_open: int = DEFAULT_MAX_OPEN_FILES) -> MappingPool:
    """The process's pool for this bound (``maxOpenConsumeQueueFiles``): every store view a
    process opens with the same setting shares it, so the bound is per process. A service
    process has one configuration, hence one pool."""
    with _pools_lock:
        pool = _pools.get(max_open)
        if pool is None:
            effective = effective_max_open(max_open)
            if effective < max_open:
                log.warning(
                    "maxOpenConsumeQueueFiles=%d lowered to %d: half the open-file limit (ulimit -n)",
                    max_open,
                    effective,
                )
            pool = _pools[max_open] = MappingPool(effective)
        return pool


class PooledMappedFile(MappedFile):
    """A `MappedFile` whose mapping and descriptor come and go with ``pool``; positions stay."""

    def __init__(
        self, path: Path, file_size: int, *, writable: bool, pool: MappingPool, create: bool = False
    ) -> None:
        self._pool = pool
        self._live_mm: mmap.mmap | None = None
        self._live_fd = -1
        self._released = False
        """True while unmapped by the pool; any use maps it again."""
        self._closed = False
        with pool.lock:
            pool.make_room(self)
            try:
                super().__init__(path, file_size, writable=writable, create=create)
            except BaseException:
                pool._open.pop(self, None)
                raise
            self._drop_fd()
            pool._touch(self)

    def _drop_fd(self) -> None:
        """The mapping keeps its own duplicate descriptor; ours is opened again only if a method
        writes or syncs by descriptor (half the descriptors for a mapped file)."""
        if self._live_fd >= 0:
            os.close(self._live_fd)
            self._live_fd = -1

    # Every MappedFile method reaches the file through these two attributes.
    @property
    def _mm(self) -> mmap.mmap | None:
        if self._closed:
            return None
        with self._pool.lock:
            if self._released:
                self._reopen()
            self._pool._touch(self)
            return self._live_mm

    @_mm.setter
    def _mm(self, value: mmap.mmap | None) -> None:
        self._live_mm = value

    @property
    def buf(self) -> Any:
        """`MappedFile.buf` with one look-up (it is on every read's path)."""
        mm = self._mm
        return mm if mm is not None else b""

    @property
    def _fd(self) -> int:
        if self._closed:
            return -1
        with self._pool.lock:
            if self._released:
                self._reopen()
            if self._live_fd < 0:
                self._live_fd = os.open(self.path, os.O_RDWR if self.writable else os.O_RDONLY)
            self._pool._touch(self)
            return self._live_fd

    @_fd.setter
    def _fd(self, value: int) -> None:
        self._live_fd = value

    def _reopen(self) -> None:
        """Under the pool lock: map the file again, the way `MappedFile` opens one (a plain
        instance opens it and hands over its mapping); positions are ours and stay."""
        self._pool.make_room(self)
        fresh = MappedFile(self.path, self.file_size, writable=self.writable)
        self._live_mm = fresh._mm
        self.actual_size = fresh.actual_size
        os.close(fresh._fd)
        fresh._mm, fresh._fd = None, -1
        self._released = False
        self._pool.reopens += 1

    def _release(self) -> bool:
        """Under the pool lock: unmap and close unless a reader holds the mapping. True if done."""
        mm = self._live_mm
        if mm is not None:
            if sys.getrefcount(mm) > _PINNED_REFS:
                return False
            try:
                mm.close()
            except BufferError:  # a numpy or memoryview export of it is alive
                return False
        self._live_mm = None
        del mm
        if self._live_fd >= 0:
            os.close(self._live_fd)
            self._live_fd = -1
        self._released = True
        return True

    @property
    def mapped(self) -> bool:
        """Whether the file is mapped now (False while released by the pool)."""
        return not self._released and not self._closed

    def flush(self) -> int:
        """Force written bytes to disk through a descriptor of our own: dirty pages belong to the
        file, not to the mapping that wrote them, so this covers a released file too, and no
        other thread's release can close the descriptor under the fdatasync. A file the cleaner
        deleted has nothing left to make durable."""
        target = self.read_position
        if target > self.flushed_position:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                self.flushed_position = target
                return target
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            self.flushed_position = target
        return self.flushed_position

    def close(self) -> None:
        self._pool._forget(self)
        with self._pool.lock:
            self._closed = True
            mm, self._live_mm = self._live_mm, None
            if mm is not None:
                close_mapping(mm)
            if self._live_fd >= 0:
                os.close(self._live_fd)
                self._live_fd = -1
