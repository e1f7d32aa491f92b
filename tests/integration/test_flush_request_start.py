"""A SYNC flush request carries when its send began (the ring slot's ``started_ns``,
CLOCK_MONOTONIC, taken before the put lock): the flusher's gather bounds a request's wait by its
age from there (workers/flusher.py `GroupGather.wait`). Each send path writes it, the compiled core's
`send`, `send_batch` and `send_batch` of keyword dicts, and the Python reference's, to the
slot its ticket names, between the call's start and its return. And the gather is woken once:
by the put whose ticket it waits for last (FLUSH_GATHER_TICKET), from either path."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import posix_ipc
import psutil
import pytest

from bench.store import CTX
from rmq_mp.format import message as m
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from shm import flush_requests as fr
from shm import layout
from shm.layout import Role
from shm.metrics import REFERENCE_REASONS
from shm.pointer_table import PointerTable
from tests.service import reference_put_path, running_service, wait_until

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


def sync_put(root: str, reference: bool, out: Any) -> None:
    """One SYNC send in its own process, through the compiled core or the reference, after one
    that waits for nothing (no ticket: it places the queue and the file for this process, which
    the core leaves to the reference the first time). Hands back its status and whether the
    reference served it."""
    with Producer.attach(Path(root)) as producer:
        if reference:
            reference_put_path(producer)
        producer.send("Gather", b"w", queue_id=0, properties={m.PROPERTY_WAIT_STORE_MSG_OK: "false"})
        metrics = producer._metrics
        assert metrics._words is not None, "no metrics slot"
        served = metrics._words[metrics.reference_word : metrics.reference_word + len(REFERENCE_REASONS)]
        before = sum(served)
        status = producer.send("Gather", b"x", queue_id=0).status.name
        out.put((status, sum(served) > before))


@pytest.mark.parametrize("reference", [False, True], ids=["core", "reference"])
def test_only_the_last_ticket_a_gather_awaits_posts_the_flusher(tmp_path: Path, reference: bool) -> None:
    """While the flusher gathers, its notified flag stays set (no put posts its semaphore) and
    FLUSH_GATHER_TICKET names the last request it waits for: that put, and only that one, posts
    it. The flusher is held (SIGSTOP) with the state its gather leaves; each put's producer is
    seen asleep in its flush wait (after its wake-ups) before the semaphore is read."""
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "60000"}
    with running_service(tmp_path, **settings) as service:
        flusher = psutil.Process(service.worker_pid("flusher"))
        semaphore = posix_ipc.Semaphore(service.names.wakeup("flusher"))
        table = PointerTable.attach(service.names.pointer_table, Role.FLUSHER)
        out, procs = CTX.Queue(), []
        flusher.suspend()
        try:
            wait_until(lambda: flusher.status() == psutil.STATUS_STOPPED, 10, "the flusher to stop")
            base = table.get(layout.FLUSH_REQUEST_SEQ)
            table.set(layout.worker_field("flusher", "notified"), 1)
            table.set(layout.FLUSH_GATHER_TICKET, base + 2)
            posts = [semaphore.value]
            for ticket in (base + 1, base + 2):
                proc = CTX.Process(target=sync_put, args=(str(service.root), reference, out))
                proc.start()
                procs.append(proc)
                waiter = psutil.Process(proc.pid)

                def waiting(t: int = ticket, w: psutil.Process = waiter) -> bool:
                    return table.get(layout.FLUSH_REQUEST_SEQ) == t and w.status() == psutil.STATUS_SLEEPING

                wait_until(
                    waiting,
                    30,
                    f"ticket {ticket}'s producer to wait for its flush",
                )
                posts.append(semaphore.value)
            assert posts == [posts[0], posts[0], posts[0] + 1]
        finally:
            table.set(layout.FLUSH_GATHER_TICKET, 0)
            flusher.resume()
            results = [out.get(timeout=30) for _ in procs]
            for proc in procs:
                proc.join(30)
            table.close()
            semaphore.close()
        assert results == [(PutMessageStatus.PUT_OK.name, reference)] * 2
