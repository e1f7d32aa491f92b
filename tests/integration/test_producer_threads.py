"""The producer's thread model against a real store: threads sharing one producer through
`ThreadSafeProducer` while other processes contend for the put lock (the window where an
unguarded compiled send waits with the GIL released), every message stored once, whole and
where its result says; `raise_for_status` on results. In the put_path list (tests/conftest.py):
run again on the Python reference under RMQ_PURE_PYTHON=1."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import SendRefusedError
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.locked import ThreadSafeProducer
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendResult
from tests.service import running_service, start_producers, wait_processes_gone

THREADS, EACH = 4, 1500


def test_threads_share_one_producer_while_processes_contend(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        procs, _outs = start_producers(service, tmp_path, [4000, 4000])
        results: dict[int, list[SendResult]] = {t: [] for t in range(THREADS)}
        errors: list[BaseException] = []
        with ThreadSafeProducer.attach(service.names.base) as shared:

            def sender(thread: int) -> None:
                try:
                    for i in range(EACH):
                        result = shared.send("Threads", f"t{thread}-{i}".encode(), queue_id=thread)
                        results[thread].append(result.raise_for_status())
                except BaseException as exc:  # reported by the main thread
                    errors.append(exc)

            workers = [threading.Thread(target=sender, args=(t,)) for t in range(THREADS)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(120)
                assert not worker.is_alive()
        for proc in procs:
            assert proc.wait(120) == 0
        wait_processes_gone([p.pid for p in procs])
        assert errors == []
        with Consumer.attach(service.names.base, "check") as reader:
            for thread in range(THREADS):
                stored = []
                offset = 0
                while (
                    r := reader.pull("Threads", thread, offset, 500, timeout_s=5)
                ).status is GetMessageStatus.FOUND:
                    stored.extend(r.messages)
                    offset = r.next_begin_offset
                    if offset >= EACH:
                        break
                assert [msg.body for msg in stored] == [f"t{thread}-{i}".encode() for i in range(EACH)]
                sent = results[thread]
                assert [s.queue_offset for s in sent] == [msg.queue_offset for msg in stored]
                assert [s.commit_log_offset for s in sent] == [msg.commit_log_offset for msg in stored]
                assert [s.uniq_key for s in sent] == [msg.properties["UNIQ_KEY"] for msg in stored]


def test_raise_for_status(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Producer.attach(service.names.base) as producer:
        ok = producer.send("Checked", b"x", queue_id=0)
        assert ok.raise_for_status() is ok
        refused = producer.send("Checked", b"x" * (service.config.max_message_size + 1), queue_id=0)
        assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL
        with pytest.raises(SendRefusedError, match="not stored: MESSAGE_ILLEGAL") as caught:
            refused.raise_for_status()
        assert caught.value.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert not caught.value.stored
        assert caught.value.reason == refused.reason
        batch = producer.send_batch(MessageBatch("Checked", [b"a", b"b"], queue_id=0))
        assert batch.raise_for_status() is batch
        mixed = producer.send_batch(
            [{"topic": "Checked", "body": b"a", "queue_id": 0},
             {"topic": "Checked", "body": b"b" * (service.config.max_message_size + 1), "queue_id": 0}]
        )  # fmt: skip
        with pytest.raises(SendRefusedError, match="1 of 2 messages not ok"):
            mixed.raise_for_status()
