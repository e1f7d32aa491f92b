"""The deleteTopic marker: a record that carries `rmq-admin deleteTopic` in the commit log itself.

The metadata channel (workers/ha_meta.py) cannot order a delete against the log a slave
replicates; the log can. So the master, in the put-lock step that takes a delete's tombstone
offset (workers/topic_delete.py), appends one marker record there, and every reader of the log
that rebuilds queues (reput and recovery, on a master and a slave alike; the slave's ha worker
for its queues' next offsets) applies the delete when it meets the marker, before anything after
it.

A marker is a plain RocketMQ v1 record (nothing in it is rmq-mp's but its content), so RocketMQ
reading the store sees one more message of a system topic, and nothing else:

- topic ``rmq_sys_DELETE_TOPIC`` (`message.DELETE_TOPIC_MARKER`: TopicValidator's system-topic
  prefix), queue 0, its queue offset the queue's next, as any put;
- body: the deleted topics' names, UTF-8, one per line (a topic name holds no newline);
- properties: ``KEYS`` the same names, space-separated (so `queryMsgByKey` finds a topic's
  deletes), and the store's WAIT=false.

A send to the topic is refused (`RecordEncoder.topic_field`), so only the store writes one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rmq_mp.errors import CorruptRecordError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.record_batch import RecordBatch
from rmq_mp.validators import topic_problem

TOPIC = m.DELETE_TOPIC_MARKER
QUEUE_ID = 0
_TOPIC_FIELD = bytes((len(TOPIC),)) + TOPIC.encode("ascii")


def encode(encoder: record.RecordEncoder, topics: Sequence[str], born_ms: int) -> bytearray:
    """The marker record for ``topics`` (their queue and physical offsets and store time 0, to be
    patched under the put lock as any record's). Each topic must be one a send may name."""
    if not topics:
        raise ValueError("a marker names at least one topic")
    for topic in topics:
        if problem := topic_problem(topic) or ("\n" in topic and "newline in a topic"):
            raise ValueError(problem)
    properties = m.properties_to_string(
        {m.PROPERTY_KEYS: " ".join(topics), m.PROPERTY_WAIT_STORE_MSG_OK: "false"}
    )
    return encoder.encode_own(
        _TOPIC_FIELD, "\n".join(topics).encode("utf-8"), QUEUE_ID, 0, born_ms, properties.encode("utf-8")
    )


def decode(body: bytes) -> list[str]:
    """The topics a marker's body names; `CorruptRecordError` for a body that names none or
    a name no topic can have."""
    try:
        topics = body.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"deleteTopic marker: body is not UTF-8 ({exc})") from None
    for topic in topics:
        if problem := topic_problem(topic):
            raise CorruptRecordError(f"deleteTopic marker: {problem}")
    return topics


def rows(batch: RecordBatch) -> list[int]:
    """Rows of ``batch`` that are markers, in log order (none: the common case, one list lookup)."""
    if TOPIC not in batch.topics:
        return []
    index = batch.topics.index(TOPIC)
    return [int(r) for r in np.flatnonzero(batch.topic_index == index)]
