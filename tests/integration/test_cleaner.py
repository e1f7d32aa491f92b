"""The cleaner against a real running store: each RocketMQ cleaning rule
(`DefaultMessageStoreCleanFilesTest`) has a counterpart here, and the disk thresholds are crossed
for real on a small tmpfs each test mounts (skipped, with the reason, where mounting is refused).

File age is set with os.utime; the deleteWhen hour by configuration (an hour twelve hours away
never fires during a test, all 24 hours always do).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus, RunningFlags
from rmq_mp.put.producer import Producer
from rmq_mp.store.cleaning import CleanerStatistics
from rmq_mp.store.disk import disk_used_ratio
from shm import layout
from shm.pointer_table import now_ms
from tests.service import ROOT, RunningService, running_service, wait_until

MIB = 1 << 20
BODY = bytes(range(256)) * 40  # 10 KiB: about 100 records a 1 MiB commit-log file
NEVER = str((datetime.now().hour + 12) % 24)
ALWAYS = ";".join(str(h) for h in range(24))
CLEANER = dict(
    cleanResourceInterval="100",
    diskCheckIntervalMs="100",
    deleteCommitLogFilesInterval="0",
    deleteConsumeQueueFilesInterval="0",
    fileReservedTime="1",
    deleteWhen=NEVER,
)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Mount a tmpfs of the given size (MiB) under tmp_path; unmounted after the test."""
    mounts: list[Path] = []

    def mount(size_mib: int) -> Path:
        target = tmp_path / f"fs{len(mounts)}"
        target.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); disk thresholds need one")
        mounts.append(target)
        return target

    yield mount
    for target in mounts:
        subprocess.run(["umount", "-l", str(target)], check=False)


def fill_to(fs: Path, ratio: float) -> None:
    """Reserve real blocks in a filler file until the filesystem is ``ratio`` used (RocketMQ's
    used / (used + available))."""
    filler = fs / "filler"
    filler.unlink(missing_ok=True)
    st = os.statvfs(fs)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    need = int(ratio * entire) - used
    assert need > 0, f"already {used / entire:.0%} used"
    fd = os.open(filler, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, need)
    finally:
        os.close(fd)


def write_files(service: RunningService, producer: Producer, files: int, queues: int = 1) -> int:
    """Send 10 KiB messages until ``files`` commit-log files are full; returns how many."""
    size = service.config.mapped_file_size_commit_log
    sent = 0
    while service.read(layout.WROTE_POSITION) < files * size:
        result = producer.send("Clean", BODY, queue_id=sent % queues, keys=[f"k{sent}"])
        assert result.ok, result
        sent += 1
    end = service.read(layout.WROTE_POSITION)  # the last send may begin file `files`: its entry too
    wait_until(lambda: service.read(layout.REPUT_FROM_OFFSET) >= end, 20, "everything dispatched")
    return sent


def age_files(service: RunningService, first: int, count: int, hours: float = 2) -> None:
    """Date full files ``hours`` back (a file's mtime is its age to the cleaner), once the
    allocator is done with them. Every fallocate sets mtime, and one the allocator decided on
    just before the write position left a file may still be on its way into it (the moment
    between its read of the position and the call, `AllocatorService.reserve`); its fallocates
    start at or above ALLOCATED_UNTIL, so once that is past the files none is to come."""
    size = service.config.mapped_file_size_commit_log
    end = (first + count) * size
    wait_until(lambda: service.read(layout.ALLOCATED_UNTIL) >= end, 60, "the allocator past the files to age")
    date_files(service, first, count, hours)


def date_files(service: RunningService, first: int, count: int, hours: float) -> None:
    size = service.config.mapped_file_size_commit_log
    then = time.time() - hours * 3600
    for i in range(first, first + count):
        os.utime(service.root / "commitlog" / f"{i * size:020d}", (then, then))


def cleaner_passes(service: RunningService, passes: int) -> None:
    """Wait until the cleaner's loop has run ``passes`` more times (events, not sleeps)."""
    field = layout.worker_field("cleaner", "work_count")
    start = service.read(field)
    wait_until(lambda: service.read(field) >= start + passes, 20, f"{passes} cleaner passes")


def next_disk_check(service: RunningService, after_ms: int) -> None:
    """Wait for a disk check that began after ``after_ms`` and finished: the one after the first
    check that finished after it (that one may have measured before)."""
    seen = [0]

    def finished_after() -> bool:
        seen[0] = service.read(layout.DISK_CHECK_MS)
        return seen[0] > after_ms

    wait_until(finished_after, 30, "a disk check")
    wait_until(lambda: service.read(layout.DISK_CHECK_MS) > seen[0], 30, "the next disk check")


def stats(service: RunningService) -> CleanerStatistics:
    table = service.table()
    try:
        return CleanerStatistics.read(table, reserved_hours=service.config.file_reserved_time)
    finally:
        table.close()


def commit_log_names(service: RunningService) -> list[str]:
    return sorted(p.name for p in (service.root / "commitlog").iterdir() if not p.name.startswith("."))


def test_expired_files_are_deleted_only_at_the_delete_when_hour(tmp_path: Path) -> None:
    """testDeleteExpiredFilesByTimeUp: with no trigger nothing goes; at a deleteWhen hour the
    expired files go, oldest first, up to the first unexpired one."""
    with running_service(tmp_path, **CLEANER) as service, Producer.attach(service.root) as producer:
        write_files(service, producer, 5)
        age_files(service, 0, 3)
        cleaner_passes(service, 3)
        assert service.read(layout.MIN_OFFSET) == 0
        assert stats(service).runs == 0, "no trigger, no run (not the hour, disk below 75%)"
    size = 1 * MIB
    with running_service(tmp_path, **(CLEANER | {"deleteWhen": ALWAYS})) as service:
        wait_until(lambda: service.read(layout.MIN_OFFSET) == 3 * size, 20, "expired files deleted")
        wait_until(lambda: stats(service).runs >= 1, 20, "the run recorded (after its deletions)")
        s = stats(service)
        assert s.last_triggers == "deleteWhen"
        assert "fileReservedTime is 1 h" in s.last_outcome, s
        assert commit_log_names(service)[0] == f"{3 * size:020d}", "the first unexpired file stays"


def test_space_above_75_percent_deletes_only_expired_files(tmp_path: Path, small_fs) -> None:
    """testDeleteExpiredFilesBySpaceFull: past diskMaxUsedSpaceRatio (but not 85%), any hour,
    only files past fileReservedTime."""
    fs = small_fs(64)
    with running_service(fs, **CLEANER) as service, Producer.attach(service.root) as producer:
        write_files(service, producer, 6)
        age_files(service, 0, 2)
        fill_to(fs, 0.80)
        wait_until(lambda: service.read(layout.MIN_OFFSET) == 2 * MIB, 20, "the two expired files deleted")
        cleaner_passes(service, 2)
        s = stats(service)
        assert s.last_triggers == "disk space", s
        assert service.read(layout.MIN_OFFSET) == 2 * MIB, "unexpired files stay below 85%"
        assert "fileReservedTime is 1 h" in s.last_outcome


def test_forcibly_above_85_percent_deletes_unexpired_files_ten_a_run_never_the_last(
    tmp_path: Path, small_fs
) -> None:
    """testDeleteFilesImmediatelyBySpaceFull + batch size: past diskSpaceCleanForciblyRatio,
    fresh files go too, at most 10 a run, never the file being written."""
    fs = small_fs(128)
    settings = CLEANER | {"cleanResourceInterval": "1500"}
    with running_service(fs, **settings) as service, Producer.attach(service.root) as producer:
        write_files(service, producer, 13)
        current = service.read(layout.WROTE_POSITION) // MIB * MIB
        fill_to(fs, 0.95)
        wait_until(lambda: stats(service).runs >= 1, 20, "a forcible run")
        first = stats(service)
        assert first.last_triggers == "disk space+clean forcibly"
        assert first.last_deleted_files == 10
        assert first.last_outcome.startswith("deleted 10 files")
        # MIN_OFFSET moves before each file's unlink (new readers first): wait on the files
        wait_until(lambda: commit_log_names(service)[0] == f"{current:020d}", 30, "all but the current file")
        assert service.read(layout.MIN_OFFSET) == current
        cleaner_passes(service, 1)
        assert service.read(layout.MIN_OFFSET) == current, "the file being written is never deleted"


def test_disk_full_refuses_sends_with_the_reason_until_cleaning_frees_space(tmp_path: Path, small_fs) -> None:
    """Filling a real filesystem past 90% sets DISK_FULL (on the disk check's own schedule) and
    sends get SERVICE_NOT_AVAILABLE naming it; forcible cleaning frees space, the flag clears
    and sends are accepted again. Nothing acknowledged before is lost. Files go 300 ms apart
    (deleteCommitLogFilesInterval): ten at once took the disk from 93% to 77% before the disk
    check had looked, so no send was refused (1 run in ~15)."""
    fs = small_fs(64)
    settings = CLEANER | {"deleteCommitLogFilesInterval": "300"}
    with running_service(fs, **settings) as service, Producer.attach(service.root) as producer:
        sent = write_files(service, producer, 12)
        fill_to(fs, 0.93)
        refused = None
        deadline = time.monotonic() + 20
        while refused is None and time.monotonic() < deadline:
            result = producer.send("Clean", b"x")
            if result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
                refused = result
        assert refused is not None, "no send was refused at 93% used"
        assert "DISK_FULL" in refused.reason
        assert "diskSpaceWarningLevelRatio 90%" in refused.reason, refused.reason
        wait_until(
            lambda: not service.read(layout.RUNNING_FLAGS) & RunningFlags.DISK_FULL, 20, "DISK_FULL cleared"
        )
        assert disk_used_ratio(fs) <= 0.90, "cleared once not above diskSpaceWarningLevelRatio"
        assert producer.send("Clean", b"accepted again").ok
        # The sends until the refusal may have rolled into newer files, so "the file being
        # written" is taken now, not before them (a test bug that failed once in ~10 runs).
        writing = service.read(layout.WROTE_POSITION) // MIB * MIB
        wait_until(lambda: service.read(layout.MIN_OFFSET) >= 10 * MIB, 20, "a batch of 10 fresh files gone")
        assert writing >= service.read(layout.MIN_OFFSET), "never the file being written"
        assert sent > 1000


def test_the_disk_check_keeps_its_own_schedule_when_cleaning_is_hourly(tmp_path: Path, small_fs) -> None:
    """RocketMQ runs `isSpaceFull` on its own executor every 10 s, whatever cleanResourceInterval
    is: with cleaning set to once an hour, filling a real filesystem past
    diskSpaceWarningLevelRatio still refuses sends by the next disk check (diskCheckIntervalMs)
    with DISK_FULL named, stores nothing, and freeing the space re-admits them, while the cleaning
    loop never runs. Waits on the checks' own timestamps (DISK_CHECK_MS), not on time."""
    fs = small_fs(64)
    settings = CLEANER | {"cleanResourceInterval": "3600000", "diskCheckIntervalMs": "500"}
    cleaner_runs = layout.worker_field("cleaner", "work_count")
    with running_service(fs, **settings) as service, Producer.attach(service.root) as producer:
        assert producer.send("Clean", b"before").ok
        runs = service.read(cleaner_runs)
        fill_to(fs, 0.93)
        next_disk_check(service, now_ms())
        assert service.read(layout.RUNNING_FLAGS) & RunningFlags.DISK_FULL, "DISK_FULL after the next check"
        wrote = service.read(layout.WROTE_POSITION)
        refused = producer.send("Clean", b"refused")
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
        assert "DISK_FULL" in refused.reason
        assert "diskSpaceWarningLevelRatio 90%" in refused.reason, refused.reason
        assert not producer.send_batch([dict(topic="Clean", body=b"refused too")]).ok
        assert service.read(layout.WROTE_POSITION) == wrote, "a refused send stores nothing"
        (fs / "filler").unlink()
        next_disk_check(service, now_ms())
        assert not service.read(layout.RUNNING_FLAGS) & RunningFlags.DISK_FULL, "cleared by the next check"
        assert producer.send("Clean", b"accepted again").ok
        assert service.read(cleaner_runs) == runs, "no cleaning run: the disk check did it on its own"


def test_manual_deletion_from_rmq_admin(tmp_path: Path) -> None:
    """`rmq-admin deleteExpiredCommitLog` makes the cleaner run now, whatever the hour and disk,
    still only for expired files; both output forms report the run."""
    with running_service(tmp_path, **CLEANER) as service, Producer.attach(service.root) as producer:
        write_files(service, producer, 5)
        age_files(service, 0, 2)
        cleaner_passes(service, 2)
        assert service.read(layout.MIN_OFFSET) == 0
        admin = [
            sys.executable,
            "-m",
            "rmq_mp.tools.admin",
            "deleteExpiredCommitLog",
            "--name",
            service.names.base,
        ]
        human = subprocess.run(admin, capture_output=True, text=True, cwd=ROOT, check=True).stdout
        assert "deleted 2 file(s)" in human, human
        assert "stopped: oldest file 00000000000002097152" in human
        assert service.read(layout.MIN_OFFSET) == 2 * MIB
        age_files(service, 2, 1)
        # A request buys 20 runs, as RocketMQ's manualDeleteFileSeveralTimes: the next one takes it.
        wait_until(lambda: service.read(layout.MIN_OFFSET) == 3 * MIB, 20, "a later manual run")
        machine = json.loads(
            subprocess.run([*admin, "--json"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
        )
        assert machine["last_triggers"] == "manual"
        assert machine["last_deleted_files"] == 0
        assert machine["min_offset"] == 3 * MIB
        assert "00000000000003145728 was modified" in machine["last_outcome"]


def test_a_stalled_reservation_leaves_full_files_alone(tmp_path: Path) -> None:
    """The allocator's reservation is a posix_fallocate, and the kernel counts every fallocate
    as a modification (ext4 sets mtime even where the blocks are all there already), while the
    cleaner expires a file by its mtime: so no reservation may land in a file the write position
    has left. Forced here: the allocator is held inside a pass that began when the write position
    was in file 1 (a lease on the temporary name it creates file 3 under blocks that open), while
    the producer fills files 1-3 and they are aged; once it goes on, their ages are as set. (A
    pass that reserved from the write position it read at its start touched file 2 here, and
    made test_manual_deletion_from_rmq_admin find file 1 "modified 0.0 h ago" under load.)"""
    size = MIB
    with running_service(tmp_path, **CLEANER) as service, Producer.attach(service.root) as producer:
        commit_log = service.root / "commitlog"
        wait_until(lambda: (commit_log / f"{2 * size:020d}").exists(), 60, "the allocator's first files")
        held = commit_log / f".{3 * size:020d}.tmp{service.worker_pid('allocator')}"
        held.touch()
        previous = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the lease break's signal
        fd = os.open(held, os.O_RDONLY)
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
            sent = 0
            while service.read(layout.WROTE_POSITION) < size:
                assert producer.send("Clean", BODY, keys=[f"k{sent}"]).ok
                sent += 1
            wait_until(
                lambda: fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_UNLCK, 20, "the allocator to open file 3"
            )
            while service.read(layout.WROTE_POSITION) < 4 * size:
                assert producer.send("Clean", BODY, keys=[f"k{sent}"]).ok
                sent += 1
            date_files(service, 0, 4, 2)  # not age_files: it would wait for the held allocator
            aged = {
                name: (commit_log / name).stat().st_mtime_ns
                for name in (f"{i * size:020d}" for i in range(4))
            }
        finally:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            os.close(fd)
            signal.signal(signal.SIGIO, previous)
        wrote = service.read(layout.WROTE_POSITION)
        wait_until(lambda: service.read(layout.ALLOCATED_UNTIL) > wrote, 60, "the allocator to catch up")
        now = {name: (commit_log / name).stat().st_mtime_ns for name in aged}
        assert now == aged, f"full files modified after the write position left them: {now} != {aged}"


def test_consume_queues_and_index_follow_the_new_minimum(tmp_path: Path) -> None:
    """CleanConsumeQueueService: queue files wholly below the new commit-log minimum go, the
    queue's minimum offset moves, readers of deleted offsets get OFFSET_TOO_SMALL with the new
    minimum, index files below it go, and what is left is still found."""
    settings = CLEANER | {"mappedFileSizeConsumeQueue": "2000", "maxIndexNum": "300"}
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        sent = write_files(service, producer, 6)
        queue_dir = service.root / "consumequeue" / "Clean" / "0"
        index_dir = service.root / "index"
        cq_before = sorted(p.name for p in queue_dir.iterdir())
        index_before = sorted(p.name for p in index_dir.iterdir())
        assert len(cq_before) > 4
        assert len(index_before) > 4
        age_files(service, 0, 4)
        with Consumer.attach(service.root, "g") as consumer:
            first_kept = consumer.pull("Clean", 0, 0, 1).messages[0]
            subprocess.run(
                [sys.executable, "-m", "rmq_mp.tools.admin", "deleteExpiredCommitLog", "--name", service.names.base],
                check=True, cwd=ROOT, capture_output=True,
            )  # fmt: skip
            assert service.read(layout.MIN_OFFSET) == 4 * MIB
            wait_until(lambda: stats(service).consume_queue_files_deleted > 0, 20, "queue files deleted")
            cq_after = sorted(p.name for p in queue_dir.iterdir())
            assert cq_after[0] > cq_before[0]
            assert cq_after[-1] == cq_before[-1]
            result = consumer.pull("Clean", 0, 0, 32)
            assert result.status is GetMessageStatus.OFFSET_TOO_SMALL
            new_min = result.next_begin_offset
            assert new_min == result.min_offset > 0
            kept = consumer.pull("Clean", 0, new_min, 1).messages[0]
            assert kept.commit_log_offset >= 4 * MIB, "the new minimum is the first message still stored"
            previous = consumer.pull("Clean", 0, new_min - 1, 1)
            assert previous.status is GetMessageStatus.OFFSET_TOO_SMALL
            assert first_kept.commit_log_offset < 4 * MIB
        wait_until(lambda: stats(service).index_files_deleted > 0, 20, "index files deleted")
        index_after = sorted(p.name for p in index_dir.iterdir())
        assert index_after[-1] == index_before[-1]
        assert len(index_after) < len(index_before)
    from rmq_mp.config.store_config import MessageStoreConfig
    from rmq_mp.store.message_store import MessageStore

    config = MessageStoreConfig.from_file(service.conf)
    with MessageStore.open(service.root, config, read_only=True) as store:
        assert store.query_message("Clean", f"k{sent - 1}"), "the newest key is still found"
        assert not store.query_message("Clean", "k0"), "a deleted message is not returned"
        assert store.get_message("Clean", 0, 0, 1).status is GetMessageStatus.OFFSET_TOO_SMALL


def test_a_held_file_waits_for_its_reader_then_goes(tmp_path: Path) -> None:
    """A consumer holding a file keeps reading it while the cleaner waits; once released the
    file is deleted and the reader gets OFFSET_TOO_SMALL, never a crash."""
    settings = CLEANER | {"fileReservedTime": "0", "destroyMapedFileIntervalForcibly": "600000"}
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        write_files(service, producer, 3)
        first_file = service.root / "commitlog" / f"{0:020d}"
        with Consumer.attach(service.root, "reader") as consumer:
            before = consumer.pull("Clean", 0, 0, 8).messages
            with consumer.hold_from(0):
                subprocess.run(
                    [sys.executable, "-m", "rmq_mp.tools.admin", "deleteExpiredCommitLog", "--name", service.names.base],
                    check=True, cwd=ROOT, capture_output=True,
                )  # fmt: skip
                s = stats(service)
                assert f"held by consumer pid {os.getpid()}" in s.last_outcome, s
                assert s.pending_file_offset == 0
                assert first_file.exists()
                cleaner_passes(service, 3)
                assert first_file.exists(), "not deleted while held"
                again = consumer.pull("Clean", 0, 0, 8)
                assert again.status is GetMessageStatus.FOUND
                assert [m.body for m in again.messages] == [m.body for m in before]
            wait_until(lambda: not first_file.exists(), 20, "the released file deleted")
            assert stats(service).forced_destroys == 0
            wait_until(
                lambda: consumer.pull("Clean", 0, 0, 8).status is GetMessageStatus.OFFSET_TOO_SMALL,
                20,
                "reads of the deleted file answered OFFSET_TOO_SMALL",
            )


def test_a_held_file_is_deleted_after_the_forcible_interval_and_the_reader_keeps_valid_bytes(
    tmp_path: Path,
) -> None:
    """destroyMapedFileIntervalForcibly: a reader that never releases does not keep the file
    forever; its own mapping stays valid (POSIX unlink), so it never reads freed memory."""
    settings = CLEANER | {"fileReservedTime": "0", "destroyMapedFileIntervalForcibly": "1000"}
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        write_files(service, producer, 3)
        first_file = service.root / "commitlog" / f"{0:020d}"
        with Consumer.attach(service.root, "reader") as consumer:
            with consumer.hold_from(0):
                before = consumer.pull("Clean", 0, 0, 8).messages
                subprocess.run(
                    [sys.executable, "-m", "rmq_mp.tools.admin", "deleteExpiredCommitLog", "--name", service.names.base],
                    check=True, cwd=ROOT, capture_output=True,
                )  # fmt: skip
                wait_until(lambda: not first_file.exists(), 20, "forcible deletion")
                assert stats(service).forced_destroys >= 1
                log_view = consumer.store.commit_log
                assert log_view.mfq.files[0].file_from_offset == 0, "this process still maps the file"
                for message in before:
                    again = log_view.look_message_by_offset(message.commit_log_offset)
                    assert again.body == message.body
                    assert again.msg_id == message.msg_id
            wait_until(
                lambda: (
                    consumer.pull("Clean", 0, 0, 8).status
                    in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.MESSAGE_WAS_REMOVING)
                ),
                20,
                "reads after release answer that the data is gone",
            )


def test_clean_protect_consumer_offsets_keeps_unconsumed_files(tmp_path: Path, small_fs) -> None:
    """cleanProtectConsumerOffsets (RocketMQ #4549): expired files a known group has not consumed
    stay, below the warning ratio; past it they go anyway."""
    fs = small_fs(64)
    settings = CLEANER | {
        "deleteWhen": ALWAYS,
        "cleanProtectConsumerOffsets": "true",
        "fileReservedTime": "0",
    }
    with (
        running_service(fs, **settings) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "slow-group") as consumer,
    ):
        consumer.commit({("Clean", 0): 0})  # a known group that has consumed nothing yet
        write_files(service, producer, 5)
        cleaner_passes(service, 3)
        assert service.read(layout.MIN_OFFSET) == 0, "every file holds unconsumed messages"
        assert "has not consumed yet" in stats(service).last_outcome
        messages: list = []
        offset = 0
        while not messages or messages[-1].commit_log_offset < 2 * MIB:
            result = consumer.pull("Clean", 0, offset, 32)
            messages += result.messages
            offset = result.next_begin_offset
        consumer.commit({("Clean", 0): offset})
        wait_until(lambda: service.read(layout.MIN_OFFSET) == 2 * MIB, 20, "consumed files deleted")
        cleaner_passes(service, 2)
        assert service.read(layout.MIN_OFFSET) == 2 * MIB
        assert "has not consumed yet" in stats(service).last_outcome
        fill_to(fs, 0.93)
        current = service.read(layout.WROTE_POSITION) // MIB * MIB
        wait_until(lambda: service.read(layout.MIN_OFFSET) == current, 20, "past 90% protection ends")
