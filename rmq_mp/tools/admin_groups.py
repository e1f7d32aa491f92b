"""`rmq-admin` commands mqadmin 4.9.8 has for groups and peeks: deleteSubGroup,
skipAccumulatedMessage, cloneGroupOffset, printMsgByQueue, queryMsgByUniqueKey,
getBrokerConfig, brokerStatus, statsAll, and consumeMessage's peek (by queue and offset, no
group, nothing committed).

A change to a running store's group offsets is made in shared memory under the flags lock (the
one members join under and the supervisor takes to snapshot the offsets it persists), so a
group is deleted whole or not at all, and a member cannot join in between the check that none
is attached and the deletion. A deleted entry holds `shm.queue_offsets.DELETED` until the
store's next start frees its slot: not persisted, not reported, revived by a later commit. On a
stopped store (``--store``) the files change, each replaced whole (tmp, rename).

deleteTopic is rmq_mp/tools/admin_topics.py: recovery rebuilds a queue directory whose records
are in the log (a deleted one is damage to it), so a deleted topic leaves a tombstone that
recovery and dispatch honour (rmq_mp/config/deleted_topics.py).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from rmq_mp import validators as v
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.errors import StoreError
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.store.message_store import MAX_TIMESTAMP, MessageStore
from rmq_mp.tools.admin_common import (
    attach_running,
    emit,
    flags_lock,
    is_running,
    mark_offsets_moved,
    need_running,
    open_store,
    print_messages,
    refuse_if_running,
    to_json_line,
)
from shm import queue_offsets as qo
from shm.pointer_table import pid_alive_since

# ---------------------------------------------------------------------------- groups


def _offline_offsets(store: MessageStore) -> ConsumerOffsetManager:
    """A stopped store's consumerOffset.json, loaded; refused when damaged (writing it now would
    make the loss final behind the store's back, as resetOffsetByTime refuses)."""
    refuse_if_running(store)
    offsets = ConsumerOffsetManager(store.paths.consumer_offset)
    if not offsets.load():
        raise StoreError(
            f"{offsets.path}: {offsets.last_load.describe()}; not changed: start the store to "
            "decide (acceptConsumerOffsetLoss) or restore the file first"
        )
    return offsets


def _refuse_attached(members: list[Any], group: str, force: bool, what: str) -> None:
    if members and not force:
        pids = ", ".join(str(m.pid) for m in members)
        raise StoreError(
            f"consumer group {group!r} has {len(members)} live member(s) (pid {pids}): stop them "
            f"first, or --force to {what} anyway (a member that commits again brings its offsets back)"
        )


def _drop_broadcast_offsets(root: Path, group: str) -> int:
    """Broadcasting members' own progress files of ``group`` (rmq_mp/client/local_offsets.py)."""
    dropped = 0
    for path in sorted((root / "broadcastOffsets").glob(f"*/{group}")):
        shutil.rmtree(path, ignore_errors=True)
        dropped += 1
    return dropped


def delete_sub_group(args: argparse.Namespace) -> int:
    """mqadmin deleteSubGroup: forget every offset of the group (all topics, its retry topic's
    too) and its broadcasting members' progress; refused while a member is attached unless
    ``--force``. A dead group's lag no longer shows in consumerProgress or the metrics."""
    group = v.check_group(args.group)
    suffix = "@" + group
    removed: dict[str, int] = {}
    if is_running(args):
        with attach_running(args) as running:
            root = running.paths.root
            with flags_lock(running):
                shm = running.shm
                _refuse_attached(shm.members.members(pid_alive_since, group), group, args.force, "delete it")
                for key, _queue_id, slot in list(shm.groups.queues()):
                    if key.endswith(suffix) and shm.groups.get(slot, qo.COMMITTED) != qo.DELETED:
                        shm.groups.set(slot, qo.COMMITTED, qo.DELETED)
                        shm.groups.set(slot, qo.OWNER, 0)
                        topic = key[: -len(suffix)]
                        removed[topic] = removed.get(topic, 0) + 1
                if removed:
                    mark_offsets_moved(running)
    else:
        with open_store(args) as store:
            root = store.paths.root
            offsets = _offline_offsets(store)
            for topic in offsets.topics_of_group(group):
                removed[topic] = len(offsets.offsets_of(group, topic))
            offsets.remove_group(group)
            if removed:
                offsets.persist()
    broadcast = _drop_broadcast_offsets(root, group)
    if not removed and not broadcast:
        raise StoreError(f"consumer group {group!r} has no offsets in this store")
    rows = [{"group": group, "topic": t, "queues": n} for t, n in sorted(removed.items())]
    emit(
        rows,
        as_json=args.json,
        columns={"group": "Group", "topic": "Topic", "queues": "Queues"},
        footer=f"delete subscription group {group} success"
        + (f" ({broadcast} broadcasting members' progress removed)" if broadcast else ""),
    )
    return 0


def _set_group_offsets(
    args: argparse.Namespace, group: str, topic: str, targets: dict[int, int]
) -> dict[int, int]:
    """Set ``group``'s offsets of ``topic`` to ``targets`` (queue -> offset); the old ones (-1:
    none). Running: under the flags lock, all or nothing; stopped: consumerOffset.json."""
    old: dict[int, int] = {}
    key = ConsumerOffsetManager.key(group, topic)
    if is_running(args):
        with attach_running(args) as running, flags_lock(running):
            groups = running.shm.groups
            known = {q for q in targets if groups.find(key, q) >= 0}
            slots = groups.find_or_insert_all([(key, q) for q in targets])
            for (queue_id, offset), slot in zip(targets.items(), slots, strict=True):
                before = groups.get(slot, qo.COMMITTED) if queue_id in known else -1
                old[queue_id] = -1 if before == qo.DELETED else before
                groups.set(slot, qo.COMMITTED, offset)
            mark_offsets_moved(running)
    else:
        with open_store(args) as store:
            offsets = _offline_offsets(store)
            for queue_id, offset in targets.items():
                old[queue_id] = offsets.query_offset(group, topic, queue_id)
                offsets.commit_offset(group, topic, queue_id, offset)
            offsets.persist()
    return old


def _move_group_offsets(
    args: argparse.Namespace, group: str, topic: str, targets: dict[int, int], footer: str = ""
) -> int:
    """Set ``group``'s offsets of ``topic`` to ``targets`` (queue -> offset) and print each queue's
    old and new offset: what skipAccumulatedMessage and cloneGroupOffset answer."""
    old = _set_group_offsets(args, group, topic, targets)
    rows = [
        {"group": group, "topic": topic, "queueId": q, "oldOffset": old[q], "newOffset": targets[q]}
        for q in sorted(targets)
    ]
    columns = {"group": "Group", "topic": "Topic", "queueId": "QID", "oldOffset": "Old", "newOffset": "New"}
    emit(rows, as_json=args.json, columns=columns, footer=footer)
    return 0


def skip_accumulated_message(args: argparse.Namespace) -> int:
    """mqadmin skipAccumulatedMessage: the group's offsets of the topic to each queue's end (a
    live member picks them up when it next claims the queue, as after resetOffsetByTime)."""
    group = v.check_group(args.group)
    topic = v.check_topic(args.topic, "--topic", with_offsets=True)
    with open_store(args) as store:
        targets = {q.queue_id: q.max_offset for q in store.queue_status(topic)}
    if not targets:
        raise StoreError(f"topic {topic!r} has no queue in this store")
    return _move_group_offsets(args, group, topic, targets)


def clone_group_offset(args: argparse.Namespace) -> int:
    """mqadmin cloneGroupOffset: the destination group's offsets of the topic become the source
    group's (queues the source never committed are left as they are)."""
    source, dest = v.check_group(args.src_group), v.check_group(args.dest_group)
    topic = v.check_topic(args.topic, "--topic", with_offsets=True)
    if is_running(args):
        with attach_running(args) as running:
            groups = running.shm.groups
            found = {
                q: groups.get(slot, qo.COMMITTED)
                for q, slot in groups.queues_of(ConsumerOffsetManager.key(source, topic))
            }
    else:
        with open_store(args) as store:
            offsets = ConsumerOffsetManager(store.paths.consumer_offset)
            offsets.load()
            found = offsets.offsets_of(source, topic)
    targets = {q: o for q, o in found.items() if o >= 0}
    if not targets:
        raise StoreError(f"consumer group {source!r} has no offsets of topic {topic!r}")
    return _move_group_offsets(
        args, dest, topic, targets, footer=f"clone group offset of {source} to {dest} for {topic} success"
    )


# ---------------------------------------------------------------------------- reads


def print_msg_by_queue(args: argparse.Namespace) -> int:
    """mqadmin printMsgByQueue: one queue's messages stored between ``-b`` and ``-e`` (ms since
    the epoch), tag-filtered by ``-s``."""
    from rmq_mp.client.consumer import parse_tag_expression

    tags = parse_tag_expression(args.subExpression or "*")
    begin, end = args.begin, args.end if args.end is not None else MAX_TIMESTAMP
    with open_store(args) as store:
        offset = store.get_offset_in_queue_by_time(args.topic, args.queue, begin) if begin > 0 else 0

        def messages() -> Any:
            nonlocal offset
            while True:
                result = store.get_message(args.topic, args.queue, offset, 64, tags=tags)
                if result.status in (
                    GetMessageStatus.OFFSET_TOO_SMALL,
                    GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                ):
                    offset = result.next_begin_offset
                    continue
                for msg in result.messages:
                    if msg.store_timestamp > end:
                        return
                    if msg.store_timestamp >= begin:
                        yield msg
                if result.next_begin_offset <= offset or result.next_begin_offset >= result.max_offset:
                    return
                offset = result.next_begin_offset

        return print_messages(messages(), as_json=args.json, bodies=args.printBody)


def query_msg_by_unique_key(args: argparse.Namespace) -> int:
    """mqadmin queryMsgByUniqueKey: messages whose UNIQ_KEY (the client msgId a send returns as
    ``uniq_key``) is ``-i``, from the index."""
    with open_store(args) as store:
        found = [
            m for m in store.query_message(args.topic, args.id) if m.properties.get("UNIQ_KEY") == args.id
        ]
        if not found:
            raise StoreError(f"no message of topic {args.topic!r} has UNIQ_KEY {args.id!r}")
        return print_messages(found, as_json=args.json, bodies=True)


def get_broker_config(args: argparse.Namespace) -> int:
    """mqadmin getBrokerConfig: every setting in effect, ``key = value`` (a running store's from
    its shared memory, else broker.conf/--set over the defaults)."""
    if is_running(args):
        with attach_running(args) as running:
            properties = running.config.to_properties()
    else:
        with open_store(args) as store:
            properties = store.config.to_properties()
    if args.json:
        print(to_json_line(dict(sorted(properties.items()))))
    else:
        for key, value in sorted(properties.items()):
            print(f"{key:<40}= {value}")
    return 0


def broker_status(args: argparse.Namespace) -> int:
    """mqadmin brokerStatus: RocketMQ's runtime-info keys this store can answer, from
    `collect_status` (running store)."""
    from rmq_mp.tools.store_status import collect_status

    need_running(args, "brokerStatus")
    with open_store(args) as store:
        status = collect_status(store.config)
    offsets, lags = status["offsets"], status["lags"]
    info = {
        "brokerVersionDesc": "rmq-mp (RocketMQ 4.9.8 store format)",
        "brokerRole": status["broker"],
        "flushDiskType": status["flush_disk_type"],
        "commitLogMinOffset": offsets["min"],
        "commitLogMaxOffset": offsets["wrote"],
        "commitLogDiskRatio": status["disk_used_ratio"],
        "dispatchBehindBytes": lags["reput"],
        "flushBehindBytes": lags["flush"],
        "runningFlags": status["running_flags"],
        "state": status["state"],
    }
    if args.json:
        print(to_json_line(info))
    else:
        for key, value in info.items():
            print(f"{key:<32}: {value}")
    return 0


def stats_all(args: argparse.Namespace) -> int:
    """mqadmin statsAll: per topic and consumer group, the accumulation (messages not consumed)
    and the messages the topic holds; per-second rates are the metrics' (rmq-mp keeps no
    per-topic rate counters here)."""
    with open_store(args) as store:
        topics = {t: store.queue_status(t) for t in store.topics()}
    lags: dict[tuple[str, str], int] = {}
    if is_running(args):
        with attach_running(args) as running:
            groups = running.shm.groups
            committed: dict[tuple[str, str], dict[int, int]] = {}
            for key, queue_id, slot in groups.queues():
                offset = groups.get(slot, qo.COMMITTED)
                if offset != qo.DELETED:
                    topic, _, group = key.partition("@")
                    committed.setdefault((topic, group), {})[queue_id] = offset
    else:
        with open_store(args) as store:
            offsets = ConsumerOffsetManager(store.paths.consumer_offset)
            offsets.load()
            committed = {
                (t, g): offsets.offsets_of(g, t) for g in offsets.groups() for t in offsets.topics_of_group(g)
            }
    for (topic, group), by_queue in committed.items():
        lags[(topic, group)] = sum(
            max(q.max_offset - max(by_queue.get(q.queue_id, -1), q.min_offset), 0)
            for q in topics.get(topic, [])
        )
    rows = []
    for topic in sorted(topics):
        held = sum(q.max_offset - q.min_offset for q in topics[topic])
        groups_of = sorted(g for t, g in lags if t == topic) or [""]
        for group in groups_of:
            rows.append(
                {
                    "topic": topic,
                    "group": group,
                    "accumulation": lags.get((topic, group), 0),
                    "messages": held,
                }
            )
    emit(
        rows,
        as_json=args.json,
        columns={
            "topic": "#Topic",
            "group": "#Consumer Group",
            "accumulation": "#Accumulation",
            "messages": "#Messages",
        },
    )
    return 0


def peek_messages(args: argparse.Namespace) -> int:
    """consumeMessage without a group (mqadmin's): pull from ``-i`` queue (every queue when
    absent) from ``-o`` offset (each queue's first message when absent), up to ``-c`` messages;
    nothing committed, no group joined. A stopped store (``--store``) is read from its files."""
    topic = v.check_topic(args.topic, "--topic")
    from rmq_mp.client.consumer import parse_tag_expression

    tags = parse_tag_expression(args.tags or "*")
    messages: list[MessageExt] = []
    with open_store(args) as store:
        queue_ids = (
            [args.queue] if args.queue is not None else [q.queue_id for q in store.queue_status(topic)]
        )
        for queue_id in queue_ids:
            offset = args.offset if args.offset is not None else 0
            while len(messages) < args.count:
                result = store.get_message(topic, queue_id, offset, args.count - len(messages), tags=tags)
                if result.status is GetMessageStatus.OFFSET_TOO_SMALL and args.offset is None:
                    offset = result.next_begin_offset
                    continue
                messages.extend(result.messages)
                if result.next_begin_offset <= offset or result.next_begin_offset >= result.max_offset:
                    break
                offset = result.next_begin_offset
            if len(messages) >= args.count:
                break
    return print_messages(messages, as_json=args.json, bodies=True)


COMMANDS = {
    "deleteSubGroup": delete_sub_group,
    "skipAccumulatedMessage": skip_accumulated_message,
    "cloneGroupOffset": clone_group_offset,
    "printMsgByQueue": print_msg_by_queue,
    "queryMsgByUniqueKey": query_msg_by_unique_key,
    "getBrokerConfig": get_broker_config,
    "brokerStatus": broker_status,
    "statsAll": stats_all,
}


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    ignored = "accepted for mqadmin's sake; a store is one broker"
    p = sub.add_parser("deleteSubGroup", parents=[common], help="forget a consumer group's offsets")
    p.add_argument("--groupName", "--group", "-g", dest="group", required=True)
    p.add_argument("--force", "-f", action="store_true", help="even with live members attached")
    p.add_argument("--brokerAddr", "-b", help=ignored)
    p.add_argument("--clusterName", "-c", help=ignored)
    p.add_argument("--removeOffset", "-r", help="accepted for mqadmin's sake: offsets are always removed")
    p = sub.add_parser(
        "skipAccumulatedMessage", parents=[common], help="a group's offsets to the queues' ends"
    )
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--cluster", "-c", help=ignored)
    p.add_argument("--force", "-f", help="accepted for mqadmin's sake")
    p = sub.add_parser("cloneGroupOffset", parents=[common], help="copy a group's offsets to another group")
    p.add_argument("--srcGroup", "-s", dest="src_group", required=True)
    p.add_argument("--destGroup", "-d", dest="dest_group", required=True)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--offline", "-o", help="accepted for mqadmin's sake")
    p = sub.add_parser("printMsgByQueue", parents=[common], help="one queue's messages in a time range")
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--queueId", "-i", dest="queue", type=int, required=True)
    p.add_argument("--beginTimestamp", "-b", dest="begin", type=int, default=0)
    p.add_argument("--endTimestamp", "-e", dest="end", type=int)
    p.add_argument("--subExpression", "-s", help="tag expression, e.g. 'TagA || TagB'")
    p.add_argument("--printBody", "-d", action="store_true", help="print the bodies")
    p.add_argument("--brokerName", "-a", help=ignored)
    p = sub.add_parser(
        "queryMsgByUniqueKey", parents=[common], help="a message by its UNIQ_KEY (client msgId)"
    )
    p.add_argument("--msgId", "-i", dest="id", required=True)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument(
        "--consumerGroup", "-g", dest="group", help="accepted for mqadmin's sake (no direct consume)"
    )
    p = sub.add_parser("getBrokerConfig", parents=[common], help="every setting in effect")
    p.add_argument("--brokerAddr", "-b", help=ignored)
    p.add_argument("--clusterName", "-c", help=ignored)
    sub.add_parser("brokerStatus", parents=[common], help="(running store) RocketMQ's runtime-info keys")
    p = sub.add_parser("statsAll", parents=[common], help="per topic and group: accumulation, messages")
    p.add_argument("--activeTopic", "-a", action="store_true", help="accepted for mqadmin's sake")
    p.add_argument("--topic", "-t", help="accepted for mqadmin's sake")


def add_peek_arguments(p: argparse.ArgumentParser) -> None:
    """consumeMessage's mqadmin options for a peek (no group)."""
    p.add_argument("--queueId", "-i", dest="queue", type=int, help="peek: this queue (default: every queue)")
    p.add_argument("--offset", "-o", type=int, help="peek: from this queue offset (default: the first)")
    p.add_argument("--brokerName", "-b", help="accepted for mqadmin's sake; a store is one broker")
