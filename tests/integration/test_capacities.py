"""Every fixed-capacity shared table at its edge, through a real running store (issue 17): a
full table is an outcome the caller can handle, named after the setting that sizes it, and
nothing is half-done; consumers are many, one per thread, and a dead one's slot comes back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import OffsetTableFullError, ShmAttachError
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.service import ROOT, RunningService, running_service, wait_until, write_conf


def status_json(conf: Path) -> dict:
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "status", "--json", "--conf", str(conf)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_a_send_to_one_queue_more_than_max_consume_queue_num_is_refused_naming_it(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, maxConsumeQueueNum="4") as service,
        Producer.attach(service.names.base) as p,
    ):
        for queue_id in range(4):
            assert p.send("T", b"x", queue_id=queue_id).status is PutMessageStatus.PUT_OK
        puts = service.read(layout.PUT_COUNT)
        refused = p.send("T", b"x", queue_id=4)
        assert refused.status is PutMessageStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
        assert "maxConsumeQueueNum" in refused.reason
        batch = p.send_batch(MessageBatch("Other", [b"a", b"b"]))
        assert [r.status for r in batch] == [PutMessageStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED] * 2
        mixed = p.send_batch([{"topic": "T", "body": b"ok", "queue_id": 1}, {"topic": "New", "body": b"no"}])
        assert [r.status for r in mixed] == [
            PutMessageStatus.PUT_OK,
            PutMessageStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED,
        ]
        assert service.read(layout.PUT_COUNT) == puts + 1  # only the one that fit was stored
        assert p.send("T", b"y", queue_id=0).queue_offset == 1
        tables = status_json(service.conf)["tables"]
        assert tables["maxConsumeQueueNum"] == {"used": 4, "capacity": 4}
        with Consumer.attach(service.names.base, "cg") as consumer:
            # both records: "x" alone may be dispatched a pass before "ok" (put after it)
            wait_until(lambda: len(consumer.pull("T", 1, 0).messages) == 2, 30, "dispatch")
            assert [m.body for m in consumer.pull("T", 1, 0).messages] == [b"x", b"ok"]


def test_a_commit_past_max_consumer_offset_num_records_nothing_and_names_it(tmp_path: Path) -> None:
    with running_service(tmp_path, maxConsumerOffsetNum="3") as service:
        with Consumer.attach(service.names.base, "cg") as consumer:
            consumer.commit({("T", 0): 5, ("T", 1): 6})
            with pytest.raises(OffsetTableFullError, match="maxConsumerOffsetNum"):
                consumer.commit({("T", 0): 7, ("T", 2): 8, ("T", 3): 9})
            assert [consumer.committed_offset("T", q) for q in range(4)] == [5, 6, -1, -1]
            consumer.commit({("T", 0): 7, ("T", 2): 8})  # exactly full
            assert [consumer.committed_offset("T", q) for q in range(3)] == [7, 6, 8]
        assert status_json(service.conf)["tables"]["maxConsumerOffsetNum"] == {"used": 3, "capacity": 3}


def _hold_consumers(base: str, ready: Path) -> None:
    consumers = [Consumer.attach(base, f"held-{i}") for i in range(2)]
    ready.write_text(str(len(consumers)))
    signal.pause()


def _hold_producer(base: str, ready: Path) -> None:
    producer = Producer.attach(base)
    assert producer.send("Held", b"x", queue_id=0).ok
    ready.write_text("1")
    signal.pause()


@contextlib.contextmanager
def holder_process(service: RunningService, tmp_path: Path, hold: str) -> Iterator[subprocess.Popen[bytes]]:
    """Another process that runs ``hold`` (a function of this module: it takes table slots, says
    so in a file, and waits to be killed); killed on the way out."""
    ready = tmp_path / f"{hold}.ready"
    code = f"import sys; from pathlib import Path; from {__name__} import {hold}; {hold}(sys.argv[1], Path(sys.argv[2]))"
    holder = subprocess.Popen([sys.executable, "-c", code, service.names.base, str(ready)], cwd=ROOT)
    try:
        wait_until(ready.exists, 60, f"the holder process ({hold})")
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(30)


def test_max_consumer_num_is_named_when_full_and_a_killed_processs_slots_come_back(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, maxConsumerNum="3") as service,
        holder_process(service, tmp_path, "_hold_consumers") as holder,
    ):
        mine = Consumer.attach(service.names.base, "mine")
        with pytest.raises(ShmAttachError, match="maxConsumerNum = 3"):
            Consumer.attach(service.names.base, "one-too-many")
        assert status_json(service.conf)["tables"]["maxConsumerNum"] == {"used": 3, "capacity": 3}
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        again = [Consumer.attach(service.names.base, f"again-{i}") for i in range(2)]  # the dead one's
        with pytest.raises(ShmAttachError, match="maxConsumerNum"):
            Consumer.attach(service.names.base, "still-too-many")
        for consumer in [mine, *again]:
            consumer.close()
        assert status_json(service.conf)["tables"]["maxConsumerNum"] == {"used": 0, "capacity": 3}


def test_one_consumer_per_thread_each_long_polls_its_own_queue(tmp_path: Path) -> None:
    threads_n, per_queue = 8, 20
    with running_service(tmp_path) as service:
        received: dict[int, list[bytes]] = {}
        errors: list[BaseException] = []
        attached = threading.Barrier(threads_n + 1)

        def consume(queue_id: int) -> None:
            try:
                with Consumer.attach(service.names.base, f"thread-{queue_id}") as consumer:
                    attached.wait(60)
                    bodies: list[bytes] = []
                    offset = 0
                    while len(bodies) < per_queue:
                        result = consumer.pull("Threads", queue_id, offset, 32, timeout_s=30)
                        assert result.status in (GetMessageStatus.FOUND, GetMessageStatus.OFFSET_OVERFLOW_ONE,
                                                 GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
                                                 GetMessageStatus.NO_MESSAGE_IN_QUEUE), result  # fmt: skip
                        bodies += [m.body for m in result.messages]
                        offset = result.next_begin_offset if result.messages else offset
                    consumer.commit({("Threads", queue_id): offset})
                    received[queue_id] = bodies
            except BaseException as exc:
                errors.append(exc)
                attached.abort()

        threads = [threading.Thread(target=consume, args=(q,)) for q in range(threads_n)]
        for thread in threads:
            thread.start()
        attached.wait(60)  # every thread is attached (and will long-poll) before anything is sent
        with Producer.attach(service.names.base) as producer:
            for i in range(per_queue):
                for queue_id in range(threads_n):
                    assert producer.send("Threads", f"{queue_id}:{i}".encode(), queue_id=queue_id).ok
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert received == {q: [f"{q}:{i}".encode() for i in range(per_queue)] for q in range(threads_n)}
        tables = status_json(service.conf)["tables"]
        assert tables["maxConsumerNum"]["used"] == 0
        assert tables["maxConsumerOffsetNum"]["used"] == threads_n


def test_a_store_holding_more_queues_than_max_consume_queue_num_refuses_to_start(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Producer.attach(service.names.base) as producer:
        for queue_id in range(5):
            assert producer.send("T", b"x", queue_id=queue_id).ok
    conf = write_conf(tmp_path / "small.conf", tmp_path / "store", maxConsumeQueueNum="3")
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert (
        "maxConsumeQueueNum = 3, but the store holds 5 consume queues: raise maxConsumeQueueNum"
        in out.stderr + out.stdout
    )


def test_a_pool_larger_than_the_pointer_tables_slots_is_refused_at_start(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "pool.conf", tmp_path / "store", transientStorePoolEnable="true",
                      transientStorePoolSize="33")  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out
    assert "transientStorePoolSize = 33: must be <= 32" in out.stderr
    assert "Traceback" not in out.stderr


SEND_ONE = (
    "import json, sys; from rmq_mp.put.producer import Producer\n"
    "with Producer.attach(sys.argv[1]) as p:\n"
    "    r = p.send('Sync', b'x', queue_id=0)\n"
    "print(json.dumps([r.status.name, r.reason]))\n"
)


def test_sync_puts_past_max_sync_flush_request_num_are_answered_at_once_naming_it(tmp_path: Path) -> None:
    settings = {"flushDiskType": "SYNC_FLUSH", "maxSyncFlushRequestNum": "2", "syncFlushTimeout": "30000"}
    with running_service(tmp_path, **settings) as service:
        with Producer.attach(service.names.base) as producer:  # the queue exists, the flusher is warm
            assert producer.send("Sync", b"first", queue_id=0).ok
        flusher = service.worker_pid("flusher")
        os.kill(flusher, signal.SIGSTOP)  # no flush completes: every SYNC put keeps its slot
        waiting = []
        try:
            for _ in range(2):
                waiting.append(subprocess.Popen([sys.executable, "-c", SEND_ONE, service.names.base],
                                                cwd=ROOT, stdout=subprocess.PIPE, text=True))  # fmt: skip
            wait_until(lambda: status_json(service.conf)["tables"]["maxSyncFlushRequestNum"]["used"] == 2,
                       60, "both puts waiting for their flush")  # fmt: skip
            third = subprocess.run([sys.executable, "-c", SEND_ONE, service.names.base],
                                   cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
            status, reason = json.loads(third.stdout)
            assert status == "FLUSH_DISK_TIMEOUT"
            assert "maxSyncFlushRequestNum" in reason
        finally:
            os.kill(flusher, signal.SIGCONT)
            answers = [json.loads(proc.communicate(timeout=60)[0]) for proc in waiting]
        assert [a[0] for a in answers] == ["PUT_OK", "PUT_OK"]
        assert status_json(service.conf)["tables"]["maxSyncFlushRequestNum"]["used"] == 0


def test_producers_past_max_producer_num_send_unmeasured(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, maxProducerNum="1") as service,
        holder_process(service, tmp_path, "_hold_producer"),
    ):
        with Producer.attach(service.names.base) as producer:  # no metrics slot left: still sends
            assert all(producer.send("Free", b"y", queue_id=0).ok for _ in range(5))
        status = status_json(service.conf)
        assert status["tables"]["maxProducerNum"] == {"used": 1, "capacity": 1}
        assert status["producer_metrics"]["puts"] == 1  # the holder's one send, measured
        assert status["counters"]["put_count"] == 6
