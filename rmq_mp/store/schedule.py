"""Delayed messages: RocketMQ 4.9.8's put-time rewrite and `ScheduleMessageService.messageTimeup`.

A put whose ``DELAY`` property is a level above 0 (and whose transaction type is NOT or COMMIT)
is stored on ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` with ``REAL_TOPIC``/``REAL_QID`` added
(`delayed_put`, docs/format.md §3.3); reput gives its ConsumeQueue entry the delivery time
as tags code (`record.cq_tags_code`, §2.6), and the scheduler worker (workers/scheduler.py)
puts it on its real topic and queue when due (`message_timeup`). Every put path calls
`delayed_put` on the properties string it is about to store: `Producer` (send, send_batch
items, `Message` items) and `MessageStore.put_message`; a `MessageBatch` may not carry a delay
(`batch_delay_problem`), as RocketMQ's batch check.

What RocketMQ stores, byte for byte, and so this module:

* the rewrite puts ``REAL_TOPIC`` then ``REAL_QID`` into the message's property map and
  re-encodes it; a level above the last is clamped, and the clamped value is what ``DELAY``
  then holds (`setDelayTimeLevel`). Properties keep their order here (Java's map order is its
  hash order; rmq-mp keeps insertion order everywhere), the two new ones last.
* ``messageTimeup`` builds the delivered message's properties *string* from the stored map
  before it clears ``DELAY`` from the map, so the delivered record still carries ``DELAY``,
  ``REAL_TOPIC`` and ``REAL_QID`` (a consumer of a delayed message sees them, as a RocketMQ
  consumer does); only the map the put path looks at lacks ``DELAY``, which is why it is not
  delayed again. `Message.properties_string` carries that separate string.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rmq_mp.format import message as m
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus

SCHEDULE_TOPIC = m.SCHEDULE_TOPIC
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL


def queue_id_of(delay_level: int) -> int:
    """`ScheduleMessageService.delayLevel2QueueId`."""
    return delay_level - 1


def delay_level_of(queue_id: int) -> int:
    """`ScheduleMessageService.queueId2DelayLevel`."""
    return queue_id + 1


def parse_level(text: str) -> int:
    """`Message.getDelayTimeLevel`: the DELAY property as a Java int (`Integer.parseInt`), or
    `RecordRejected` MESSAGE_ILLEGAL (RocketMQ's put throws NumberFormatException: nothing is
    stored)."""
    stripped = text[1:] if text[:1] in "+-" else text
    if not stripped or not stripped.isascii() or not stripped.isdigit():
        raise RecordRejected(_ILLEGAL, f"DELAY property {text!r} is not a delay level (an integer)")
    level = int(text)
    if not -(1 << 31) <= level < (1 << 31):
        raise RecordRejected(_ILLEGAL, f"DELAY property {text!r} is outside a Java int")
    return level


def delayed_put(
    topic: str, queue_id: int, sys_flag: int, delay: str | None, properties_text: str, max_delay_level: int
) -> tuple[str, int, str] | None:
    """`CommitLog.asyncPutMessage`'s delay rewrite: (SCHEDULE_TOPIC_XXXX, level - 1, the new
    properties string), or None when the put is not delayed (``delay``, the DELAY value of the
    property map the put was given, absent, or a level of 0 or less; a PREPARED or ROLLBACK
    transaction type). ``properties_text``: the properties string the put would store, rebuilt
    with the clamped level and REAL_TOPIC, REAL_QID. The caller has checked topic and queue id
    as the real ones; `RecordRejected` for a DELAY that is not an int."""
    if delay is None or not m.is_dispatchable(sys_flag):
        return None
    level = parse_level(delay)
    if level <= 0:
        return None
    props = m.string_to_properties(properties_text)
    if level > max_delay_level:  # setDelayTimeLevel: the clamped level is what DELAY then says
        level = max_delay_level
        props[m.PROPERTY_DELAY_TIME_LEVEL] = str(level)
    props[m.PROPERTY_REAL_TOPIC] = topic
    props[m.PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    return SCHEDULE_TOPIC, queue_id_of(level), m.properties_to_string(props)


def delayed_message(message: m.Message, text: str, max_delay_level: int) -> m.Message:
    """``message`` as stored (`schedule.delayed_put`): on SCHEDULE_TOPIC_XXXX when its property
    map has a DELAY level above 0, else itself. ``text``: its properties string as stored."""
    delayed = delayed_put(
        message.topic,
        message.queue_id,
        message.sys_flag,
        message.properties.get(m.PROPERTY_DELAY_TIME_LEVEL),
        text,
        max_delay_level,
    )
    if delayed is None:
        return message if message.properties_string is not None else replace(message, properties_string=text)
    topic, queue_id, text = delayed
    return replace(
        message,
        topic=topic,
        queue_id=queue_id,
        properties=m.string_to_properties(text),
        properties_string=text,
    )


def batch_delay_problem(properties: Mapping[str, str] | None) -> str:
    """Why a batch with these properties is refused ('' when it is not delayed): RocketMQ's
    `asyncPutMessages` refuses a batch with a delay level above 0 (MESSAGE_ILLEGAL)."""
    raw = (properties or {}).get(m.PROPERTY_DELAY_TIME_LEVEL)
    if raw is None:
        return ""
    try:
        level = parse_level(raw)
    except RecordRejected as exc:
        return exc.reason
    return "a batch cannot carry a delay level (RocketMQ refuses delayed batches)" if level > 0 else ""


def correct_deliver_timestamp(now_ms: int, deliver_ms: int, level_delay_ms: int) -> int:
    """`correctDeliverTimestamp`: a delivery time further ahead than the level's whole delay (the
    clock went back, or the level was shortened) is taken as now."""
    return now_ms if deliver_ms > now_ms + level_delay_ms else deliver_ms


def message_timeup(ext: m.MessageExt) -> m.Message:
    """`messageTimeup`: the message a due schedule record becomes, for its real topic and queue.
    Body, flag, sys flag, born time and host, reconsume times and UNIQ_KEY are kept; the stored
    properties string is the schedule record's (DELAY, REAL_TOPIC, REAL_QID included, as
    RocketMQ writes it); the map lacks DELAY and says WAIT=false (the scheduler does not wait
    for a SYNC flush). `KeyError`/`ValueError` when REAL_TOPIC or REAL_QID is missing or bad
    (RocketMQ logs and drops such a record)."""
    props = dict(ext.properties)
    text = m.properties_to_string(props)
    props[m.PROPERTY_WAIT_STORE_MSG_OK] = "false"
    props.pop(m.PROPERTY_DELAY_TIME_LEVEL, None)
    real_topic = props[m.PROPERTY_REAL_TOPIC]
    real_queue_id = int(props[m.PROPERTY_REAL_QUEUE_ID])
    return m.Message(
        topic=real_topic,
        body=ext.body,
        flag=ext.flag,
        properties=props,
        properties_string=text,
        queue_id=real_queue_id,
        sys_flag=ext.sys_flag,
        born_timestamp=ext.born_timestamp,
        born_host=ext.born_host,
        store_host=ext.store_host,
        reconsume_times=ext.reconsume_times,
    )


@dataclass(frozen=True, slots=True)
class LevelProgress:
    """One delay level as status and metrics show it."""

    level: int
    delay_ms: int
    offset: int
    """Next SCHEDULE_TOPIC_XXXX queue offset to deliver."""
    max_offset: int
    """The queue's dispatched end."""
    next_due_ms: int
    """Delivery time of the entry at `offset`, -1 when the scheduler has none in view."""
    delivered: int
    """Messages delivered since the store started."""

    @property
    def backlog(self) -> int:
        return max(0, self.max_offset - self.offset)

    def lag_ms(self, now_ms: int | None = None) -> int:
        """How late the oldest undelivered entry is (0 when none is due)."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if self.backlog == 0 or self.next_due_ms < 0:
            return 0
        return max(0, now_ms - self.next_due_ms)
