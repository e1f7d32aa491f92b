"""Per-topic put and consume counters on the metrics endpoint, and `metricsAddress` (issue 34
point 6): real producers and consumers, the endpoint scraped over TCP."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ConfigError
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from shm.consume_counts import HEADER_WORDS, ConsumeCounts
from shm.queue_offsets import QueueOffsetTable
from tests.service import running_service, wait_until


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def scrape(port: int, address: str = "127.0.0.1") -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def put(values: dict[str, float], topic: str) -> float:
    return values.get(f'rmq_topic_put_messages_total{{topic="{topic}"}}', -1)


def consumed(values: dict[str, float], topic: str) -> float:
    return values.get(f'rmq_topic_consumed_messages_total{{topic="{topic}"}}', -1)


def test_per_topic_put_and_consume_counters(tmp_path: Path) -> None:
    port = free_port()
    with running_service(tmp_path, metricsPort=str(port)) as service:
        store = str(service.root)
        with Producer.attach(store) as producer:
            for topic, count in (("Orders", 30), ("Payments", 20), ("Idle", 1)):
                results = producer.send_batch(
                    dict(topic=topic, body=f"{topic} {i}".encode()) for i in range(count)
                )
                assert all(r.ok for r in results)
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
            30,
            "dispatch",
        )
        before = scrape(port)
        assert (put(before, "Orders"), put(before, "Payments"), put(before, "Idle")) == (30, 20, 1)
        assert (consumed(before, "Orders"), consumed(before, "Payments")) == (0, 0)
        # Two groups read all of Orders (each message counts for each group that received it);
        # one reads 10 of Payments by pull and keeps the rest unread.
        for group in ("billing", "audit"):
            with Consumer.attach(store, group) as consumer:
                consumer.subscribe("Orders")
                received = 0
                while received < 30 and (batch := consumer.poll(timeout_s=5)):
                    received += len(batch)
                assert received == 30
        with Consumer.attach(store, "peek") as consumer:
            pulled = 0
            for queue_id in range(8):
                result = consumer.pull("Payments", queue_id, 0, max_msgs=10 - pulled)
                if result.status is GetMessageStatus.FOUND:
                    pulled += len(result.messages)
                if pulled == 10:
                    break
            assert pulled == 10
        after = scrape(port)
        assert consumed(after, "Orders") == 60
        assert consumed(after, "Payments") == 10
        assert consumed(after, "Idle") == 0
        assert put(after, "Orders") == 30  # consuming puts nothing
        # The put counter survives a restart (it is the queues' dispatched offsets); the consume
        # counter starts again (it counts since start).
    with running_service(tmp_path, metricsPort=str(port)):
        again = scrape(port)
        assert (put(again, "Orders"), consumed(again, "Orders")) == (30, 0)


def test_metrics_address_binds_where_set(tmp_path: Path) -> None:
    """127.0.0.2 is loopback too on Linux (all of 127/8): the endpoint answers there and not on
    127.0.0.1, so the setting is what chose the address."""
    port = free_port("127.0.0.2")
    with running_service(tmp_path, metricsPort=str(port), metricsAddress="127.0.0.2") as service:
        assert service.read(layout.METRICS_PORT) == port
        assert "rmq_put_messages_total" in scrape(port, "127.0.0.2")
        with pytest.raises(urllib.error.URLError):
            scrape(port, "127.0.0.1")


def test_metrics_address_must_be_an_ip_address(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nmetricsAddress=localhost\n")
    with pytest.raises(ConfigError, match="metricsAddress = 'localhost': must be an IPv4 or IPv6 address"):
        MessageStoreConfig.from_file(conf)
    assert MessageStoreConfig().metrics_address == "127.0.0.1"


def test_consume_counts_are_bounded_by_the_queue_table(tmp_path: Path) -> None:
    """One word per queue-table slot: 10,000 topics of 8 queues (80,000 queues, within the
    default maxConsumeQueueNum of 65,536 raised to 80,000) cost under 1 MiB."""
    slots = QueueOffsetTable.slots_for(80_000)
    name = f"/rmqtest_consumed_{uuid.uuid4().hex}"
    counts = ConsumeCounts.create(name, slots)
    try:
        assert counts.segment.size == (HEADER_WORDS + slots) * 8 < 1 << 20
        attached = ConsumeCounts.attach(name, layout.Role.CONSUMER)
        try:
            attached.add(slots - 1, 5)
            assert counts.count(slots - 1) == 5
        finally:
            attached.close()
        with pytest.raises(PermissionError):
            counts.add(0, 1)  # the supervisor only creates it
    finally:
        counts.close()
        counts.segment.unlink(name)
