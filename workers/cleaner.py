"""Cleaner: deletes expired CommitLog files (the basic rules of CleanCommitLogService).

Mirrors the core of `CleanCommitLogService.deleteExpiredFiles` (rocketmq-format.md §10.3): every
`cleanResourceInterval` ms, when the hour is one of `deleteWhen` or the commit-log disk is more
than `diskMaxUsedSpaceRatio` % used, delete files whose last modification is older than
`fileReservedTime` hours, oldest first, at most 10 a run, `deleteCommitLogFilesInterval` ms
apart, stopping at the first unexpired file and never touching the file being written. Writes
MIN_OFFSET (its single writer while running). The forcible, disk-full and consume-queue rules
are their own issue. Final pass: nothing.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from datetime import datetime

from rmq_mp.mapped_file import offset_to_file_name
from shm import layout
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.cleaner")
DELETE_FILES_BATCH_MAX = 10


def disk_used_ratio(path: str) -> float:
    """`UtilAll.getDiskPartitionSpaceUsedPercent`: used / (used + available), rounded up to 1 %."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    return math.ceil(used * 100 / entire) / 100 if entire else -1.0


class CleanerService(ServiceLoop):
    role = "cleaner"

    def interval_s(self) -> float:
        return self.store.config.clean_resource_interval / 1000

    def triggered(self) -> str:
        cfg = self.store.config
        if datetime.now().hour in cfg.delete_when_hours:
            return f"deleteWhen hour {datetime.now().hour}"
        ratio = disk_used_ratio(str(self.store.paths.commit_log))
        if ratio < 0 or ratio > cfg.disk_max_used_space_ratio / 100:
            return f"disk {ratio:.0%} used > diskMaxUsedSpaceRatio {cfg.disk_max_used_space_ratio}%"
        return ""

    def do_work(self) -> None:
        reason = self.triggered()
        if reason:
            self.delete_expired(reason)

    def delete_expired(self, reason: str) -> int:
        cfg = self.store.config
        size = cfg.mapped_file_size_commit_log
        wrote = self.table.get(layout.WROTE_POSITION)
        current = wrote - wrote % size
        expired_before = time.time() - cfg.file_reserved_time * 3600
        deleted = 0
        offset = self.table.get(layout.MIN_OFFSET)
        while offset < current and deleted < DELETE_FILES_BATCH_MAX:
            path = self.store.paths.commit_log / offset_to_file_name(offset)
            try:
                if path.stat().st_mtime > expired_before:
                    break
                path.unlink()
            except FileNotFoundError:
                pass
            offset += size
            deleted += 1
            self.table.set(layout.MIN_OFFSET, offset)
            log.info("deleted expired commit-log file %s (%s)", path.name, reason)
            time.sleep(cfg.delete_commit_log_files_interval / 1000)
        return deleted


if __name__ == "__main__":
    sys.exit(main(CleanerService))
