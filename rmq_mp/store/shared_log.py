"""SharedCommitLog: one process's view of a running store's CommitLog.

Every process of a running store (producers, committer, flusher, reput, consumers) maps the
same segment files; the positions that RocketMQ keeps in MappedFile fields live in the pointer
table instead (wrote under the put lock, committed by the committer, flushed by the flusher), and
`sync_positions` copies them onto this view's MappedFile objects before use. Appending goes
through `CommitLog.append_to`, the same code as the library writer.
"""

from __future__ import annotations

from pathlib import Path

from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.mapped_file import MappedFile
from rmq_mp.store.reporter import Reporter


class SharedCommitLog(CommitLog):
    def __init__(
        self, store_dir: Path, mapped_file_size: int, *, writable: bool, delay_level_ms: list[int]
    ) -> None:
        super().__init__(
            store_dir, mapped_file_size, writable=writable, reporter=Reporter(), delay_level_ms=delay_level_ms
        )

    def file_at(self, phy_offset: int) -> MappedFile:
        """The segment holding ``phy_offset`` (mapped on first use)."""
        return self.mfq.ensure_file(phy_offset - phy_offset % self.mapped_file_size)

    def release_before(self, phy_offset: int) -> None:
        """Unmap segments wholly below ``phy_offset``, which this process no longer needs: each
        process maps only the part of the log it works on, since a mapping pins the disk space
        of a file the cleaner deleted."""
        self.mfq.drop_files_before(phy_offset)

    def sync_positions(self, *, min_offset: int, readable_end: int) -> None:
        """Make this view readable over ``[min_offset, readable_end)``: map new segments, drop
        deleted ones, and set each segment's read position."""
        self.mfq.drop_files_before(min_offset)
        if readable_end > min_offset:
            self.mfq.ensure_range(min_offset, readable_end - 1)
        for mf in self.mfq.files:
            end = readable_end - mf.file_from_offset
            position = max(0, min(end, mf.file_size))
            mf.committed_position = position
            if not mf.writable or mf.write_buffer is None:
                mf.wrote_position = max(mf.wrote_position, position)
