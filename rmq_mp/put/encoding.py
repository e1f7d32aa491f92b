"""The reference put path's encoding, outside the lock: `SendEncoder` turns sends into runs of
records, with the helpers it shares with the producer (argument types, refusals, batch checks,
joining single-record runs). A `Message` goes through `rmq_mp.store.put_rules`, the sequence
`MessageStore.put_message` shares. The record bytes themselves are `rmq_mp.format.record.RecordEncoder`
and `rmq_mp.format.message_batch`; the compiled core has its own, tested to give the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from rmq_mp import validators as v
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.message_batch import (
    EncodedRun,
    MessageBatch,
    UniqKeys,
    encode_uniform,
    join_records,
    properties_text,
)
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.routing import QueueRouter
from rmq_mp.store import schedule
from rmq_mp.store.put_rules import ENCODE_FAILURES, encode_put, refused_send


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
        and a.answer_queue_id == b.answer_queue_id
    )


def joined(group: list[EncodedRun]) -> EncodedRun:
    """Consecutive single-record runs of one kind as one run."""
    if len(group) == 1:
        return group[0]
    head = group[0]
    data, ends = join_records([single.data for single in group])
    run = EncodedRun(
        head.topic,
        head.queue_id,
        data,
        count=len(group),
        ends=ends,
        sys_flag=head.sys_flag,
        uniq_keys=[key for single in group for key in single.uniq_keys],
        wait_flush=head.wait_flush,
    )
    run.answer_queue_id = head.answer_queue_id
    return run


def typed_arguments(body: object, queue_id: object, flag: object) -> tuple[bytes, int | None, int]:
    """A send's body, queue id (None: rotate) and flag as bytes and ints, for the slow path
    (one of them was not of its type): `InvalidArgumentTypeError` naming the first wrong one."""
    if queue_id is not None:
        queue_id = v.integer(queue_id, "queue_id")
    return v.body_bytes(body), queue_id, v.integer(flag, "flag")


def _uniq_of(message: m.Message) -> str:
    """The unique key a `Message` carries ('' when its properties are not a mapping)."""
    properties = message.properties
    return (
        properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        if isinstance(properties, Mapping)
        else ""
    )


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


def bodies_as_bytes(bodies: Sequence[m.Body]) -> Sequence[bytes]:
    """``bodies`` itself when every one is bytes or a bytearray, else a list of their bytes
    (a memoryview's ``len`` counts items, not bytes); `InvalidArgumentTypeError` for one that
    is no buffer at all."""
    if all(type(body) in _BYTES_TYPES for body in bodies):
        return cast("Sequence[bytes]", bodies)
    return [v.body_bytes(body, "MessageBatch body") for body in bodies]


_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_ITEM_FIELDS = frozenset(("topic", "body", "tags", "keys", "properties", "queue_id", "flag"))


class SendEncoder:
    """A producer's sends encoded outside the put lock: each `send_batch` item, `Message` and
    `MessageBatch` becomes an `EncodedRun` (or a refused one, with RocketMQ's status and the
    reason), in RocketMQ's order of checks (topic, queue, properties, body). The lock-decided
    fields (queue offset, physical offset, store time) stay 0 until the append patches them."""

    def __init__(
        self,
        encoder: record.RecordEncoder,
        uniq: m.UniqueIdGenerator,
        router: QueueRouter,
        *,
        born_host: m.Host,
        max_message_size: int,
        max_delay_level: int,
    ) -> None:
        self.encoder = encoder
        self.uniq = uniq
        self.router = router
        self.max_message_size = max_message_size
        self.max_delay_level = max_delay_level
        self.born_ip, self.born_port = m.parse_host(born_host)
        """The host the encoder stamps on this producer's records (IPv4: its pid as the port)."""

    def record(self, topic: str, body: bytes, queue_id: int, flag: int, born_ms: int, text: str) -> bytearray:
        """One record as this producer sends it; `RecordRejected` for what the store refuses,
        in RocketMQ's order of checks (topic, queue, properties, body)."""
        topic_field = self.encoder.topic_field(topic)
        if queue_id < 0:
            raise RecordRejected(_ILLEGAL, f"queue id {queue_id} is negative")
        props = text.encode("utf-8")
        if len(props) > record.MAX_PROPERTIES_BYTES:
            problem = record.properties_problem(text)
            raise RecordRejected(_ILLEGAL, problem[1] if problem else "properties too long")
        if len(body) > self.max_message_size:
            raise RecordRejected(_ILLEGAL, record.body_problem(len(body), self.max_message_size))
        return self.encoder.encode_own(topic_field, body, queue_id, flag, born_ms, props)

    def item(
        self,
        topic: str,
        body: bytes,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        flag: int,
        born_ms: int,
    ) -> EncodedRun:
        """A run of the one message a keyword dict of `send_batch` describes (checked as `send`
        checks its arguments)."""
        uniq = self.uniq.next_id(born_ms)
        try:
            if (
                type(body) is not bytes
                or type(flag) is not int
                or (queue_id is not None and type(queue_id) is not int)
            ):
                body, queue_id, flag = typed_arguments(body, queue_id, flag)
            named = queue_id is not None
            queue_id = self.router.queue_for(topic, queue_id)
            if properties or tags or keys:
                v.check_properties(tags, keys, properties)
            if named and not self.router.known(topic, queue_id):  # after every type check
                self.router.check(topic, queue_id)
            answer_queue_id = queue_id
            text = properties_text(properties, tags, keys, uniq)
            if properties:
                uniq = properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
                if (delay := properties.get(m.PROPERTY_DELAY_TIME_LEVEL)) is not None:
                    delayed = schedule.delayed_put(topic, queue_id, 0, delay, text, self.max_delay_level)
                    if delayed is not None:
                        topic, queue_id, text = delayed
            data = self.record(topic, body, queue_id, flag, born_ms, text)
        except RecordRejected as exc:
            v.topic_problem(topic)  # a wrong type raises first (the others were checked above)
            return EncodedRun.refused(
                topic, int_or_minus_one(queue_id), 1, exc.status, exc.reason, uniq_keys=(uniq,)
            )
        except InvalidArgumentError:
            raise
        except ENCODE_FAILURES as exc:
            reason = refused_send(exc, v.send_problem(topic, body, queue_id, flag, tags, keys, properties))
            return EncodedRun.refused(
                topic, int_or_minus_one(queue_id), 1, _ILLEGAL, reason, uniq_keys=(uniq,)
            )
        run = EncodedRun(
            topic,
            queue_id,
            data,
            count=1,
            record_size=len(data),
            uniq_keys=(uniq,),
            wait_flush=waits_for_store(properties),
        )
        run.answer_queue_id = answer_queue_id  # delayed: the sender's queue, as `send` answers
        return run

    def message(self, message: m.Message) -> EncodedRun:
        """A run of one `Message`, stored as given (its born host, time, flags, properties):
        `put_rules.encode_put`, which `MessageStore.put_message` shares, with this producer's
        topic table for the queue check."""
        try:
            stored = encode_put(
                message,
                self.encoder,
                max_message_size=self.max_message_size,
                max_delay_level=self.max_delay_level,
                queue_problem=self._queue_problem,
            )
        except RecordRejected as exc:  # PROPERTIES_SIZE_EXCEEDED too: the broker answers MESSAGE_ILLEGAL
            return EncodedRun.refused(
                message.topic,
                int_or_minus_one(message.queue_id),
                1,
                _ILLEGAL,
                exc.reason,
                uniq_keys=(_uniq_of(message),),
            )
        run = EncodedRun(
            stored.message.topic,
            stored.message.queue_id,
            stored.data,
            count=1,
            record_size=len(stored.data),
            sys_flag=stored.sys_flag,
            uniq_keys=(_uniq_of(message),),
            wait_flush=waits_for_store(message.properties),
        )
        run.answer_queue_id = stored.answer_queue_id  # delayed: the sender's queue, as `send` answers
        return run

    def _queue_problem(self, topic: str, queue_id: int) -> str:
        """Why this producer's topic table refuses ``queue_id`` ('' when it is one of the topic's)."""
        return "" if self.router.known(topic, queue_id) else self.router.problem(topic, queue_id)

    def runs(self, items: Iterable[m.Message | Mapping[str, Any]], born_ms: int) -> list[EncodedRun]:
        """One run of one record per item, then consecutive records of one queue (and one kind:
        queue or not, host family, flush wait) joined into one run."""
        singles: list[EncodedRun] = []
        for index, item in enumerate(items):
            if isinstance(item, m.Message):
                singles.append(self.message(item))
                continue
            if type(item) is not dict and not isinstance(item, Mapping):
                raise InvalidArgumentTypeError(
                    f"send_batch item {index} is a {type(item).__name__}, not a Message or a dict of send's arguments"
                )
            if not _ITEM_FIELDS.issuperset(item):
                raise InvalidArgumentTypeError(
                    f"send_batch items take {sorted(_ITEM_FIELDS)}, not {sorted(set(item) - _ITEM_FIELDS, key=str)}"
                )
            try:
                topic, body = item["topic"], item["body"]
            except KeyError:
                raise InvalidArgumentTypeError(
                    f"send_batch item {index} needs a 'topic' and a 'body'"
                ) from None
            singles.append(
                self.item(
                    topic,
                    body,
                    item.get("tags"),
                    item.get("keys"),
                    item.get("properties"),
                    item.get("queue_id"),
                    item.get("flag", 0),
                    born_ms,
                )
            )
        runs: list[EncodedRun] = []
        group: list[EncodedRun] = []
        for single in singles:
            if group and not (single.pending and same_kind(group[0], single)):
                runs.append(joined(group))
                group = []
            if single.pending:
                group.append(single)
            else:
                runs.append(single)
        if group:
            runs.append(joined(group))
        return runs

    def batch(self, batch: MessageBatch, born_ms: int) -> EncodedRun:
        """A `MessageBatch` as one run: one numpy array when the bodies have one length and no
        message has keys of its own, else its records joined."""
        batch = checked_batch(batch)
        count = len(batch.bodies)
        queue_id = self.router.queue_for(batch.topic, None) if batch.queue_id is None else batch.queue_id
        first = self.uniq.take(count)
        uniq_prefix = f"{self.uniq.prefix_hex}{self.uniq.time_hex(born_ms)}"
        # a given UNIQ_KEY, even '', is stored and answered as given (as `send` does)
        given_uniq = (batch.properties or {}).get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        uniq_keys: Sequence[str] = (
            [given_uniq] * count if given_uniq is not None else UniqKeys(uniq_prefix, first, count)
        )
        if batch.properties and (problem := schedule.batch_delay_problem(batch.properties)):
            # MessageBatch refuses a delay when made; one set on it since is refused here.
            return EncodedRun.refused(batch.topic, queue_id, count, _ILLEGAL, problem, uniq_keys=uniq_keys)
        try:
            if batch.queue_id is not None and not self.router.known(batch.topic, queue_id):
                self.router.check(batch.topic, queue_id)
            if batch.keys is None:
                head = properties_text(
                    batch.properties, batch.tags, None, "" if given_uniq is not None else uniq_prefix
                )
                rows = self._uniform(batch, queue_id, born_ms, head, -1 if given_uniq is not None else first)
                if rows is not None:
                    return EncodedRun(
                        batch.topic,
                        queue_id,
                        rows,
                        count=count,
                        record_size=rows.shape[1],
                        uniq_keys=uniq_keys,
                        whole=True,
                        wait_flush=waits_for_store(batch.properties),
                    )
            encoded = [
                self.record(
                    batch.topic,
                    body if type(body) is bytes else v.body_bytes(body, "MessageBatch body"),
                    queue_id,
                    batch.flag,
                    born_ms,
                    properties_text(
                        batch.properties, batch.tags, batch.keys[i] if batch.keys else None, uniq_keys[i]
                    ),
                )
                for i, body in enumerate(batch.bodies)
            ]
        except RecordRejected as exc:  # RocketMQ stores a batch whole or not at all
            bodies_as_bytes(batch.bodies)  # a wrong type raises first, as for `send`
            return EncodedRun.refused(
                batch.topic, queue_id, count, exc.status, exc.reason, uniq_keys=uniq_keys
            )
        except InvalidArgumentError:
            raise
        except ENCODE_FAILURES as exc:
            bodies = bodies_as_bytes(batch.bodies)
            if bodies is not batch.bodies:  # buffers, not bytes: encoded again as their bytes
                return self.batch(dataclasses.replace(batch, bodies=bodies), born_ms)
            reason = refused_send(
                exc,
                v.send_problem(batch.topic, b"", queue_id, batch.flag, batch.tags, None, batch.properties),
            )
            return EncodedRun.refused(batch.topic, queue_id, count, _ILLEGAL, reason, uniq_keys=uniq_keys)
        data, ends = join_records(encoded)
        return EncodedRun(
            batch.topic,
            queue_id,
            data,
            count=count,
            ends=ends,
            uniq_keys=uniq_keys,
            whole=True,
            wait_flush=waits_for_store(batch.properties),
        )

    def _uniform(
        self, batch: MessageBatch, queue_id: int, born_ms: int, head: str, uniq_counter: int
    ) -> np.ndarray | None:
        """`encode_uniform` after the checks `record` makes per record, made once."""
        topic_field = self.encoder.topic_field(batch.topic)
        if problem := v.queue_id_problem(queue_id) or v.flag_problem(batch.flag):
            raise RecordRejected(_ILLEGAL, problem)
        props = head.encode("utf-8")
        if len(props) + 4 > record.MAX_PROPERTIES_BYTES:
            return None  # per record: `record` gives the exact refusal
        return encode_uniform(
            self.encoder,
            topic_field,
            cast("Sequence[bytes]", batch.bodies),  # another buffer fails it: `batch` retries with bytes
            queue_id=queue_id,
            flag=batch.flag,
            born_timestamp=born_ms,
            born_ip=self.born_ip,
            born_port=self.born_port,
            properties_head=props,
            uniq_counter=uniq_counter,
            max_body_size=self.max_message_size,
        )
