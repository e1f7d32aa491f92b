"""ConsumeQueue: per topic/queue index of entries into the CommitLog.

The entry's bytes (phy offset, size, tags code; pre-blank entries) are
`rmq_mp.format.queue_entry`'s. Mirrors `ConsumeQueue` (§4.2-§4.5, §8.4);
`put_position_infos` (batch dispatch) appends many entries with the bytes of one
`putMessagePositionInfo` at a time, in one copy per file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rmq_mp.errors import ConfigError, CorruptFileError
from rmq_mp.format import record
from rmq_mp.format.queue_entry import (
    CQ_ENTRY,
    CQ_ENTRY_DTYPE,
    CQ_STORE_UNIT_SIZE,
    PRE_BLANK_ENTRY,
    PRE_BLANK_SIZE,
)
from rmq_mp.store.mapped_file import MappedFile, offset_to_file_name
from rmq_mp.store.mapped_file_queue import MappedFileQueue
from rmq_mp.store.mapping_pool import MappingPool, process_pool
from rmq_mp.store.reporter import Reporter

if TYPE_CHECKING:
    from rmq_mp.store.commit_log import CommitLog

log = logging.getLogger(__name__)


_HUGE = 1 << 62


def _entries(phy_offset: np.ndarray, size: np.ndarray, tags_code: np.ndarray) -> bytes:
    """ConsumeQueue entries of these columns, packed."""
    entries = np.empty(len(phy_offset), dtype=CQ_ENTRY_DTYPE)
    entries["phy"] = phy_offset
    entries["size"] = size
    entries["tags"] = tags_code
    return entries.tobytes()


def _one_run(phy_offset: list[int], size: list[int], queue_offset: list[int]) -> bool:
    """Each entry at the next queue offset, each record ending above the one before."""
    return all(
        queue_offset[k] - queue_offset[k - 1] == 1
        and phy_offset[k] + size[k] > phy_offset[k - 1] + size[k - 1]
        for k in range(1, len(phy_offset))
    )


def _first_above(values: np.ndarray, start: int, bound: int) -> int:
    """First index from ``start`` whose value exceeds ``bound`` (len if none), looking at
    windows that double in size, so a long run costs one pass and a short one little."""
    step = 64
    while start < len(values):
        above = values[start : start + step] > bound
        if above.any():
            return start + int(np.argmax(above))
        start += step
        step *= 2
    return len(values)


def _agree_after(
    agree: Callable[[np.ndarray, np.ndarray, np.ndarray], int],
    prev_entry: tuple[int, int, int] | None,
    phy: np.ndarray,
    size: np.ndarray,
    queue_offset: np.ndarray,
) -> int:
    """``agree`` of a file's checked entries, the previous file's last entry put before them when
    they start at the file's first: a damaged record at a file's first entry then has a known
    boundary before it and its entry is kept (a read skips it), where alone it was cut and the
    queue's next put took its queue offset again. If that previous entry itself does not agree
    now (an entry kept for its damaged record), the file's entries are asked alone, as before."""
    if prev_entry is not None:
        prev_phy, prev_size, prev_queue_offset = prev_entry
        wrong = agree(np.insert(phy, 0, prev_phy), np.insert(size, 0, prev_size),
                      np.insert(queue_offset, 0, prev_queue_offset))  # fmt: skip
        if wrong > 0:
            return wrong - 1
    return agree(phy, size, queue_offset)


def _first_last(real: np.ndarray) -> np.ndarray:
    """Mask of the first and last True of ``real``."""
    mask = np.zeros(len(real), dtype=bool)
    found = np.flatnonzero(real)
    if len(found):
        mask[found[0]] = mask[found[-1]] = True
    return mask


def _valid_entry_count(mf: MappedFile, limit: int) -> tuple[int, int]:
    """(entries before the first invalid one within ``limit`` bytes, phy end of the last valid).
    Entries are written from the file's start, so none lies past its last data block: the scan
    stops there instead of reading (and faulting in) megabytes of holes of a sparse file."""
    ranges = mf.data_ranges(0, min(limit, len(mf.buf)))
    count = (ranges[-1][1] if ranges else 0) // CQ_STORE_UNIT_SIZE
    if count == 0:
        return 0, -1
    entries = np.frombuffer(mf.buf, dtype=CQ_ENTRY_DTYPE, count=count)
    try:
        bad = np.flatnonzero((entries["phy"] < 0) | (entries["size"] <= 0))
        valid = int(bad[0]) if bad.size else count
        real = np.flatnonzero(entries["size"][:valid] != PRE_BLANK_SIZE)  # a pre-blank has no end
        end = int(entries["phy"][real[-1]]) + int(entries["size"][real[-1]]) if real.size else -1
    finally:
        del entries
    return valid, end


class ConsumeQueue:
    """One queue's entries under ``root/<topic>/<queue_id>/``."""

    def __init__(
        self,
        topic: str,
        queue_id: int,
        root: Path,
        mapped_file_size: int,
        *,
        writable: bool,
        reporter: Reporter,
        pool: MappingPool | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = mapped_file_size
        self.mfq = MappedFileQueue(
            root / topic / str(queue_id), mapped_file_size, writable=writable, reporter=reporter, pool=pool,
            pwrite_min_bytes=0,
        )  # fmt: skip
        # Entries go in by pwrite: a store through a mapping into a file's first fresh page costs
        # 2-5 ms here (page_mkwrite with an inode update), into a remapped or just-flushed page
        # 17-29 us; pwrite costs 3-5 us either way (bench/NOTES.md, 2026-11-25 scale).
        self.reporter = reporter
        self.max_physic_offset = -1
        """End (phy offset + size) of the last entry written; duplicate dispatch stops below it."""
        self.min_logic_offset = 0
        """Byte position of the first entry still served."""
        self.gap_seen = False
        """Set when dispatch met an entry not at the queue's next offset: records are missing
        before it (recovery rebuilds such a queue from the log's beginning)."""

    def load(self, names: list[str] | None = None) -> None:
        self.mfq.load(names)

    def close(self) -> None:
        self.mfq.close()

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Keep entries up to the first invalid one, from the third-last file (§8.4): where a
        running reput restarts. Startup recovery checks the whole queue (`check`) instead."""
        files = self.mfq.files
        if not files:
            return
        index = max(0, len(files) - 3)
        process_offset = files[index].file_from_offset
        for mf in files[index:]:
            valid, end = _valid_entry_count(mf, mf.read_position)
            process_offset = mf.file_from_offset + valid * CQ_STORE_UNIT_SIZE
            if end >= 0:
                self.max_physic_offset = end
            if valid * CQ_STORE_UNIT_SIZE < self.mapped_file_size:
                break
        self._cut(process_offset, "invalid entry; everything after it dropped")

    def check(
        self, agree: Callable[[np.ndarray, np.ndarray, np.ndarray], int], verify_from_phy: int
    ) -> int | None:
        """Startup recovery of the whole queue: keep the entries before the first damaged one and
        say where the commit log must be re-dispatched from to rebuild the rest; None if whole.

        An entry is damaged when it is unwritten or invalid inside the queue's data (a non-last
        file must be full), when it does not lie after the record of the last entry before it
        that is not a pre-blank (leading pre-blanks, and holes where dispatch stepped over a
        damaged record, `_fill_holes`) (then the predecessor is suspect too and goes with it), or
        when ``agree`` (the commit log's header check, `CommitLog.first_disagreeing`) finds its
        record is not this queue's at this queue offset. ``agree`` is asked of each file's first
        and last entries and of every entry at or above ``verify_from_phy`` (the files recovery
        reads anyway): checking every entry would read every record header of the log at every
        start. Entries pointing past the log's end are left to `truncate_dirty_logic_files`.
        Returns the end of the last kept entry (0: none kept), from which dispatch rebuilds the
        queue: it appends only above a queue's last entry, so other queues take no harm."""
        files = self.mfq.files
        prev_end = -1
        prev_entry: tuple[int, int, int] | None = None
        """The previous file's last entry (phy, size, queue offset) when it is a record's: the known
        boundary `agree` needs before this file's first entry (else it cuts there)."""
        self.max_physic_offset = -1
        for file_index, mf in enumerate(files):
            last_file = file_index == len(files) - 1
            count = self.mapped_file_size // CQ_STORE_UNIT_SIZE
            if last_file:
                ranges = mf.data_ranges(0, min(mf.read_position, len(mf.buf)))
                count = (ranges[-1][1] if ranges else 0) // CQ_STORE_UNIT_SIZE
            entries = np.frombuffer(mf.buf, dtype=CQ_ENTRY_DTYPE, count=count)
            try:
                phy = entries["phy"].astype(np.int64)
                size = entries["size"].astype(np.int64)
                tags = entries["tags"].astype(np.int64)
            finally:
                del entries
            blank = (size == PRE_BLANK_SIZE) & (phy == 0) & (tags == 0)
            real = (phy >= 0) & (size > 0) & (size < PRE_BLANK_SIZE)
            lead = (int(np.argmin(blank)) if not blank.all() else count) if file_index == 0 else 0
            ok = real | blank  # pre-blanks: the queue's leading entries, and holes (`_fill_holes`)
            ends = np.where(blank, -1, phy + size)
            prior = np.maximum.accumulate(np.concatenate(([prev_end], ends[:-1]))) if count else ends
            after_prior = blank | (phy >= prior)  # each record after the last record before it
            good = ok & after_prior
            bad = np.flatnonzero(~good)
            cut = int(bad[0]) if bad.size else count
            reason = ""
            if cut < count:
                if not ok[cut]:
                    reason = "unwritten or invalid entry"
                    if (
                        not bool(phy[cut] | size[cut] | tags[cut])
                        and last_file
                        and not (phy[cut:].any() or size[cut:].any() or tags[cut:].any())
                    ):
                        reason = ""  # the end of the queue's data, not damage
                else:
                    reason = "entry overlaps its predecessor's record"
                    cut = max(lead, cut - 1)  # either may be the damaged one
            checked = np.flatnonzero(real[:cut] & ((phy[:cut] >= verify_from_phy) | _first_last(real[:cut])))
            if len(checked):
                queue_offsets = mf.file_from_offset // CQ_STORE_UNIT_SIZE + checked
                before = prev_entry if checked[0] == 0 else None
                wrong = _agree_after(agree, before, phy[checked], size[checked], queue_offsets)
                if wrong < len(checked) and int(checked[wrong]) < cut:
                    cut, reason = int(checked[wrong]), "entry does not match its commit-log record"
            kept = np.flatnonzero(real[:cut])
            if len(kept):
                prev_end = int(ends[kept[-1]])
                self.max_physic_offset = prev_end
            if reason:
                self._cut(mf.file_from_offset + cut * CQ_STORE_UNIT_SIZE, reason)
                return max(prev_end, 0)
            if last_file:  # its data ends here: the write position
                self.mfq.truncate_dirty_files(mf.file_from_offset + cut * CQ_STORE_UNIT_SIZE)
            elif count:
                last = count - 1
                queue_offset = mf.file_from_offset // CQ_STORE_UNIT_SIZE + last
                prev_entry = (int(phy[last]), int(size[last]), queue_offset) if real[last] else None
        return None

    def _cut(self, process_offset: int, reason: str) -> None:
        """Truncate at byte ``process_offset``, reporting any non-zero bytes dropped."""
        garbage_end = self.mfq.last_nonzero(process_offset)
        if garbage_end > process_offset:
            self.reporter.report(
                "cq-entries-dropped", str(self.mfq.store_dir), process_offset, garbage_end, reason
            )
        self.mfq.truncate_dirty_files(process_offset)

    def truncate_dirty_logic_files(self, phy_offset: int) -> int:
        """Drop entries that point at or beyond ``phy_offset`` (the recovered commit-log end).

        Returns how many entries were dropped."""
        dropped = 0
        self.max_physic_offset = -1
        while self.mfq.files:
            mf = self.mfq.files[-1]
            valid, _ = _valid_entry_count(mf, mf.wrote_position)
            keep = 0
            buf = mf.buf  # once: a pooled file's look-up takes the pool's lock
            while keep < valid:
                phy, size, _tags = CQ_ENTRY.unpack_from(buf, keep * CQ_STORE_UNIT_SIZE)
                if phy + (0 if size == PRE_BLANK_SIZE else size) > phy_offset:
                    break
                keep += 1
            dropped += valid - keep
            if keep == 0:
                self.mfq.delete_last_file()
                continue
            cut = keep * CQ_STORE_UNIT_SIZE
            mf.set_positions(cut)
            if self.mfq.writable:
                mf.zero_tail(cut)
            _, self.max_physic_offset = _valid_entry_count(mf, cut)  # the last kept record's end
            break
        if dropped:
            self.reporter.report(
                "cq-entries-truncated",
                str(self.mfq.store_dir),
                0,
                dropped,
                f"entries pointing at or beyond commit-log end {phy_offset}",
            )
        return dropped

    def destroy_files(self) -> None:
        """Remove every file: the queue is empty until dispatch rebuilds it."""
        while self.mfq.files:
            self.mfq.delete_last_file()
        self.mfq.flushed_where = self.mfq.committed_where = 0
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    def correct_min_offset(self, min_phy_offset: int) -> None:
        """First entry of the first file that still points into the commit log (pre-blanks skipped)."""
        first = self.mfq.first_file()
        if first is None:
            return
        valid, _ = _valid_entry_count(first, first.read_position)
        for i in range(valid):
            phy, size, _tags = CQ_ENTRY.unpack_from(first.buf, i * CQ_STORE_UNIT_SIZE)
            if size != PRE_BLANK_SIZE and phy >= min_phy_offset:
                self.min_logic_offset = max(
                    self.min_logic_offset, first.file_from_offset + i * CQ_STORE_UNIT_SIZE
                )
                return

    # ------------------------------------------------------------------ write

    def put_message_position_info(
        self, *, phy_offset: int, size: int, tags_code: int, queue_offset: int
    ) -> bool:
        """Append the entry for ``queue_offset``; idempotent under re-dispatch (§4.3). Raises
        OSError (ENOSPC) when the disk refuses the blocks, with nothing of this entry written,
        so the same dispatch can be retried."""
        if phy_offset + size <= self.max_physic_offset:
            return True
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        was_empty = not self.mfq.files
        mf = self.mfq.get_last_mapped_file(expect)
        if mf is None:
            return False
        if was_empty and queue_offset != 0 and mf.wrote_position == 0:
            self.gap_seen = True
            try:  # the pre-blanks and the entry reserved at once: all written or none
                mf.reserve(expect % self.mapped_file_size + CQ_STORE_UNIT_SIZE)
            except OSError:
                self.mfq.delete_last_file()  # a retry starts from an empty queue again
                raise
            self.min_logic_offset = expect
            self.mfq.flushed_where = self.mfq.committed_where = expect
            self._fill_pre_blank(mf, expect)
        if queue_offset != 0:
            current = mf.file_from_offset + mf.wrote_position
            if expect < current:
                self.gap_seen = True
                return True
            if expect != current:
                self.gap_seen = True
                filled = self._fill_holes(current, expect, phy_offset)
                if filled is None:
                    log.warning(
                        "[BUG]logic queue order maybe wrong, expect %d current %d (%s/%d)",
                        expect,
                        current,
                        self.topic,
                        self.queue_id,
                    )
                else:
                    mf = filled
        if mf.append(CQ_ENTRY.pack(phy_offset, size, tags_code)) < 0:
            return False
        self.max_physic_offset = phy_offset + size  # only once written: a retry must not skip it
        return True

    def put_position_infos(
        self, *, phy_offset: np.ndarray, size: np.ndarray, tags_code: np.ndarray, queue_offset: np.ndarray
    ) -> bool:
        """`put_message_position_info` for this queue's records of a dispatch batch, in log order,
        with the same result byte for byte. A run that simply continues the queue (each entry at
        the next queue offset, each ending above the last) is written as one block per file;
        anything else (duplicates, the first entry of a new queue above offset 0, gaps) goes
        entry by entry. OSError (ENOSPC) leaves what was written counted, so a retry of the same
        batch writes the rest."""
        n = len(phy_offset)
        if n and max(int(phy_offset.max()), -int(phy_offset.min())) >= _HUGE:
            return all(  # sums could leave int64: entry by entry, as Python ints
                self.put_message_position_info(phy_offset=p, size=s, tags_code=t, queue_offset=q)
                for p, s, t, q in zip(
                    phy_offset.tolist(), size.tolist(), tags_code.tolist(), queue_offset.tolist(), strict=True
                )
            )
        ends = phy_offset + size
        steps_ok = (queue_offset[1:] - queue_offset[:-1] == 1) & (ends[1:] > ends[:-1])
        breaks = np.flatnonzero(~steps_ok)
        i = 0
        while i < n:
            if ends[i] <= self.max_physic_offset:
                i = _first_above(ends, i, self.max_physic_offset)  # duplicates: skipped as is
                continue
            later = breaks[np.searchsorted(breaks, i) :]
            run_end = int(later[0]) + 1 if len(later) else n
            if self._continues_at(int(ends[i]), int(queue_offset[i])):
                if not self._append_run(
                    _entries(phy_offset[i:run_end], size[i:run_end], tags_code[i:run_end]), ends[i:run_end]
                ):
                    return False
                i = run_end
                continue
            if not self.put_message_position_info(
                phy_offset=int(phy_offset[i]),
                size=int(size[i]),
                tags_code=int(tags_code[i]),
                queue_offset=int(queue_offset[i]),
            ):
                return False
            i += 1
        return True

    def _continues_at(self, end: int, queue_offset: int) -> bool:
        """The entry would be appended as is: not a duplicate, at the queue's next position, and
        no pre-blank fill (the queue has a file, or starts at offset 0)."""
        if end <= self.max_physic_offset:
            return False
        last = self.mfq.last_file()
        current = last.file_from_offset + last.wrote_position if last is not None else 0
        return queue_offset * CQ_STORE_UNIT_SIZE == current and (last is not None or queue_offset == 0)

    def put_position_rows(
        self, *, phy_offset: list[int], size: list[int], tags_code: list[int], queue_offset: list[int]
    ) -> bool:
        """`put_position_infos` of a few entries as Python ints (reput's small passes: numpy's
        per-call cost was most of the work there), with the same result byte for byte: a run
        that continues the queue is written as one block, anything else entry by entry."""
        n = len(phy_offset)
        last = self.mfq.last_file()
        if (
            last is not None
            and phy_offset[0] + size[0] > self.max_physic_offset
            and queue_offset[0] * CQ_STORE_UNIT_SIZE == last.file_from_offset + last.wrote_position
            and last.wrote_position + n * CQ_STORE_UNIT_SIZE <= last.file_size
            and (n == 1 or _one_run(phy_offset, size, queue_offset))
            and min(phy_offset) >= 0
            and max(phy_offset) < _HUGE
        ):  # the common case (a pass of a few records over many queues): entries that continue
            # the queue in its last file, which `_append_run` would write as this one block
            if last.append(b"".join(map(CQ_ENTRY.pack, phy_offset, size, tags_code))) < 0:
                return False
            self.max_physic_offset = phy_offset[-1] + size[-1]
            return True
        if max(phy_offset) >= _HUGE or -min(phy_offset) >= _HUGE:
            return all(
                self.put_message_position_info(phy_offset=p, size=s, tags_code=t, queue_offset=q)
                for p, s, t, q in zip(phy_offset, size, tags_code, queue_offset, strict=True)
            )
        ends = [p + s for p, s in zip(phy_offset, size, strict=True)]
        i = 0
        while i < n:
            if ends[i] <= self.max_physic_offset:
                i += 1  # a duplicate: skipped as is
                continue
            run_end = i + 1
            while (
                run_end < n
                and queue_offset[run_end] - queue_offset[run_end - 1] == 1
                and ends[run_end] > ends[run_end - 1]
            ):
                run_end += 1
            if self._continues_at(ends[i], queue_offset[i]):
                data = b"".join(
                    map(CQ_ENTRY.pack, phy_offset[i:run_end], size[i:run_end], tags_code[i:run_end])
                )
                if not self._append_run(data, ends[i:run_end]):
                    return False
                i = run_end
                continue
            if not self.put_message_position_info(
                phy_offset=phy_offset[i], size=size[i], tags_code=tags_code[i], queue_offset=queue_offset[i]
            ):
                return False
            i += 1
        return True

    def _append_run(self, data: bytes, ends: Sequence[int] | np.ndarray) -> bool:
        """Append entries that continue the queue (``data``, packed; ``ends``: each entry's
        record end), one copy per file."""
        done = 0
        while done < len(data):
            last = self.mfq.last_file()
            expect = (last.file_from_offset + last.wrote_position) if last is not None else 0
            mf = self.mfq.get_last_mapped_file(expect)
            if mf is None:
                return False
            room = mf.file_size - mf.wrote_position
            assert room % CQ_STORE_UNIT_SIZE == 0, "queue files hold whole entries"
            take = min(room, len(data) - done)
            if mf.append(data[done : done + take]) < 0:
                return False
            done += take
            self.max_physic_offset = int(ends[done // CQ_STORE_UNIT_SIZE - 1])
        return True

    def _fill_holes(self, current: int, expect: int, phy_offset: int) -> MappedFile | None:
        """Pre-blank entries from ``current`` up to ``expect`` (bytes), so the entry of the record
        at ``phy_offset`` lands at its own queue offset: the queue's records between lie in a
        span of the log dispatch stepped over (a damaged record, reported where it was met).
        RocketMQ appends at ``current`` instead ("logic queue order maybe wrong"), which shifts
        every later entry off its record's queue offset, and a read that checks the two serves
        none of them. Readers skip pre-blanks (RocketMQ's, whose read of one fails, too). None,
        nothing written, when the span cannot hold that many records (a wrong queue offset):
        then RocketMQ's append. The file the entry goes to, else."""
        holes = (expect - current) // CQ_STORE_UNIT_SIZE
        if holes * record.MIN_RECORD_SIZE > phy_offset - max(self.max_physic_offset, 0):
            return None
        log.warning(
            "%s/%d: queue offsets [%d, %d) have no record dispatch could read: pre-blank entries",
            self.topic,
            self.queue_id,
            current // CQ_STORE_UNIT_SIZE,
            expect // CQ_STORE_UNIT_SIZE,
        )
        while True:  # a retry after ENOSPC goes on from where this stopped
            mf = self.mfq.get_last_mapped_file(current)
            if mf is None:
                return None
            current = mf.file_from_offset + mf.wrote_position
            if current >= expect:
                return mf
            room = min(mf.file_size - mf.wrote_position, expect - current) // CQ_STORE_UNIT_SIZE
            if mf.append(PRE_BLANK_ENTRY * room) < 0:
                return None

    def _fill_pre_blank(self, mf: MappedFile, until_where: int) -> None:
        """`fillPreBlank`: the file's entries before ``until_where``, in one write (a pwrite an
        entry was up to a file's 300,000 system calls for each queue a slave first meets late)."""
        mf.append(PRE_BLANK_ENTRY * (until_where % self.mapped_file_size // CQ_STORE_UNIT_SIZE))

    # ------------------------------------------------------------------ read

    def set_read_window(self, min_queue_offset: int, max_queue_offset: int) -> None:
        """Serve ``[min_queue_offset, max_queue_offset)`` of a running store's queue, read-only:
        what the cleaner kept and reput dispatched, as the queue table in shared memory says.
        Files below the window are dropped, files up to its end mapped, and each file's readable
        end set at the window's, so a reader never sees an entry reput is still writing."""
        assert not self.mfq.writable, "a read window is for a reader's view of a running store"
        end = max_queue_offset * CQ_STORE_UNIT_SIZE
        self.min_logic_offset = min_queue_offset * CQ_STORE_UNIT_SIZE
        self.mfq.drop_files_before(self.min_logic_offset)
        if end > self.min_logic_offset:
            self.mfq.ensure_range(self.min_logic_offset, end - 1)
        for mf in self.mfq.files:
            mf.committed_position = max(0, min(end - mf.file_from_offset, mf.file_size))

    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def max_offset_in_queue(self) -> int:
        """The next queue offset to be written."""
        return self.mfq.max_offset() // CQ_STORE_UNIT_SIZE

    def entries(self, queue_offset: int, max_count: int) -> Iterator[tuple[int, int, int]]:
        """Up to ``max_count`` (phy offset, size, tags code) from ``queue_offset``, within one file
        (RocketMQ's `getIndexBuffer` slice), unpacked as they are taken: a pull of one message
        reads one entry, not the 800 a 16 KB slice holds."""
        position = queue_offset * CQ_STORE_UNIT_SIZE
        if position < self.min_logic_offset:
            return iter(())
        mf = self.mfq.find_mapped_file_by_offset(position)
        if mf is None:
            return iter(())
        start = position - mf.file_from_offset
        stop = min(mf.read_position, start + max_count * CQ_STORE_UNIT_SIZE)
        buf, unpack = mf.buf, CQ_ENTRY.unpack_from
        return (unpack(buf, p) for p in range(start, stop, CQ_STORE_UNIT_SIZE))

    def get_entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        """The entry `entries` would yield first, or None: one unpack, no generator (a
        consumer's pull looks up its first entry before it reads; 4.3 -> 1.5 us)."""
        position = queue_offset * CQ_STORE_UNIT_SIZE
        if position < self.min_logic_offset:
            return None
        mf = self.mfq.find_mapped_file_by_offset(position)
        if mf is None or position - mf.file_from_offset >= mf.read_position:
            return None
        return CQ_ENTRY.unpack_from(mf.buf, position - mf.file_from_offset)

    def offset_in_queue_by_time(self, timestamp_ms: int, commit_log: CommitLog) -> int:
        """`getOffsetInQueueByTime`: binary search on store times (§4.4).

        Deviation: the file is chosen by the store time of its last entry, not the file's mtime,
        which copying a store (or a backup restore) rewrites."""
        min_phy = commit_log.min_offset()
        candidates = [mf for mf in self.mfq.files if mf.read_position > 0]
        if not candidates:
            return 0
        chosen = candidates[-1]
        for mf in candidates:
            phy, size, _ = CQ_ENTRY.unpack_from(mf.buf, mf.read_position - CQ_STORE_UNIT_SIZE)
            if commit_log.store_timestamp_at(phy, size) >= timestamp_ms:
                chosen = mf
                break
        low = max(0, self.min_logic_offset - chosen.file_from_offset)
        high = chosen.read_position - CQ_STORE_UNIT_SIZE
        left = right = target = -1
        left_time = right_time = -1
        while high >= low:
            mid = (low + high) // (2 * CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE
            phy, size, _ = CQ_ENTRY.unpack_from(chosen.buf, mid)
            if phy < min_phy or size == PRE_BLANK_SIZE:
                low = mid + CQ_STORE_UNIT_SIZE
                continue
            store_time = commit_log.store_timestamp_at(phy, size)
            if store_time < 0:
                return 0
            if store_time == timestamp_ms:
                target = mid
                break
            if store_time > timestamp_ms:
                high, right, right_time = mid - CQ_STORE_UNIT_SIZE, mid, store_time
            else:
                low, left, left_time = mid + CQ_STORE_UNIT_SIZE, mid, store_time
        if target < 0:
            if left_time < 0:
                target = right
            elif right_time < 0:
                target = left
            else:
                target = right if timestamp_ms - left_time > right_time - timestamp_ms else left
        return (chosen.file_from_offset + max(target, 0)) // CQ_STORE_UNIT_SIZE

    def flush(self, least_pages: int = 0) -> bool:
        return self.mfq.flush(least_pages)


def java_string_order(text: str) -> bytes:
    """Sort key giving Java's String.compareTo order (UTF-16 code units)."""
    return text.encode("utf-16-be")


class ConsumeQueueTable:
    """Every ConsumeQueue of a store by topic and queue id (DefaultMessageStore's
    consumeQueueTable): loaded from ``consumequeue/<topic>/<queueId>/``, created on first use.
    Their files are mapped only while in use, at most ``pool.max_open`` at once (the process's
    pool of the default ``maxOpenConsumeQueueFiles`` unless given; mapping_pool.py)."""

    def __init__(
        self,
        root: Path,
        mapped_file_size: int,
        *,
        writable: bool,
        reporter: Reporter,
        pool: MappingPool | None = None,
    ) -> None:
        self.root = root
        self.mapped_file_size = mapped_file_size
        self.writable = writable
        self.reporter = reporter
        self.pool = pool if pool is not None else process_pool()
        self.queues: dict[str, dict[int, ConsumeQueue]] = {}
        self.discarded = False
        """Set when a damaged queue was discarded (writable only): recovery then re-dispatches
        the whole commit log to rebuild it (RocketMQ refuses to start instead)."""

    def load(self) -> None:
        """Every queue's files, once each queue's file names show they were written with the
        configured file size (`_refuse_other_file_size`): before any file is touched."""
        if not self.root.is_dir():
            return
        listed: list[tuple[str, Path, list[str] | None]] = []
        for topic_dir in sorted(self.root.iterdir()):
            if topic_dir.is_dir():
                for queue_dir in sorted(topic_dir.iterdir()):
                    names = os.listdir(queue_dir) if queue_dir.is_dir() else None
                    listed.append((topic_dir.name, queue_dir, names))
        for _topic, queue_dir, names in listed:
            if names and len(names) > 1:
                self._refuse_other_file_size(queue_dir, names, lone_file=False)
        for topic, queue_dir, names in listed:
            self._load_queue(topic, queue_dir, names)

    def _refuse_other_file_size(self, queue_dir: Path, names: list[str], *, lone_file: bool) -> None:
        """`ConfigError` naming mappedFileSizeConsumeQueue when a queue's files were written with
        another file size, as a commit log of another size is refused (RocketMQ refuses both):
        rebuilt as damaged, every queue would be rewritten. The evidence: the step between its
        first two file names (a name is its first entry's byte offset) with the first file that
        long, or (``lone_file``, after its load failed) a queue's one file longer than configured
        (a file never grows past its size). Anything else is damage, which recovery repairs."""
        segments = sorted(name for name in names if len(name) == 20 and name.isdigit())
        if len(segments) > 1:
            written = int(segments[1]) - int(segments[0])
            if written == self.mapped_file_size:
                return
        elif not (lone_file and segments):
            return
        try:
            length = (queue_dir / segments[0]).stat().st_size
        except OSError:
            return
        if len(segments) == 1:
            written = length if length > self.mapped_file_size else 0
        if written <= 0 or written % CQ_STORE_UNIT_SIZE or length != written:
            return
        raise ConfigError(
            f"{queue_dir}: ConsumeQueue files of {written} bytes, but mappedFileSizeConsumeQueue is "
            f"{self.mapped_file_size}: start this store with mappedFileSizeConsumeQueue={written} "
            f"(its queue files are never rewritten to another size)"
        )

    def _load_queue(self, topic: str, queue_dir: Path, names: list[str] | None = None) -> ConsumeQueue | None:
        if not queue_dir.name.isdigit():
            log.warning("ignoring %s: not a queue id", queue_dir)
            return None
        cq = self._new(topic, int(queue_dir.name))
        if cq.mfq.store_dir != queue_dir:  # a directory named 007: queue 7 lists its own, 7
            names = None
        try:
            cq.load(names)
        except CorruptFileError as exc:
            store_dir = cq.mfq.store_dir
            self._refuse_other_file_size(store_dir, names or os.listdir(store_dir), lone_file=True)
            if not self.writable:
                raise
            cq.close()
            for path in sorted(cq.mfq.store_dir.iterdir()):
                self.reporter.report("cq-file-discarded", str(path), 0, path.stat().st_size, str(exc))
                path.unlink()
            self.discarded = True
        return cq

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            topic,
            queue_id,
            self.root,
            self.mapped_file_size,
            writable=self.writable,
            reporter=self.reporter,
            pool=self.pool,
        )
        self.queues.setdefault(topic, {})[queue_id] = cq
        return cq

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it exists, here or (for a reader of a running store) on disk by now."""
        cq = self.queues.get(topic, {}).get(queue_id)
        if cq is None and not self.writable and (self.root / topic / str(queue_id)).is_dir():
            cq = self._load_queue(topic, self.root / topic / str(queue_id))
        return cq

    def find(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created empty (no file until the first entry) when new."""
        cq = self.queues.get(topic, {}).get(queue_id)
        return cq if cq is not None else self._new(topic, queue_id)

    def all(self) -> list[ConsumeQueue]:
        return [cq for queues in self.queues.values() for cq in queues.values()]

    def topics(self) -> list[str]:
        return sorted(self.queues, key=java_string_order)

    def destroy_all(self) -> None:
        """No commit log left: every queue goes (RocketMQ's `destroyLogics`)."""
        for cq in self.all():
            while cq.mfq.files:
                cq.mfq.delete_last_file()
        self.queues.clear()

    def close(self) -> None:
        for cq in self.all():
            cq.close()


@dataclass(frozen=True, slots=True)
class ExpiredQueueFiles:
    """What `plan_expired_files` found for one queue."""

    paths: list[Path]
    """Files to delete, oldest first (never the last file, which reput appends to)."""
    min_queue_offset: int
    """The queue's new minimum offset: its first entry still pointing into the commit log."""


def plan_expired_files(queue_dir: Path, file_size: int, min_phy_offset: int) -> ExpiredQueueFiles:
    """`deleteExpiredFileByOffset` + `correctMinOffset` for one queue, read from the files
    themselves with a few preads (the cleaner maps nothing, so it never pins a file it deletes).

    A file goes when its last entry points below ``min_phy_offset``, oldest first, stopping at the
    first file that must stay (RocketMQ never deletes from the middle). The new minimum is the
    first later entry at or above ``min_phy_offset`` (pre-blank entries point at 0, so they are
    below it), or the queue's end when every entry is below it. Entries are dispatched in
    commit-log order, so both are binary searches."""
    names = sorted(p.name for p in queue_dir.iterdir() if p.name.isdigit()) if queue_dir.is_dir() else []
    per_file = file_size // CQ_STORE_UNIT_SIZE
    doomed: list[Path] = []
    for name in names[:-1]:
        with (queue_dir / name).open("rb") as f:
            entry = _pread_entry(f.fileno(), per_file - 1)
        if entry is None or entry[0] >= min_phy_offset:
            break
        doomed.append(queue_dir / name)
    end_offset = 0
    for name in names[len(doomed) :]:
        base = int(name) // CQ_STORE_UNIT_SIZE
        with (queue_dir / name).open("rb") as f:
            written = _first_index(f.fileno(), per_file, _unwritten)
            live = _first_index(f.fileno(), written, partial(_points_at_or_above, min_phy_offset))
        if live < written:
            return ExpiredQueueFiles(doomed, base + live)
        end_offset = base + written
        if written < per_file:
            break
    return ExpiredQueueFiles(doomed, end_offset)


def _first_index(fd: int, count: int, predicate: Callable[[tuple[int, int, int] | None], bool]) -> int:
    """The first entry index in [0, count) of an open queue file where a monotone ``predicate``
    of the entry holds, or ``count``: a binary search by pread."""
    low, high = 0, count
    while low < high:
        mid = (low + high) // 2
        if predicate(_pread_entry(fd, mid)):
            high = mid
        else:
            low = mid + 1
    return low


def _pread_entry(fd: int, index: int) -> tuple[int, int, int] | None:
    """Entry ``index`` of an open queue file, None where none was written (or the file is short)."""
    raw = os.pread(fd, CQ_STORE_UNIT_SIZE, index * CQ_STORE_UNIT_SIZE)
    if len(raw) < CQ_STORE_UNIT_SIZE:
        return None
    phy, size, tags = CQ_ENTRY.unpack(raw)
    return (phy, size, tags) if size > 0 else None


def _unwritten(entry: tuple[int, int, int] | None) -> bool:
    return entry is None


def _points_at_or_above(phy_offset: int, entry: tuple[int, int, int] | None) -> bool:
    assert entry is not None, "only written entries are searched"
    return entry[0] >= phy_offset


def read_entry(queue_dir: Path, file_size: int, queue_offset: int) -> tuple[int, int, int] | None:
    """(phy offset, size, tags code) of one entry read from its file, None where there is none."""
    position = queue_offset * CQ_STORE_UNIT_SIZE
    try:
        with (queue_dir / offset_to_file_name(position - position % file_size)).open("rb") as f:
            return _pread_entry(f.fileno(), position % file_size // CQ_STORE_UNIT_SIZE)
    except FileNotFoundError:
        return None
