"""The IndexFile's bytes: header, hash slots and entries (docs/format.md §5.1).

Big-endian:

    header, 40 bytes: beginTimestamp:long endTimestamp:long beginPhyOffset:long
                      endPhyOffset:long hashSlotCount:int indexCount:int (starts at 1)
    hash slots:       hashSlotNum ints at 40 + slot*4 = number of the newest entry (0 = empty)
    entries:          indexNum x 20 bytes at 40 + hashSlotNum*4 + n*20:
                      keyHash:int phyOffset:long timeDiff:int (seconds since beginTimestamp)
                      prevIndex:int (older entry of the same slot, 0 = end of chain)

The one definition of these bytes: the index files, the index service, the settings (which size
a file of given slots and entries has) and the tools use it.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

INDEX_HEADER_SIZE: Final = 40
HASH_SLOT_SIZE: Final = 4
INDEX_ENTRY_SIZE: Final = 20
HEADER = struct.Struct(">qqqqii")
"""beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount."""
ENTRY = struct.Struct(">iqii")
"""keyHash, phyOffset, timeDiff, prevIndex."""
SLOT = struct.Struct(">i")
SLOT_DTYPE = np.dtype(">i4")
"""The hash slots as a numpy array."""
ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")])


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of an index file of ``hash_slot_num`` slots and ``index_num`` entries."""
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def slots_and_entries(file_length: int, *, slots: int = 0, entries: int = 0) -> tuple[int, int] | None:
    """(slots, entries) of a file of ``file_length`` bytes, given one of the two (or neither:
    RocketMQ's default ratio of 4 entries a slot), or None when the length does not fit."""
    body = file_length - INDEX_HEADER_SIZE
    if slots > 0:
        entries = (body - HASH_SLOT_SIZE * slots) // INDEX_ENTRY_SIZE
    elif entries > 0:
        slots = (body - INDEX_ENTRY_SIZE * entries) // HASH_SLOT_SIZE
    else:
        slots = body // (HASH_SLOT_SIZE + 4 * INDEX_ENTRY_SIZE)
        entries = 4 * slots
    if slots > 0 and entries > 0 and index_file_size(slots, entries) == file_length:
        return slots, entries
    return None


def header_end_phy_offset(header: bytes) -> int:
    """endPhyOffset from a file's first INDEX_HEADER_SIZE bytes."""
    return int(HEADER.unpack_from(header, 0)[3])
