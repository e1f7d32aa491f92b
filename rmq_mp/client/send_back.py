"""consumerSendMsgBack: a message its consumer failed is stored again for a later retry.

RocketMQ's broker does this for a clustering consumer (`SendMessageProcessor.
asyncConsumerSendMsgBack`, 4.9.8): the message as stored is put again on the group's retry topic
``%RETRY%<group>`` with delay level ``3 + reconsumeTimes`` (or the level its listener asked for),
so the schedule service hands it back after 10 s, 30 s, 1 min ... (the default levels), and its
reconsume count (a record header field) one higher. Once the count reaches the group's
``maxReconsumeTimes`` (or the listener asked for no retry, a negative level) it goes to the
dead-letter topic ``%DLQ%<group>`` instead, undelayed. ``RETRY_TOPIC`` keeps the topic the
message was first sent to (the consumer hands the message to its listener under that topic
again) and ``ORIGIN_MESSAGE_ID`` the first stored copy's msgId.

rmq-mp has no broker between consumer and store, so the consumer builds the message here and puts
it with its own producer. One difference, on purpose: RocketMQ stores a sent-back message with
``WAIT=false`` (its put does not wait for the flush); rmq-mp's waits like any send, so an offset
committed after a send-back never covers a retry that a power loss could take away.
"""

from __future__ import annotations

from rmq_mp.format import message as m

FIRST_RETRY_DELAY_LEVEL = 3
"""The broker's level for a first retry when the consumer names none (10 s by default)."""
DEFAULT_MAX_RECONSUME_TIMES = 16
"""A concurrent consumer's retries before the dead-letter topic (maxReconsumeTimes -1 means 16)."""


def message_back(
    msg: m.MessageExt,
    group: str,
    *,
    delay_level: int = 0,
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
) -> m.Message:
    """The message to store for ``msg``, which ``group`` failed to consume: on ``%RETRY%<group>``
    with its next delay level, or on ``%DLQ%<group>`` once ``msg`` has been reconsumed
    ``max_reconsume_times`` times or ``delay_level`` is negative (the listener wants no retry).
    A ``delay_level`` of 0 lets the count decide (3 + reconsume times)."""
    properties = dict(msg.properties)
    properties.setdefault(m.PROPERTY_RETRY_TOPIC, msg.topic)
    if not properties.get(m.PROPERTY_ORIGIN_MESSAGE_ID):
        properties[m.PROPERTY_ORIGIN_MESSAGE_ID] = msg.msg_id
    if msg.reconsume_times >= max_reconsume_times or delay_level < 0:
        topic = m.dlq_topic(group)
        properties.pop(m.PROPERTY_DELAY_TIME_LEVEL, None)
    else:
        topic = m.retry_topic(group)
        level = delay_level if delay_level > 0 else FIRST_RETRY_DELAY_LEVEL + msg.reconsume_times
        properties[m.PROPERTY_DELAY_TIME_LEVEL] = str(level)
    return m.Message(
        topic=topic,
        body=msg.body,
        flag=msg.flag,
        properties=properties,
        queue_id=0,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times + 1,
    )


def original_view(msg: m.MessageExt, group: str) -> m.MessageExt:
    """``msg`` as its listener sees it (the client's `resetRetryAndNamespace`): a message read
    from the group's retry topic carries the topic it was first sent to."""
    real = msg.properties.get(m.PROPERTY_RETRY_TOPIC)
    if real and msg.topic == m.retry_topic(group):
        view = m.MessageExt(**{name: getattr(msg, name) for name in m.MessageExt.__dataclass_fields__})
        view.topic = real
        return view
    return msg
