"""The reference put path's message preparation helpers: argument types, refusals, batch checks
and joining single-record runs (the encoding itself is `rmq_mp.format.record.RecordEncoder` and
`rmq_mp.format.message_batch`; the compiled core has its own, tested to give the same bytes).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping, Sequence

from rmq_mp import validators as v
from rmq_mp.errors import InvalidArgumentTypeError
from rmq_mp.format import message as m
from rmq_mp.format.message_batch import EncodedRun, MessageBatch, join_records


def waits_for_store(properties: Mapping[str, str] | None) -> bool:
    """RocketMQ's WAIT property (`isWaitStoreMsgOK`): absent or "true" means wait for disk."""
    return not properties or properties.get(m.PROPERTY_WAIT_STORE_MSG_OK, "true") == "true"


def same_kind(a: EncodedRun, b: EncodedRun) -> bool:
    """Whether ``b`` may extend a run that starts with ``a``."""
    return (
        a.topic == b.topic
        and a.queue_id == b.queue_id
        and a.sys_flag == b.sys_flag
        and a.wait_flush == b.wait_flush
    )


def joined(group: list[EncodedRun]) -> EncodedRun:
    """Consecutive single-record runs of one kind as one run."""
    if len(group) == 1:
        return group[0]
    head = group[0]
    data, ends = join_records([single.data for single in group])
    return EncodedRun(
        head.topic,
        head.queue_id,
        data,
        count=len(group),
        ends=ends,
        sys_flag=head.sys_flag,
        uniq_keys=[key for single in group for key in single.uniq_keys],
        wait_flush=head.wait_flush,
    )


ENCODE_FAILURES = (TypeError, ValueError, OverflowError, struct.error)
"""What encoding raises for arguments Python's types let through (a queue id beyond a Java int,
a list for a topic): caught only then, so the common send pays nothing for the diagnosis."""


def typed_arguments(body: object, queue_id: object, flag: object) -> tuple[bytes, int | None, int]:
    """A send's body, queue id (None: rotate) and flag as bytes and ints, for the slow path
    (one of them was not of its type): `InvalidArgumentTypeError` naming the first wrong one."""
    if queue_id is not None:
        queue_id = v.integer(queue_id, "queue_id")
    return v.body_bytes(body), queue_id, v.integer(flag, "flag")


def refused_send(failure: Exception, problem: str) -> str:
    """The MESSAGE_ILLEGAL reason `validators` found for a send whose encode raised ``failure``;
    no reason means the failure was not the arguments', and it propagates."""
    if not problem:
        raise failure
    return problem


def int_or_minus_one(queue_id: object) -> int:
    """A refused message's queue id for its result: the id if it is an int, else -1."""
    return queue_id if isinstance(queue_id, int) and not isinstance(queue_id, bool) else -1


def checked_batch(batch: MessageBatch) -> MessageBatch:
    """``batch`` once the types of its fields are right (`InvalidArgumentTypeError` otherwise),
    before anything is encoded; a copy only when its queue id had to become an int. The bodies
    are not looked at one by one here (2.3 us a 100-message batch): the encode raises for
    anything but a buffer, and `bodies_as_bytes` then tells which."""
    if type(batch.topic) is not str:
        v.topic_problem(batch.topic)  # a non-str topic raises; a refused one is answered later
    if type(batch.flag) is not int:
        v.integer(batch.flag, "MessageBatch.flag")
    if batch.tags is not None or batch.properties is not None:
        v.check_properties(batch.tags, None, batch.properties)
    for keys in batch.keys or ():
        v.check_properties(None, keys, None)
    bodies = batch.bodies
    if type(bodies) is not list and (not isinstance(bodies, Sequence) or isinstance(bodies, (str, bytes))):
        raise InvalidArgumentTypeError(
            f"MessageBatch.bodies must be a sequence of bytes, not {type(bodies).__name__}"
        )
    if batch.queue_id is not None and type(batch.queue_id) is not int:
        return dataclasses.replace(batch, queue_id=v.integer(batch.queue_id, "MessageBatch.queue_id"))
    return batch


_BYTES_TYPES = (bytes, bytearray)


def bodies_as_bytes(bodies: Sequence[bytes]) -> Sequence[bytes]:
    """``bodies`` itself when every one is bytes or a bytearray, else a list of their bytes
    (a memoryview's ``len`` counts items, not bytes); `InvalidArgumentTypeError` for one that
    is no buffer at all."""
    if all(type(body) in _BYTES_TYPES for body in bodies):
        return bodies
    return [v.body_bytes(body, "MessageBatch body") for body in bodies]
