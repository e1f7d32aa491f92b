"""IndexFile: a fixed-size hash index from message keys to commit-log offsets.

The layout (header, hash slots, entries) is `rmq_mp.format.index_layout`'s.

Entry 0 is never used. Chains run newest to oldest, so lookups return newest first. Mirrors
`IndexFile` and `IndexHeader`; `put_hashes` (batch dispatch) writes many keys with the bytes of
one `putKey` at a time; `truncate` is rmq-mp's: after a crash, entries pointing past the
recovered commit log are cut (slots rewound along their chains) instead of destroying the whole
file as RocketMQ does (#3868, #8007).

Disk: the file is sparse at its full length. A writable open reserves the header and slot area
(written at random positions) and entries get blocks in chunks ahead of the entry count
(`mapped_file.reservation_end`), so a full disk is an OSError from a put with nothing written,
never a SIGBUS; an index holding a few keys costs its slot area and a page or so.
"""

from __future__ import annotations

import math
import mmap
import os
from array import array
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rmq_mp import file_modes
from rmq_mp.format import native
from rmq_mp.format.index_layout import (
    ENTRY,
    ENTRY_DTYPE,
    HASH_SLOT_SIZE,
    HEADER,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    SLOT,
    SLOT_DTYPE,
    index_file_size,
)
from rmq_mp.format.message import index_key_hash
from rmq_mp.store.mapped_file import close_mapping, reservation_end, reserve_blocks
from rmq_mp.store.reporter import Reporter

_INT_MAX = 0x7FFFFFFF


def _time_diff(store_timestamp: int, begin_timestamp: int) -> int:
    """An entry's seconds after the file's begin time, as `put_hashes` computes it in numpy
    (float64 division, truncated, clipped to [0, INT_MAX]; 0 before the file has a begin)."""
    if begin_timestamp <= 0:
        return 0
    return int(min(max(math.trunc((store_timestamp - begin_timestamp) / 1000.0), 0), _INT_MAX))


class IndexFile:
    """One index file; header values are cached and written through on every put."""

    def __init__(
        self,
        path: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        writable: bool,
        reporter: Reporter,
        create: bool = False,
        seed_end_phy_offset: int = 0,
        seed_end_timestamp: int = 0,
    ) -> None:
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self.writable = writable
        self.reporter = reporter
        flags = (os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)) if writable else os.O_RDONLY
        fd = os.open(path, flags, file_modes.file_mode())
        self._fd = -1
        """Kept open while writable, for reserving entry blocks."""
        self._reserved_end = 0
        """``[0, _reserved_end)`` has its blocks reserved (header and slots at least, once open)."""
        try:
            actual = os.fstat(fd).st_size
            if create:
                os.ftruncate(fd, self.file_size)  # sparse; the entries reserve as they come
                actual = self.file_size
            elif writable and actual != self.file_size:
                os.ftruncate(fd, self.file_size)
            if writable:  # ENOSPC here, not a SIGBUS in a slot write
                reserve_blocks(fd, 0, self._slots_end())
                self._reserved_end = self._slots_end()
            length = self.file_size if writable else min(actual, self.file_size)
            self._mm: mmap.mmap | None = (
                mmap.mmap(fd, length, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
                if length
                else None
            )
        except BaseException:
            os.close(fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        if writable:
            self._fd = fd
        else:
            os.close(fd)
        self._intact_bytes = actual
        if length >= INDEX_HEADER_SIZE:
            (
                self.begin_timestamp,
                self.end_timestamp,
                self.begin_phy_offset,
                self.end_phy_offset,
                self.hash_slot_count,
                self.index_count,
            ) = HEADER.unpack_from(self._buf, 0)
        else:
            self.begin_timestamp = self.end_timestamp = self.begin_phy_offset = self.end_phy_offset = 0
            self.hash_slot_count = self.index_count = 0
        self._header_count = self.index_count
        """The count the header held when loaded (or last written): `damage` judges it, since a
        garbled one (negative, past maxIndexNum) must not pass as an empty file's."""
        self.index_count = max(self.index_count, 1)
        if writable and self._mm is not None and length >= self._slots_end() and self._count_in_range():
            self._repair_torn_put()
        if create and seed_end_phy_offset > 0:
            self.begin_phy_offset = self.end_phy_offset = seed_end_phy_offset
            self.begin_timestamp = self.end_timestamp = seed_end_timestamp
            self._write_header()

    @property
    def _buf(self) -> bytes:
        return self._mm if self._mm is not None else b""  # type: ignore[return-value]

    def _slot_pos(self, key_hash: int) -> int:
        return INDEX_HEADER_SIZE + key_hash % self.hash_slot_num * HASH_SLOT_SIZE

    def _slots_end(self) -> int:
        return INDEX_HEADER_SIZE + self.hash_slot_num * HASH_SLOT_SIZE

    def _entry_pos(self, n: int) -> int:
        return self._slots_end() + n * INDEX_ENTRY_SIZE

    def _reserve_entries(self, end: int) -> None:
        """Blocks for the entry area up to byte ``end``, a chunk ahead. OSError (ENOSPC) with
        nothing written."""
        if end > self._reserved_end:
            mark = reservation_end(self._reserved_end, end, self.file_size)
            reserve_blocks(self._fd, self._reserved_end, mark)
            self._reserved_end = mark

    def _count_in_range(self) -> bool:
        """The header's count is one a file can hold (0: a header never written)."""
        return 0 <= self._header_count <= self.index_num

    def _write_header(self) -> None:
        if self._mm is not None and self.writable:
            self._header_count = self.index_count
            HEADER.pack_into(
                self._mm,
                0,
                self.begin_timestamp,
                self.end_timestamp,
                self.begin_phy_offset,
                self.end_phy_offset,
                self.hash_slot_count,
                self.index_count,
            )

    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def entry_count(self) -> int:
        """Keys stored (entry 0 is never used)."""
        return self.index_count - 1

    # ------------------------------------------------------------------ write

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """`putKey`: False when the file is full."""
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """`putKey` of a key whose `indexKeyHashMethod` value is ``key_hash``."""
        assert self._mm is not None
        assert self.writable
        if self.index_count >= self.index_num:
            return False
        slot_pos = self._slot_pos(key_hash)
        (slot_value,) = SLOT.unpack_from(self._mm, slot_pos)
        if slot_value <= 0 or slot_value > self.index_count:
            slot_value = 0
        if self.begin_timestamp <= 0:
            time_diff = 0
        else:
            time_diff = min(max(int((store_timestamp - self.begin_timestamp) / 1000), 0), _INT_MAX)
        entry_pos = self._entry_pos(self.index_count)
        if entry_pos + INDEX_ENTRY_SIZE > self._reserved_end:
            self._reserve_entries(entry_pos + INDEX_ENTRY_SIZE)
        ENTRY.pack_into(self._mm, entry_pos, key_hash, phy_offset, time_diff, slot_value)
        SLOT.pack_into(self._mm, slot_pos, self.index_count)
        if self.index_count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        if slot_value == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        self._write_header()
        return True

    def put_hashes(self, key_hash: np.ndarray, phy_offset: np.ndarray, store_timestamp: np.ndarray) -> int:
        """`put_hash` for keys in order, as many as the file takes; returns how many it took.

        The same bytes as one put at a time, the header written once. The entries and slots are
        a compiled loop of `putKey`s (rmq_mp/store/_index.c) or, without it, `_put_entries` in
        numpy; the time differences are computed here for both. Timestamps that could overflow
        int64 arithmetic go one put at a time."""
        assert self._mm is not None
        assert self.writable
        count = min(self.index_num - self.index_count, len(key_hash))
        if count <= 0:
            return 0
        self._reserve_entries(self._entry_pos(self.index_count + count))
        key_hash, phy_offset, store_timestamp = key_hash[:count], phy_offset[:count], store_timestamp[:count]
        first = self.index_count
        begin = self.begin_timestamp if first > 1 else int(store_timestamp[0])
        if max(abs(begin), abs(self.begin_timestamp), int(np.abs(store_timestamp).max())) >= 1 << 61:
            return self._put_one_by_one(key_hash, phy_offset, store_timestamp)
        begins = np.full(count, begin, dtype=np.int64)
        begins[0] = self.begin_timestamp
        diff = np.trunc((store_timestamp - begins) / 1000.0)
        time_diff = np.where(begins <= 0, 0, np.clip(diff, 0, _INT_MAX)).astype(np.int64)
        compiled = native.index.active
        if compiled is not None:
            new_slots = compiled.put_entries(
                self._mm, INDEX_HEADER_SIZE, self.hash_slot_num, self._entry_pos(0), INDEX_ENTRY_SIZE, first,
                np.ascontiguousarray(key_hash, dtype=np.int64), np.ascontiguousarray(phy_offset, dtype=np.int64),
                time_diff,
            )  # fmt: skip
        else:
            new_slots = self._put_entries(key_hash, phy_offset, time_diff, first)
            if new_slots < 0:
                return self._put_one_by_one(key_hash, phy_offset, store_timestamp)
        self._count_put(
            first,
            count,
            new_slots,
            int(phy_offset[0]),
            int(store_timestamp[0]),
            int(phy_offset[-1]),
            int(store_timestamp[-1]),
        )
        return count

    def put_hash_rows(self, key_hash: list[int], phy_offset: list[int], store_timestamp: list[int]) -> int:
        """`put_hashes` of a few keys as Python ints (reput's small passes, where numpy's
        per-call cost was most of the work), the same bytes: the time differences as Python
        floats (numpy's float64 arithmetic), then the compiled entry writes; without them, or
        with timestamps near int64's range, `put_hashes` itself."""
        compiled = native.index.active
        count = min(self.index_num - self.index_count, len(key_hash))
        if count <= 0:
            return 0
        key_hash, phy_offset, store_timestamp = key_hash[:count], phy_offset[:count], store_timestamp[:count]
        first = self.index_count
        begin = self.begin_timestamp if first > 1 else store_timestamp[0]
        if (
            compiled is None
            or max(abs(begin), abs(self.begin_timestamp), max(store_timestamp), -min(store_timestamp))
            >= 1 << 61
        ):
            return self.put_hashes(
                np.array(key_hash, dtype=np.int64),
                np.array(phy_offset, dtype=np.int64),
                np.array(store_timestamp, dtype=np.int64),
            )
        self._reserve_entries(self._entry_pos(first + count))
        time_diff = [_time_diff(store_timestamp[0], self.begin_timestamp)]
        if begin > 0:  # `_time_diff` inline: a call a key was a fifth of the index's work here
            time_diff += [
                int(min(max(math.trunc((t - begin) / 1000.0), 0), _INT_MAX)) for t in store_timestamp[1:]
            ]
        else:
            time_diff += [0] * (count - 1)
        new_slots = compiled.put_entries(
            self._mm, INDEX_HEADER_SIZE, self.hash_slot_num, self._entry_pos(0), INDEX_ENTRY_SIZE, first,
            array("q", key_hash), array("q", phy_offset), array("q", time_diff),
        )  # fmt: skip
        self._count_put(
            first, count, new_slots, phy_offset[0], store_timestamp[0], phy_offset[-1], store_timestamp[-1]
        )
        return count

    def _count_put(
        self,
        first: int,
        count: int,
        new_slots: int,
        first_phy: int,
        first_ts: int,
        last_phy: int,
        last_ts: int,
    ) -> None:
        """The header after ``count`` keys were put from entry ``first``."""
        if first <= 1:
            self.begin_phy_offset = first_phy
            self.begin_timestamp = first_ts
        self.hash_slot_count += new_slots
        self.index_count += count
        self.end_phy_offset = last_phy
        self.end_timestamp = last_ts
        self._write_header()

    def _put_entries(
        self, key_hash: np.ndarray, phy_offset: np.ndarray, time_diff: np.ndarray, first: int
    ) -> int:
        """The entries and slots of `put_hashes` in numpy, each written once: the entries as one
        block, each slot once (its newest entry). Each entry's ``prevIndex`` is the entry before
        it in the same slot: within the block that is the previous key of the slot (a stable sort
        by slot lists them in order), and for a slot's first key the slot's value before the
        block. Returns how many slots were empty, or -1 with nothing written when a slot points
        past the entry count (only a torn put leaves one, repaired at open): the keys then go one
        at a time."""
        assert self._mm is not None
        count = len(key_hash)
        slots = key_hash % self.hash_slot_num
        slot_table = np.frombuffer(
            self._mm, dtype=SLOT_DTYPE, count=self.hash_slot_num, offset=INDEX_HEADER_SIZE
        )
        try:
            before = slot_table[slots].astype(np.int64)
        finally:
            del slot_table
        if bool((before > first).any()):
            return -1
        before[before < 0] = 0
        slot_table = np.frombuffer(
            self._mm, dtype=SLOT_DTYPE, count=self.hash_slot_num, offset=INDEX_HEADER_SIZE
        )
        try:
            numbers = first + np.arange(count, dtype=np.int64)
            # Stable order by slot: the keys' positions break ties, so a plain (vectorised) sort
            # of unique composites does it, about half the time of a stable argsort (measured).
            shift = count.bit_length()
            order = np.sort((slots << shift) | np.arange(count, dtype=np.int64)) & ((1 << shift) - 1)
            sorted_slots = slots[order]
            starts_group = np.ones(count, dtype=bool)
            starts_group[1:] = sorted_slots[1:] != sorted_slots[:-1]
            prev_sorted = np.empty(count, dtype=np.int64)
            prev_sorted[starts_group] = before[order][starts_group]
            prev_sorted[1:][~starts_group[1:]] = numbers[order][:-1][~starts_group[1:]]
            prev = np.empty(count, dtype=np.int64)
            prev[order] = prev_sorted
            new_slots = int(np.count_nonzero(prev_sorted[starts_group] == 0))
            ends_group = np.ones(count, dtype=bool)
            ends_group[:-1] = starts_group[1:]
            # Entries first, then slots, then the header: the order `putKey` writes in, so a
            # crash in between leaves what `_repair_torn_put` recognises.
            entries = np.empty(count, dtype=ENTRY_DTYPE)
            entries["hash"] = key_hash
            entries["phy"] = phy_offset
            entries["time_diff"] = time_diff
            entries["prev"] = prev
            start = self._entry_pos(first)
            self._mm[start : start + count * INDEX_ENTRY_SIZE] = entries.tobytes()
            slot_table[sorted_slots[ends_group]] = numbers[order][ends_group]
        finally:
            del slot_table
        return new_slots

    def _put_one_by_one(
        self, key_hash: np.ndarray, phy_offset: np.ndarray, store_timestamp: np.ndarray
    ) -> int:
        for h, phy, ts in zip(key_hash.tolist(), phy_offset.tolist(), store_timestamp.tolist(), strict=True):
            if not self.put_hash(h, phy, ts):
                raise AssertionError("put_hashes takes no more keys than the file has room for")
        return len(key_hash)

    # ------------------------------------------------------------------ read

    def is_time_matched(self, begin: int, end: int) -> bool:
        """`isTimeMatched`: the file's [begin, end] timestamps overlap the query's."""
        return (
            (begin < self.begin_timestamp and end > self.end_timestamp)
            or self.begin_timestamp <= begin <= self.end_timestamp
            or self.begin_timestamp <= end <= self.end_timestamp
        )

    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """Offsets of entries whose hash equals ``key``'s within [begin, end], newest first.
        Candidates only: different keys can share a hash, callers verify the record."""
        return self.select_by_hash(index_key_hash(key), max_num, begin, end)

    def select_by_hash(self, key_hash: int, max_num: int, begin: int, end: int) -> list[int]:
        """`select_phy_offsets` of a key given by its `indexKeyHashMethod` value."""
        buf = self._buf
        slot_pos = self._slot_pos(key_hash)
        if slot_pos + HASH_SLOT_SIZE > len(buf) or self.index_count <= 1:
            return []
        (current,) = SLOT.unpack_from(buf, slot_pos)
        found: list[int] = []
        for _ in range(self.index_count):  # bound: a corrupt chain can never loop forever
            if current <= 0 or current >= self.index_count or len(found) >= max_num:
                break
            pos = self._entry_pos(current)
            if pos + INDEX_ENTRY_SIZE > len(buf):
                break
            hash_read, phy, time_diff, prev = ENTRY.unpack_from(buf, pos)
            if time_diff < 0:
                break
            time_read = self.begin_timestamp + time_diff * 1000
            if hash_read == key_hash and begin <= time_read <= end:
                found.append(phy)
            if prev <= 0 or prev > self.index_count or prev == current or time_read < begin:
                break
            current = prev
        return found

    def entries(self) -> list[tuple[int, int, int, int]]:
        """Every stored entry (keyHash, phyOffset, timeDiff, prevIndex), oldest first."""
        return [ENTRY.unpack_from(self._buf, self._entry_pos(n)) for n in range(1, self.index_count)]

    # ------------------------------------------------------------------ recovery

    def is_intact(self) -> bool:
        """The file had all its bytes when opened (not cut by a crash or a full disk)."""
        return self._intact_bytes >= self.file_size

    def in_order(self) -> bool:
        """Entries point at non-decreasing commit-log offsets, as dispatch writes them."""
        if self._mm is None or self.index_count <= 2:
            return True
        entries = np.frombuffer(
            self._mm, dtype=ENTRY_DTYPE, count=self.index_count - 1, offset=self._entry_pos(1)
        )
        try:
            phys = entries["phy"]
            return bool((phys[1:] >= phys[:-1]).all())
        finally:
            del entries, phys

    def damage(self) -> str | None:
        """Why this file's entries cannot be trusted, None if they can. A full structural check
        of the entries wholly on disk: the header's count and offsets, each entry's hash, offset
        and time, and every hash chain (each entry reached exactly once, from its slot or from the
        next newer entry of its slot). A flipped byte almost always breaks one of these; the
        keys it would lose are re-keyed from the commit log instead (`IndexService.remove_damaged`)."""
        if self._mm is None or len(self._mm) < self._slots_end():
            return None  # cut inside the slot table: `IndexService.recover` removes it
        count = min(self.index_count, max(1, self.intact_entry_limit()))
        if not self._count_in_range() or not 1 <= self.index_count <= self.index_num:
            return f"header entry count {self._header_count} outside [1, {self.index_num}]"
        if self.begin_phy_offset > self.end_phy_offset or self.begin_phy_offset < 0:
            return f"header offsets [{self.begin_phy_offset}, {self.end_phy_offset}] out of order"
        if count <= 1:
            return None
        entries = np.frombuffer(self._mm, dtype=ENTRY_DTYPE, count=count - 1, offset=self._entry_pos(1))
        slots = np.frombuffer(self._mm, dtype=SLOT_DTYPE, count=self.hash_slot_num, offset=INDEX_HEADER_SIZE)
        try:
            key_hash = entries["hash"].astype(np.int64)
            phy = entries["phy"].astype(np.int64)
            prev = entries["prev"].astype(np.int64)
            time_diff = entries["time_diff"]
            heads = slots.astype(np.int64)
        finally:
            del entries, slots
        number = np.arange(1, count, dtype=np.int64)
        if (key_hash < 0).any() or (time_diff < 0).any():
            return "negative key hash or time"
        if (prev < 0).any() or (prev >= number).any():
            return "an entry links to itself or a newer entry"
        if (
            (phy < self.begin_phy_offset).any()
            or (phy > self.end_phy_offset).any()
            or (phy[1:] < phy[:-1]).any()
        ):
            return "entry offsets outside the header's range or out of order"
        if (heads < 0).any() or (heads >= max(count, self.index_count)).any():
            return "a hash slot points past the entries"
        slot_of = key_hash % self.hash_slot_num
        used = np.flatnonzero(heads)
        linked = prev > 0
        heads_in = heads[used][heads[used] < count]
        if (slot_of[heads_in - 1] != used[heads[used] < count]).any():
            return "a hash slot points at an entry of another slot"
        if (slot_of[prev[linked] - 1] != slot_of[linked]).any():
            return "a hash chain links entries of different slots"
        reached = np.bincount(np.concatenate((heads_in, prev[linked])), minlength=count)[1:count]
        if count == self.index_count and (reached != 1).any():
            return "a hash chain loses or repeats entries"
        return None

    def intact_entry_limit(self) -> int:
        """Entries wholly inside the bytes the file really had (a cut file loses its tail)."""
        return max(0, (self._intact_bytes - self._slots_end()) // INDEX_ENTRY_SIZE)

    def truncate(self, valid_phy_end: int, store_time_of: Callable[[int], int]) -> int:
        """Keep entries below ``valid_phy_end`` that were wholly on disk; rewind slots; returns
        the number dropped. ``store_time_of(phy)`` restores the exact end timestamp."""
        assert self.writable
        assert self._mm is not None
        limit = min(self.index_count, max(1, self.intact_entry_limit()))
        if limit == self.index_count and self.end_phy_offset < valid_phy_end:
            return 0  # the common case: nothing cut, nothing beyond the end
        entries = np.frombuffer(self._mm, dtype=ENTRY_DTYPE, count=limit - 1, offset=self._entry_pos(1))
        try:
            beyond = np.flatnonzero(entries["phy"] >= valid_phy_end)
        finally:
            del entries
        new_count = int(beyond[0]) + 1 if beyond.size else limit
        dropped = self.index_count - new_count
        if dropped <= 0:
            return 0
        start = self._entry_pos(new_count)
        stop = self._entry_pos(self.index_count)
        reserve_blocks(self._fd, start, stop)  # a cut or sparse file may have holes there
        self._mm[start:stop] = bytes(stop - start)
        self._rebuild_slots(new_count)
        self.index_count = new_count
        if new_count > 1:
            _h, phy, _t, _p = ENTRY.unpack_from(self._mm, self._entry_pos(new_count - 1))
            self.end_phy_offset = phy
            self.end_timestamp = max(store_time_of(phy), self.begin_timestamp)
        else:
            self.end_phy_offset, self.end_timestamp = self.begin_phy_offset, self.begin_timestamp
        self._write_header()
        self.reporter.report(
            "index-entries-truncated",
            str(self.path),
            new_count,
            new_count + dropped,
            f"entries beyond commit-log end {valid_phy_end} or beyond the file's bytes",
        )
        return dropped

    def _repair_torn_put(self) -> None:
        """`putKey` writes the entry, then its slot, then the header's count. A process killed
        between the last two leaves a slot pointing at an entry the header does not count; the next
        put would link to it as its own predecessor (a loop that cuts the older chain off). Such a
        slot is the mark of a torn put: rebuild the slots from the counted entries."""
        assert self._mm is not None
        slots = np.frombuffer(self._mm, dtype=SLOT_DTYPE, count=self.hash_slot_num, offset=INDEX_HEADER_SIZE)
        try:
            torn = int(np.count_nonzero(slots >= self.index_count))
        finally:
            del slots
        if torn:
            self._rebuild_slots(self.index_count)
            self._write_header()
            self.reporter.report(
                "index-torn-put-repaired",
                str(self.path),
                self.index_count,
                self.index_count + 1,
                f"{torn} slot(s) pointed past the entry count; slots rebuilt",
            )

    def _rebuild_slots(self, entry_count: int) -> None:
        """Point every slot at its newest surviving entry. Dropped entries may be unreadable (a
        cut file), so slots are recomputed from the survivors, whose ``prev`` links only point
        to older entries and so stay intact."""
        assert self._mm is not None
        survivors = np.frombuffer(
            self._mm, dtype=ENTRY_DTYPE, count=entry_count - 1, offset=self._entry_pos(1)
        )
        heads = np.zeros(self.hash_slot_num, dtype=np.int64)
        try:
            np.maximum.at(
                heads,
                survivors["hash"].astype(np.int64) % self.hash_slot_num,
                np.arange(1, entry_count, dtype=np.int64),
            )
        finally:
            del survivors
        self._mm[INDEX_HEADER_SIZE : self._slots_end()] = heads.astype(SLOT_DTYPE).tobytes()
        self.hash_slot_count = int(np.count_nonzero(heads))

    def flush(self) -> None:
        if self._mm is not None and self.writable:
            self._mm.flush()

    def close(self) -> None:
        if self._mm is not None:
            close_mapping(self._mm)
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
