"""A producer's sends into fresh TransientStorePool pages find them already mapped.

The supervisor mlocks the pool buffers, but a producer's own mapping of a buffer starts without
page-table entries, so each first write to a page was a minor fault (bench/NOTES.md, the
realistic row). The producer populates its mapping ahead of the write position
(`shm.transient_pool.prefault`, called off the lock by `Appender.prefault_ahead`). The test
counts, before each send, whether the pages the record will occupy are present in this
process's mapping (/proc/self/pagemap, bit 63): without the prefault every page is absent at its
first write; with it only a buffer's first page, written before the first prefault, is.
`getrusage`'s minor-fault count cannot tell the two apart: the kernel counts the pages
MADV_POPULATE_WRITE maps as minor faults too.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from pathlib import Path

import pytest

from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from shm import layout
from tests.service import reference_put_path, running_service

FILE_SIZE = 2 << 20
BODY = b"p" * 300
SENDS = 8_000
"""About 2.7 MiB of records: most of one 2 MiB file, a roll, and on into the second buffer."""
_PAGE = mmap.PAGESIZE
_PRESENT = 1 << 63


def _address(buffer: mmap.mmap) -> int:
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # an exported view would keep the producer from closing the buffer


@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_sends_find_fresh_pool_pages_populated(tmp_path: Path, path: str) -> None:
    if path == "compiled" and native.core is None:
        pytest.skip(f"no compiled core: {native.why_reference}")
    settings = {"transientStorePoolEnable": "true", "transientStorePoolSize": "2"}
    with (
        running_service(tmp_path, mappedFileSizeCommitLog=str(FILE_SIZE), **settings) as service,
        Producer.attach(service.names.base) as producer,
        open("/proc/self/pagemap", "rb", buffering=0) as pagemap,
    ):
        if path == "reference":
            reference_put_path(producer)
        table = producer.store.shm.table
        assert producer.send("Prefault", BODY, queue_id=0).ok  # maps the first file and its buffer
        before = table.get(layout.WROTE_POSITION)
        assert producer.send("Prefault", BODY, queue_id=0).ok
        record_size = table.get(layout.WROTE_POSITION) - before
        assert (producer._native is not None and producer._native.sent > 0) == (path == "compiled")

        def present(address: int) -> bool:
            entry = os.pread(pagemap.fileno(), 8, address // _PAGE * 8)
            return bool(struct.unpack("<Q", entry)[0] & _PRESENT)

        cached = None
        address = written_until = 0
        fresh = absent = 0
        for i in range(SENDS):
            if producer.appender._file is not cached:  # the first file, or a roll
                cached = producer.appender._file
                assert cached is not None
                assert cached[1] is not None, "the pool is on: the producer writes a pool buffer"
                address, written_until = _address(cached[1]), 0
            assert cached is not None
            position = table.get(layout.WROTE_POSITION) - cached[0].file_from_offset
            if position + record_size <= FILE_SIZE:  # else this send rolls to the next file
                for page in range(position // _PAGE, (position + record_size - 1) // _PAGE + 1):
                    if page * _PAGE >= written_until:  # no send wrote into it yet
                        fresh += 1
                        absent += not present(address + page * _PAGE)
                written_until = position + record_size
            assert producer.send("Prefault", BODY, queue_id=i % 4).ok
        assert cached is not None
        assert cached[0].file_from_offset == FILE_SIZE, "the sends rolled once"
        # Without the prefault each of these pages was absent; with it, at most the first page
        # of each buffer is (written by the send that maps the file, before its first prefault).
        assert fresh > 600
        assert absent <= 2, f"{absent} of {fresh} fresh pages were not mapped before a send wrote there"


def test_the_committer_runs_under_sched_batch(tmp_path: Path) -> None:
    """A put's wake of the committer must not preempt the producer (`ServiceLoop.batch_scheduled`)."""
    settings = {"transientStorePoolEnable": "true", "transientStorePoolSize": "2"}
    with running_service(tmp_path, mappedFileSizeCommitLog=str(FILE_SIZE), **settings) as service:
        table = service.table()
        try:
            pids = {role: table.get(layout.worker_field(role, "pid")) for role in ("committer", "flusher")}
        finally:
            table.close()
        assert os.sched_getscheduler(pids["committer"]) == os.SCHED_BATCH
        assert os.sched_getscheduler(pids["flusher"]) == os.SCHED_OTHER  # SYNC waits on it: not batch
