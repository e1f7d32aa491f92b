"""A running store's state in one read of its shared memory: what `run.py status`,
`rmq-admin storeStatus` and the metrics endpoint show.

Everything comes from the pointer table, the queue and group tables and the producers' metrics
segment; nothing is written. `collect_status` attaches in the CONSUMER role and detaches.
"""

from __future__ import annotations

import errno
import ipaddress
import os
from collections import Counter
from typing import Any

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from rmq_mp.errors import ShmAttachError
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE, tags_code_of
from rmq_mp.outcomes import RunningFlags
from rmq_mp.store.cleaning import CleanerStatistics
from rmq_mp.store.disk import disk_used_ratio
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.message_store import queue_end_in_files
from rmq_mp.store.running_store import promoted_role
from rmq_mp.store.schedule import SCHEDULE_TOPIC, LevelProgress, queue_id_of
from shm import layout
from shm import queue_offsets as qo
from shm import schedule_offsets as so
from shm.layout import Role
from shm.metrics import LOCK_HELD_TOO_LONG_US, MetricsTable
from shm.names import ShmNames
from shm.pointer_table import now_ms, pid_alive_since
from shm.roles import ROLES
from shm.store_shm import StoreShm

STATE_NAMES = {
    layout.STARTING: "STARTING",
    layout.RUNNING: "RUNNING",
    layout.STOPPING: "STOPPING",
    layout.STOPPED: "STOPPED",
}
WORKER_STATES = {
    layout.W_STOPPED: "stopped",
    layout.W_STARTING: "starting",
    layout.W_READY: "ready",
    layout.W_STOPPING: "stopping",
}


def collect_status(config: MessageStoreConfig) -> dict[str, Any]:
    names = ShmNames.for_store(config.store_path_root_dir, config.shm_name)
    shm = StoreShm.attach(names, Role.CONSUMER)
    try:
        t = shm.table
        snap = t.snapshot()
        wrote, committed = snap["wrote_position"], snap["committed_position"]
        if not snap["pool_size"]:
            committed = wrote  # without the pool, appended bytes are in the file at once
        flushed, reput = snap["flushed_position"], snap["reput_from_offset"]
        pool_size = snap["pool_size"]
        workers = {}
        for role in ROLES:
            pid = t.get(layout.worker_field(role, "pid"))
            if not pid:
                continue
            workers[role] = {
                "pid": pid,
                "state": WORKER_STATES.get(t.get(layout.worker_field(role, "state")), "?"),
                "restarts": t.get(layout.worker_field(role, "restarts")),
                "heartbeat_age_ms": now_ms() - t.get(layout.worker_field(role, "heartbeat_ms")),
                "errors": t.get(layout.worker_field(role, "errors")),
                "work_count": t.get(layout.worker_field(role, "work_count")),
            }
        flags = snap["running_flags"]
        cleaner = CleanerStatistics.read(t, reserved_hours=config.file_reserved_time)
        ops = _ops_sections(shm, snap, config)
        return {
            **ops,
            "tables": table_levels(shm, ops["producer_metrics"]),
            "store": config.store_path_root_dir,
            "shm_name": names.base,
            "broker": f"{config.broker_cluster_name}/{config.broker_name} {config.broker_role.value}",
            "state": STATE_NAMES.get(snap["state"], "?"),
            "supervisor_pid": snap["supervisor_pid"],
            "flush_disk_type": "SYNC_FLUSH" if snap["flush_disk_sync"] else "ASYNC_FLUSH",
            "offsets": {
                "min": snap["min_offset"],
                "wrote": wrote,
                "committed": committed,
                "flushed": flushed,
                "reput": reput,
            },
            "lags": {
                "commit": wrote - committed if pool_size else 0,
                "flush": max(wrote - flushed, 0),
                "reput": max(
                    (flushed if snap["flush_disk_sync"] else committed if pool_size else wrote) - reput, 0
                ),
            },
            "pool": {
                "buffers": pool_size,
                "in_use": pool_size - shm.pool.available(),
                "mlock_failed": snap["pool_mlock_failed"],
            },
            "disk_used_ratio": disk_used_ratio(config.store_path_root_dir),
            "running_flags": RunningFlags.names(flags),
            "dispatch_faults": dispatch_faults(shm, snap),
            "cleaner": cleaner.as_dict() | {"summary": cleaner.summary()},
            "workers": workers,
            "replication": replication_status(shm, config),
            "counters": {
                k: snap[k]
                for k in (
                    "put_count",
                    "put_bytes",
                    "flush_count",
                    "flush_failures",
                    "commit_count",
                    "dispatch_count",
                    "lock_recoveries",
                    "recovery_dropped_bytes",
                    "read_skipped_records",
                    "config_persist_failures",
                )
            },
        }
    finally:
        shm.close()


SLAVE_STATES = {
    layout.SLAVE_IDLE: "idle",
    layout.SLAVE_CONNECTING: "connecting",
    layout.SLAVE_CONNECTED: "connected",
    layout.SLAVE_BACKOFF: "backing off",
    layout.SLAVE_VERIFYING: "comparing its log with the master's",
    layout.SLAVE_FORKED: "forked from the master's log (its records set aside; restart to cut)",
    layout.SLAVE_REFUSED: "refusing: cannot tell where its log and the master's part",
}
CONNECTION_STATES = {
    layout.CONN_WAITING_REPORT: "waiting for its first report",
    layout.CONN_TRANSFERRING: "transferring",
    layout.CONN_BEHIND_MIN_OFFSET: "needs deleted files (heartbeats only)",
}


def peer_text(word: int) -> str:
    """A connection slot's peer word (IPv4 << 16 | port) as `a.b.c.d:port`; '?' for others."""
    if word <= 0:
        return "?"
    return f"{ipaddress.IPv4Address(word >> 16)}:{word & 0xFFFF}"


def replication_status(shm: StoreShm, config: MessageStoreConfig) -> dict[str, Any]:
    """The ha worker's shared state (workers/ha.py): a SLAVE's master and progress, or a
    master's listener, connections (peer, acknowledged offset, lag in bytes and ms, last
    heard) and SYNC_MASTER outcome counts."""
    t = shm.table
    current_ms = now_ms()
    config = promoted_role(config, t)  # rmq-admin promote's, live
    role = config.broker_role.value
    if config.broker_role is BrokerRole.SLAVE:
        heard = t.get(layout.HA_SLAVE_LAST_HEARD_MS)
        applied = t.get(layout.HA_META_APPLIED_MS)
        return {
            "role": role,
            "meta_master": config.ha_master_meta_address or None,
            "meta_snapshots_applied": t.get(layout.HA_META_APPLIED),
            "meta_applied_age_ms": current_ms - applied if applied else None,
            "master_end_heard": t.get(layout.HA_META_MASTER_END),
            "meta_malformed": t.get(layout.HA_META_MALFORMED),
            "master": config.ha_master_address,
            "state": SLAVE_STATES.get(t.get(layout.HA_SLAVE_STATE), "?"),
            "received_end": t.get(layout.HA_SLAVE_RECEIVED_END),
            "fork_offset": t.get(layout.HA_SLAVE_FORK_OFFSET),
            "read_end": t.get(layout.FORK_READ_END),
            "unconfirmed_from": t.get(layout.HA_UNCONFIRMED_FROM),
            "connects": t.get(layout.HA_SLAVE_CONNECTS),
            "last_heard_age_ms": current_ms - heard if heard else None,
        }
    end = t.written_end()
    connections = []
    for slot in range(layout.HA_CONN_SLOTS):
        state = t.get(layout.ha_connection_field(slot, "state"))
        if state == layout.CONN_FREE:
            continue
        acked = t.get(layout.ha_connection_field(slot, "acked"))
        caught_up = t.get(layout.ha_connection_field(slot, "caught_up_ms"))
        lag_bytes = max(end - acked, 0) if acked >= 0 else None
        connections.append(
            {
                "peer": peer_text(t.get(layout.ha_connection_field(slot, "peer"))),
                "state": CONNECTION_STATES.get(state, "?"),
                "acked_offset": acked,
                "lag_bytes": lag_bytes,
                "lag_ms": (current_ms - caught_up if caught_up else None) if lag_bytes else 0,
                "last_heard_age_ms": current_ms - t.get(layout.ha_connection_field(slot, "last_heard_ms")),
            }
        )
    return {
        "role": role,
        "listen_port": t.get(layout.HA_LISTEN_PORT) or None,
        "acked_offset": t.get(layout.HA_ACKED_OFFSET),
        "connection_count": t.get(layout.HA_CONNECTIONS),
        "connections": connections,
        "refused_peers": t.get(layout.HA_REFUSED_PEERS),
        "meta_listen_port": t.get(layout.HA_META_LISTEN_PORT) or None,
        "meta_connections": t.get(layout.HA_META_CONNECTIONS),
        "meta_refused_peers": t.get(layout.HA_META_REFUSED),
        "meta_malformed": t.get(layout.HA_META_MALFORMED),
        "dropped": t.get(layout.HA_DROPPED),
        "slave_not_available": t.get(layout.HA_SLAVE_NOT_AVAILABLE),
        "flush_slave_timeout": t.get(layout.HA_FLUSH_SLAVE_TIMEOUT),
    }


def _ago(age_ms: int | None) -> str:
    return "never" if age_ms is None else f"{age_ms} ms ago"


def replication_summary(r: dict[str, Any]) -> list[str]:
    """`replication_status` as the text status's lines."""
    if r["role"] == "SLAVE":
        heard = r["last_heard_age_ms"]
        return [
            f"replica  SLAVE of {r['master'] or '(no haMasterAddress)'}  {r['state']}  received "
            f"{r['received_end']}  connects {r['connects']}  last heard "
            f"{'never' if heard is None else f'{heard} ms ago'}"
            + (f"  at offset {r['fork_offset']}" if r.get("fork_offset", -1) >= 0 else "")
            + (
                f"  serves nothing from {r['unconfirmed_from']} (not yet confirmed as its master's)"
                if r.get("unconfirmed_from", -1) >= 0
                else ""
            ),
            f"metadata from {r['meta_master'] or '(no haMasterMetaAddress)'}  snapshots "
            f"{r['meta_snapshots_applied']}  last {_ago(r['meta_applied_age_ms'])}  master end heard "
            f"{r['master_end_heard']}  malformed {r['meta_malformed']}",
        ]
    lines = [
        f"replica  {r['role']}  ha port {r['listen_port'] or 'off'}  acked {r['acked_offset']}  "
        f"slaves {r['connection_count']}  refused {r['refused_peers']}  dropped {r['dropped']}  "
        f"SLAVE_NOT_AVAILABLE {r['slave_not_available']}  FLUSH_SLAVE_TIMEOUT {r['flush_slave_timeout']}"
    ]
    if r["meta_listen_port"]:
        lines.append(
            f"  metadata port {r['meta_listen_port']}  slaves {r['meta_connections']}  refused "
            f"{r['meta_refused_peers']}  malformed {r['meta_malformed']}"
        )
    for c in r["connections"]:
        lag = (
            "-"
            if c["lag_bytes"] is None
            else f"{c['lag_bytes']} B / {c['lag_ms'] if c['lag_ms'] is not None else '?'} ms"
        )
        lines.append(
            f"  slave {c['peer']}  {c['state']}  acked {c['acked_offset']}  lag {lag}  "
            f"heard {c['last_heard_age_ms']} ms ago"
        )
    return lines


MAX_LISTED_QUEUES = 100
"""Quarantined queues a status lists by name (a full disk can quarantine every queue)."""


def fault_reason(code: int) -> str:
    """A dispatch fault code (an errno, or shm.layout's FAULT_*) as words."""
    if code > 0:
        return f"{errno.errorcode.get(code, f'errno {code}')} ({os.strerror(code)})"
    if code == layout.FAULT_CONFIG:
        return "the configuration leaves no room (see reput.log)"
    return "unexpected error (see reput.log)"


def dispatch_faults(shm: StoreShm, snap: dict[str, int]) -> dict[str, Any]:
    """Queues reput quarantined and a paused index (workers/reput.py), with why: dispatch to
    them waits for a retry while the rest goes on, so the workers alone look healthy."""
    failed = snap["dispatch_failed_queues"]
    queues = []
    if failed:
        for topic, queue_id, slot in shm.queues.queues():
            code = shm.queues.get(slot, qo.DISPATCH_ERROR)
            if code:
                queues.append(
                    {
                        "topic": topic,
                        "queue_id": queue_id,
                        "reason": fault_reason(code),
                        "dispatched": shm.queues.get(slot, qo.DISPATCHED),
                        "stored": shm.queues.get(slot, qo.NEXT_OFFSET),
                    }
                )
                if len(queues) >= MAX_LISTED_QUEUES:
                    break
    index_code = snap["index_dispatch_error"]
    return {
        "failed_queues": failed,
        "queues": queues,
        "redispatch_from": snap["queue_redispatch_from"] if failed else None,
        "index": (
            {"reason": fault_reason(index_code), "resume_offset": snap["index_resume_offset"]}
            if index_code
            else None
        ),
    }


def format_dispatch_faults(faults: dict[str, Any]) -> list[str]:
    """Lines for a text status: none when dispatch reaches every queue and the index."""
    lines = [
        f"queue {q['topic']}/{q['queue_id']} QUARANTINED: {q['reason']}; "
        f"dispatched {q['dispatched']} of {q['stored']} message(s)"
        for q in faults["queues"]
    ]
    if faults["failed_queues"] > len(faults["queues"]):
        lines.append(f"... {faults['failed_queues']} queue(s) quarantined in all")
    if faults["failed_queues"]:
        lines.append(f"reput retries them from commit-log offset {faults['redispatch_from']}")
    index = faults["index"]
    if index is not None:
        lines.append(
            f"index PAUSED: {index['reason']}; keys from commit-log offset {index['resume_offset']} wait"
        )
    return lines


def table_levels(shm: StoreShm, producer_metrics: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each fixed-capacity shared table's entries in use against its broker.conf capacity."""
    levels = {
        "maxConsumeQueueNum": (shm.queues.used, shm.queues.capacity),
        "maxConsumerOffsetNum": (shm.groups.used, shm.groups.capacity),
        "maxConsumerNum": (shm.waiters.live_slots(), shm.waiters.capacity),
        "maxSyncFlushRequestNum": (shm.ring.waiting(), shm.ring.capacity),
        "maxProducerNum": (producer_metrics.get("producers", 0), producer_metrics.get("producer_slots", 0)),
        "transientStorePoolSize": (shm.pool.in_use(), len(shm.pool.buffers)),
    }
    return {key: {"used": used, "capacity": capacity} for key, (used, capacity) in levels.items()}


def format_table_levels(levels: dict[str, dict[str, int]]) -> str:
    """One line: ``queues 12/65,536  offsets 3/65,536 ...`` (the setting names each capacity)."""
    return "  ".join(f"{key} {v['used']:,}/{v['capacity']:,}" for key, v in levels.items())


def _ops_sections(shm: StoreShm, snap: dict[str, int], config: MessageStoreConfig) -> dict[str, Any]:
    """Producer histograms, consumer lag per group, recovery time, metrics port."""
    metrics: dict[str, Any] = {}
    try:
        table = MetricsTable.attach(shm.names.metrics, Role.CONSUMER)
    except ShmAttachError:  # a store started before the segment existed
        pass
    else:
        try:
            totals = table.totals()
        finally:
            table.close()
        metrics = {
            "puts": totals.puts,
            "put_failures": totals.put_failures,
            "put_calls": totals.latency.count,
            "put_latency_avg_us": totals.latency.sum_us // max(totals.latency.count, 1),
            # Per `send`/`send_batch` call (a batch's whole time), and per message sent:
            "put_latency_per_message_avg_us": round(totals.latency.sum_us / max(totals.puts, 1), 1),
            "lock_hold_avg_us": totals.lock_hold.sum_us // max(totals.lock_hold.count, 1),
            "lock_holds_over_500ms": totals.lock_hold.over(LOCK_HELD_TOO_LONG_US),
            "producers": totals.producers,
            "producer_slots": table.slots,
            # Messages the pure-Python reference sent instead of the compiled core, per reason:
            "reference_sends": totals.reference_sends,
        }
    return {
        "generation": snap["generation"],
        "recovery_ms": snap["recovery_ms"],
        "metrics_port": snap["metrics_port"],
        "producer_metrics": metrics,
        "consumer_groups": consumer_lags(shm, config),
        "delay_levels": delay_levels(shm, config),
    }


def consumer_lags(shm: StoreShm, config: MessageStoreConfig) -> list[dict[str, Any]]:
    """Per group and topic: messages dispatched but not committed, over every queue of the topic
    (a queue the group never committed counts from its min offset), as consumerProgress's Diff,
    and the group's live members (shm/members.py). A slave's queues end at its read window, as its
    pulls do (`FORK_READ_END`)."""
    by_topic: dict[str, dict[int, tuple[int, int]]] = {}
    read_end = shm.table.get(layout.FORK_READ_END)
    for topic, queue_id, slot in shm.queues.queues():
        low, high = shm.queues.get(slot, qo.MIN_OFFSET), shm.queues.get(slot, qo.DISPATCHED)
        if read_end >= 0:
            high = max(low, queue_end_in_files(config, topic, queue_id, low, high, read_end))
        by_topic.setdefault(topic, {})[queue_id] = (low, high)
    committed: dict[tuple[str, str], dict[int, int]] = {}
    for key, queue_id, slot in shm.groups.queues():
        topic, _, group = key.partition("@")
        offset = shm.groups.get(slot, qo.COMMITTED)
        if offset != qo.DELETED:
            committed.setdefault((group, topic), {})[queue_id] = offset
    members = Counter(m.group for m in shm.members.members(pid_alive_since))
    rows = []
    for (group, topic), offsets in sorted(committed.items()):
        queues = by_topic.get(topic, {})
        lag = sum(max(high - max(offsets.get(q, -1), low), 0) for q, (low, high) in queues.items())
        rows.append(
            {"group": group, "topic": topic, "queues": len(queues), "lag": lag, "members": members[group]}
        )
    return rows


def schedule_progress(shm: StoreShm, config: MessageStoreConfig) -> list[LevelProgress]:
    """Each delay level's progress through its SCHEDULE_TOPIC_XXXX queue (the schedule table
    and the queue table), level 1 first. The due time of a level's oldest undelivered entry is
    read from its queue file (one 20-byte pread), so a scheduler that hangs shows its lag."""
    table = shm.schedule
    levels = []
    for level in range(1, table.levels + 1):
        queue_id = queue_id_of(level)
        slot = shm.queues.find(SCHEDULE_TOPIC, queue_id)
        offset = table.get(level - 1, so.OFFSET)
        max_offset = shm.queues.get(slot, qo.DISPATCHED) if slot >= 0 else 0
        levels.append(
            LevelProgress(
                level=level,
                delay_ms=table.get(level - 1, so.DELAY_MS),
                offset=offset,
                max_offset=max_offset,
                next_due_ms=_due_ms(config, queue_id, offset) if offset < max_offset else so.NONE_DUE,
                delivered=table.get(level - 1, so.DELIVERED),
            )
        )
    return levels


def _due_ms(config: MessageStoreConfig, queue_id: int, offset: int) -> int:
    """The tags code (a delivery time) of SCHEDULE_TOPIC_XXXX queue entry ``offset``, -1 when
    its file is gone (cleaned meanwhile)."""
    size = config.mapped_file_size_consume_queue
    position = offset * CQ_STORE_UNIT_SIZE
    path = (
        config.consume_queue_dir
        / SCHEDULE_TOPIC
        / str(queue_id)
        / offset_to_file_name(position - position % size)
    )
    try:
        with path.open("rb") as f:
            raw = os.pread(f.fileno(), CQ_STORE_UNIT_SIZE, position % size)
    except OSError:
        return so.NONE_DUE
    return tags_code_of(raw) if len(raw) == CQ_STORE_UNIT_SIZE else so.NONE_DUE


def delay_levels(shm: StoreShm, config: MessageStoreConfig) -> list[dict[str, int]]:
    """`schedule_progress` as status shows it: backlog (entries not yet delivered) and lag (ms
    the oldest undelivered entry is past its due time, 0 when none is due) per level."""
    current_ms = now_ms()
    return [
        {
            "level": p.level,
            "delay_ms": p.delay_ms,
            "offset": p.offset,
            "max_offset": p.max_offset,
            "backlog": p.backlog,
            "lag_ms": p.lag_ms(current_ms),
            "delivered": p.delivered,
        }
        for p in schedule_progress(shm, config)
    ]


def format_delay_levels(levels: list[dict[str, int]]) -> list[str]:
    """Lines for the levels that hold or held anything (an idle store's 18 levels say nothing)."""
    return [
        f"level {d['level']} ({d['delay_ms'] / 1000:g} s): backlog {d['backlog']}  lag {d['lag_ms']} ms  "
        f"offset {d['offset']}/{d['max_offset']}  delivered {d['delivered']}"
        for d in levels
        if d["max_offset"] or d["offset"]
    ]
