"""Disk use proportional to content, and a full disk refused, never a SIGBUS.

ConsumeQueue, index and commit-log files are sparse at their full length and get disk blocks
reserved ahead of the write position in chunks (`MappedFile.reserve`, `IndexFile`, the
allocator's ALLOCATED_UNTIL). Each test runs the real service on its own small ext4 filesystem,
loop-mounted, so the disk it can use is bounded and a full disk is real (skipped, with the
reason, where mounting is refused).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.format.index_layout import index_file_size
from rmq_mp.format.queue_entry import CQ_ENTRY, CQ_STORE_UNIT_SIZE
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store.consume_queue import ConsumeQueue
from rmq_mp.store.index_file import IndexFile
from rmq_mp.store.mapped_file import OS_PAGE_SIZE, RESERVE_MAX_CHUNK_BYTES
from rmq_mp.store.reporter import Reporter
from shm import layout
from tests.service import RunningService, running_service, wait_until

MIB = 1 << 20
CQ_FILE_SIZE = 6_000_000  # RocketMQ's default: 300,000 entries
LOG_FILE_SIZE = 4 * MIB
HASH_SLOTS, INDEX_ENTRIES = 100_000, 400_000
SETTINGS = dict(
    mappedFileSizeCommitLog=str(LOG_FILE_SIZE),
    mappedFileSizeConsumeQueue=str(CQ_FILE_SIZE),
    maxHashSlotNum=str(HASH_SLOTS),
    maxIndexNum=str(INDEX_ENTRIES),
    cleanResourceInterval="3600000",  # no cleaning pass meddles with the disk while a test fills it
)


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Make and loop-mount an ext4 filesystem of the given size (MiB) under tmp_path (its image is
    sparse in tmp_path); unmounted after the test."""
    mounts: list[Path] = []

    def mount(size_mib: int) -> Path:
        image = tmp_path / f"fs{len(mounts)}.img"
        target = tmp_path / f"fs{len(mounts)}"
        target.mkdir()
        with image.open("wb") as f:
            f.truncate(size_mib * MIB)
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, text=True
        )
        if made.returncode:
            pytest.skip(f"cannot make an ext4 filesystem here ({made.stderr.strip()})")
        done = subprocess.run(
            ["mount", "-o", "loop", str(image), str(target)], capture_output=True, text=True
        )
        if done.returncode:
            pytest.skip(f"cannot loop-mount a filesystem here ({done.stderr.strip()}); a full disk needs one")
        mounts.append(target)
        return target

    yield mount
    for target in mounts:
        subprocess.run(["umount", "-l", str(target)], check=False)


def allocated_bytes(path: Path) -> int:
    """Disk blocks held by a file, or by everything under a directory (directories included)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return path.stat().st_blocks * 512 + sum(p.lstat().st_blocks * 512 for p in path.rglob("*"))


def fill_disk(mount: Path) -> Path:
    """Reserve every free block of ``mount`` in a ballast file; the disk is then full."""
    ballast = mount / "ballast"
    fd = os.open(ballast, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        end = 0
        for chunk in (MIB, OS_PAGE_SIZE):
            while True:
                try:
                    os.posix_fallocate(fd, end, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                end += chunk
    finally:
        os.close(fd)
    return ballast


def read_all(service: RunningService, topic: str, queue_id: int, count: int) -> list[bytes]:
    """The first ``count`` bodies of a queue, waiting (bounded) for them to be dispatched."""
    with Consumer.attach(service.root, "g") as consumer:
        got: list[bytes] = []
        while len(got) < count:
            result = consumer.pull(topic, queue_id, len(got), 64, timeout_s=10)
            assert result.messages, f"{topic}/{queue_id} at {len(got)} of {count}: {result.status}"
            got.extend(m.body for m in result.messages)
        return got


def test_queues_of_one_message_cost_a_page_each(tmp_path: Path, small_ext4: Callable[[int], Path]) -> None:
    """400 queues of one message each at RocketMQ's ConsumeQueue geometry: each queue file is 6 MB
    long and holds one 4 KiB page of disk; the store's whole allocation stays within the commit
    log's reservation (one file size ahead), the index's slot area and a few KiB a queue. Whole
    allocation, as before, would need 2.4 GB on a 96 MiB disk."""
    mount = small_ext4(96)
    topics, queues_per_topic = 50, 8
    with running_service(tmp_path, storePathRootDir=str(mount / "store"), **SETTINGS) as service:
        with Producer.attach(service.root) as producer:
            for t in range(topics):
                for q in range(queues_per_topic):
                    result = producer.send(f"T{t}", b"body-%d-%d" % (t, q), queue_id=q)
                    assert result.ok, result
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) == service.read(layout.WROTE_POSITION),
            30,
            "every message dispatched",
        )
        root = service.root
        cq_files = sorted((root / "consumequeue").rglob("0" * 20))
        assert len(cq_files) == topics * queues_per_topic
        for path in cq_files:
            data = path.read_bytes()
            assert len(data) == CQ_FILE_SIZE  # the length RocketMQ reads by
            phy, size, _tags = CQ_ENTRY.unpack_from(data, 0)
            assert phy >= 0
            assert size > 0
            assert data.count(0, CQ_STORE_UNIT_SIZE) == CQ_FILE_SIZE - CQ_STORE_UNIT_SIZE  # zeros beyond
            assert allocated_bytes(path) <= OS_PAGE_SIZE, path
        (index,) = (root / "index").iterdir()
        slots_end = 40 + HASH_SLOTS * 4
        assert index.stat().st_size == index_file_size(HASH_SLOTS, INDEX_ENTRIES)
        assert allocated_bytes(index) <= slots_end + RESERVE_MAX_CHUNK_BYTES + OS_PAGE_SIZE
        log_bytes = allocated_bytes(root / "commitlog")
        assert log_bytes <= LOG_FILE_SIZE + OS_PAGE_SIZE  # one file size ahead, not three files
        per_queue = 3 * OS_PAGE_SIZE  # its file's page, its directory, a share of its topic's
        bound = log_bytes + allocated_bytes(index) + topics * queues_per_topic * per_queue + 2 * MIB
        assert allocated_bytes(root) <= bound


def test_full_disk_refuses_puts_and_dispatch_resumes(
    tmp_path: Path, small_ext4: Callable[[int], Path]
) -> None:
    """With the disk full, dispatch cannot reserve a ConsumeQueue (or index) chunk: reput
    quarantines the queue, reports it and retries, nobody gets a SIGBUS; puts go on into the commit log's reserved blocks
    and are refused (CREATE_MAPEDFILE_FAILED, with the reason) past them. Once space is freed,
    every acknowledged message is dispatched and readable, and again after a restart."""
    mount = small_ext4(48)
    store = dict(storePathRootDir=str(mount / "store"), **SETTINGS)
    body = bytes(range(256)) * 4
    with running_service(tmp_path, **store) as service:
        reput_pid = service.worker_pid("reput")
        with Producer.attach(service.root) as producer:
            assert producer.send("F", b"first", queue_id=0).ok  # the queue's file and page exist
            wait_until(lambda: service.read(layout.ALLOCATED_UNTIL) >= LOG_FILE_SIZE, 60, "reservation")
            wait_until(
                lambda: service.read(layout.REPUT_FROM_OFFSET) == service.read(layout.WROTE_POSITION),
                10,
                "the first message dispatched",
            )
            ballast = fill_disk(mount)
            acked = [b"first"]
            refusal = None
            # 300 entries outgrow the queue's first page: the next chunk cannot be reserved.
            for i in range(300):
                result = producer.send("F", b"%06d" % i + body, queue_id=0)
                if not result.ok:
                    refusal = result
                    break
                acked.append(b"%06d" % i + body)
            # The queue is quarantined (docs/architecture.md, "Dispatch faults"): reported, retried.
            wait_until(
                lambda: service.read(layout.DISPATCH_FAILED_QUEUES) > 0, 10, "reput to quarantine the queue"
            )
            # Puts go on into the commit log's reserved blocks, and are refused past them.
            for i in range(300, 300 + 2 * LOG_FILE_SIZE // len(body)):
                if refusal is not None:
                    break
                result = producer.send("F", b"%06d" % i + body, queue_id=0)
                if not result.ok:
                    refusal = result
                    break
                acked.append(b"%06d" % i + body)
            assert refusal is not None, "a full disk must refuse puts once the reservation is used"
            assert refusal.status in (
                PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                PutMessageStatus.SERVICE_NOT_AVAILABLE,  # the disk-space check's DISK_FULL
            ), refusal
            assert refusal.reason
            if refusal.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED:
                assert "No space left on device" in refusal.reason, refusal.reason
            assert len(acked) > 301
            assert service.worker_pid("reput") == reput_pid  # alive, no SIGBUS
            ballast.unlink()
            assert read_all(service, "F", 0, len(acked)) == acked
            wait_until(lambda: producer.send("F", b"again", queue_id=0).ok, 10, "puts accepted again")
        assert service.worker_pid("reput") == reput_pid
    with running_service(tmp_path, **store) as service:
        assert read_all(service, "F", 0, len(acked) + 1) == [*acked, b"again"]


def _queue_bytes(root: Path) -> bytes:
    return (root / "T" / "0" / ("0" * 20)).read_bytes()


def test_refused_reservation_writes_nothing_and_a_retry_completes(
    tmp_path: Path, small_ext4: Callable[[int], Path]
) -> None:
    """On a full disk, a ConsumeQueue batch, a queue starting above offset 0 (its pre-blank
    entries) and an index block each raise ENOSPC with nothing written and nothing counted;
    retried once space is freed they leave the same bytes as on a disk that was never full."""
    mount = small_ext4(32)
    count = 600  # past the first page (204 entries), so the batch needs a second chunk
    phy = np.arange(count, dtype=np.int64) * 100
    size = np.full(count, 100, dtype=np.int64)
    tags = np.arange(count, dtype=np.int64)

    def write(root: Path, ballast_first: bool) -> tuple[bytes, bytes, bytes]:
        (root / "T" / "1").mkdir(parents=True)  # on a full disk a new directory fails first
        cq = ConsumeQueue("T", 0, root, CQ_FILE_SIZE, writable=True, reporter=Reporter())
        late = ConsumeQueue("T", 1, root, CQ_FILE_SIZE, writable=True, reporter=Reporter())
        # 1,000 slots: the first entry chunk (a page) holds ~200 entries, so the block needs another
        index = IndexFile(root / "index", 1000, 4000, writable=True, reporter=Reporter(), create=True)
        try:
            assert cq.put_position_infos(
                phy_offset=phy[:1], size=size[:1], tags_code=tags[:1], queue_offset=phy[:1] // 100
            )
            assert index.put_hashes(tags[:1], phy[:1], phy[:1] + 1_700_000_000_000) == 1
            if ballast_first:
                ballast = fill_disk(mount)
                with pytest.raises(OSError, match="No space left"):
                    cq.put_position_infos(phy_offset=phy, size=size, tags_code=tags, queue_offset=phy // 100)
                assert cq.max_offset_in_queue() == 1  # nothing counted
                with pytest.raises(OSError, match="No space left"):
                    late.put_message_position_info(
                        phy_offset=phy[-1], size=100, tags_code=7, queue_offset=5000
                    )
                assert not late.mfq.files  # the queue stays empty: a retry fills its pre-blanks
                with pytest.raises(OSError, match="No space left"):
                    index.put_hashes(tags[1:], phy[1:], phy[1:] + 1_700_000_000_000)
                assert index.entry_count() == 1
                ballast.unlink()
            assert cq.put_position_infos(phy_offset=phy, size=size, tags_code=tags, queue_offset=phy // 100)
            assert late.put_message_position_info(
                phy_offset=phy[-1], size=100, tags_code=7, queue_offset=5000
            )
            assert index.put_hashes(tags[1:], phy[1:], phy[1:] + 1_700_000_000_000) == count - 1
            index.flush()
            late_bytes = (root / "T" / "1" / ("0" * 20)).read_bytes()
            return _queue_bytes(root), late_bytes, (root / "index").read_bytes()
        finally:
            cq.close()
            late.close()
            index.close()

    full = write(mount / "full", ballast_first=True)
    reference = write(tmp_path / "reference", ballast_first=False)
    assert full == reference
    assert len(full[0]) == CQ_FILE_SIZE
    assert full[0][count * CQ_STORE_UNIT_SIZE :].count(0) == CQ_FILE_SIZE - count * CQ_STORE_UNIT_SIZE
