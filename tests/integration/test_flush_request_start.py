"""A SYNC flush request carries when its send began (the ring slot's ``started_ns``,
CLOCK_MONOTONIC, taken before the put lock): the flusher's gather bounds a request's wait by its
age from there (workers/flusher.py `gather`). Each send path writes it, the compiled core's
`send`, `send_batch` and `send_batch` of keyword dicts, and the Python reference's, to the
slot its ticket names, between the call's start and its return."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from shm import flush_requests as fr
from shm import layout
from tests.service import running_service

SENDS: dict[str, Callable[[Producer], Any]] = {
    "send": lambda p: [p.send("Age", b"x" * 64, queue_id=0)],
    "send_batch": lambda p: p.send_batch(MessageBatch("Age", [b"a", b"b"], queue_id=1)),
    "send_batch of dicts": lambda p: p.send_batch([{"topic": "Age", "body": b"c", "queue_id": 2}]),
    "reference send": lambda p: [p._send("Age", b"y", None, None, None, 3, 0, True)],
}


def test_every_send_path_stamps_its_flush_request_with_its_start(tmp_path: Path) -> None:
    with (
        running_service(tmp_path, flushDiskType="SYNC_FLUSH") as service,
        Producer.attach(service.root) as producer,
    ):
        ring, table = producer.store.shm.ring, producer.store.shm.table
        for name, send in SENDS.items():
            if name != "reference send" and native.core is None:
                continue
            for _ in range(3):  # the slot a previous request left must not pass for this one
                before_ticket = table.get(layout.FLUSH_REQUEST_SEQ)
                before_ns = time.monotonic_ns()
                results = send(producer)
                after_ns = time.monotonic_ns()
                assert {r.status for r in results} == {PutMessageStatus.PUT_OK}, name
                ticket = table.get(layout.FLUSH_REQUEST_SEQ)
                assert ticket == before_ticket + 1, f"{name}: one request a call"
                started_ns = ring.get(ticket % ring.capacity, fr.STARTED_NS)
                assert before_ns <= started_ns <= after_ns, (name, before_ns, started_ns, after_ns)


def test_the_reference_takes_a_start_only_once(tmp_path: Path) -> None:
    """A start the producer set is used by one request; a later one that set none (a re-put of
    the scheduler's, say) is stamped when it asks, never with an old send's start."""
    with (
        running_service(tmp_path, flushDiskType="SYNC_FLUSH") as service,
        Producer.attach(service.root) as producer,
    ):
        requests, ring = producer.appender.flush_requests, producer.store.shm.ring
        written = producer.store.shm.table.written_end()
        stamps = []
        for started_ns in (1, 0):
            requests.started_ns = started_ns
            before_ns = time.monotonic_ns()
            assert producer.lock.acquire(5)
            try:
                slot = requests.request(written, 0)
            finally:
                producer.lock.release()
            assert slot >= 0
            assert requests.started_ns == 0
            stamps.append((before_ns, ring.get(slot, fr.STARTED_NS)))
            assert requests.wait(slot) == fr.DONE_OK  # the flusher answers it (collected: FREE)
        assert stamps[0][1] == 1
        assert stamps[1][1] >= stamps[1][0]
