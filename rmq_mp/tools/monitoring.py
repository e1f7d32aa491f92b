"""Operator side of the supervisor: the Prometheus endpoint and the store's event log lines.

Runs in the supervisor process. The endpoint (``metricsPort`` in broker.conf, 0 = off) is
prometheus-client's HTTP server thread on ``metricsAddress`` (127.0.0.1 by default) with a collector that reads shared memory on
every scrape (the pointer table, the queue and group tables, the producers' metrics segment), so
nothing is sampled or cached and an idle store costs nothing. `OpsMonitor.tick`, called from the
supervisor's watch loop, writes the lines RocketMQ users search for when something is slow (a
put lock held over 500 ms) and stays silent otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ConfigError, ShmAttachError, StoreError
from rmq_mp.outcomes import RunningFlags
from rmq_mp.tools.status_report import collect_status, host_port
from rmq_mp.tools.store_status import CONNECTION_STATES
from shm import layout
from shm import queue_offsets as qo
from shm.consume_counts import ConsumeCounts
from shm.layout import Role
from shm.metrics import LOCK_HELD_TOO_LONG_US, MetricsTable
from shm.names import ShmNames
from shm.pointer_table import PointerTable, now_ms
from shm.queue_offsets import QueueOffsetTable

log = logging.getLogger("rmq_mp.supervisor")

TICK_INTERVAL_S = 1.0


class StoreCollector(Collector):
    """Every metric of one running store, read from shared memory at scrape time."""

    def __init__(self, config: MessageStoreConfig) -> None:
        self.config = config
        self.names = ShmNames.for_store(config.store_path_root_dir, config.shm_name)

    def collect(self) -> Iterator[Metric]:
        try:
            status = collect_status(self.config)
            table = MetricsTable.attach(self.names.metrics, Role.SUPERVISOR)
        except (ShmAttachError, StoreError):
            return  # the store is stopping: an empty scrape, not an error page
        try:
            totals = table.totals()
        finally:
            table.close()
        yield from _store_metrics(status)
        yield from self._topic_metrics()
        yield _counter(
            "rmq_put_failures", "Puts answered with a status other than PUT_OK", totals.put_failures
        )
        reference = CounterMetricFamily(
            "rmq_put_reference_sends",
            "Messages the pure-Python reference sent instead of the compiled core, per reason",
            labels=["reason"],
        )
        for why, count in totals.reference_sends.items():
            reference.add_metric([why], count)
        yield reference
        for name, doc, hist in (
            ("rmq_put_latency_seconds", "Producer send/send_batch call latency", totals.latency),
            ("rmq_put_lock_hold_seconds", "How long a put held the commit-log put lock", totals.lock_hold),
        ):
            family = HistogramMetricFamily(name, doc)
            family.add_metric([], hist.cumulative(), hist.sum_us / 1e6)
            yield family

    def _topic_metrics(self) -> Iterator[Metric]:
        """Per topic: messages put (reput's dispatch writes each queue's ConsumeQueue max offset,
        once per record, so the sum over a topic's queues counts every record once, since the
        store's first message) and messages consumers received (`ConsumeCounts`, since start)."""
        try:
            queues = QueueOffsetTable.attach(self.names.queue_offsets, Role.SUPERVISOR)
        except ShmAttachError:
            return
        try:
            counts = ConsumeCounts.attach(self.names.consume_counts, Role.SUPERVISOR)
        except ShmAttachError:
            queues.close()
            return
        put: dict[str, int] = {}
        consumed: dict[str, int] = {}
        try:
            for topic, _queue_id, slot in queues.queues():  # the directory: untouched slots stay unread
                put[topic] = put.get(topic, 0) + queues.get(slot, qo.DISPATCHED)
                consumed[topic] = consumed.get(topic, 0) + counts.count(slot)
        finally:
            counts.close()
            queues.close()
        put_family = CounterMetricFamily(
            "rmq_topic_put_messages", "Messages put to a topic (dispatched to its queues)", labels=["topic"]
        )
        consumed_family = CounterMetricFamily(
            "rmq_topic_consumed_messages",
            "Messages consumers received from a topic since start",
            labels=["topic"],
        )
        for topic in sorted(put):
            put_family.add_metric([topic], put[topic])
            consumed_family.add_metric([topic], consumed[topic])
        yield put_family
        yield consumed_family


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _replication_metrics(r: dict[str, Any]) -> Iterator[Metric]:
    """The ha worker's state (store_status.replication_status)."""
    if r["role"] == "SLAVE":
        yield _gauge(
            "rmq_ha_slave_received_end_bytes", "A slave's end of the master's bytes", r["received_end"]
        )
        yield _counter("rmq_ha_slave_connects", "Connections a slave made to its master", r["connects"])
        return
    yield _gauge(
        "rmq_ha_acked_offset_bytes", "Highest commit-log end any slave acknowledged", r["acked_offset"]
    )
    yield _gauge("rmq_ha_connections", "Slave connections open", r["connection_count"])
    yield _counter(
        "rmq_ha_refused_peers",
        "HA connections refused: outside haAllowedSlaves, or past 32 at once",
        r["refused_peers"],
    )
    yield _counter("rmq_ha_dropped", "HA connections closed for silence or a bad report", r["dropped"])
    yield _gauge(
        "rmq_ha_slaves_behind_min_offset",
        "Slave connections that need commit-log bytes the cleaner deleted (heartbeats only: rebuild them)",
        sum(c["state"] == CONNECTION_STATES[layout.CONN_BEHIND_MIN_OFFSET] for c in r["connections"]),
    )
    yield _counter(
        "rmq_ha_slave_not_available",
        "SYNC_MASTER puts answered SLAVE_NOT_AVAILABLE",
        r["slave_not_available"],
    )
    yield _counter(
        "rmq_ha_flush_slave_timeout",
        "SYNC_MASTER puts answered FLUSH_SLAVE_TIMEOUT",
        r["flush_slave_timeout"],
    )
    lag = GaugeMetricFamily(
        "rmq_ha_slave_lag_bytes", "Master's end minus a slave's acknowledged offset", labels=["peer"]
    )
    lag_ms = GaugeMetricFamily(
        "rmq_ha_slave_lag_ms", "How long a slave has been behind the master's end", labels=["peer"]
    )
    for c in r["connections"]:
        if c["lag_bytes"] is not None:
            lag.add_metric([c["peer"]], c["lag_bytes"])
        if c["lag_ms"] is not None:
            lag_ms.add_metric([c["peer"]], c["lag_ms"])
    yield lag
    yield lag_ms


def _store_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    c, lags, pool = status["counters"], status["lags"], status["pool"]
    yield from _replication_metrics(status["replication"])
    yield _counter("rmq_put_messages", "Messages appended to the commit log", c["put_count"])
    yield _counter("rmq_put_bytes", "Bytes appended to the commit log", c["put_bytes"])
    yield _counter("rmq_commit", "Pool-to-file commits", c["commit_count"])
    yield _counter("rmq_flush", "Commit-log flushes that advanced the flushed offset", c["flush_count"])
    yield _counter("rmq_flush_failures", "Failed commit-log fsyncs", c["flush_failures"])
    yield _counter("rmq_dispatch", "Records dispatched to ConsumeQueue and index", c["dispatch_count"])
    yield _counter("rmq_put_lock_recoveries", "Put locks taken over from a dead owner", c["lock_recoveries"])
    yield _counter(
        "rmq_read_skipped_records",
        "Records readers skipped rather than serve (body CRC, queue entry not matching its record)",
        c["read_skipped_records"],
    )
    for what in ("commit", "flush", "reput"):
        yield _gauge(f"rmq_{what}_lag_bytes", f"Bytes written but not yet {what}ed", lags[what])
    offsets = GaugeMetricFamily("rmq_commitlog_offset_bytes", "Commit-log offsets", labels=["position"])
    for position, value in status["offsets"].items():
        offsets.add_metric([position], value)
    yield offsets
    yield _gauge("rmq_pool_buffers", "TransientStorePool buffers (0 = pool off)", pool["buffers"])
    yield _gauge("rmq_pool_buffers_in_use", "Pool buffers holding uncommitted data", pool["in_use"])
    entries = GaugeMetricFamily(
        "rmq_table_entries", "Entries in use in a fixed-capacity shared table", labels=["capacity_key"]
    )
    capacity = GaugeMetricFamily(
        "rmq_table_capacity",
        "Configured capacity of a shared table (its broker.conf key)",
        labels=["capacity_key"],
    )
    for key, level in status["tables"].items():
        entries.add_metric([key], level["used"])
        capacity.add_metric([key], level["capacity"])
    yield entries
    yield capacity
    yield _gauge("rmq_disk_used_ratio", "Used fraction of the commit log's disk", status["disk_used_ratio"])
    yield _gauge(
        "rmq_recovery_seconds", "Wall time of the last startup recovery", status["recovery_ms"] / 1000
    )
    flags = GaugeMetricFamily("rmq_running_flag", "RocketMQ RunningFlags bits that are set", labels=["flag"])
    for name in RunningFlags.names(RunningFlags.put_blockers()):
        flags.add_metric([name], int(name in status["running_flags"]))
    yield flags
    restarts = CounterMetricFamily("rmq_worker_restarts", "Worker processes restarted", labels=["role"])
    errors = CounterMetricFamily("rmq_worker_errors", "Failed work passes of a worker", labels=["role"])
    heartbeat = GaugeMetricFamily(
        "rmq_worker_heartbeat_age_seconds", "Since a worker last beat", labels=["role"]
    )
    for role, w in status["workers"].items():
        restarts.add_metric([role], w["restarts"])
        errors.add_metric([role], w["errors"])
        heartbeat.add_metric([role], max(w["heartbeat_age_ms"], 0) / 1000)
    yield from (restarts, errors, heartbeat)
    cleaner = status["cleaner"]
    yield _counter("rmq_cleaner_runs", "Commit-log cleaning runs that had a trigger", cleaner["runs"])
    yield _counter(
        "rmq_cleaner_deleted_files", "Commit-log files the cleaner deleted", cleaner["deleted_files"]
    )
    yield _counter(
        "rmq_cleaner_deleted_bytes", "Commit-log bytes the cleaner deleted", cleaner["deleted_bytes"]
    )
    yield _counter(
        "rmq_cleaner_forced_destroys", "Files deleted while a reader held them", cleaner["forced_destroys"]
    )
    yield _gauge(
        "rmq_cleaner_last_run_deleted_files",
        "Files the last cleaning run deleted",
        cleaner["last_deleted_files"],
    )
    faults = status["dispatch_faults"]
    yield _gauge(
        "rmq_dispatch_failed_queues",
        "Queues reput quarantined: their messages wait for a retry (run.py status says why)",
        faults["failed_queues"],
    )
    quarantined = GaugeMetricFamily(
        "rmq_dispatch_failed_queue",
        "1 for each quarantined queue (the first MAX_LISTED_QUEUES), with why",
        labels=["topic", "queue_id", "reason"],
    )
    for q in faults["queues"]:
        quarantined.add_metric([q["topic"], str(q["queue_id"]), q["reason"]], 1)
    yield quarantined
    index_paused = GaugeMetricFamily(
        "rmq_index_dispatch_paused", "1 while reput cannot write the index", labels=["reason"]
    )
    index_paused.add_metric(
        [faults["index"]["reason"] if faults["index"] else ""], int(faults["index"] is not None)
    )
    yield index_paused
    lag = GaugeMetricFamily(
        "rmq_consumer_lag_messages", "Dispatched minus committed", labels=["group", "topic"]
    )
    for g in status["consumer_groups"]:
        lag.add_metric([g["group"], g["topic"]], g["lag"])
    yield lag
    backlog = GaugeMetricFamily(
        "rmq_delay_level_backlog_messages",
        "Delayed messages of a level stored but not yet delivered (SCHEDULE_TOPIC_XXXX queue level-1)",
        labels=["level"],
    )
    late = GaugeMetricFamily(
        "rmq_delay_level_lag_ms",
        "How long past its due time the oldest undelivered message of a level is (0: none due)",
        labels=["level"],
    )
    delivered = CounterMetricFamily(
        "rmq_delay_level_delivered",
        "Delayed messages delivered to their real topic since start",
        labels=["level"],
    )
    for d in status["delay_levels"]:
        backlog.add_metric([str(d["level"])], d["backlog"])
        late.add_metric([str(d["level"])], d["lag_ms"])
        delivered.add_metric([str(d["level"])], d["delivered"])
    yield backlog
    yield late
    yield delivered


class OpsMonitor:
    """The supervisor's metrics endpoint and slow-event log lines."""

    def __init__(self, config: MessageStoreConfig, table: PointerTable, names: ShmNames) -> None:
        self.config = config
        self.table = table
        self.names = names
        self.server: Any = None
        self.next_tick = 0.0
        self.long_holds = 0
        self.reported_hold_since_ms = 0
        self.metrics: MetricsTable | None = None

    def start(self) -> None:
        """Serve /metrics when ``metricsPort`` is set; the bound port goes in the pointer table."""
        self.metrics = MetricsTable.attach(self.names.metrics, Role.SUPERVISOR)
        self.long_holds = self.metrics.totals().lock_hold.over(LOCK_HELD_TOO_LONG_US)
        if not self.config.metrics_port:
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(self.config))
        address = self.config.metrics_address
        try:
            self.server, _thread = start_http_server(
                self.config.metrics_port, addr=address, registry=registry
            )
        except OSError as exc:
            raise ConfigError(
                f"metricsPort={self.config.metrics_port}: cannot listen on {address}: {exc.strerror or exc}"
            ) from exc
        self.table.set(layout.METRICS_PORT, self.server.server_port)
        log.info("metrics on http://%s/metrics", host_port(address, self.server.server_port))

    def tick(self) -> None:
        """At most once a second: log put-lock holds over 500 ms (RocketMQ's "putMessage in lock
        cost time" line), both those producers finished and one still going on."""
        now_s = time.monotonic()
        if now_s < self.next_tick or self.metrics is None:
            return
        self.next_tick = now_s + TICK_INTERVAL_S
        long_holds = self.metrics.totals().lock_hold.over(LOCK_HELD_TOO_LONG_US)
        if long_holds > self.long_holds:
            log.warning(
                "put lock held over %d ms by %d put(s) since the last report (%d in all)",
                LOCK_HELD_TOO_LONG_US // 1000,
                long_holds - self.long_holds,
                long_holds,
            )
            self.long_holds = long_holds
        since_ms = self.table.get(layout.PUT_LOCK_SINCE_MS)
        held_ms = now_ms() - since_ms if since_ms else 0
        if held_ms > LOCK_HELD_TOO_LONG_US // 1000 and since_ms != self.reported_hold_since_ms:
            self.reported_hold_since_ms = since_ms
            log.warning(
                "put lock held for %d ms so far by pid %d",
                held_ms,
                layout.lock_owner(self.table.get(layout.PUT_LOCK_OWNER_PID)),
            )

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
