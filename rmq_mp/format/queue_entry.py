"""The ConsumeQueue entry: 20 bytes per message of a topic/queue (docs/format.md §4.1).

Big-endian, entry N at byte N*20 of the queue's files:

    off size field
      0    8 commit-log phy offset (long)
      8    4 record total size (int)
     12    8 tags code (long): Java hash of TAGS, or delivery time for delayed messages

A queue that starts above offset 0 has its first file padded with pre-blank entries
``(0, Integer.MAX_VALUE, 0)`` (`fillPreBlank`). The one definition of these bytes: the
ConsumeQueue files, recovery, reput, the readers, the tools and Spark all use it.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

CQ_STORE_UNIT_SIZE: Final = 20
"""Bytes per entry (`ConsumeQueue.CQ_STORE_UNIT_SIZE`)."""
PRE_BLANK_SIZE: Final = 0x7FFFFFFF
"""The size field of a pre-blank entry (`Integer.MAX_VALUE`)."""
CQ_ENTRY = struct.Struct(">qiq")
"""One entry: phy offset, size, tags code."""
CQ_ENTRY_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
"""The same entry as a numpy record, for reading many at once."""
TAGS_CODE = struct.Struct(">q")
TAGS_CODE_POSITION: Final = 12
"""Where the tags code lies in an entry (a delayed message's delivery time)."""
PRE_BLANK_ENTRY: Final = CQ_ENTRY.pack(0, PRE_BLANK_SIZE, 0)


def entry_position(queue_offset: int) -> int:
    """Byte position of entry ``queue_offset`` in the queue (its files are named by these)."""
    return queue_offset * CQ_STORE_UNIT_SIZE


def entries_in(byte_length: int) -> int:
    """Whole entries in ``byte_length`` bytes."""
    return byte_length // CQ_STORE_UNIT_SIZE


def effective_file_size(configured: int) -> int:
    """`getMappedFileSizeConsumeQueue`: a file size rounded up to a whole number of entries."""
    return -(-configured // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


def tags_code_of(entry: bytes) -> int:
    """The tags code of one entry's bytes."""
    return int(TAGS_CODE.unpack_from(entry, TAGS_CODE_POSITION)[0])
