"""What every Python put of a `Message` does before the put lock, in one place: RocketMQ's checks
in its order (topic, queue, properties, body), the queue check of the caller's topic table, the
delay rewrite onto SCHEDULE_TOPIC_XXXX and the encode.

Its two callers are the two ways a Python process writes records: `MessageStore.put_message`
(the library, offline, one process) and the producer's `SendEncoder.message` (a running store,
shared memory). Both then take their queue offset by the same rule, `takes_queue_offset`, under
their put lock, and patch the lock-decided fields with `record.patch_record`. What stays apart
is the append itself: the producer's `Appender` journals into shared memory and pool buffers so
a kill -9 mid-put is undone (`shm.put_journal`); the library appends to its own mapped files
(`CommitLog.append`) in a process that owns the store. `rmq_mp/put/_core.c` mirrors the
producer's sequence, and so this one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from rmq_mp import validators as v
from rmq_mp.errors import InvalidArgumentError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.store import schedule

ENCODE_FAILURES = (TypeError, ValueError, OverflowError, struct.error)
"""What encoding raises for arguments Python's types let through (a queue id beyond a Java int,
a list for a topic): caught only then, so the common send pays nothing for the diagnosis."""

_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL


def refused_send(failure: Exception, problem: str) -> str:
    """The MESSAGE_ILLEGAL reason `validators` found for a send whose encode raised ``failure``;
    no reason means the failure was not the arguments', and it propagates."""
    if not problem:
        raise failure
    return problem


def takes_queue_offset(sys_flag: int) -> bool:
    """Whether a record takes the next offset of its queue under the put lock (and the queue's
    next offset moves on): every record but a transaction's prepared or rolled-back half, which
    is stored with queue offset 0 and never dispatched (RocketMQ's `CommitLog.doAppend`)."""
    return m.is_dispatchable(sys_flag)


class StoredMessage(NamedTuple):
    """A `Message` checked and encoded as it will be stored."""

    message: m.Message
    """As stored: on SCHEDULE_TOPIC_XXXX (its queue the delay level's) when it was delayed."""
    data: bytearray
    """The record, its lock-decided fields (queue and physical offsets, store time, CRC) 0."""
    sys_flag: int
    answer_queue_id: int
    """The queue the sender named: what a put of a delayed message answers, as RocketMQ's broker."""


def encode_put(
    message: m.Message,
    encoder: record.RecordEncoder,
    *,
    max_message_size: int,
    max_delay_level: int,
    queue_problem: Callable[[str, int], str] | None = None,
) -> StoredMessage:
    """``message`` checked and encoded. A message the store refuses raises `RecordRejected` with
    the store's status (PROPERTIES_SIZE_EXCEEDED for long properties, MESSAGE_ILLEGAL for the
    rest, as RocketMQ's `checkMessage`; a broker answers each MESSAGE_ILLEGAL) and the reason; a
    field of the wrong type raises `InvalidArgumentTypeError` first, whatever else is wrong.
    ``queue_problem``: why the caller's topic table refuses the queue ('' if it does not)."""
    try:
        text = message.stored_properties()
        problem = record.validate_message(message, max_message_size=max_message_size, properties_text=text)
        if problem is None and queue_problem is not None:
            found = queue_problem(message.topic, message.queue_id)
            problem = (_ILLEGAL, found) if found else None
        if problem is None:
            stored = schedule.delayed_message(message, text, max_delay_level)
            data = encoder.encode_message(stored, stored.properties_string)
    except InvalidArgumentError:
        raise
    except RecordRejected as exc:  # a DELAY that is not a level, a topic the encoder refuses
        problem = (exc.status, exc.reason)
    except (*ENCODE_FAILURES, AttributeError) as exc:
        problem = (_ILLEGAL, refused_send(exc, v.message_problem(message)))
    if problem is not None:
        v.message_problem(message)  # a wrong type raises first, as for a send
        raise RecordRejected(*problem)
    return StoredMessage(stored, data, record.peek_sys_flag(data, 0), message.queue_id)
