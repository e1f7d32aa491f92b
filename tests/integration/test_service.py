"""The service with real processes: supervisor, workers, producers and consumers attaching by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import StoreNotRunningError
from rmq_mp.outcomes import GetMessageResult, GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendResult
from rmq_mp.store.message_store import MessageStore
from shm import layout
from shm.pointer_table import now_ms
from tests.integration.test_ops import free_port
from tests.integration.test_round_trip import independent_records
from tests.load import QUEUES, TOPICS, message_for
from tests.service import (
    ROOT,
    RunningService,
    poll_bodies,
    reference_put_path,
    running_service,
    start_producers,
    start_service,
    store_cpu_fraction,
    wait_in,
    wait_until,
    worker_passes,
)


def run_producers(
    service: RunningService, tmp_path: Path, producers: int, count: int, batch: int = 1
) -> list[Path]:
    procs, outs = start_producers(service, tmp_path, [count] * producers, batch)
    for proc in procs:
        assert proc.wait(300) == 0
    return outs


def read_all(consumer: Consumer) -> dict[tuple[str, int], list]:
    found: dict[tuple[str, int], list] = {}
    for topic in TOPICS:
        for queue_id in range(QUEUES):
            messages, offset = [], 0
            while True:
                result = consumer.pull(topic, queue_id, offset, 32)
                if result.status is not GetMessageStatus.FOUND:
                    assert result.status in (
                        GetMessageStatus.OFFSET_OVERFLOW_ONE,
                        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                    )
                    break
                messages.extend(result.messages)
                offset = result.next_begin_offset
            found[(topic, queue_id)] = messages
    return found


def check_everything_once(found: dict[tuple[str, int], list], producers: int, count: int) -> None:
    """Every message read back once, byte-identical; queue offsets contiguous; producer order kept."""
    seen: set[tuple[int, int]] = set()
    for (topic, queue_id), messages in found.items():
        assert [msg.queue_offset for msg in messages] == list(range(len(messages)))
        last_seq: dict[int, int] = defaultdict(lambda: -1)
        for msg in messages:
            producer, seq = int(msg.properties["producer"]), int(msg.properties["seq"])
            assert (producer, seq) not in seen
            seen.add((producer, seq))
            assert message_for(producer, seq) == (topic, queue_id, msg.body)
            assert seq > last_seq[producer], "per-producer order within a queue"
            last_seq[producer] = seq
    assert len(seen) == producers * count


@pytest.mark.slow
def test_four_producer_processes_every_message_once(tmp_path: Path) -> None:
    producers, count = 4, 25_000
    with running_service(tmp_path) as service:
        outs = run_producers(service, tmp_path, producers, count, batch=1)
        for out in outs:
            assert {json.loads(line)["status"] for line in out.read_text().splitlines()} == {"PUT_OK"}
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
            60,
            "dispatch to catch up",
        )
        with Consumer.attach(service.names.base, "checker") as consumer:
            check_everything_once(read_all(consumer), producers, count)
    # The files the service wrote follow the spec byte for byte.
    records = independent_records(service.root / "commitlog", service.config.mapped_file_size_commit_log)
    assert len(records) == producers * count
    with MessageStore.open(config=service.config, read_only=True) as store:
        assert store.recovery is not None
        assert not store.recovery.abnormal
        assert sum(q.max_offset for t in store.topics() for q in store.queue_status(t)) == producers * count


def _assert_is_its_worker(service: RunningService, role: str, pid: int) -> None:
    """The worker `ps` and the store's own checks see: its name, its command line exactly as
    ``python -m workers.<role>`` would have, and none of the supervisor's files (its store lock)."""
    proc = psutil.Process(pid)
    assert proc.name() == f"rmq-{role}"
    command = [arg for arg in proc.cmdline() if arg]  # a forked worker's is padded with NULs
    assert Path(command[0]).name == Path(sys.executable).name
    assert command[1:] == ["-m", f"workers.{role}", service.names.base, str(service.root)]
    assert proc.ppid() == service.process.pid
    assert str(service.root / "lock") not in {f.path for f in proc.open_files()}


@pytest.mark.parametrize("started", ["forked", "executed"])
def test_a_killed_worker_comes_back_as_the_same_command_forked_or_executed(
    tmp_path: Path, started: str
) -> None:
    """The supervisor forks its workers (workers/spawn.py) unless another of its threads runs:
    the metrics endpoint's makes it execute them. Either way a restarted worker is the same."""
    settings = {"metricsPort": str(free_port())} if started == "executed" else {}
    with running_service(tmp_path, **settings) as service:
        first = service.worker_pid("reput")
        _assert_is_its_worker(service, "reput", first)
        os.kill(first, signal.SIGKILL)
        killed_ms = now_ms()
        heartbeat = layout.worker_field("reput", "heartbeat_ms")
        wait_until(  # a heartbeat after the kill is the new worker's, which beats once it is ready
            lambda: service.worker_pid("reput") not in (0, first) and service.read(heartbeat) > killed_ms,
            30,
            "reput to be restarted",
        )
        _assert_is_its_worker(service, "reput", service.worker_pid("reput"))
        assert service.process.poll() is None


def test_start_status_stop_and_a_second_supervisor_is_refused(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        status = subprocess.run(
            [sys.executable, "run.py", "status", "--conf", str(service.conf), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        info = json.loads(status.stdout)
        assert info["state"] == "RUNNING"
        assert info["broker"] == "DefaultCluster/broker-a ASYNC_MASTER"  # cluster/name role
        assert set(info["workers"]) == {"allocator", "flusher", "reput", "cleaner", "scheduler"}
        assert all(w["state"] == "ready" for w in info["workers"].values())
        for role, w in info["workers"].items():
            proc = psutil.Process(w["pid"])
            assert proc.name() == f"rmq-{role}"
            assert f"workers.{role}" in " ".join(proc.cmdline())
            assert str(service.root) in proc.cmdline()
        second = subprocess.run(
            [sys.executable, "run.py", "start", "--conf", str(service.conf)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2
        assert "already" in second.stderr
        human = subprocess.run(
            [sys.executable, "run.py", "status", "--conf", str(service.conf)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "RUNNING" in human
        assert "broker DefaultCluster/broker-a ASYNC_MASTER" in human
        assert "reput" in human
        assert "pool" in human
        assert "flags" in human
    assert not (service.root / "abort").exists()


def test_attaching_to_a_store_that_is_not_running_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(StoreNotRunningError, match="not running"):
        Producer.attach(tmp_path)
    with pytest.raises(StoreNotRunningError):
        Consumer.attach("rmq_nosuchstore", "g")


def test_two_stores_side_by_side(tmp_path: Path) -> None:
    with running_service(tmp_path, "one") as one, running_service(tmp_path, "two") as two:
        assert one.names.base != two.names.base
        with Producer.attach(one.root) as p1, Producer.attach(two.root) as p2:
            assert p1.send("T", b"one", queue_id=0).ok
            assert p2.send("T", b"two", queue_id=0).ok
        with Consumer.attach(one.root, "g") as c1, Consumer.attach(two.root, "g") as c2:
            assert [m.body for m in c1.pull("T", 0, 0, timeout_s=5).messages] == [b"one"]
            assert [m.body for m in c2.pull("T", 0, 0, timeout_s=5).messages] == [b"two"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
def test_another_uid_cannot_attach(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        code = (  # import first: the other user cannot read this interpreter's files under /root
            "import os, json, rmq_mp.store.running_store\n"
            "from rmq_mp.put.producer import Producer\n"
            "from rmq_mp.errors import ShmAttachError\n"
            "os.setgid(65534); os.setuid(65534)\n"
            f"try:\n    Producer.attach({service.names.base!r})\nexcept ShmAttachError as e:\n"
            "    print('refused:', e); raise SystemExit(0)\nraise SystemExit(1)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "not allowed" in result.stdout
        assert oct(os.stat(f"/dev/shm/{service.names.base}_ptr").st_mode & 0o777) == "0o600"


def test_long_poll_wakes_on_dispatch(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Consumer.attach(service.root, "g") as consumer:
        assert consumer.pull("T", 0, 0, timeout_s=0.2).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
        pulled: list[GetMessageResult] = []
        puller = threading.Thread(
            target=lambda: pulled.append(consumer.pull("T", 0, 0, timeout_s=30)), daemon=True
        )
        started = time.monotonic()
        puller.start()
        try:
            # The pull is parked (its waiter slot says so) before the message exists: only a wake
            # from another process's put, through dispatch, can end it before its 30 s.
            wait_until(lambda: consumer.waiters.waiting_slots() != [], 10, "the pull to park")
            sender = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from rmq_mp.put.producer import Producer\n"
                    f"Producer.attach({service.names.base!r}).send('T', b'late', queue_id=0)",
                ],
                cwd=ROOT,
                timeout=60,
            )
        finally:
            puller.join(60)
        waited = time.monotonic() - started
        assert sender.returncode == 0
        assert [m.body for m in pulled[0].messages] == [b"late"]
        assert waited < 10, "woken by dispatch, not by the timeout"
        consumer.subscribe("T", "TagX || TagY")
        with Producer.attach(service.root) as producer:
            producer.send("T", b"x", tags="TagX", queue_id=1)
            producer.send("T", b"z", tags="TagZ", queue_id=1)
            producer.send("T", b"y", tags="TagY", queue_id=1)
        got = poll_bodies(consumer, 2, 20, "poll")
        assert sorted(got) == [b"x", b"y"], "untagged and TagZ messages are filtered out"


def test_puts_wait_for_dispatch_beyond_max_dispatch_lag(tmp_path: Path) -> None:
    """Back-pressure: with reput stopped the log runs ahead until maxDispatchLagBytes; then a put
    waits for reput (and succeeds once it catches up), or is refused OS_PAGECACHE_BUSY with the
    reason when reput does not come back. Nothing acknowledged is lost either way."""
    limit = 64 << 10
    with (
        running_service(tmp_path, maxDispatchLagBytes=str(limit)) as service,
        Producer.attach(service.root) as producer,
    ):
        reput = psutil.Process(service.worker_pid("reput"))
        acked = [producer.send("Lag", b"warm", queue_id=0)]
        reput.suspend()
        try:
            while service.read(layout.WROTE_POSITION) - service.read(layout.REPUT_FROM_OFFSET) <= limit:
                acked.append(producer.send("Lag", b"x" * 1024, queue_id=0))
            assert all(r.ok for r in acked)
            wrote = service.read(layout.WROTE_POSITION)
            sent: list[SendResult] = []
            sender = threading.Thread(target=lambda: sent.append(producer.send("Lag", b"waited", queue_id=0)))
            sender.start()
            try:
                wait_in(sender, "_wait_for_dispatch")  # the put is held back, not refused
                assert service.read(layout.WROTE_POSITION) == wrote, "the held put appended nothing"
            finally:
                reput.resume()
                sender.join(30)
            assert sent[0].ok, sent[0]  # once reput caught up
            acked.append(sent[0])
            reput.suspend()
            while service.read(layout.WROTE_POSITION) - service.read(layout.REPUT_FROM_OFFSET) <= limit:
                acked.append(producer.send("Lag", b"y" * 1024, queue_id=0))
            refused = producer.send("Lag", b"refused", queue_id=0)
            assert refused.status is PutMessageStatus.OS_PAGECACHE_BUSY
            assert "maxDispatchLagBytes" in refused.reason, refused.reason
        finally:
            reput.resume()
        after = producer.send("Lag", b"after", queue_id=0)
        assert after.ok
        acked.append(after)
        with Consumer.attach(service.root, "lag") as consumer:
            wait_until(
                lambda: consumer.pull("Lag", 0, 0, 1).max_offset == len(acked), 10, "everything dispatched"
            )
            assert [r.queue_offset for r in acked] == list(range(len(acked)))


def test_sync_flush_request_is_waiting_before_its_ticket_is_published(tmp_path: Path) -> None:
    """The flusher reads FLUSH_REQUEST_SEQ without the put lock and answers tickets up to it: a
    ticket published before its slot said WAITING looked answered and was never looked at again
    (a put then failed with FLUSH_DISK_TIMEOUT after syncFlushTimeout, about 1 in 40k SYNC sends
    under 8 producers). The order of the producer's shared writes is recorded and checked."""
    from shm import flush_requests as fr

    with (
        running_service(tmp_path, flushDiskType="SYNC_FLUSH") as service,
        Producer.attach(service.root) as producer,
    ):
        reference_put_path(producer)  # the order of the reference's own stores is recorded
        writes: list[tuple[str, int, int]] = []

        class Recorded:
            """The producer's word view of a segment, recording each store in order."""

            def __init__(self, name: str, words: Any) -> None:
                self.name, self.words = name, words

            def __getitem__(self, index: int) -> int:
                return int(self.words[index])

            def __setitem__(self, index: int, value: int) -> None:
                writes.append((self.name, index, value))
                self.words[index] = value

        requests = producer.flush_requests
        requests.ring._words = Recorded("ring", requests.ring._words)  # type: ignore[assignment]
        requests._words = Recorded("table", requests._words)  # type: ignore[assignment]
        state_words = {producer.ring.word_index(slot, fr.STATE) for slot in range(producer.ring.capacity)}
        for _ in range(3):
            assert producer.send("Sync", b"x", queue_id=0).ok
            assert producer.send_batch([dict(topic="Sync", body=b"y", queue_id=1)] * 2).ok
        published = [i for i, w in enumerate(writes) if w[:2] == ("table", layout.FLUSH_REQUEST_SEQ.index)]
        waiting = [
            i
            for i, (name, word, value) in enumerate(writes)
            if name == "ring" and word in state_words and value == fr.WAITING
        ]
        assert len(published) == len(waiting) == 6
        assert all(w < p for w, p in zip(waiting, published, strict=True)), writes


def test_sync_flush_durability_and_visibility(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, flushDiskType="SYNC_FLUSH", syncFlushTimeout="700") as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        for i in range(200):
            result = producer.send("S", b"durable %d" % i, queue_id=0)
            assert result.status is PutMessageStatus.PUT_OK
            assert service.read(layout.FLUSHED_POSITION) >= result.commit_log_offset + 1
        flusher = psutil.Process(service.worker_pid("flusher"))
        flusher.suspend()
        try:
            started = time.monotonic()
            stuck = producer.send("S", b"not durable yet", queue_id=0)
            assert stuck.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert 0.6 <= time.monotonic() - started < 5
            assert stuck.stored, "in the log, not flushed: stored"
            assert not stuck.ok, "only PUT_OK is ok"
            stuck_batch = producer.send_batch(
                [{"topic": "S", "body": b"batch not durable yet", "queue_id": 0}]
            )
            assert not stuck_batch.ok
            assert stuck_batch.failures == 1
            assert stuck_batch[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert stuck_batch[0].stored
            flushed = service.read(layout.FLUSHED_POSITION)
            assert stuck.commit_log_offset >= flushed
            worker_passes(service, "reput")  # reput looked at the log after the record was written
            assert service.read(layout.FLUSHED_POSITION) == flushed
            assert consumer.pull("S", 0, 200).status is GetMessageStatus.OFFSET_OVERFLOW_ONE, (
                "not visible above the flushed offset"
            )
        finally:
            flusher.resume()
        assert producer.send("S", b"after resume", queue_id=0).status is PutMessageStatus.PUT_OK
        wait_until(lambda: len(consumer.pull("S", 0, 200, 10, timeout_s=1).messages) == 3, 60, "all visible")
        assert [m.body for m in consumer.pull("S", 0, 200, 10).messages] == [
            b"not durable yet",
            b"batch not durable yet",
            b"after resume",
        ]


def test_sync_reput_passes_are_paced_by_reput_batch_interval(tmp_path: Path) -> None:
    """Under SYNC_FLUSH records become readable at each flush; reput starts a pass at most every
    reputBatchIntervalMs (a pass per flush took half a core from the producers), yet a record
    after a quiet spell is dispatched (at once: tests/unit/test_pass_pacing.py, on a fake clock;
    a SCHED_IDLE reput on a loaded machine waited longer than the interval for a CPU), and every
    record is dispatched in the end."""
    interval_s = 1.0
    passes = layout.worker_field("reput", "work_count")
    with (
        running_service(tmp_path, flushDiskType="SYNC_FLUSH", reputBatchIntervalMs="1000") as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        # Idle: reput finished a pass that found nothing to dispatch. Only a pass that dispatched
        # paces the next one, so the record below is dispatched at the flush's wake.
        worker_passes(service, "reput", passes=1)
        assert service.read(layout.REPUT_FROM_OFFSET) == service.read(layout.WROTE_POSITION)
        assert producer.send("Paced", b"first", queue_id=0).ok
        assert [m.body for m in consumer.pull("Paced", 0, 0, timeout_s=30).messages] == [b"first"]
        before = service.read(passes)
        sent = 1
        deadline = time.monotonic() + interval_s * 1.5
        while time.monotonic() < deadline:
            assert producer.send("Paced", b"%d" % sent, queue_id=0).ok
            sent += 1
        # Counted over the sends' 1.5 s, not after the wait below: once all is dispatched, idle
        # passes follow every 100 ms, and a test held off the CPU afterwards counted them too.
        assert service.read(passes) - before <= 4, "one pass per interval, not one per flush"
        assert sent > 50
        wait_until(lambda: consumer.pull("Paced", 0, 0, 1).max_offset == sent, 60, "every record dispatched")
        bodies = [m.body for m in consumer.pull("Paced", 0, 1, 32).messages]
        assert bodies == [b"%d" % i for i in range(1, min(sent, 33))]


@pytest.mark.parametrize(
    ("mode", "sched_idle"), [("SYNC_FLUSH", "true"), ("SYNC_FLUSH", "false"), ("ASYNC_FLUSH", "true")]
)
def test_reput_runs_at_reput_sync_flush_nice_under_sync_flush_only(
    tmp_path: Path, mode: str, sched_idle: str
) -> None:
    """Under SYNC_FLUSH reput's passes are off the acknowledgement path and took CPU from it: reput
    runs at nice reputSyncFlushNice (19) and SCHED_IDLE (reputSyncFlushSchedIdle); the flusher,
    and reput under ASYNC_FLUSH (consumers' latency path), at the supervisor's own nice and
    SCHED_OTHER. The allocator runs at nice 19 in both: its files are work ahead of need."""
    with running_service(tmp_path, flushDiskType=mode, reputSyncFlushSchedIdle=sched_idle) as service:
        base = psutil.Process(service.process.pid).nice()
        assert psutil.Process(service.worker_pid("flusher")).nice() == base
        assert os.sched_getscheduler(service.worker_pid("flusher")) == os.SCHED_OTHER
        reput = psutil.Process(service.worker_pid("reput")).nice()
        assert reput == (max(base, 19) if mode == "SYNC_FLUSH" else base)
        idle = mode == "SYNC_FLUSH" and sched_idle == "true"
        assert os.sched_getscheduler(service.worker_pid("reput")) == (
            os.SCHED_IDLE if idle else os.SCHED_OTHER
        )
        assert psutil.Process(service.worker_pid("allocator")).nice() == max(base, 19), "work ahead of need"


def test_reput_leaves_sched_idle_while_it_is_behind(tmp_path: Path) -> None:
    """reputSyncFlushSchedIdle only while reput keeps up: held off the CPU (SIGSTOP) while flushed
    SYNC puts pile up past IDLE_BACKLOG_BYTES, its next pass runs SCHED_OTHER (counted in
    REPUT_BEHIND_PASSES) and dispatches them; a pass that starts close behind goes back to
    SCHED_IDLE."""
    from workers.reput import IDLE_BACKLOG_BYTES

    with (
        running_service(tmp_path, flushDiskType="SYNC_FLUSH") as service,
        Producer.attach(service.root) as producer,
    ):
        reput = service.worker_pid("reput")
        assert os.sched_getscheduler(reput) == os.SCHED_IDLE
        assert service.read(layout.REPUT_BEHIND_PASSES) == 0
        body = b"b" * 4096
        os.kill(reput, signal.SIGSTOP)
        try:
            sent = [
                producer.send("Behind", body, queue_id=0) for _ in range(IDLE_BACKLOG_BYTES // len(body) + 2)
            ]
        finally:
            os.kill(reput, signal.SIGCONT)
        assert all(r.status is PutMessageStatus.PUT_OK for r in sent)
        wait_until(lambda: service.read(layout.REPUT_BEHIND_PASSES) >= 1, 60, "a pass that starts behind")
        end = sent[-1].commit_log_offset
        wait_until(lambda: service.read(layout.REPUT_FROM_OFFSET) > end, 60, "reput to catch up")
        assert producer.send("Behind", b"close", queue_id=0).ok
        wait_until(
            lambda: os.sched_getscheduler(reput) == os.SCHED_IDLE, 60, "a pass close behind: SCHED_IDLE"
        )
        passes = service.read(layout.REPUT_BEHIND_PASSES)
        assert 1 <= passes <= 3, f"{passes} passes started behind"


def test_async_pool_commit_flush_and_exhaustion(tmp_path: Path) -> None:
    settings = dict(
        transientStorePoolEnable="true",
        transientStorePoolSize="2",
        commitIntervalCommitLog="50",
        commitCommitLogThoroughInterval="5000",
        commitCommitLogLeastPages="4",
        flushIntervalCommitLog="50",
        flushCommitLogThoroughInterval="300",
        flushCommitLogTimed="false",
    )
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        assert service.read(layout.POOL_SIZE) == 2
        assert service.read(layout.POOL_MLOCK_FAILED) == 0, (
            "both buffers mlocked (2 MiB: under any RLIMIT_MEMLOCK)"
        )
        committed = lambda: service.read(layout.COMMITTED_POSITION)  # noqa: E731
        producer.send("P", b"a" * 100, queue_id=0)
        wait_until(lambda: committed() > 0, 15, "first (thorough) commit")
        # At least leastPages (4 x 4 KiB): committed at the next 50 ms interval, long before 5 s
        # (an interval that wide so a loaded machine's late passes still fall inside it).
        big = producer.send("P", b"c" * 20_000, queue_id=0)
        big_sent = time.monotonic()
        wait_until(lambda: committed() > big.commit_log_offset, 4, "least-pages commit")
        # Less than leastPages: it waits for the thorough interval, 5 s after that commit (which
        # came after big_sent). Two committer passes after the put, inside that window, left it.
        first = committed()
        assert first == service.read(layout.WROTE_POSITION)
        small = producer.send("P", b"b" * 100, queue_id=0)
        worker_passes(service, "committer")
        after_passes = committed()
        assert time.monotonic() - big_sent < 5.0, "the passes fell inside the thorough interval"
        assert after_passes == first, "a small put is not committed before the thorough interval"
        wait_until(lambda: committed() >= small.commit_log_offset + 1, 20, "thorough commit")
        wait_until(lambda: service.read(layout.FLUSHED_POSITION) == committed(), 5, "flush after commit")
        # Several files: each buffer returns to the pool once its file is wholly committed.
        for _ in range(150):
            assert producer.send("P", b"d" * 20_000, queue_id=0).ok
        wait_until(lambda: committed() == service.read(layout.WROTE_POSITION), 5, "commit to catch up")
        assert service.read(layout.WROTE_POSITION) > 2 * service.config.mapped_file_size_commit_log
        size = service.config.mapped_file_size_commit_log
        current = service.read(layout.WROTE_POSITION) // size * size
        in_use = {service.read(layout.pool_file_offset(i)) for i in range(2)} - {-1}
        assert in_use <= {current}, "only the file being written holds a buffer"
        # Committer stopped: the pool runs dry and sends report busy within the bound, never hang.
        committer = psutil.Process(service.worker_pid("committer"))
        committer.suspend()
        try:
            statuses = []
            started = time.monotonic()
            for _ in range(200):
                status = producer.send("P", b"e" * 20_000, queue_id=0).status
                statuses.append(status)
                if status is not PutMessageStatus.PUT_OK:
                    break
            assert statuses[-1] is PutMessageStatus.OS_PAGECACHE_BUSY
            assert time.monotonic() - started < 30
        finally:
            committer.resume()
        wait_until(lambda: producer.send("P", b"f", queue_id=0).ok, 10, "puts to resume")


@pytest.mark.parametrize("role", ["allocator", "flusher", "reput", "cleaner"])
def test_killed_worker_is_restarted_and_nothing_acknowledged_is_lost(tmp_path: Path, role: str) -> None:
    with running_service(tmp_path) as service:
        outs = []
        loader = subprocess.Popen(
            [sys.executable, "-m", "tests.load", service.names.base, "0", "6000", str(tmp_path / "p0.jsonl")],
            cwd=ROOT,
        )
        outs.append(tmp_path / "p0.jsonl")
        wait_until(lambda: service.read(layout.PUT_COUNT) > 1500, 60, "load to be under way")
        victim = service.worker_pid(role)
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: (
                service.worker_pid(role) != victim
                and service.read(layout.worker_field(role, "state")) == layout.W_READY
            ),
            5,
            f"{role} to be restarted",
        )
        assert loader.wait(120) == 0
        assert service.read(layout.worker_field(role, "restarts")) == 1
        acked = [json.loads(line) for line in outs[0].read_text().splitlines()]
        assert all(a["status"] == "PUT_OK" for a in acked)
        assert len(acked) == 6000
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
            60,
            "dispatch to catch up",
        )
        with Consumer.attach(service.root, "g") as consumer:
            check_everything_once(read_all(consumer), 1, 6000)


def test_idle_store_uses_little_cpu(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        for role in ("allocator", "flusher", "reput"):  # start-up work done: each in its idle loop
            worker_passes(service, role)
        idle = store_cpu_fraction(service, 3.0)
        # The scheduler's run time (schedstat): ~1.0% of a core on a quiet machine, 2.1% once in a
        # CI pass beside 3 workers' tests (each wakeup costs more there); a loop that spins is 10x.
        assert idle < 0.05, f"idle store used {idle:.1%} of a core"


def test_send_statuses_a_user_can_act_on(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, maxMessageSize="4096") as service,
        Producer.attach(service.root) as producer,
    ):
        too_long_topic = producer.send("t" * 128, b"x")
        assert too_long_topic.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "127" in too_long_topic.reason
        big_props = producer.send("T", b"x", properties={"k": "é" * 20_000})
        assert big_props.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "32767" in big_props.reason
        big_body = producer.send("T", bytes(4097))
        assert big_body.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "maxMessageSize" in big_body.reason
        assert producer.send("T", bytes(4096)).ok
        results = producer.send_batch(
            [{"topic": "T", "body": b"a"}, {"topic": "t" * 200, "body": b"b"}, {"topic": "T", "body": b"c"}]
        )
        assert [r.status for r in results] == [
            PutMessageStatus.PUT_OK,
            PutMessageStatus.MESSAGE_ILLEGAL,
            PutMessageStatus.PUT_OK,
        ]
        service.stop()
        stopped = producer.send("T", b"after stop")
        assert stopped.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert stopped.reason


@pytest.mark.parametrize("reentrant", ["true", "false"])
def test_put_lock_held_by_a_killed_producer_is_recovered(tmp_path: Path, reentrant: str) -> None:
    """A producer SIGKILLed inside the put lock, mid-put: the next producer takes the lock over,
    the half-written record is never visible, and queue offsets stay contiguous. With either
    lock (useReentrantLockWhenPutMessage: a mutex that sleeps, or a spin lock)."""
    settings = {"useReentrantLockWhenPutMessage": reentrant}
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        assert producer.lock.spin is (reentrant == "false")
        assert producer.send("L", b"before", queue_id=0).ok
        code = (
            "import os, signal\n"
            "from rmq_mp.put.producer import Producer\n"
            f"p = Producer.attach({service.names.base!r})\n"
            "from rmq_mp.store.mapped_file import MappedFile\n"
            "real_fill = MappedFile.fill\n"
            "def dying_fill(mf, pos, data):\n"  # the put's journalled copy into the log, cut in half
            "    real_fill(mf, pos, bytes(data)[: len(data) // 2])\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "MappedFile.fill = dying_fill\n"
            "p.send('L', b'half written' * 10, queue_id=0)\n"
        )
        victim = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
        assert victim.returncode == -signal.SIGKILL
        assert service.read(layout.PUT_LOCK_OWNER_PID) != 0, "the victim died holding the lock"
        started = time.monotonic()
        after = producer.send("L", b"after", queue_id=0)
        took = time.monotonic() - started
        assert after.ok
        print(f"put lock taken over from the dead producer in {took * 1000:.0f} ms")
        assert took < 1.0, "the store accepts writes again within a second"
        assert after.queue_offset == 1
        assert service.read(layout.LOCK_RECOVERIES) == 1
        with Consumer.attach(service.root, "g") as consumer:
            result = consumer.pull("L", 0, 0, 10, timeout_s=5)
            wait_until(lambda: len(consumer.pull("L", 0, 0, 10).messages) == 2, 10, "both dispatched")
            assert [m.body for m in consumer.pull("L", 0, 0, 10).messages] == [b"before", b"after"]
            assert result.status is GetMessageStatus.FOUND
    with MessageStore.open(config=service.config, read_only=True) as store:
        assert [m.body for m in store.iter_messages()] == [b"before", b"after"]


def test_workers_exit_when_the_supervisor_dies_and_a_restart_saves_the_pool(tmp_path: Path) -> None:
    """SIGKILL of the supervisor: workers exit on their own; acknowledged ASYNC puts that were
    only in pool buffers (committer stopped) are committed by the next supervisor before recovery."""
    settings = dict(transientStorePoolEnable="true", transientStorePoolSize="2")
    service = start_service(tmp_path, **settings)
    workers = {
        role: service.worker_pid(role) for role in ("allocator", "committer", "flusher", "reput", "cleaner")
    }
    with Producer.attach(service.root) as producer:
        assert producer.send("K", b"committed", queue_id=0).ok
        wait_until(
            lambda: service.read(layout.COMMITTED_POSITION) == service.read(layout.WROTE_POSITION),
            5,
            "first commit",
        )
        psutil.Process(workers["committer"]).suspend()
        acked = [producer.send("K", b"only in the pool %d" % i, queue_id=0) for i in range(50)]
        assert all(r.ok for r in acked)
        assert service.read(layout.COMMITTED_POSITION) < service.read(layout.WROTE_POSITION)
    service.process.kill()
    service.process.wait(10)
    os.kill(workers["committer"], signal.SIGKILL)  # no final pass: the pool alone holds those puts
    wait_until(
        lambda: (
            not any(
                psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                for pid in workers.values()
            )
        ),
        10,
        "workers to exit",
    )
    assert service.names.leftovers(), "the crashed run's shared memory is still there"
    assert (service.root / "abort").exists()
    with running_service(tmp_path, **settings) as again, Consumer.attach(again.root, "g") as consumer:
        wait_until(
            lambda: consumer.pull("K", 0, 50).status is GetMessageStatus.FOUND, 10, "everything visible"
        )
        bodies = [
            m.body for m in consumer.pull("K", 0, 0, 32).messages + consumer.pull("K", 0, 32, 32).messages
        ]
        assert bodies == [b"committed"] + [b"only in the pool %d" % i for i in range(50)]
        assert "bytes of pool buffer" in again.supervisor_log(), "the restart copied the pool into the file"


def test_restarted_store_continues_where_it_stopped(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        first = [producer.send("R", b"first %d" % i, queue_id=0) for i in range(100)]
    end = first[-1].commit_log_offset + 1
    with running_service(tmp_path) as service:
        assert service.read(layout.WROTE_POSITION) > end - 1
        assert service.read(layout.REPUT_FROM_OFFSET) == service.read(layout.WROTE_POSITION)
        with Producer.attach(service.root) as producer:
            second = producer.send("R", b"second", queue_id=0)
            assert second.queue_offset == 100
            assert second.commit_log_offset > first[-1].commit_log_offset
        with Consumer.attach(service.root, "g") as consumer:
            wait_until(
                lambda: consumer.pull("R", 0, 100, timeout_s=1).status is GetMessageStatus.FOUND, 10, "new"
            )
            assert consumer.pull("R", 0, 0, 1).messages[0].body == b"first 0"


def test_a_clean_stop_removes_the_temporaries_of_killed_segment_creators(tmp_path: Path) -> None:
    """An allocator (or reput, or a producer) killed inside `MappedFile.prepare` leaves its
    ``.<name>.tmp<pid>``; the supervisor restarts it and the store goes on, and a clean stop
    must not leave the file for the next reader (RocketMQ takes every name in a segment
    directory for an offset; the kill matrix's independent decoder failed on one in CI). A live
    process's temporary is its own to finish."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(gone.stdout)
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        assert producer.send("Tmp", b"x", queue_id=0).ok
        wait_until(
            lambda: (service.root / "consumequeue" / "Tmp" / "0").is_dir(), 30, "the queue's directory"
        )
        orphans = [
            service.root / "commitlog" / f".{3 * 2**20:020d}.tmp{dead_pid}",
            service.root / "consumequeue" / "Tmp" / "0" / f".{20_000:020d}.tmp{dead_pid}",
        ]
        live = service.root / "commitlog" / f".{4 * 2**20:020d}.tmp{os.getpid()}"
        for path in [*orphans, live]:
            path.write_bytes(b"")
        assert service.stop() == 0
    assert not any(path.exists() for path in orphans)
    assert live.exists()
    assert (
        service.log.read_text().count("the temporary of a segment creation its process did not finish") == 2
    )
    live.unlink()
    assert independent_records(service.root / "commitlog", service.config.mapped_file_size_commit_log)


def test_daemon_start_then_stop(tmp_path: Path) -> None:
    from tests.service import write_conf

    conf = write_conf(tmp_path / "d.conf", tmp_path / "d")
    run = [sys.executable, "run.py"]
    started = subprocess.run(
        [*run, "start", "--daemon", "--conf", str(conf)], cwd=ROOT, capture_output=True, text=True, timeout=90
    )
    try:
        assert started.returncode == 0, started.stderr
        assert "running" in started.stdout
        status = json.loads(
            subprocess.run(
                [*run, "status", "--json", "--conf", str(conf)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert status["state"] == "RUNNING"
    finally:
        stopped = subprocess.run(
            [*run, "stop", "--conf", str(conf)], cwd=ROOT, capture_output=True, text=True, timeout=90
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not (tmp_path / "d" / "abort").exists()
    assert "cleanly" in (tmp_path / "d" / "logs" / "supervisor.log").read_text()


def test_group_offsets_and_topics_are_persisted_in_rocketmq_format(tmp_path: Path) -> None:
    from rmq_mp.config.config_manager import loads

    with running_service(tmp_path, flushConsumerOffsetInterval="200") as service:
        with Producer.attach(service.root) as producer:
            for i in range(10):
                assert producer.send("G", b"%d" % i, queue_id=i % 2).ok
        with Consumer.attach(service.root, "group-a") as consumer:
            consumer.subscribe("G")
            assert sorted(poll_bodies(consumer, 10, 20, "all ten")) == sorted(b"%d" % i for i in range(10))
            consumer.commit()
            assert consumer.committed_offset("G", 0) == 5
        path = service.root / "config" / "consumerOffset.json"
        wait_until(lambda: path.exists() and "G@group-a" in path.read_text(), 10, "periodic persist")
        assert loads(path.read_text())["offsetTable"]["G@group-a"] == {0: 5, 1: 5}
        assert '"G@group-a":{0:5,1:5\n\t\t}' in path.read_text(), "fastjson layout"
        topics_path = service.root / "config" / "topics.json"
        wait_until(topics_path.exists, 10, "topics.json (persisted right after the offsets)")
        topics = loads(topics_path.read_text())["topicConfigTable"]
        assert topics["G"]["readQueueNums"] == 8
    with running_service(tmp_path) as again, Consumer.attach(again.root, "group-a") as consumer:
        assert consumer.committed_offset("G", 1) == 5
        with Producer.attach(again.root) as producer:
            assert producer.send("G", b"new", queue_id=1).ok
        consumer.subscribe("G")
        got = poll_bodies(consumer, 1, 20, "resume")
        assert got == [b"new"], "a restarted consumer resumes from the persisted offsets"


def test_cleaner_deletes_expired_files_but_never_the_one_being_written(tmp_path: Path) -> None:
    every_hour = ";".join(str(h) for h in range(24))
    settings = dict(
        deleteWhen=every_hour,
        fileReservedTime="0",
        cleanResourceInterval="200",
        deleteCommitLogFilesInterval="0",
    )
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        for i in range(300):
            assert producer.send("C", bytes(10_000), queue_id=i % 4).ok
        size = service.config.mapped_file_size_commit_log
        wrote = service.read(layout.WROTE_POSITION)
        current = wrote - wrote % size
        assert current >= 2 * size
        # The cleaner moves MIN_OFFSET before each file's unlink (new readers first), so the wait
        # is on the files themselves; the allocator's temporary files (dot names) are not the log's.
        wait_until(
            lambda: (
                min(p.name for p in (service.root / "commitlog").iterdir() if not p.name.startswith("."))
                == f"{current:020d}"
            ),
            30,
            "every file before the one being written deleted",
        )
        assert service.read(layout.MIN_OFFSET) == current
        assert producer.send("C", b"still writable", queue_id=0).ok


def test_attaching_while_a_segment_is_being_created_is_a_typed_error(tmp_path: Path) -> None:
    """A segment exists before its creator sizes it; an attacher in that window (run.py status
    during start) gets ShmAttachError, not a crash (found by the kill matrix, seed 1402)."""
    import posix_ipc

    from rmq_mp.errors import ShmAttachError
    from shm.segment import SharedSegment

    name = f"/rmqtest_{os.getpid()}_{tmp_path.name[-8:]}"
    unsized = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
    try:
        with pytest.raises(ShmAttachError, match="still being created"):
            SharedSegment.attach(name)
    finally:
        unsized.close_fd()
        unsized.unlink()


def test_a_store_with_shm_name_is_attached_by_that_name(tmp_path: Path) -> None:
    """With shmName set, the segments are named by it: attaching by the store directory (which
    derives the default name) says so instead of only "not running"."""
    shm_name = f"rmqt{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    with running_service(tmp_path, shmName=shm_name) as service:
        assert service.names.base == shm_name
        with pytest.raises(StoreNotRunningError, match="shmName"):
            Producer.attach(service.root)
        with Producer.attach(shm_name) as producer:
            assert producer.send("N", b"by name").ok


def test_producers_on_the_spin_lock_store_every_message_once(tmp_path: Path) -> None:
    """useReentrantLockWhenPutMessage=false: four producer processes contending on the spin lock
    (no sleeping in the kernel) still store every message once, in contiguous queues."""
    producers, count = 4, 2_000
    with running_service(tmp_path, useReentrantLockWhenPutMessage="false") as service:
        outs = run_producers(service, tmp_path, producers, count, batch=1)
        for out in outs:
            assert {json.loads(line)["status"] for line in out.read_text().splitlines()} == {"PUT_OK"}
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
            60,
            "dispatch to catch up",
        )
        with Consumer.attach(service.names.base, "checker") as consumer:
            check_everything_once(read_all(consumer), producers, count)
