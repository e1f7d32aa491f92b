"""The supervisor's half of `rmq-admin deleteTopic` on a running store.

rmq-admin (rmq_mp/tools/admin_topics.py) checks that no member of a group consuming the topic is
attached, writes a ``requested`` tombstone to config/deletedTopics.json and counts
TOPIC_DELETE_REQUESTS, all under the flags lock. The supervisor, in its watch loop
(`carry_out`), then, for each requested topic, under the flags lock:

1. under the put lock: appends the delete's marker record (rmq_mp/format/topic_marker.py) with
   the producer's own appender, as a send, and takes its offset as the tombstone's; persists
   the tombstone ``pending`` (from here a crash is finished at the next start; one between the
   marker and this is finished by reput or recovery meeting the marker), sets the topic's next
   queue offsets to 0 and bumps TOPIC_DELETE_GENERATION. A send after it is the new topic's
   first message, at queue offset 0, above the tombstone and the marker;
2. marks the topic's group offsets deleted (`shm.queue_offsets.DELETED`, as deleteSubGroup)
   and removes its topics.json entry;

then persists consumerOffset.json (without them), marks the tombstone ``done`` and counts
TOPIC_DELETES_DONE, which the command waits for. Reput, seeing the generation move before it
dispatches any record put after step 1, drops the old queue files and resets the queue table's
dispatched and minimum offsets (`workers/reput.py`), then publishes TOPIC_DELETES_APPLIED.

The marker carries the delete to slaves in log order (docs/replication.md, "A topic deleted on
the master"): a SLAVE's reput, meeting it, writes the tombstone at its offset and drops the
queues as above, its ha worker sets the topic's next offsets to 0 there, and its supervisor
(`finish_from_log`, when TOPIC_DELETE_MARKERS_APPLIED moves) drops the topic's group offsets
and topics.json entry as step 2 does, persists consumerOffset.json and marks the tombstone
``done``. The same runs on a master whose supervisor died between the marker and the tombstone.

``RMQ_CRASH_AT=deleteTopic:<step>`` (tests only: begin, marker, tombstone, queues, config, finish;
reput: reput-marker, reput) kills the process with SIGKILL at that step, so the crash tests can stop a delete where they choose.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Protocol

from rmq_mp.config.deleted_topics import DONE, PENDING, REQUESTED, DeletedTopics
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.errors import StoreError
from rmq_mp.format import topic_marker
from rmq_mp.format.message_batch import EncodedRun
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.paths import StorePaths
from rmq_mp.put.fence import holding_put_lock
from rmq_mp.put.producer import Producer
from shm import layout
from shm import queue_offsets as qo
from shm.names import ShmNames
from shm.store_shm import StoreShm

log = logging.getLogger("rmq_mp.supervisor")


class Supervisor(Protocol):
    """What a delete uses of workers/supervisor.py's Supervisor."""

    names: ShmNames
    shm: StoreShm | None
    topics: TopicConfigManager | None

    def persist_config(self) -> bool: ...


def crash_point(step: str) -> None:
    """SIGKILL this process at ``step`` when the crash tests ask (RMQ_CRASH_AT); only the first
    time when RMQ_CRASH_ONCE names a file to create (a restarted worker inherits the setting)."""
    if os.environ.get("RMQ_CRASH_AT") != f"deleteTopic:{step}":
        return
    once = os.environ.get("RMQ_CRASH_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def carry_out(supervisor: Supervisor, paths: StorePaths) -> None:
    """Carry out every requested delete (see the module docstring); counts TOPIC_DELETES_DONE
    up to the requests seen, also when one failed (logged: the command reports it)."""
    shm = supervisor.shm
    assert shm is not None
    t = shm.table
    requests = t.get(layout.TOPIC_DELETE_REQUESTS)
    crash_point("begin")
    deleted: list[str] = []
    try:
        with shm.flags_lock("deleteTopic"):
            tombstones = DeletedTopics(paths.deleted_topics)
            tombstones.load()
            deleted = sorted(topic for topic, s in tombstones.table.items() if s.state == REQUESTED)
            if deleted:
                _delete_under_lock(supervisor, tombstones, deleted)
        if deleted and supervisor.persist_config():
            _mark_done(shm, tombstones, deleted, "deleteTopic done")
            log.info("deleteTopic: %s deleted", ", ".join(deleted))
    except (StoreError, OSError) as exc:
        log.error("deleteTopic %s: %s (finished at the next start)", ", ".join(deleted) or "?", exc)
    t.set(layout.TOPIC_DELETES_DONE, requests)


def _mark_done(shm: StoreShm, tombstones: DeletedTopics, topics: list[str], purpose: str) -> None:
    """The delete's last step, once the config without the topics is persisted: their pending
    tombstones become done (re-read under the flags lock: rmq-admin may have added one)."""
    with shm.flags_lock(purpose):
        tombstones.load()
        for topic in topics:
            stone = tombstones.table.get(topic)
            if stone is not None and stone.state == PENDING:
                tombstones.set(topic, stone.phy_offset, DONE)
        tombstones.persist()


def _delete_under_lock(supervisor: Supervisor, tombstones: DeletedTopics, topics: list[str]) -> None:
    """Steps 1 and 2 (the flags lock held)."""
    shm = supervisor.shm
    assert shm is not None
    t = shm.table
    with holding_put_lock(supervisor.names.base, "deleteTopic") as producer:
        phy_offset = append_marker(producer, topics)
        crash_point("marker")
        for topic in topics:
            tombstones.set(topic, phy_offset, PENDING)
        tombstones.persist()
        crash_point("tombstone")
        for topic in topics:
            for _queue_id, slot in shm.queues.queues_of(topic):
                shm.queues.set(slot, qo.NEXT_OFFSET, 0)
        t.set(layout.TOPIC_DELETE_GENERATION, t.get(layout.TOPIC_DELETE_GENERATION) + 1)
    shm.wake("flusher")  # the marker readable soon under SYNC_FLUSH (the pool: the next commit)
    shm.wake("reput")
    crash_point("queues")
    _drop_groups_and_config(supervisor, topics)
    crash_point("config")


def append_marker(producer: Producer, topics: list[str]) -> int:
    """The marker record naming ``topics`` (rmq_mp/format/topic_marker.py), put under the put
    lock ``producer`` holds by the producer's own appender, as a send's; its commit-log offset,
    the tombstones' offset. `StoreError` when it could not be stored (a full disk: nothing of
    the delete is done, the tombstone stays requested and the next start finishes it)."""
    data = topic_marker.encode(producer.encoding.encoder, topics, time.time_ns() // 1_000_000)
    run = EncodedRun(
        topic_marker.TOPIC, topic_marker.QUEUE_ID, data, count=1, record_size=len(data), wait_flush=False
    )
    producer.appender.append((run,), producer.lock.acquired_ms)
    placed = run.placements[0]
    if placed.status is not PutMessageStatus.PUT_OK:
        raise StoreError(f"the deleteTopic marker was not stored: {placed.status.name} {placed.reason}")
    return placed.phy_offset


def finish_from_log(supervisor: Supervisor, paths: StorePaths) -> None:
    """A delete reput met as a marker in the log with no tombstone of it yet (a SLAVE replicating
    its master's delete; a master whose supervisor died between the marker and the tombstone):
    reput wrote the tombstone ``pending`` and dropped the queues; here, under the flags lock, the
    topic's group offsets and topics.json entry go, as in step 2, then consumerOffset.json is
    persisted and the tombstone is ``done``. TOPIC_DELETE_MARKERS_FINISHED then says so (the
    metadata channel follows it with a full snapshot)."""
    shm = supervisor.shm
    assert shm is not None
    t = shm.table
    applied = t.get(layout.TOPIC_DELETE_MARKERS_APPLIED)
    pending: list[str] = []
    try:
        with shm.flags_lock("deleteTopic from the log"):
            tombstones = DeletedTopics(paths.deleted_topics)
            tombstones.load()
            pending = sorted(topic for topic, s in tombstones.table.items() if s.state == PENDING)
            if pending:
                _drop_groups_and_config(supervisor, pending)
        crash_point("finish")
        if pending and supervisor.persist_config():
            _mark_done(shm, tombstones, pending, "deleteTopic from the log done")
            log.info("deleteTopic from the log: %s deleted", ", ".join(pending))
    except (StoreError, OSError) as exc:
        log.error("deleteTopic from the log %s: %s (retried)", ", ".join(pending) or "?", exc)
        return
    t.set(layout.TOPIC_DELETE_MARKERS_FINISHED, applied)


def _drop_groups_and_config(supervisor: Supervisor, topics: list[str]) -> None:
    """Step 2 (the flags lock held): ``topics``' group offsets deleted, their topics.json entries gone."""
    shm = supervisor.shm
    assert shm is not None
    prefixes = tuple(f"{topic}@" for topic in topics)
    for key, _queue_id, slot in list(shm.groups.queues()):
        if key.startswith(prefixes):
            shm.groups.set(slot, qo.COMMITTED, qo.DELETED)
    manager = supervisor.topics
    if manager is not None:
        manager.load()
        if any(topic in manager.table for topic in topics):
            manager.table = {name: c for name, c in manager.table.items() if name not in topics}
            manager.counter += 1
            manager.timestamp_ms = time.time_ns() // 1_000_000
            manager.persist()
