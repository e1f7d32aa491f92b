"""StoreCheckpoint: the 4 KiB `checkpoint` file of durable progress timestamps.

Mirrors `StoreCheckpoint` (docs/format.md §6): big-endian longs physicMsgTimestamp @0,
logicsMsgTimestamp @8, indexMsgTimestamp @16; the rest of the page is kept as found (RocketMQ 5.x
adds fields at 24 and 32). Abnormal recovery starts from the newest commit-log file whose first
record is older than ``min_timestamp()``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from rmq_mp import file_modes

CHECKPOINT_FILE_SIZE = 4096
_FIELDS = struct.Struct(">qqq")


class StoreCheckpoint:
    """Read at open; `flush()` writes the three timestamps and fsyncs."""

    def __init__(self, path: Path, *, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        if path.exists():
            data = path.read_bytes()
            if len(data) >= _FIELDS.size:
                self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = (
                    _FIELDS.unpack_from(data, 0)
                )

    def min_timestamp(self) -> int:
        """`getMinTimestamp`: a safe store time to restart dispatch from (3 s of slack)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def flush(self) -> None:
        """Write the fields in place (the file is created at its full 4 KiB) and fsync."""
        if not self.writable:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, file_modes.file_mode())
        try:
            if os.fstat(fd).st_size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            os.pwrite(
                fd,
                _FIELDS.pack(self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp),
                0,
            )
            os.fdatasync(fd)
        finally:
            os.close(fd)
