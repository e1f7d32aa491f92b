"""MappedFileQueue: the ordered segment files of one directory (a commit log or one queue).

Mirrors `MappedFileQueue` (docs/format.md §7.3). Loading is stricter than RocketMQ about
what cannot be guessed (a wrong-sized middle file, a name that is not an offset, a gap) and more
forgiving about what can: a zero-length or short *last* file, the mark of a crash during file
creation, is extended with zeros and reported instead of failing the whole store (#6904).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from rmq_mp import file_modes
from rmq_mp.errors import CorruptFileError
from rmq_mp.store.mapped_file import OS_PAGE_SIZE, TEMP_SUFFIX, MappedFile, offset_to_file_name
from rmq_mp.store.mapping_pool import MappingPool, PooledMappedFile
from rmq_mp.store.reporter import Reporter

log = logging.getLogger(__name__)

_NAME = re.compile(r"^\d{20}$")


class MappedFileQueue:
    """Segments of ``mapped_file_size`` bytes in ``store_dir``, named by their first offset."""

    def __init__(
        self,
        store_dir: Path,
        mapped_file_size: int,
        *,
        writable: bool,
        reporter: Reporter,
        pool: MappingPool | None = None,
        pwrite_min_bytes: int | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.pwrite_min_bytes = pwrite_min_bytes
        """Writes of this many bytes or more go by `pwrite` (`MappedFile.pwrite_min_bytes`);
        None keeps the file's default."""
        self.mapped_file_size = mapped_file_size
        self.writable = writable
        self.reporter = reporter
        self.pool = pool
        """With a pool (ConsumeQueues), files are mapped only while in use (mapping_pool.py)."""
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0

    # ------------------------------------------------------------------ loading

    def load(self, names: list[str] | None = None) -> None:
        """Map every segment; all positions start at the file size and recovery cuts them.
        ``names``: the directory's entries when the caller listed it already."""
        if names is None and not self.store_dir.is_dir():
            return
        if self.writable:
            for stale in self.store_dir.glob(f".*{TEMP_SUFFIX}*"):  # a segment creation cut short by a crash
                self.reporter.report(
                    "stale-temp-file-removed",
                    str(stale),
                    0,
                    stale.stat().st_size,
                    "temporary file of an interrupted segment creation",
                )
                stale.unlink()
        if names is None:
            names = [p.name for p in self.store_dir.iterdir()]
        names = sorted(name for name in names if not name.startswith("."))
        for name in names:
            if not _NAME.match(name):
                raise CorruptFileError(f"{self.store_dir / name}: not a segment name (20 decimal digits)")
        expected = None
        for i, name in enumerate(names):
            path = self.store_dir / name
            offset = int(name)
            if offset % self.mapped_file_size:
                raise CorruptFileError(
                    f"{path}: offset is not a multiple of the file size {self.mapped_file_size}"
                )
            if expected is not None and offset != expected:
                raise CorruptFileError(
                    f"{path}: expected the segment at {expected} before it (gap in {self.store_dir})"
                )
            expected = offset + self.mapped_file_size
            size = path.stat().st_size
            last = i == len(names) - 1
            if size != self.mapped_file_size and not (last and size < self.mapped_file_size):
                raise CorruptFileError(
                    f"{path}: length {size} does not match the configured file size {self.mapped_file_size}"
                )
            if size < self.mapped_file_size and self.writable:
                MappedFile.extend(path, self.mapped_file_size)
                self.reporter.report(
                    "short-file-extended",
                    str(path),
                    size,
                    self.mapped_file_size,
                    "last segment shorter than its size (torn creation); zero-filled",
                )
            mf = self._open(path, self.mapped_file_size, writable=self.writable)
            mf.set_positions(min(size, self.mapped_file_size) if not self.writable else self.mapped_file_size)
            self.files.append(mf)

    def _open(self, path: Path, file_size: int, *, writable: bool, create: bool = False) -> MappedFile:
        if self.pool is None:
            mf = MappedFile(path, file_size, writable=writable, create=create)
        else:
            mf = PooledMappedFile(path, file_size, writable=writable, create=create, pool=self.pool)
        if self.pwrite_min_bytes is not None:
            mf.pwrite_min_bytes = self.pwrite_min_bytes
        return mf

    # ------------------------------------------------------------------ lookup

    def first_file(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def last_nonzero(self, offset: int) -> int:
        """One past the last non-zero byte at or after ``offset`` over every segment (``offset``
        if all zero): where a cut at ``offset`` reports its dropped range ending."""
        end = offset
        for mf in self.files:
            if mf.file_from_offset + mf.file_size > offset:
                local = max(0, offset - mf.file_from_offset)
                tail = mf.last_nonzero(local)
                if tail > local:
                    end = mf.file_from_offset + tail
        return end

    def min_offset(self) -> int:
        """First byte still stored, -1 when there is no file."""
        return self.files[0].file_from_offset if self.files else -1

    def max_offset(self) -> int:
        """End of readable data (RocketMQ's getMaxOffset)."""
        last = self.last_file()
        return last.file_from_offset + last.read_position if last else 0

    def max_wrote_position(self) -> int:
        last = self.last_file()
        return last.file_from_offset + last.wrote_position if last else 0

    def find_mapped_file_by_offset(
        self, offset: int, return_first_on_not_found: bool = False
    ) -> MappedFile | None:
        """The segment holding ``offset``, by index arithmetic (files are contiguous)."""
        if not self.files:
            return None
        first = self.files[0].file_from_offset
        if first <= offset < self.files[-1].file_from_offset + self.mapped_file_size:
            mf = self.files[(offset - first) // self.mapped_file_size]
            assert mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size
            return mf
        return self.files[0] if return_first_on_not_found else None

    def ensure_range(self, first_offset: int, last_offset: int) -> None:
        """Map every segment holding ``[first_offset, last_offset]`` that this view lacks: the
        service's processes see files that another process (allocator, producer) created."""
        size = self.mapped_file_size
        first = first_offset - first_offset % size
        if not self.files or self.files[0].file_from_offset > first:
            for mf in self.files:
                mf.close()
            self.files = []
            start = first
        else:
            start = self.files[-1].file_from_offset + size
        for offset in range(start, last_offset - last_offset % size + 1, size):
            path = self.store_dir / offset_to_file_name(offset)
            if self.writable:
                self.store_dir.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
                MappedFile.prepare(path, size)
            self.files.append(self._open(path, size, writable=self.writable))

    def ensure_file(self, file_offset: int) -> MappedFile:
        """The segment starting at ``file_offset`` (mapping it, and any missing before it)."""
        mf = self.find_mapped_file_by_offset(file_offset)
        if mf is not None:
            return mf
        if self.files and file_offset < self.files[0].file_from_offset:
            # Below this view's first segment (a slave comparing its log with a master's from an
            # older file): map it and those up to the first in front, leaving what is mapped open
            # (views of it may be in use). ensure_range maps only forward: this once returned the
            # last segment for it, so the fork check compared the wrong file's bytes.
            size = self.mapped_file_size
            first = file_offset - file_offset % size
            front = [
                self._open(self.store_dir / offset_to_file_name(offset), size, writable=self.writable)
                for offset in range(first, self.files[0].file_from_offset, size)
            ]
            self.files[:0] = front
            return front[0]
        self.ensure_range(self.files[0].file_from_offset if self.files else file_offset, file_offset)
        return self.files[-1]

    def drop_files_before(self, offset: int) -> None:
        """Unmap segments wholly below ``offset`` (deleted by the cleaner in another process)."""
        while self.files and self.files[0].file_from_offset + self.mapped_file_size <= offset:
            self.files.pop(0).close()

    def drop_deleted_files(self) -> int:
        """Unmap leading segments the cleaner (another process) deleted, never the last one: the
        mapping keeps a deleted file's disk space until it is dropped. Returns how many."""
        dropped = 0
        while len(self.files) > 1 and not self.files[0].path.exists():
            self.files.pop(0).close()
            dropped += 1
        return dropped

    def get_last_mapped_file(self, start_offset: int = 0, *, create: bool = True) -> MappedFile | None:
        """The segment to append to: the last one unless full; creates the next when allowed."""
        last = self.last_file()
        if last is not None and not last.is_full():
            return last
        if not create or not self.writable:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        self.store_dir.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        mf = self._open(
            self.store_dir / offset_to_file_name(create_offset),
            self.mapped_file_size,
            writable=True,
            create=True,
        )
        self.files.append(mf)
        return mf

    # ------------------------------------------------------------------ recovery cuts

    def truncate_dirty_files(self, offset: int) -> None:
        """Cut everything at and above ``offset``: the holding file's positions, later files removed.

        Bytes above the cut in the holding file are zeroed, so a later scan can never mistake
        them for records (RocketMQ leaves them and relies on the positions alone)."""
        keep: list[MappedFile] = []
        for mf in self.files:
            end = mf.file_from_offset + self.mapped_file_size
            if end <= offset:
                keep.append(mf)
            elif offset >= mf.file_from_offset:
                pos = offset - mf.file_from_offset
                mf.set_positions(pos)
                if self.writable:
                    mf.zero_tail(pos)
                keep.append(mf)
            else:
                log.info("removing segment %s above the recovered end %d", mf.path, offset)
                if self.writable:
                    mf.destroy()
                else:
                    mf.close()
        self.files = keep
        self.flushed_where = self.committed_where = min(offset, self.max_wrote_position())

    def delete_last_file(self) -> None:
        last = self.files.pop()
        last.destroy() if self.writable else last.close()

    # ------------------------------------------------------------------ durability

    def flush(self, least_pages: int = 0) -> bool:
        """Force every segment between ``flushed_where`` and the end. True if anything moved.
        With ``least_pages``, a segment not yet full waits until that many 4 KiB pages are
        unflushed (RocketMQ's `isAbleToFlush`)."""
        before = self.flushed_where
        for mf in self.files:
            if mf.file_from_offset + mf.read_position > self.flushed_where:
                full = mf.read_position == mf.file_size
                dirty_pages = mf.read_position // OS_PAGE_SIZE - mf.flushed_position // OS_PAGE_SIZE
                if least_pages > 0 and not full and dirty_pages < least_pages:
                    break
                mf.flush()
                self.flushed_where = mf.file_from_offset + mf.flushed_position
        return self.flushed_where != before

    def close(self) -> None:
        for mf in self.files:
            mf.close()
        self.files = []
