"""broker.conf keys that decide a put's answer: brokerRole, osPageCacheBusyTimeOutMills,
fastFailIfNoBufferInStorePool, useReentrantLockWhenPutMessage (each against a real store)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from rmq_mp.client.consumer import Consumer
from rmq_mp.format import message as m
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.service import running_service, wait_until


def test_a_slave_refuses_puts(tmp_path: Path) -> None:
    """RocketMQ's checkStoreStatus: "message store is slave mode, so putMessage is forbidden"."""
    with running_service(tmp_path, brokerRole="SLAVE") as service, Producer.attach(service.root) as producer:
        refused = producer.send("R", b"x", queue_id=0)
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "slave" in refused.reason
        batch = producer.send_batch([dict(topic="R", body=b"y")] * 3)
        assert [r.status for r in batch] == [PutMessageStatus.SERVICE_NOT_AVAILABLE] * 3
        assert service.read(layout.WROTE_POSITION) == 0, "nothing was written"


def test_a_sync_master_stores_but_answers_slave_not_available(tmp_path: Path) -> None:
    """With no slave connected (no haListenPort here), a put that waits for the store is answered
    SLAVE_NOT_AVAILABLE as RocketMQ answers it: stored and readable, but not replicated. A put
    with WAIT=false is answered at once, PUT_OK."""
    with (
        running_service(tmp_path, brokerRole="SYNC_MASTER") as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        waited = producer.send("M", b"one", queue_id=0)
        assert waited.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        assert "no slave" in waited.reason
        assert waited.queue_offset == 0
        unwaited = producer.send("M", b"two", queue_id=0, properties={m.PROPERTY_WAIT_STORE_MSG_OK: "false"})
        assert unwaited.status is PutMessageStatus.PUT_OK
        batch = producer.send_batch([dict(topic="M", body=b"three", queue_id=0)] * 2)
        assert [r.status for r in batch] == [PutMessageStatus.SLAVE_NOT_AVAILABLE] * 2
        result = consumer.pull("M", 0, 0, 10, timeout_s=5)
        wait_until(lambda: len(consumer.pull("M", 0, 0, 10).messages) == 4, 5, "all four dispatched")
        assert result.status is GetMessageStatus.FOUND
        assert [x.body for x in consumer.pull("M", 0, 0, 10).messages] == [b"one", b"two", b"three", b"three"]


def test_a_put_lock_held_too_long_answers_os_pagecache_busy(tmp_path: Path) -> None:
    """RocketMQ's isOSPageCacheBusy: while a live put holds the lock longer than
    osPageCacheBusyTimeOutMills, puts are refused at once instead of queueing behind it."""
    with (
        running_service(tmp_path, osPageCacheBusyTimeOutMills="200") as service,
        Producer.attach(service.root) as producer,
        Producer.attach(service.root) as holder,
    ):
        assert producer.send("B", b"before", queue_id=0).ok
        assert holder.lock.acquire(1.0)
        try:
            since_ms = service.read(layout.PUT_LOCK_SINCE_MS)  # the holder's word the put path reads
            assert since_ms > 0
            wait_until(  # on busy_refusal's clock
                lambda: time.time_ns() // 1_000_000 - since_ms > 200, 10, "the lock held over 200 ms"
            )
            started = time.monotonic()
            busy = producer.send("B", b"refused", queue_id=0)
            assert busy.status is PutMessageStatus.OS_PAGECACHE_BUSY
            assert "osPageCacheBusyTimeOutMills" in busy.reason
            assert time.monotonic() - started < 2.5, "refused, not queued for the lock (LOCK_TIMEOUT_S 3 s)"
        finally:
            holder.lock.release()
        assert producer.send("B", b"after", queue_id=0).queue_offset == 1


def test_fast_fail_when_the_pool_has_no_buffer(tmp_path: Path) -> None:
    """fastFailIfNoBufferInStorePool: with every pool buffer taken (committer stopped), the put
    that needs a new file fails at once with CREATE_MAPEDFILE_FAILED, RocketMQ's answer when the
    file cannot be created, instead of waiting for a buffer and answering OS_PAGECACHE_BUSY."""
    settings = dict(
        transientStorePoolEnable="true", transientStorePoolSize="2", fastFailIfNoBufferInStorePool="true"
    )
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        committer = psutil.Process(service.worker_pid("committer"))
        committer.suspend()
        try:
            statuses = []
            for _ in range(200):
                result = producer.send("F", b"e" * 20_000, queue_id=0)
                statuses.append(result.status)
                if result.status is not PutMessageStatus.PUT_OK:
                    break
            assert statuses[-1] is PutMessageStatus.CREATE_MAPEDFILE_FAILED, statuses[-3:]
            assert "fastFailIfNoBufferInStorePool" in result.reason
            assert statuses.count(PutMessageStatus.PUT_OK) == len(statuses) - 1
        finally:
            committer.resume()
        wait_until(lambda: producer.send("F", b"f", queue_id=0).ok, 10, "puts to resume")
