"""broker.conf keys that shape a pull from the running store: longPollingEnable and the on-disk
transfer limits (accessMessageInMemoryMaxRatio, maxTransferCountOnMessageInDisk)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rmq_mp.client.consumer import SHORT_POLLING_S, Consumer
from rmq_mp.outcomes import GetMessageResult, GetMessageStatus
from rmq_mp.put.producer import Producer
from tests.service import running_service, wait_in, wait_until


@pytest.mark.parametrize("long_polling", ["true", "false"])
def test_a_pull_that_waits_is_woken_by_arrival_only_with_long_polling(
    tmp_path: Path, long_polling: str
) -> None:
    """longPollingEnable=true: reput wakes a waiting pull when its message is dispatched.
    false (RocketMQ's short polling): the pull sleeps SHORT_POLLING_S before it looks again, so
    a message arriving while it waits is returned only after that."""
    with (
        running_service(tmp_path, longPollingEnable=long_polling) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        assert producer.send("W", b"first", queue_id=0).ok
        wait_until(lambda: consumer.pull("W", 0, 0).status is GetMessageStatus.FOUND, 5, "first dispatched")
        pulled: list[GetMessageResult] = []
        puller = threading.Thread(
            target=lambda: pulled.append(consumer.pull("W", 0, 1, timeout_s=5)), daemon=True
        )
        started = time.monotonic()
        puller.start()
        try:
            wait_in(puller, "_park")  # it looked, found nothing, and waits: then the message comes
            assert producer.send("W", b"second", queue_id=0).ok
        finally:
            puller.join(30)
        waited = time.monotonic() - started
        (result,) = pulled
        assert result.status is GetMessageStatus.FOUND
        assert [x.body for x in result.messages] == [b"second"]
        if long_polling == "false":
            assert waited >= SHORT_POLLING_S, f"answered after {waited:.2f} s: woken by the arrival"
        else:
            assert waited < SHORT_POLLING_S, f"answered after {waited:.2f} s: not woken by the arrival"


def test_a_pull_of_records_on_disk_returns_fewer(tmp_path: Path) -> None:
    """At accessMessageInMemoryMaxRatio=0 every record counts as on disk: a pull through the
    running store returns maxTransferCountOnMessageInDisk of them, not up to 32."""
    with (
        running_service(
            tmp_path, accessMessageInMemoryMaxRatio="0", maxTransferCountOnMessageInDisk="5"
        ) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        assert producer.send_batch([dict(topic="D", body=b"%d" % i, queue_id=0) for i in range(20)]).ok
        wait_until(lambda: consumer.pull("D", 0, 0).max_offset == 20, 5, "all dispatched")
        result = consumer.pull("D", 0, 0, 32)
        assert [x.body for x in result.messages] == [b"%d" % i for i in range(5)]
        assert result.next_begin_offset == 5
