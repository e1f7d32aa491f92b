"""Files are created sparse at their full length and reserve disk blocks ahead of what is
written, in chunks that double from one page to RESERVE_MAX_CHUNK_BYTES (real files, st_blocks)."""

from __future__ import annotations

import itertools
from pathlib import Path

from rmq_mp.format.index_layout import INDEX_HEADER_SIZE
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.index_file import IndexFile
from rmq_mp.store.mapped_file import OS_PAGE_SIZE, RESERVE_MAX_CHUNK_BYTES, MappedFile, reservation_end
from rmq_mp.store.reporter import Reporter

MIB = 1 << 20


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_chunks_double_from_a_page_up_to_the_cap_and_stop_at_the_file_end() -> None:
    marks = [0]
    while marks[-1] < 8 * MIB:
        marks.append(reservation_end(marks[-1], marks[-1] + 1, 8 * MIB))
    chunks = [b - a for a, b in itertools.pairwise(marks)]
    assert chunks[:4] == [OS_PAGE_SIZE, OS_PAGE_SIZE, 2 * OS_PAGE_SIZE, 4 * OS_PAGE_SIZE]
    assert max(chunks) == RESERVE_MAX_CHUNK_BYTES
    assert marks[-1] == 8 * MIB  # never past the file
    assert reservation_end(0, 3 * OS_PAGE_SIZE + 1, 8 * MIB) == 4 * OS_PAGE_SIZE  # a big write: all of it
    assert reservation_end(OS_PAGE_SIZE, 10, 5000) == 5000  # a file size that is not page aligned


def test_a_mapped_file_is_sparse_and_reserves_as_it_is_appended(tmp_path: Path) -> None:
    path = tmp_path / ("0" * 20)
    mf = MappedFile(path, 6_000_000, writable=True, create=True)
    try:
        assert path.stat().st_size == 6_000_000
        assert allocated(path) == 0
        assert mf.append(b"x" * CQ_STORE_UNIT_SIZE) == 0
        assert mf.reserved_position == OS_PAGE_SIZE
        assert allocated(path) == OS_PAGE_SIZE
        mf.append(b"y" * OS_PAGE_SIZE)  # crosses the mark: the next chunk
        assert mf.reserved_position == 2 * OS_PAGE_SIZE
        assert allocated(path) == 2 * OS_PAGE_SIZE
    finally:
        mf.close()


def test_a_reopened_file_reserves_from_its_start_without_changing_a_byte(tmp_path: Path) -> None:
    root = tmp_path / "cq"
    cq = ConsumeQueue("T", 0, root, 6_000_000, writable=True, reporter=Reporter())
    for n in range(3):
        assert cq.put_message_position_info(phy_offset=n * 100, size=100, tags_code=n, queue_offset=n)
    cq.close()
    path = root / "T" / "0" / ("0" * 20)
    before = path.read_bytes()
    again = ConsumeQueue("T", 0, root, 6_000_000, writable=True, reporter=Reporter())
    again.load()
    again.recover()
    assert again.put_message_position_info(phy_offset=300, size=100, tags_code=3, queue_offset=3)
    again.close()
    after = path.read_bytes()
    assert after[: 3 * CQ_STORE_UNIT_SIZE] == before[: 3 * CQ_STORE_UNIT_SIZE]
    assert after[4 * CQ_STORE_UNIT_SIZE :].count(0) == len(after) - 4 * CQ_STORE_UNIT_SIZE
    assert allocated(path) == OS_PAGE_SIZE


def test_a_queue_starting_above_zero_reserves_its_pre_blanks_at_once(tmp_path: Path) -> None:
    cq = ConsumeQueue("T", 0, tmp_path, 6_000_000, writable=True, reporter=Reporter())
    try:
        assert cq.put_message_position_info(phy_offset=0, size=100, tags_code=0, queue_offset=1000)
        mf = cq.mfq.files[0]
        assert mf.wrote_position == 1001 * CQ_STORE_UNIT_SIZE
        assert mf.reserved_position >= mf.wrote_position
        assert allocated(mf.path) <= mf.reserved_position
    finally:
        cq.close()


def test_an_index_file_reserves_its_slots_at_creation_and_entries_as_they_come(tmp_path: Path) -> None:
    slots, entries = 100_000, 400_000
    path = tmp_path / "index"
    index = IndexFile(path, slots, entries, writable=True, reporter=Reporter(), create=True)
    slots_end = INDEX_HEADER_SIZE + slots * 4
    try:
        assert path.stat().st_size == slots_end + entries * 20
        created = allocated(path)
        assert slots_end <= created <= slots_end + OS_PAGE_SIZE
        assert index.put_key("T#k", 100, 1_700_000_000_000)
        assert created < allocated(path) <= slots_end + RESERVE_MAX_CHUNK_BYTES + OS_PAGE_SIZE
        assert index.select_phy_offsets("T#k", 10, 0, 1 << 62) == [100]
    finally:
        index.close()


def test_last_nonzero_skips_holes_and_still_finds_every_byte(tmp_path: Path) -> None:
    """Recovery asks for the last non-zero byte of every queue's last file: holes are skipped
    (SEEK_DATA), data ranges scanned, and the answer is the same as a full scan's."""
    size = 8 << 20
    path = tmp_path / "00000000000000000000"
    mf = MappedFile(path, size, writable=True, create=True)
    try:
        assert mf.last_nonzero(0) == 0
        assert mf.data_ranges(0, size) == []
        mf.append(b"\x01" * 20)
        with open(path, "r+b") as f:  # a stray byte far past the entries, in its own data block
            f.seek(5 << 20)
            f.write(b"\x07")
        assert mf.last_nonzero(0) == (5 << 20) + 1
        assert mf.last_nonzero((5 << 20) + 1) == (5 << 20) + 1
        ranges = mf.data_ranges(0, size)
        assert sum(end - start for start, end in ranges) < 2 << 20  # not the 8 MiB of the file
        assert any(start <= 5 << 20 < end for start, end in ranges)
    finally:
        mf.close()
