"""`rmq-admin` operator commands: topicList, updateTopic, consumerProgress, consumerConnection,
resetOffsetByTime, storeStatus, scheduleStatus (the message commands live in `rmq_mp.tools.admin`).

Each works on a running store (``--name``: live offsets from shared memory, changes made under
the store's flags lock so the supervisor's persist never overwrites them) or on a stopped store
directory (``--store``: read from the files; the two commands that change something refuse a
store that is running, naming its supervisor, so a live table is never overwritten behind its
back). Human tables by default, ``--json`` one object per line.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rmq_mp import validators as v
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.config.topics import TopicConfig, TopicConfigManager
from rmq_mp.errors import StoreError
from rmq_mp.format.message import MessageExt
from rmq_mp.store.message_store import MessageStore, queue_end_in_files
from rmq_mp.store.running_store import RunningStore
from rmq_mp.tools.admin_common import (
    attach_running,
    emit,
    flags_lock,
    is_running,
    iso,
    mark_offsets_moved,
    need_running,
    open_store,
    positive_int,
    print_messages,
    refuse_if_running,
    to_json_line,
)
from rmq_mp.tools.store_status import (
    collect_status,
    disk_used_ratio,
    format_dispatch_faults,
    format_table_levels,
    replication_summary,
)
from shm import layout
from shm import members as mb
from shm import queue_offsets as qo
from shm.pointer_table import pid_alive, pid_alive_since

FLAGS_LOCK_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------- topics


def topic_list(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        configs = TopicConfigManager(store.paths.topics)
        configs.load()
        names = sorted(set(store.topics()) | set(configs.topics()))
        rows = []
        for topic in names:
            queues = store.queue_status(topic)
            tc = configs.get(topic)
            rows.append(
                {
                    "topic": topic,
                    "queues": len(queues),
                    "readQueueNums": tc.read_queue_nums if tc else None,
                    "writeQueueNums": tc.write_queue_nums if tc else None,
                    "perm": tc.perm if tc else None,
                    "messages": sum(q.max_offset - q.min_offset for q in queues),
                }
            )
    emit(
        rows,
        as_json=args.json,
        columns={
            "topic": "Topic",
            "queues": "Queues",
            "readQueueNums": "ReadQueueNums",
            "writeQueueNums": "WriteQueueNums",
            "perm": "Perm",
            "messages": "Messages",
        },
        footer=f"{len(rows)} topic(s)",
    )
    return 0


def update_topic(args: argparse.Namespace) -> int:
    """mqadmin updateTopic: read/write queue counts (and perm) in config/topics.json, for a topic
    the store can hold (`InvalidArgumentError` otherwise, before anything is written)."""
    v.check_topic(args.topic, "--topic")

    def update(path: Path, default_queue_nums: int) -> dict[str, Any]:
        manager = TopicConfigManager(path)
        manager.load()
        old = manager.get(args.topic)
        read = args.read_queue_nums or (old.read_queue_nums if old else default_queue_nums)
        write = args.write_queue_nums or (old.write_queue_nums if old else default_queue_nums)
        perm = args.perm if args.perm is not None else (old.perm if old else 6)
        changed = manager.put(TopicConfig(args.topic, read, write, perm))
        if changed:
            manager.persist()
        return {
            "topic": args.topic,
            "readQueueNums": read,
            "writeQueueNums": write,
            "perm": perm,
            "created": old is None,
            "changed": changed,
        }

    if is_running(args):
        with attach_running(args) as running, flags_lock(running):
            row = update(running.paths.topics, running.config.default_topic_queue_nums)
    else:
        with open_store(args) as store:
            refuse_if_running(store)
            row = update(store.paths.topics, store.config.default_topic_queue_nums)
    emit(
        [row],
        as_json=args.json,
        columns={
            "topic": "Topic",
            "readQueueNums": "ReadQueueNums",
            "writeQueueNums": "WriteQueueNums",
            "perm": "Perm",
            "created": "Created",
            "changed": "Changed",
        },
    )
    return 0


# ---------------------------------------------------------------------------- consumer offsets


def _owner_client(running: RunningStore, owner: int) -> str:
    """The client id of the live member an owner word names ("" when free or its member is gone)."""
    pid, member_slot = qo.owner_of(owner)
    if not pid or not pid_alive(pid):
        return ""
    member = running.shm.members.member(member_slot)
    return member.client_id if member is not None and member.pid == pid else ""


def consumer_progress(args: argparse.Namespace) -> int:
    """mqadmin consumerProgress: per group and queue, broker offset, consumer offset, diff; on a
    running store also the client id of the member holding the queue now (mqadmin's client
    column), blank for a queue no live member holds."""
    committed: dict[tuple[str, str], dict[int, int]] = {}  # (group, topic) -> queue -> offset
    queues: dict[str, dict[int, tuple[int, int, int]]] = {}  # topic -> queue -> (min, max, last ms)
    clients: dict[tuple[str, str, int], str] = {}  # (group, topic, queue) -> owner's client id
    if is_running(args):
        with attach_running(args) as running:
            shm = running.shm
            for key, queue_id, slot in shm.groups.queues():
                topic, _, group = key.partition("@")
                offset = shm.groups.get(slot, qo.COMMITTED)
                if offset == qo.DELETED:  # deleteSubGroup
                    continue
                committed.setdefault((group, topic), {})[queue_id] = offset
                clients[(group, topic, queue_id)] = _owner_client(running, shm.groups.get(slot, qo.OWNER))
            read_end = running.table.get(layout.FORK_READ_END)  # a slave's window: as its pulls end
            for topic, queue_id, slot in shm.queues.queues():
                low, high = shm.queues.get(slot, qo.MIN_OFFSET), shm.queues.get(slot, qo.DISPATCHED)
                if read_end >= 0:
                    high = max(low, queue_end_in_files(running.config, topic, queue_id, low, high, read_end))
                queues.setdefault(topic, {})[queue_id] = (low, high, shm.queues.get(slot, qo.LAST_STORE_TS))
    else:
        with open_store(args) as store:
            offsets = ConsumerOffsetManager(store.paths.consumer_offset)
            offsets.load()
            for group in offsets.groups():
                for topic in offsets.topics_of_group(group):
                    committed[(group, topic)] = offsets.offsets_of(group, topic)
            for topic in {t for _g, t in committed}:
                queues[topic] = {
                    q.queue_id: (q.min_offset, q.max_offset, q.last_update_timestamp)
                    for q in store.queue_status(topic)
                }
    if args.group and not any(g == args.group for g, _t in committed):
        raise StoreError(f"consumer group {args.group!r} has no offsets in this store")
    rows: list[dict[str, Any]] = []
    for group, topic in sorted(committed):
        if args.group and group != args.group:
            continue
        known = queues.get(topic, {})
        for queue_id in sorted(set(known) | set(committed[(group, topic)])):
            min_offset, max_offset, last_ms = known.get(queue_id, (0, 0, 0))
            consumer = committed[(group, topic)].get(queue_id, -1)
            rows.append(
                {
                    "group": group,
                    "topic": topic,
                    "queueId": queue_id,
                    "brokerOffset": max_offset,
                    "consumerOffset": consumer,
                    "diff": max(max_offset - max(consumer, min_offset), 0),
                    "lastTimestamp": last_ms,
                    **({"clientId": clients.get((group, topic, queue_id), "")} if is_running(args) else {}),
                }
            )
    for row in rows:
        row["lastTime"] = iso(row["lastTimestamp"])
    emit(
        rows,
        as_json=args.json,
        columns={
            "group": "Group",
            "topic": "Topic",
            "queueId": "QID",
            "brokerOffset": "BrokerOffset",
            "consumerOffset": "ConsumerOffset",
            "diff": "Diff",
            "lastTime": "LastTime",
            **({"clientId": "ClientId"} if is_running(args) else {}),
        },
        footer=f"Diff Total: {sum(r['diff'] for r in rows)}",
    )
    return 0


def consumer_connection(args: argparse.Namespace) -> int:
    """mqadmin consumerConnection: the live members of a group (running store only), each with
    its client id, pid, message model, last heartbeat (its last poll) and the queues it holds
    now, from the member table and the owner words (rmq_mp/client/rebalance.py)."""
    v.check_group(args.group)
    need_running(args, "consumerConnection")
    with attach_running(args) as running:
        shm = running.shm
        members = shm.members.members(pid_alive_since, args.group)
        held: dict[tuple[int, int], list[tuple[str, int]]] = {}  # (pid, member slot) -> queues
        suffix = "@" + args.group
        for key, queue_id, slot in shm.groups.queues():
            if key.endswith(suffix):
                owner = qo.owner_of(shm.groups.get(slot, qo.OWNER))
                held.setdefault(owner, []).append((key[: -len(suffix)], queue_id))
    now_ms = int(time.time() * 1000)
    rows = []
    for m in sorted(members, key=lambda m: m.client_id):
        mine = sorted(held.get((m.pid, m.slot), []))
        rows.append(
            {
                "group": m.group,
                "clientId": m.client_id,
                "pid": m.pid,
                "messageModel": "CLUSTERING" if m.model == mb.MODEL_CLUSTERING else "BROADCASTING",
                "heartbeatAgeMs": max(now_ms - m.heartbeat_ms, 0),
                "queueCount": len(mine),
                **(
                    {"queueList": [{"topic": t, "queueId": q} for t, q in mine]}
                    if args.json
                    else {"queues": " ".join(f"{t}:{q}" for t, q in mine)}
                ),
            }
        )
    emit(
        rows,
        as_json=args.json,
        columns={
            "clientId": "ClientId",
            "pid": "Pid",
            "messageModel": "MessageModel",
            "heartbeatAgeMs": "HeartbeatAgeMs",
            "queueCount": "Queues",
            "queues": "Held",
        },
        footer=f"{len(rows)} live member(s) of {args.group}" + ("" if rows else " (not online)"),
    )
    return 0


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch, ``now``, or an ISO 8601 time (local time if no zone)."""
    if text == "now":
        return int(time.time() * 1000)
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise StoreError(
            f"--timestamp {text!r}: expected milliseconds since the epoch, 'now' or an ISO 8601 time"
        ) from None


def reset_offset_by_time(args: argparse.Namespace) -> int:
    """mqadmin resetOffsetByTime: each queue of the topic to the first message stored at or after
    the time. A live consumer of the group that commits afterwards overwrites the reset (RocketMQ
    pushes a reset to connected clients; rmq-mp consumers pick it up when they next subscribe,
    or when a group member next claims the queue)."""
    v.check_group(args.group)
    v.check_topic(args.topic, "--topic", with_offsets=True)
    timestamp_ms = parse_timestamp(args.timestamp)
    with open_store(args) as store:
        targets = {
            q.queue_id: store.get_offset_in_queue_by_time(args.topic, q.queue_id, timestamp_ms)
            for q in store.queue_status(args.topic)
        }
        if not targets:
            raise StoreError(f"topic {args.topic!r} has no queue in this store")
        key = ConsumerOffsetManager.key(args.group, args.topic)
        old: dict[int, int] = {}
        if is_running(args):
            with attach_running(args) as running, flags_lock(running):
                groups = running.shm.groups
                known = {k.partition("@")[2] for k, _queue_id, _slot in groups.queues()}
                _refuse_unknown_group(args, known)
                slots = groups.find_or_insert_all([(key, queue_id) for queue_id in targets])
                for (queue_id, offset), slot in zip(targets.items(), slots, strict=True):
                    old[queue_id] = groups.get(slot, qo.COMMITTED)
                    groups.set(slot, qo.COMMITTED, offset)
                mark_offsets_moved(running)
        else:
            refuse_if_running(store)
            offsets = ConsumerOffsetManager(store.paths.consumer_offset)
            if not offsets.load():  # writing now would make the loss final behind the store's back
                raise StoreError(
                    f"{offsets.path}: {offsets.last_load.describe()}; not changed: start the store "
                    "to decide (acceptConsumerOffsetLoss) or restore the file first"
                )
            _refuse_unknown_group(args, set(offsets.groups()))
            for queue_id, offset in targets.items():
                old[queue_id] = offsets.query_offset(args.group, args.topic, queue_id)
                offsets.commit_offset(args.group, args.topic, queue_id, offset)
            offsets.persist()
    rows = [
        {
            "group": args.group,
            "topic": args.topic,
            "queueId": q,
            "oldOffset": old[q],
            "newOffset": targets[q],
            "timestamp": timestamp_ms,
        }
        for q in sorted(targets)
    ]
    emit(
        rows,
        as_json=args.json,
        columns={
            "group": "Group",
            "topic": "Topic",
            "queueId": "QID",
            "oldOffset": "Old",
            "newOffset": "New",
        },
        footer=f"reset to {iso(timestamp_ms) if timestamp_ms > 0 else 'the first message'}",
    )
    return 0


def _refuse_unknown_group(args: argparse.Namespace, known: set[str]) -> None:
    """A group with no offsets anywhere is most likely a typo: creating it silently would leave
    the real group where it was. ``--create-group`` says it is meant."""
    if args.group not in known and not args.create_group:
        raise StoreError(
            f"consumer group {args.group!r} has no offsets in this store (a typo?); "
            "--create-group creates it at the reset offsets"
        )


# ---------------------------------------------------------------------------- store status


def store_status(args: argparse.Namespace) -> int:
    """Flush progress (RocketMQ's printFlushProgress: how far flush and dispatch fall behind),
    commit-log pointers, pool, disk and running flags."""
    if is_running(args):
        with attach_running(args) as running:
            status = collect_status(running.config)
        o, lags = status["offsets"], status["lags"]
        status["flush_progress"] = {
            "commitlog_behind_flush_bytes": lags["flush"],
            "commitlog_behind_commit_bytes": lags["commit"],
            "dispatch_behind_bytes": lags["reput"],
            "flushed_percent": _percent(o["flushed"] - o["min"], o["wrote"] - o["min"]),
        }
    else:
        with open_store(args) as store:
            status = offline_status(store)
    if args.json:
        print(to_json_line(status))
        return 0
    print_store_status(status)
    return 0


def _percent(done: int, total: int) -> float:
    return 100.0 if total <= 0 else round(done * 100 / total, 2)


def offline_status(store: MessageStore) -> dict[str, Any]:
    """What the files say about a store that is not running."""
    cp = store.checkpoint
    root = store.config.store_path_root_dir
    return {
        "store": root,
        "state": "NOT RUNNING",
        "last_exit": "abnormal (abort file present)" if store.paths.abort.exists() else "normal",
        "offsets": {"min": store.min_phy_offset(), "max": store.max_phy_offset()},
        "commitlog_files": len(store.commit_log.mfq.files),
        "checkpoint": {
            "physicMsgTimestamp": cp.physic_msg_timestamp,
            "logicsMsgTimestamp": cp.logics_msg_timestamp,
            "indexMsgTimestamp": cp.index_msg_timestamp,
        },
        "disk_used_ratio": disk_used_ratio(root),
        "topics": len(store.topics()),
    }


def print_store_status(status: dict[str, Any]) -> None:
    print(f"{'store:':<22}{status['store']}")
    print(f"{'state:':<22}{status['state']}")
    if status["state"] == "NOT RUNNING":
        o, cp = status["offsets"], status["checkpoint"]
        print(f"{'last exit:':<22}{status['last_exit']}")
        print(f"{'commitlog:':<22}[{o['min']}, {o['max']}) in {status['commitlog_files']} file(s)")
        for key, value in cp.items():
            print(f"{key + ':':<22}{iso(value)}")
        print(f"{'disk used:':<22}{status['disk_used_ratio']:.0%}")
        print(f"{'topics:':<22}{status['topics']}")
        return
    o, fp, pool = status["offsets"], status["flush_progress"], status["pool"]
    print(f"{'flush type:':<22}{status['flush_disk_type']}")
    print(
        f"{'commitlog:':<22}min {o['min']}  wrote {o['wrote']}  committed {o['committed']}  "
        f"flushed {o['flushed']}  reput {o['reput']}"
    )
    print(
        f"{'flush progress:':<22}{fp['flushed_percent']}% flushed; behind: flush {fp['commitlog_behind_flush_bytes']}, "
        f"commit {fp['commitlog_behind_commit_bytes']}, dispatch {fp['dispatch_behind_bytes']} bytes"
    )
    print(
        f"{'pool:':<22}{pool['in_use']}/{pool['buffers']} buffers in use (mlock failed on {pool['mlock_failed']})"
    )
    print(f"{'tables (used/cap):':<22}{format_table_levels(status['tables'])}")
    print(f"{'disk used:':<22}{status['disk_used_ratio']:.0%}")
    flags = status["running_flags"]
    print(f"{'running flags:':<22}{' '.join(flags) if flags else 'none'}")
    for line in format_dispatch_faults(status["dispatch_faults"]):
        print(f"{'dispatch:':<22}{line}")
    print(f"{'recovery:':<22}{status['recovery_ms']} ms")
    for line in replication_summary(status["replication"]):
        print(f"{'replication:':<22}{line.strip().removeprefix('replica').strip()}")


# ---------------------------------------------------------------------------- produce / consume


def send_message(args: argparse.Namespace) -> int:
    """mqadmin sendMessage: put ``--count`` copies of a text body from this process."""
    from rmq_mp.put.producer import Producer

    need_running(args, "sendMessage")
    body = _body(args.body) if args.body is not None else _body_file(args.body_file)
    with Producer.attach(args.name) as producer:
        results = producer.send_batch(
            dict(topic=args.topic, body=body, tags=args.tags, keys=args.keys) for _ in range(args.count)
        )
    rows = [
        {
            "status": r.status.name,
            "msgId": r.msg_id,
            "queueId": r.queue_id,
            "queueOffset": r.queue_offset,
            "reason": r.reason,
        }
        for r in results
    ]
    emit(
        rows,
        as_json=args.json,
        columns={
            "status": "Status",
            "msgId": "MsgId",
            "queueId": "QID",
            "queueOffset": "QueueOffset",
            "reason": "Reason",
        },
    )
    return 0 if all(r.ok for r in results) else 1


def consume_message(args: argparse.Namespace) -> int:
    """mqadmin consumeMessage. With ``-g``: long-poll up to ``--count`` messages of a topic for
    the group from its committed offsets (0 for a new group), then commit how far it read.
    Without: mqadmin's peek by queue (``-i``) and offset (``-o``), no group, nothing committed
    (`rmq_mp.tools.admin_groups.peek_messages`, which rmq-admin runs instead when no group is
    given)."""
    from rmq_mp.client.consumer import Consumer

    if args.queue is not None or args.offset is not None:
        raise StoreError("consumeMessage: -i/-o peek without a group; drop -g, or drop -i/-o")
    need_running(args, "consumeMessage")
    with Consumer.attach(args.name, args.group) as consumer:
        consumer.subscribe(args.topic, args.tags or "*")
        messages: list[MessageExt] = []
        deadline = time.monotonic() + args.timeout
        while len(messages) < args.count and (remaining := deadline - time.monotonic()) > 0:
            messages.extend(consumer.poll(timeout_s=remaining, max_msgs=args.count - len(messages)))
        consumer.commit()
    return print_messages(messages, as_json=args.json, bodies=True)


def schedule_status(args: argparse.Namespace) -> int:
    """Delay levels (RocketMQ's brokerStatus ``scheduleMessageOffset_<level>``: delivered offset,
    queue max): per level its delay, offset, queue end, backlog and lag; with ``--level`` the
    level's SCHEDULE_TOPIC_XXXX queue from its offset: each entry's due time, real topic and
    queue, msgId."""
    from rmq_mp.config.offsets import DelayOffsetManager
    from rmq_mp.store import schedule

    rows: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    if is_running(args):
        with attach_running(args) as running:
            status = collect_status(running.config)
        levels = status["delay_levels"]
    else:
        with open_store(args) as store:
            offsets = DelayOffsetManager(store.paths.delay_offset)
            offsets.load()
            ends = {q.queue_id: q.max_offset for q in store.queue_status(schedule.SCHEDULE_TOPIC)}
            delays = store.config.delay_levels_ms
            levels = [
                {
                    "level": level,
                    "delay_ms": delays[level - 1],
                    "offset": max(offsets.offset_of(level), 0),
                    "max_offset": ends.get(schedule.queue_id_of(level), 0),
                    "delivered": None,
                    "lag_ms": None,
                }
                for level in range(1, len(delays) + 1)
            ]
            for d in levels:
                d["backlog"] = max(0, d["max_offset"] - d["offset"])
            if args.level:
                entries = _schedule_entries_offline(store, levels, args.level, args.count)
    if args.level and not 1 <= args.level <= len(levels):
        raise StoreError(f"delay level {args.level}: messageDelayLevel has levels 1..{len(levels)}")
    if args.level and is_running(args):
        entries = _schedule_entries_running(args, levels[args.level - 1], args.count)
    for d in levels:
        if args.level and d["level"] != args.level:
            continue
        rows.append(
            {
                "level": d["level"],
                "delay": f"{d['delay_ms'] / 1000:g}s",
                "delayOffset": d["offset"],
                "maxOffset": d["max_offset"],
                "backlog": d["backlog"],
                "lagMs": d["lag_ms"],
                "delivered": d["delivered"],
            }
        )
    columns = {
        "level": "Level",
        "delay": "Delay",
        "delayOffset": "DelayOffset",
        "maxOffset": "MaxOffset",
        "backlog": "Backlog",
        "lagMs": "LagMs",
        "delivered": "Delivered",
    }
    emit(rows, as_json=args.json, columns=columns)
    if args.level:
        if not args.json:
            print()
        emit(
            entries,
            as_json=args.json,
            columns={
                "queueOffset": "QueueOffset",
                "dueTime": "DueTime",
                "realTopic": "RealTopic",
                "realQueueId": "RealQID",
                "msgId": "MsgId",
            },
        )
    return 0


def _schedule_entry(queue_offset: int, due_ms: int, msg: MessageExt) -> dict[str, Any]:
    from rmq_mp.format import message as m

    return {
        "queueOffset": queue_offset,
        "dueTimestamp": due_ms,
        "dueTime": iso(due_ms),
        "realTopic": msg.properties.get(m.PROPERTY_REAL_TOPIC),
        "realQueueId": msg.properties.get(m.PROPERTY_REAL_QUEUE_ID),
        "msgId": msg.msg_id,
    }


def _schedule_entries_running(
    args: argparse.Namespace, level: dict[str, Any], count: int
) -> list[dict[str, Any]]:
    """The level's undelivered entries, read as a consumer reads (nothing committed)."""
    from rmq_mp.client.consumer import Consumer
    from rmq_mp.outcomes import GetMessageStatus
    from rmq_mp.store import schedule

    queue_id = schedule.queue_id_of(level["level"])
    with Consumer.attach(args.name, "rmq-admin") as consumer:
        found = consumer.entries(schedule.SCHEDULE_TOPIC, queue_id, level["offset"], count)
        got = consumer.pull(schedule.SCHEDULE_TOPIC, queue_id, level["offset"], max(len(found), 1))
        messages = {x.queue_offset: x for x in got.messages} if got.status is GetMessageStatus.FOUND else {}
    return [
        _schedule_entry(level["offset"] + i, tags_code, messages[level["offset"] + i])
        for i, (_phy, _size, tags_code) in enumerate(found)
        if level["offset"] + i in messages
    ]


def _schedule_entries_offline(
    store: MessageStore, levels: list[dict[str, Any]], level: int, count: int
) -> list[dict[str, Any]]:
    from rmq_mp.store import schedule

    if not 1 <= level <= len(levels):
        return []
    queue_id = schedule.queue_id_of(level)
    start = levels[level - 1]["offset"]
    got = store.get_message(schedule.SCHEDULE_TOPIC, queue_id, start, count)
    if not got.messages:
        return []
    cq = store.find_consume_queue(schedule.SCHEDULE_TOPIC, queue_id)
    rows = []
    for msg in got.messages:
        entry = cq.get_entry(msg.queue_offset)
        rows.append(_schedule_entry(msg.queue_offset, entry[2] if entry else -1, msg))
    return rows


def _body(text: str) -> bytes:
    """``--body`` as UTF-8, the bytes of an argument that was not UTF-8 as given (Python holds
    those as lone surrogates: ``surrogateescape``)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise StoreError(f"--body {text!r} is not valid Unicode (a lone surrogate)") from None


def _body_file(path: str) -> bytes:
    """``--body-file``: the file's bytes as they are (``-`` reads standard input)."""
    import sys

    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise StoreError(f"--body-file {path}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------------------- parsers


def _seconds(text: str) -> float:
    """A ``--timeout``: a finite number of seconds, at least 0 (``nan`` parses as a float)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"seconds must be finite and at least 0, got {text!r}")
    return value


def _queue_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"queue count must be 1..1024, got {value}")
    return value


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "topicList": topic_list,
    "updateTopic": update_topic,
    "consumerProgress": consumer_progress,
    "consumerConnection": consumer_connection,
    "resetOffsetByTime": reset_offset_by_time,
    "storeStatus": store_status,
    "scheduleStatus": schedule_status,
    "sendMessage": send_message,
    "consumeMessage": consume_message,
}


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    sub.add_parser("topicList", parents=[common], help="topics with queue counts and messages")
    p = sub.add_parser("updateTopic", parents=[common], help="create a topic or change its queue counts")
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--readQueueNums", "-r", dest="read_queue_nums", type=_queue_count)
    p.add_argument("--writeQueueNums", "-w", dest="write_queue_nums", type=_queue_count)
    p.add_argument("--perm", "-p", type=int, choices=(2, 4, 6), help="2 write, 4 read, 6 both")
    p = sub.add_parser("consumerProgress", parents=[common], help="per group and queue: offsets and lag")
    p.add_argument("--group", "-g")
    p = sub.add_parser(
        "consumerConnection", parents=[common], help="(running store) a group's live members and their queues"
    )
    p.add_argument("--group", "-g", required=True)
    p = sub.add_parser("resetOffsetByTime", parents=[common], help="move a group's offsets to a time")
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--timestamp", "-s", required=True, help="ms since the epoch, 'now' or ISO 8601")
    p.add_argument(
        "--create-group",
        action="store_true",
        help="the group has no offsets yet: create it (without this, an unknown group is refused)",
    )
    sub.add_parser("storeStatus", parents=[common], help="flush progress, pointers, pool, disk, flags")
    p = sub.add_parser(
        "scheduleStatus", parents=[common], help="delay levels: offset, backlog, lag; --level: its queue"
    )
    p.add_argument("--level", "-l", type=positive_int, help="list this level's undelivered entries")
    p.add_argument("--count", "-c", type=positive_int, default=32, help="entries to list (with --level)")
    p = sub.add_parser("sendMessage", parents=[common], help="send a text message to a running store")
    p.add_argument("--topic", "-t", required=True)
    body = p.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", "-p", help="message body (UTF-8 text)")
    body.add_argument("--body-file", help="message body: the bytes of this file ('-': standard input)")
    p.add_argument("--keys", "--key", "-k", dest="keys")
    p.add_argument("--tags", "-c")
    p.add_argument("--count", type=_queue_count, default=1, help="copies to send (1..1024)")
    p = sub.add_parser(
        "consumeMessage",
        parents=[common],
        help="peek by queue and offset; with -g, read as a group and commit",
    )
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--group", "-g", help="read as this group from its offsets, and commit (default: peek)")
    p.add_argument("--tags", help="tag expression, e.g. 'TagA || TagB'")
    p.add_argument(
        "--count", "--MessageNumber", "-c", type=positive_int, default=32, help="most messages to read"
    )
    p.add_argument("--timeout", type=_seconds, default=3.0, help="seconds to wait for messages")
