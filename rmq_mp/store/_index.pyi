"""Types of the compiled index writes (rmq_mp/store/_index.c)."""

from typing import Any

def put_entries(
    mm: Any,
    slots_at: int,
    hash_slot_num: int,
    entries_at: int,
    entry_size: int,
    first: int,
    key_hash: Any,
    phy_offset: Any,
    time_diff: Any,
    /,
) -> int: ...
