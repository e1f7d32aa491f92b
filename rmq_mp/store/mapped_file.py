"""MappedFile: one fixed-size segment file, memory-mapped, with RocketMQ's three positions.

Mirrors `MappedFile` (docs/format.md §7.2). ``wrote_position`` is where the next append goes,
``committed_position`` how much of it readers may see (equal to wrote when there is no transient
pool buffer), ``flushed_position`` how much is known durable. Unlike RocketMQ 4.9.8, a failed
fsync raises and leaves ``flushed_position`` where it was (issue #2706).

Reads never hand out memoryviews of the map (they would pin it); callers unpack straight from
``buf`` with ``struct.unpack_from`` or slice copies.

Disk use follows content: a file is created sparse at its full length (RocketMQ reads it by
length), and disk blocks are reserved (`posix_fallocate`) ahead of the write position in chunks
before any byte is written there (`reserve`). On a full disk the reservation is the OSError the
caller reports; a store through the map into a hole would be a SIGBUS instead.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from rmq_mp import file_modes
from rmq_mp.errors import FileChangedError
from shm.pointer_table import pid_alive
from shm.segment import lock_in_memory

OS_PAGE_SIZE = 4096
RESERVE_MAX_CHUNK_BYTES = 1 << 20
"""Reservation chunks double from one page with what a file has reserved, up to this: an idle
queue costs a page, a busy one a `posix_fallocate` per MiB."""
PWRITE_MIN_BYTES = OS_PAGE_SIZE
"""Writes of at least this many bytes into a file go by `pwrite` rather than through the map."""
MADV_POPULATE_READ = 22
"""Linux 5.14+: fault pages in readable, filling the page cache (zeros for a hole or reserved
blocks, no I/O) without dirtying it."""
MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault pages in writable without touching their bytes (not in Python 3.11's mmap)."""


def reservation_end(reserved: int, end: int, limit: int) -> int:
    """Where to reserve up to for a write ending at ``end`` when ``[0, reserved)`` is reserved:
    one chunk past ``reserved`` (as large as ``reserved``, one page to RESERVE_MAX_CHUNK_BYTES),
    at least ``end``, page-aligned, at most ``limit`` (the file size)."""
    chunk = min(max(reserved, OS_PAGE_SIZE), RESERVE_MAX_CHUNK_BYTES)
    mark = max(end, reserved + chunk)
    return min(-(-mark // OS_PAGE_SIZE) * OS_PAGE_SIZE, limit)


def reserve_blocks(fd: int, start: int, end: int) -> None:
    """Reserve the disk blocks of ``[start, end)`` of an open file (no-op where they are already
    allocated; data is never changed). Raises OSError (ENOSPC) when the disk cannot hold them."""
    if end > start:
        os.posix_fallocate(fd, start, end - start)


def offset_to_file_name(offset: int) -> str:
    """`UtilAll.offset2FileName`: 20-digit zero-padded decimal."""
    return f"{offset:020d}"


TEMP_SUFFIX = ".tmp"
"""`MappedFile.prepare` sizes a segment as ``.<name>.tmp<pid>`` before linking it into place."""


def orphaned_temp_files(directory: Path) -> list[Path]:
    """The `MappedFile.prepare` temporaries under ``directory`` whose creator is gone (killed
    between its create and its unlink). Left in a store, they stop RocketMQ loading it (it takes
    every name in a segment directory for an offset); a live creator's is left to it."""
    orphans = []
    for path in directory.rglob(f".*{TEMP_SUFFIX}*"):
        pid = path.name.rpartition(TEMP_SUFFIX)[2]
        if pid.isdigit() and not pid_alive(int(pid)):  # a zombie is gone too: killed, not reaped yet
            orphans.append(path)
    return orphans


def close_mapping(mm: mmap.mmap) -> bool:
    """Close ``mm``; True if closed. One still exported (a numpy array or memoryview of it
    alive: an exception in flight holds the frames that made them) is left to the garbage
    collector: a cleanup on an error path must not raise BufferError over the error itself."""
    try:
        mm.close()
    except BufferError:
        return False
    return True


class MappedFile:
    """A segment named by its first offset. Open an existing file or create a new one."""

    def __init__(self, path: Path, file_size: int, *, writable: bool, create: bool = False) -> None:
        self.path = path
        self.file_size = file_size
        self.file_from_offset = int(path.name)
        self.writable = writable
        flags = (os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)) if writable else os.O_RDONLY
        self._fd = os.open(path, flags, file_modes.file_mode())
        try:
            actual = os.fstat(self._fd).st_size
            if create:
                os.ftruncate(self._fd, file_size)  # sparse: `reserve` claims blocks as it fills
                actual = file_size
            self.actual_size = actual
            """Bytes the file really has; less than ``file_size`` only for a short file opened
            read-only (a writable store repairs it first)."""
            length = min(actual, file_size)
            self._mm: mmap.mmap | None = (
                mmap.mmap(self._fd, length, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
                if length
                else None
            )
        except BaseException:
            os.close(self._fd)
            if create:  # no half-made segment left to trip the next attempt's O_EXCL
                path.unlink(missing_ok=True)
            raise
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.last_store_timestamp = 0
        self.pwrite_min_bytes = PWRITE_MIN_BYTES
        """`fill` writes this many bytes or more with `pwrite` (0 under SYNC_FLUSH, whose flush
        after every put write-protects the page the next put writes)."""
        self.write_buffer: mmap.mmap | None = None
        """A TransientStorePool buffer: appends go there and `commit` copies them to the file."""
        self.reserved_position = 0
        """``[0, reserved_position)`` has its disk blocks reserved by this object (0 for a file
        opened, not created, here: the first `reserve` claims the prefix, a no-op for blocks
        already there). `append` reserves itself; `fill`'s callers reserve first."""

    @classmethod
    def prepare(cls, path: Path, file_size: int) -> bool:
        """Create a segment at full size (sparse) if it does not exist, atomically: it is sized
        under a hidden temporary name, then linked into place, so no other process can ever map
        it short. True if this call created it. Its blocks are reserved by whoever writes it."""
        if path.exists():
            return False
        tmp = path.with_name(f".{path.name}{TEMP_SUFFIX}{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, file_modes.file_mode())
        try:
            os.ftruncate(fd, file_size)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True

    @classmethod
    def extend(cls, path: Path, file_size: int) -> None:
        """Grow a short segment to its configured size with zeros (repair of a torn creation)."""
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, file_size)
            os.fsync(fd)
        finally:
            os.close(fd)

    @property
    def buf(self) -> Any:
        """The mapped bytes (empty for a zero-length file opened read-only)."""
        return self._mm if self._mm is not None else b""

    @property
    def read_position(self) -> int:
        return self.committed_position

    def is_full(self) -> bool:
        return self.wrote_position == self.file_size

    def set_positions(self, position: int) -> None:
        """Recovery's cut: all three positions to ``position``."""
        self.wrote_position = self.committed_position = self.flushed_position = position

    @property
    def fd(self) -> int:
        """The open file (`fill`'s pwrite; the compiled put core writes through it too)."""
        return self._fd

    @property
    def mapping(self) -> mmap.mmap | None:
        """The file's shared mapping (None for a zero-length file opened read-only)."""
        return self._mm

    def _target(self) -> mmap.mmap:
        target = self.write_buffer if self.write_buffer is not None else self._mm
        assert target is not None, "zero-length file opened read-only"
        return target

    def advance_wrote(self, end: int) -> None:
        """Move the write position; without a pool buffer, written bytes are readable at once."""
        self.wrote_position = end
        if self.write_buffer is None:
            self.committed_position = end

    def reserve(self, end: int) -> None:
        """Reserve disk blocks up to at least ``end`` (a chunk ahead, `reservation_end`) before
        anything is written there. Raises OSError (ENOSPC) with nothing written."""
        if end <= self.reserved_position:
            return
        mark = reservation_end(self.reserved_position, end, self.file_size)
        reserve_blocks(self._fd, self.reserved_position, mark)
        self.reserved_position = mark

    def reserve_range(self, start: int, end: int) -> None:
        """Reserve ``[start, end)`` only (the commit log's put path, which tracks its reservation
        in the pointer table, not in this object). Raises OSError (ENOSPC)."""
        reserve_blocks(self._fd, start, end)

    def append(self, data: bytes | bytearray) -> int:
        """Copy ``data`` at the write position, its blocks reserved first; returns that position,
        or -1 if it does not fit. Raises OSError (ENOSPC) with nothing written."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size or self._mm is None:
            return -1
        if end > self.reserved_position:
            self.reserve(end)
        self.fill(pos, data)
        self.advance_wrote(end)
        return pos

    def fill(self, pos: int, data: Any) -> None:
        """Write ``data`` at ``pos`` without moving positions (a put's records, blank records).
        The caller has reserved its blocks (the producer, against ALLOCATED_UNTIL).

        Into the pool buffer when one is attached; into the file otherwise, through the map for
        small writes and with `pwrite` from ``pwrite_min_bytes`` on: the first store to each
        fresh page of a shared file mapping traps into the kernel (about 6 us a page here), and
        so does the next store after every flush (writeback write-protects the page); one
        `pwrite` of a batch does the page-cache work for half (bench/NOTES.md). Both land in the
        page cache every mapping of the file reads."""
        size = len(data)
        assert pos + size <= self.file_size
        if self.write_buffer is None and size >= self.pwrite_min_bytes:
            with memoryview(data) as view, view.cast("B") as raw:
                self._pwrite_all(pos, raw)
            return
        self._target()[pos : pos + size] = data

    def _pwrite_all(self, pos: int, view: memoryview) -> None:
        """``view`` (bytes) into the file at ``pos`` through the page cache, short writes resumed."""
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], pos + done)

    def commit(self, until: int) -> int:
        """Copy ``[committed, until)`` from the pool buffer into the file (`MappedFile.commit`),
        with `pwrite` as RocketMQ's FileChannel.write: a store through the file's mapping took a
        page fault per fresh page, each reading the page in (readahead, zeroing) before the copy
        overwrote it; half the committer's CPU in the realistic bench row."""
        assert self.write_buffer is not None
        assert self._mm is not None
        start = self.committed_position
        if until > start:
            with memoryview(self.write_buffer) as buffer, buffer[start:until] as view:
                self._pwrite_all(start, view)
            self.committed_position = until
        return self.committed_position

    def zero_tail(self, pos: int) -> None:
        """Zero ``[pos, file_size)`` so bytes dropped by recovery can never be read again. Only
        up to the last non-zero byte: writing zeros over zeros would dirty every page of a
        mostly empty file (tens of MiB after a crash)."""
        if self._mm is not None and pos < self.file_size:
            end = self.last_nonzero(pos)
            if end > pos:
                reserve_blocks(self._fd, pos, end)  # a sparse file may have holes in between
                self._mm[pos:end] = bytes(end - pos)

    def last_nonzero(self, start: int) -> int:
        """One past the last non-zero byte at or after ``start`` (``start`` if all zero). Holes
        of the sparse file are zeros by definition and skipped: recovery asks this of every
        queue's last file, and reading 6 MB of holes each made a 10,000-queue store take over
        a minute to open."""
        mm = self._mm
        if mm is None:
            return start
        view = np.frombuffer(mm, dtype=np.uint8)
        try:
            for data_start, data_end in reversed(self.data_ranges(start, len(view))):
                end = data_end
                while end > data_start:  # backwards in 8 MiB chunks: the common tail is all zeros
                    begin = max(data_start, end - (8 << 20))
                    if np.count_nonzero(view[begin:end]):  # ~50x a bytes copy + rstrip, measured
                        return begin + int(np.flatnonzero(view[begin:end])[-1]) + 1
                    end = begin
            return start
        except (ValueError, RuntimeError) as exc:  # numpy: "non-zero array elements changed"
            if "changed" not in str(exc):
                raise
            raise FileChangedError(
                f"{self.path} changed while it was read (numpy: {exc}): another process still "
                f"writes the store; stop it (run.py stop ends a dead supervisor's start) and start again"
            ) from None
        finally:
            del view

    def data_ranges(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` that are not holes (SEEK_DATA/SEEK_HOLE; the page cache
        counts as data), or the whole range where the file system cannot say."""
        ranges = []
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return [(start, end)] if end > start else []
        try:
            pos = start
            while pos < end:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data past pos
                        break
                    return [(start, end)]
                if data >= end:
                    break
                hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
                ranges.append((data, hole))
                pos = hole
        finally:
            os.close(fd)
        return ranges

    def flush(self) -> int:
        """Force written bytes to disk (fdatasync covers MAP_SHARED pages on Linux).

        Raises OSError on failure with ``flushed_position`` unchanged."""
        target = self.read_position
        if target > self.flushed_position and self._mm is not None:
            os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    def warm(self, flush_every_pages: int) -> str:
        """RocketMQ's `warmMappedFile` for a new file, without writing a byte: every page
        faulted in writable (page cache filled, blocks mapped), forced every
        ``flush_every_pages`` pages when > 0 (SYNC_FLUSH), then the mapping mlocked until it is
        closed. Nothing changes in the file, so a put that reaches it meanwhile loses nothing.
        Returns '' or why the mlock failed (the file is warmed all the same). Pre-faulting
        writable allocates every block, so the whole file is reserved first: OSError (ENOSPC)
        here rather than a failed fault."""
        assert self.writable, "warm needs a writable mapping"
        assert self._mm is not None, "a zero-length file cannot be warmed"
        self.reserve(self.file_size)
        step = flush_every_pages * OS_PAGE_SIZE if flush_every_pages > 0 else self.file_size
        for start in range(0, self.file_size, step):
            try:
                self._mm.madvise(MADV_POPULATE_WRITE, start, min(step, self.file_size - start))
            except OSError:  # a kernel before 5.14: the mlock below faults the pages in
                break
            if flush_every_pages > 0:
                os.fdatasync(self._fd)
        return lock_in_memory(self._mm)

    def populate(self, start: int, end: int) -> None:
        """Fill the page cache of ``[start, end)`` (page-aligned start) without changing or
        dirtying a byte (MADV_POPULATE_READ): a producer's first store to each of those pages then
        finds it there instead of the kernel allocating and zeroing it in the producer's fault.
        Raises OSError (EINVAL on a kernel before 5.14)."""
        assert self._mm is not None, "a zero-length file has no pages"
        assert start % OS_PAGE_SIZE == 0, "madvise takes a page-aligned start"
        end = min(end, self.file_size)
        if end > start:
            self._mm.madvise(MADV_POPULATE_READ, start, end - start)

    def close(self) -> None:
        if self._mm is not None:
            close_mapping(self._mm)
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position}, flushed={self.flushed_position})"
