"""warmMapedFileEnable: the allocator warms and mlocks each commit-log file it creates ahead, keeps
it locked while it is current or ahead, and lets it go once writes have moved past it. Without it
(and without the pool) the allocator keeps the page cache filled a window ahead of the write
position instead, changing nothing in the files."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from rmq_mp.put.producer import Producer
from rmq_mp.store.mapped_file import offset_to_file_name
from shm import layout
from tests.service import running_service, wait_until


def locked_kib(pid: int, commit_log: Path) -> dict[str, int]:
    """Resident KiB of each commit-log file process ``pid`` has mapped and mlocked, from
    /proc/<pid>/smaps (its "Locked:" line is proportional, so shared with writers it shrinks)."""
    locked: dict[str, int] = {}
    name, rss = "", 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 6:  # a mapping's header line
            name = Path(fields[5]).name if fields[5].startswith(str(commit_log)) else ""
        elif name and fields[0] == "Rss:":
            rss = int(fields[1])
        elif name and fields[0] == "VmFlags:" and "lo" in fields[1:]:
            locked[name] = rss

    return locked


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (mincore over a fresh mapping, which faults nothing in)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    try:
        anchor = ctypes.c_char.from_buffer(mm)
        vec = (ctypes.c_ubyte * (size // mmap.PAGESIZE))()
        try:
            assert _libc.mincore(ctypes.addressof(anchor), size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            del anchor
        return sum(v & 1 for v in vec)
    finally:
        mm.close()


def test_without_warming_the_page_cache_is_filled_ahead_and_nothing_written(tmp_path: Path) -> None:
    """The files ahead of the write position are in the page cache before any put reaches them
    (a producer's first store then finds each page there), read as zeros, and hold no disk blocks
    beyond what the reservation took: the pages were read in, not written."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        size = service.config.mapped_file_size_commit_log
        pages = size // mmap.PAGESIZE
        commit_log = service.config.commit_log_dir.resolve()
        files = [commit_log / offset_to_file_name(i * size) for i in range(5)]
        wait_until(
            lambda: all(f.exists() and resident_pages(f) == pages for f in files[:3]),
            60,
            "files ahead cached",
        )
        bodies = [b"%06d" % i + bytes(2000) for i in range(1200)]  # ~2.5 files of records
        for body in bodies:
            assert producer.send("W", body, queue_id=0).ok
        wrote = service.read(layout.WROTE_POSITION)
        current, ahead = files[wrote // size], files[wrote // size + 1]
        wait_until(
            lambda: ahead.exists() and resident_pages(ahead) == pages,
            60,
            "the next file cached once writes reach its predecessor",
        )
        assert ahead.read_bytes() == bytes(size)
        reserved = service.read(layout.ALLOCATED_UNTIL)
        assert os.stat(ahead).st_blocks * 512 <= max(0, reserved - (wrote // size + 1) * size), (
            "blocks written ahead"
        )
        assert current.read_bytes()[wrote % size :] == bytes(size - wrote % size)


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_files_made_ahead_are_warmed_and_locked_until_writes_pass_them(tmp_path: Path, flush: str) -> None:
    settings = dict(warmMapedFileEnable="true", flushDiskType=flush, flushLeastPagesWhenWarmMapedFile="64")
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        size = service.config.mapped_file_size_commit_log
        allocator = service.worker_pid("allocator")
        commit_log = service.config.commit_log_dir.resolve()
        names = [offset_to_file_name(i * size) for i in range(6)]
        wait_until(lambda: service.read(layout.ALLOCATED_UNTIL) >= 3 * size, 60, "three files reserved")
        wait_until(  # reserved before they are warmed: a put need not reserve for itself meanwhile
            lambda: locked_kib(allocator, commit_log) == dict.fromkeys(names[:3], size // 1024),
            60,
            "three files warmed and locked",
        )
        bodies = [b"%06d" % i + bytes(2000) for i in range(1200)]  # ~2.5 files of records
        for body in bodies:
            assert producer.send("W", body, queue_id=0).ok
        current = service.read(layout.WROTE_POSITION) // size
        wait_until(
            lambda: (
                locked_kib(allocator, commit_log) == dict.fromkeys(names[current : current + 3], size // 1024)
            ),
            60,
            "files behind the write position released, the new ones locked",
        )
    with running_service(tmp_path) as service:  # the warmed files hold exactly what was put
        from rmq_mp.client.consumer import Consumer

        with Consumer.attach(service.root, "g") as consumer:
            got: list[bytes] = []
            while len(got) < len(bodies):
                result = consumer.pull("W", 0, len(got), 32, timeout_s=5)
                assert result.messages, result.status
                got.extend(m.body for m in result.messages)
            assert got == bodies
