"""`rmq-admin deleteTopic -t T [-c CLUSTER] [--force]`: mqadmin 4.9.8's command, on one store.

What RocketMQ 4.9.8 does (AdminBrokerProcessor.deleteTopic): a slave refuses; a system topic
(TopicValidator: SCHEDULE_TOPIC_XXXX, TBW102, rmq_sys_*, ...) is refused; the topic config is
removed and `cleanUnusedTopic` destroys its ConsumeQueues and topicQueueTable entries; its group
offsets stay in consumerOffset.json; nobody attached is asked. Its records stay in the commit
log, and reput or recovery can bring the topic back from them.

What rmq-mp does on top, since a user expects a deleted topic to stay deleted:

- the topic's offsets of every group go too (consumerProgress and the metrics would report
  lag on a topic that is gone, and a consumer would resume a new topic from an old offset);
- refused while a live member of a group that has offsets on the topic is attached (they would
  read on, and commit the offsets back), unless ``--force``; producers are not asked (a store
  does not know which topics a producer sends to): a send after the delete starts the topic
  again at queue offset 0, as RocketMQ's auto-created topic does;
- a tombstone (rmq_mp/config/deleted_topics.py) keeps every rebuild of queues from the log
  (reput, recovery after a clean stop or a kill -9) from bringing the old records back, and
  makes a delete a crash cut short finish at the next start.

A running store (``--name``): the change is the supervisor's (workers/topic_delete.py), which
this command asks and waits for. A stopped store (``--store``): the store is opened writable as a
library, which finishes the delete as a start does.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from rmq_mp import validators as v
from rmq_mp.config.deleted_topics import REQUESTED, DeletedTopics
from rmq_mp.config.store_config import BrokerRole
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.errors import StoreError
from rmq_mp.format.message import SCHEDULE_TOPIC
from rmq_mp.store.message_store import MessageStore
from rmq_mp.tools.admin_common import (
    attach_running,
    emit,
    flags_lock,
    is_running,
    mark_offsets_moved,
    open_store,
    refuse_if_running,
)
from shm import layout
from shm import queue_offsets as qo
from shm.pointer_table import pid_alive, pid_alive_since

SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        SCHEDULE_TOPIC,
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
"""TopicValidator's SYSTEM_TOPIC_SET at 4.9.8 (with the ``rmq_sys_`` prefix): not deletable."""

WAIT_S = 30.0
"""How long the command waits for the supervisor and reput (a delete takes milliseconds)."""


def _check(topic: str) -> None:
    if topic in SYSTEM_TOPICS or topic.startswith("rmq_sys_"):
        raise StoreError(f"topic {topic!r} is a system topic: RocketMQ refuses to delete it too")


def delete_topic(args: argparse.Namespace) -> int:
    """mqadmin deleteTopic (see the module docstring)."""
    topic = v.check_topic(args.topic, "--topic")
    _check(topic)
    result = _delete_running(args, topic) if is_running(args) else _delete_stopped(args, topic)
    emit(
        [result],
        as_json=args.json,
        columns={"topic": "Topic", "queues": "Queues", "groups": "Groups"},
        footer=f"delete topic [{topic}] from store success.",
    )
    return 0


def _delete_running(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    with attach_running(args) as running:
        if running.config.broker_role is BrokerRole.SLAVE:
            raise StoreError("this store is a SLAVE: delete the topic on its master (RocketMQ refuses too)")
        t = running.table
        with flags_lock(running):
            shm = running.shm
            prefix = f"{topic}@"
            groups = sorted(
                {
                    key[len(prefix) :]
                    for key, _queue_id, slot in shm.groups.queues()
                    if key.startswith(prefix) and shm.groups.get(slot, qo.COMMITTED) != qo.DELETED
                }
            )
            queues = [
                q for q, slot in shm.queues.queues_of(topic) if shm.queues.get(slot, qo.NEXT_OFFSET) > 0
            ]
            topics = TopicConfigManager(running.paths.topics)
            topics.load()
            if not queues and topic not in topics.table and not groups:
                raise StoreError(f"topic {topic!r} does not exist in this store")
            members = [m for m in shm.members.members(pid_alive_since) if m.group in groups]
            if members and not args.force:
                described = ", ".join(f"{m.group} pid {m.pid}" for m in members)
                raise StoreError(
                    f"topic {topic!r} is consumed by {len(members)} live member(s) ({described}): stop "
                    "them first, or --force to delete it anyway (they then read the new topic from "
                    "where they were, and their commits bring offsets back)"
                )
            # Asked before it is written: a kill between leaves a request that finds nothing to
            # do (the delete undone); one after leaves a tombstone the supervisor carries out.
            asked = t.get(layout.TOPIC_DELETE_REQUESTS) + 1
            t.set(layout.TOPIC_DELETE_REQUESTS, asked)
            tombstones = DeletedTopics(running.paths.deleted_topics)
            tombstones.load()
            tombstones.set(topic, _prior_offset(tombstones, topic), REQUESTED)
            tombstones.persist()
        _wait_done(running.table, asked)
        if groups:
            with flags_lock(running):
                mark_offsets_moved(running)  # a slave following this master drops them too
        stone = DeletedTopics(running.paths.deleted_topics)
        stone.load()
        if topic not in stone.table or stone.table[topic].state == REQUESTED:
            raise StoreError(
                f"the supervisor could not delete topic {topic!r} (its log says why); the delete "
                "is finished at the store's next start"
            )
    return {"topic": topic, "queues": len(queues), "groups": ",".join(groups)}


def _prior_offset(tombstones: DeletedTopics, topic: str) -> int:
    """A requested tombstone keeps the offset of the topic's last delete (-1 none): a deleteTopic
    marker met in the log at or below it is that delete's, not this one's (deleted_topics.py)."""
    stone = tombstones.table.get(topic)
    return -1 if stone is None else stone.phy_offset


def _wait_done(table: Any, asked: int) -> None:
    """Until the supervisor carried out request ``asked`` and reput applied it (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        done = table.get(layout.TOPIC_DELETES_DONE) >= asked
        if done and table.get(layout.TOPIC_DELETES_APPLIED) >= table.get(layout.TOPIC_DELETE_GENERATION):
            return
        supervisor = table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS)
        if not pid_alive(*supervisor) or time.monotonic() >= deadline:
            raise StoreError(
                f"the delete was asked for but not {'applied by reput' if done else 'carried out'} within "
                f"{WAIT_S:g} s (supervisor {'alive' if pid_alive(*supervisor) else 'gone'}): it is "
                "finished when the store runs on, or at its next start"
            )
        time.sleep(0.01)  # polls shared words: the supervisor's watch loop posts nothing


def _delete_stopped(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    """A stopped store: a ``requested`` tombstone, finished by opening the store as a start does
    when it was stopped cleanly (else left for its next start, which fences what a crash left
    running first)."""
    with open_store(args) as store:
        refuse_if_running(store)
        config, paths = store.config, store.paths
        queues = len(store.queue_status(topic))
        topics = TopicConfigManager(paths.topics)
        topics.load()
        offsets = store.consumer_offsets
        offsets.load()
        groups = sorted(g for g in offsets.groups() if offsets.offsets_of(g, topic))
        if not queues and topic not in topics.table and not groups:
            raise StoreError(f"topic {topic!r} does not exist in this store")
        crashed = paths.abort.exists()
    tombstones = DeletedTopics(paths.deleted_topics)
    tombstones.load()
    tombstones.set(topic, _prior_offset(tombstones, topic), REQUESTED)
    tombstones.persist()
    if crashed:
        print(
            f"rmq-admin: store {paths.root} did not stop cleanly: the delete is finished at its next start",
            file=sys.stderr,
        )
    else:
        MessageStore.open(config=config).close()  # its start finishes the delete
    return {"topic": topic, "queues": queues, "groups": ",".join(groups)}


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "deleteTopic",
        parents=[common],
        help="delete a topic: its queues, config and group offsets (refused while a consumer of it is attached)",
    )
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--clusterName", "-c", help="accepted for mqadmin's sake; a store is one broker")
    p.add_argument("--force", "-f", action="store_true", help="even with live consumers attached")


COMMANDS = {"deleteTopic": delete_topic}
