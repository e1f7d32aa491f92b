"""The ConsumeQueue mapping pool: a bounded number of files mapped, every byte and position kept.

Real files, real mappings: each test counts its own process's mappings in /proc/self/maps."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from rmq_mp.format.queue_entry import CQ_ENTRY_DTYPE, CQ_STORE_UNIT_SIZE
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.mapping_pool import MappingPool, PooledMappedFile
from rmq_mp.store.reporter import Reporter

ENTRIES_PER_FILE = 4
FILE_SIZE = ENTRIES_PER_FILE * CQ_STORE_UNIT_SIZE


def mappings_under(root: Path) -> int:
    """Mappings of files under ``root`` in this process."""
    prefix = str(root) + "/"
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if prefix in line)


def descriptors_under(root: Path) -> int:
    prefix = str(root) + "/"
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                count += 1
        except FileNotFoundError:  # the descriptor listdir used, closed meanwhile
            pass
    return count


def queues(root: Path, count: int, pool: MappingPool, *, writable: bool = True) -> list[ConsumeQueue]:
    return [
        ConsumeQueue("T", q, root, FILE_SIZE, writable=writable, reporter=Reporter(), pool=pool)
        for q in range(count)
    ]


def test_round_robin_writes_and_reads_stay_within_the_bound(tmp_path: Path) -> None:
    pool = MappingPool(3)
    cqs = queues(tmp_path, 20, pool)
    model: dict[int, list[tuple[int, int, int]]] = {q: [] for q in range(20)}
    phy = 0
    for _round in range(3 * ENTRIES_PER_FILE + 1):  # four files per queue, the last one part full
        for q, cq in enumerate(cqs):
            entry = (phy, 50 + q, q * 7 - 3)
            assert cq.put_message_position_info(
                phy_offset=phy, size=entry[1], tags_code=entry[2], queue_offset=len(model[q])
            )
            model[q].append(entry)
            phy += entry[1]
            assert len(pool) <= 3
            assert mappings_under(tmp_path) <= 3
            assert descriptors_under(tmp_path) <= 2 * 3
    for offset in range(3 * ENTRIES_PER_FILE + 1):
        for q, cq in enumerate(cqs):
            assert cq.get_entry(offset) == model[q][offset]
            assert mappings_under(tmp_path) <= 3
    assert pool.reopens > 0
    for cq in cqs:  # positions survived every release: the flush makes all of it durable
        assert cq.max_offset_in_queue() == len(model[cq.queue_id])
        cq.flush()
        assert cq.mfq.flushed_where == len(model[cq.queue_id]) * CQ_STORE_UNIT_SIZE
        assert all(mf.flushed_position == mf.wrote_position for mf in cq.mfq.files)
    for cq in cqs:  # and the files hold exactly the model, read without any mapping
        data = b"".join(p.read_bytes() for p in sorted(cq.mfq.store_dir.iterdir()))
        entries = np.frombuffer(data, dtype=CQ_ENTRY_DTYPE)[: len(model[cq.queue_id])]
        assert [tuple(int(x) for x in e) for e in entries.tolist()] == model[cq.queue_id]
        cq.close()
    assert len(pool) == 0
    assert mappings_under(tmp_path) == 0
    assert descriptors_under(tmp_path) == 0


def test_a_read_only_view_reopens_what_another_writer_appended(tmp_path: Path) -> None:
    pool = MappingPool(1)
    writers = queues(tmp_path, 2, MappingPool(1))
    for i in range(2):
        for writer in writers:
            assert writer.put_message_position_info(phy_offset=i * 10, size=10, tags_code=0, queue_offset=i)
    reader = queues(tmp_path, 2, pool, writable=False)
    reader[0].load()
    mf = reader[0].mfq.files[0]
    assert isinstance(mf, PooledMappedFile)
    reader[1].mfq.ensure_range(0, 0)  # another file: the reader's first one is released
    assert not mf.mapped
    mf.committed_position = 2 * CQ_STORE_UNIT_SIZE
    assert reader[0].get_entry(1) == (10, 10, 0)
    assert mf.mapped
    for cq in [*reader, *writers]:
        cq.close()


def test_a_mapping_in_use_is_never_closed(tmp_path: Path) -> None:
    pool = MappingPool(1)
    a, b, c = queues(tmp_path, 3, pool)
    for cq in (a, b, c):
        assert cq.put_message_position_info(phy_offset=cq.queue_id * 100, size=9, tags_code=1, queue_offset=0)
    a_file = a.mfq.files[0]
    b_file = b.mfq.files[0]
    assert isinstance(a_file, PooledMappedFile)
    assert isinstance(b_file, PooledMappedFile)
    held = a_file.buf  # a reader between taking the buffer and unpacking from it
    view = np.frombuffer(b.mfq.files[0].buf, dtype=CQ_ENTRY_DTYPE, count=1)  # an exported buffer
    assert c.get_entry(0) == (200, 9, 1)
    assert a_file.mapped
    assert b_file.mapped
    assert bytes(held[:8]) == (0).to_bytes(8, "big")
    assert int(view["phy"][0]) == 100
    assert mappings_under(tmp_path) == 3
    del held, view
    assert c.get_entry(0) == (200, 9, 1)  # already mapped: nothing is opened, nothing released
    d = queues(tmp_path, 4, pool)[3]
    assert d.put_message_position_info(phy_offset=300, size=9, tags_code=1, queue_offset=0)
    assert mappings_under(tmp_path) == 1  # opening one released every idle other
    for cq in (a, b, c, d):
        cq.close()


def test_a_file_deleted_while_released_is_not_resurrected(tmp_path: Path) -> None:
    pool = MappingPool(1)
    a, b = queues(tmp_path, 2, pool)
    assert a.put_message_position_info(phy_offset=0, size=9, tags_code=1, queue_offset=0)
    assert b.put_message_position_info(phy_offset=9, size=9, tags_code=1, queue_offset=0)
    gone = a.mfq.files[0]
    assert isinstance(gone, PooledMappedFile)
    assert not gone.mapped
    gone.path.unlink()  # the cleaner, in another process
    assert gone.flush() == CQ_STORE_UNIT_SIZE  # nothing left to make durable
    with pytest.raises(FileNotFoundError):
        a.get_entry(0)  # what the consumer's read retries on (the minimum moved)
    assert not gone.path.exists()
    assert a.mfq.drop_deleted_files() == 0  # the last file of a queue stays listed
    for cq in (a, b):
        cq.close()


def test_threads_reading_through_one_small_pool_read_every_entry_right(tmp_path: Path) -> None:
    """Releases by one thread never close the mapping another thread is reading."""
    pool = MappingPool(2)
    count = 8
    cqs = queues(tmp_path, count, pool)
    for q, cq in enumerate(cqs):
        for i in range(ENTRIES_PER_FILE * 2):
            assert cq.put_message_position_info(
                phy_offset=q * 1000 + i * 10, size=10, tags_code=q, queue_offset=i
            )
    errors: list[BaseException] = []

    def read(start: int) -> None:
        try:
            for _round in range(60):
                for k in range(count):
                    q = (start + k) % count
                    for offset, entry in enumerate(cqs[q].entries(0, ENTRIES_PER_FILE)):
                        assert entry == (q * 1000 + offset * 10, 10, q)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert pool.reopens > 0
    assert mappings_under(tmp_path) <= 2 + len(threads)  # at most one pinned per reader
    for cq in cqs:
        cq.close()
