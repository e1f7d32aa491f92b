"""Argument checks at the public calls, mirroring where RocketMQ 4.9.8 checks what.

RocketMQ checks names in two places, and rmq-mp keeps the split:

- **The store** (`DefaultMessageStore.checkMessage`, and the v1 record's one-byte TOPICLEN):
  a topic of at most 127 UTF-8 bytes, whatever its characters, so that a RocketMQ store's topics
  (its fixtures hold ``主题-τ``) stay writable and readable. rmq-mp's `Producer.send` is the
  store's putMessage: a topic it cannot hold is answered MESSAGE_ILLEGAL with the reason, as
  any other refused message, and nothing is stored. RocketMQ 4.9.8 counts Java chars there;
  the record field holds bytes, so rmq-mp counts bytes (as 5.x's `HookUtils` does).
- **The client** (`Validators.checkGroup`; `DefaultMQPullConsumerImpl.pullSyncImpl`'s argument
  checks): a group is non-blank, at most 255 characters (CHARACTER_MAX_LENGTH) of
  ``^[%|a-zA-Z0-9_-]+$``; a pull asks for at least one message. A `Consumer` is the client, so
  these raise `InvalidArgumentError` naming the rule (MQClientException in RocketMQ).

Numbers are Java's: a queue id is an ``int`` (0..2^31-1, negative ids refused as by the
broker's ``queueId < 0`` checks), offsets are ``long``s, a message flag an ``int``. A value of
the wrong type raises `InvalidArgumentTypeError` (a TypeError) naming the argument, before
anything is read or written. The checks sit at the entry points; the send path pays for them
only when something is wrong (`send_problem` diagnoses what an encode refused).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from rmq_mp.config.store_config import closest_name
from rmq_mp.errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError
from rmq_mp.format import message as m

TOPIC_MAX_BYTES = 127
"""`DefaultMessageStore.checkMessage`: ``topic.length() > Byte.MAX_VALUE`` is MESSAGE_ILLEGAL
(the v1 record's TOPICLEN is one byte)."""
GROUP_MAX_LENGTH = 255
"""`Validators.CHARACTER_MAX_LENGTH`: the longest group name `checkGroup` accepts."""
VALID_NAME_PATTERN = "^[%|a-zA-Z0-9_-]+$"
"""`Validators.VALID_PATTERN_STR`: the characters RocketMQ allows in group (and client topic) names."""
_VALID_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
JAVA_INT_MAX = (1 << 31) - 1
JAVA_LONG_MAX = (1 << 63) - 1
TOPIC_GROUP_SEPARATOR = "@"
"""ConsumerOffsetManager's key separator (``topic@group``): a topic with offsets cannot hold it."""


def _type_name(value: object) -> str:
    return type(value).__name__


def integer(value: object, what: str) -> int:
    """``value`` as a Python int: an int or anything with ``__index__`` (numpy integers), never a
    bool or a float. `InvalidArgumentTypeError` otherwise."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise InvalidArgumentTypeError(f"{what} must be an int, not bool ({value!r})")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentTypeError(
            f"{what} must be an int, not {_type_name(value)} ({value!r})"
        ) from None


def queue_id_problem(queue_id: int) -> str:
    """Why ``queue_id`` names no queue ('' when it may): a Java int, not negative."""
    if queue_id < 0:
        return f"queue id {queue_id} is negative"
    if queue_id > JAVA_INT_MAX:
        return f"queue id {queue_id} exceeds Integer.MAX_VALUE ({JAVA_INT_MAX})"
    return ""


def check_queue_id(queue_id: object, what: str = "queue_id") -> int:
    """A queue id argument: `InvalidArgumentTypeError` / `InvalidArgumentError` unless an int in
    0..2^31-1 (the broker refuses ``queueId < 0`` with "queueId[...] is illegal")."""
    value = integer(queue_id, what)
    if problem := queue_id_problem(value):
        raise InvalidArgumentError(f"{what}: {problem}")
    return value


def check_offset(offset: object, what: str, *, negative_ok: bool = False) -> int:
    """An offset argument: an int that fits a Java long; negative only where ``negative_ok``
    (a pull, which answers OFFSET_TOO_SMALL as the store's getMessage does)."""
    value = integer(offset, what)
    if not -JAVA_LONG_MAX - 1 <= value <= JAVA_LONG_MAX:
        raise InvalidArgumentError(f"{what} {value} does not fit a Java long")
    if value < 0 and not negative_ok:
        raise InvalidArgumentError(f"{what} {value} is negative")
    return value


def check_get(
    topic: object, queue_id: object, offset: object, max_msgs: object, tags: object
) -> tuple[str, int, int, int, frozenset[str] | None]:
    """A read's arguments (`Consumer.pull`, `MessageStore.get_message`), as RocketMQ's pull
    consumer and broker refuse them: a topic the store cannot hold, a queue id outside
    0..2^31-1, an offset beyond a Java long (a negative one is the store's OFFSET_TOO_SMALL),
    ``max_msgs`` < 1 ("maxNums <= 0"), tags that are not a set of str. Normalised: numpy integers
    to int, a set of tags to a frozenset."""
    checked_topic = check_topic(topic)
    checked_queue_id = check_queue_id(queue_id)
    checked_offset = check_offset(offset, "offset", negative_ok=True)
    count = integer(max_msgs, "max_msgs")
    if count < 1:
        raise InvalidArgumentError(f"max_msgs {count}: maxNums <= 0 (a pull asks for at least one message)")
    if tags is not None:
        if not isinstance(tags, (set, frozenset)) or not all(isinstance(t, str) for t in tags):
            raise InvalidArgumentTypeError(
                f"tags must be a frozenset of str or None, not {tags!r} "
                "(parse_tag_expression('TagA || TagB') builds one)"
            )
        tags = frozenset(tags)
    return checked_topic, checked_queue_id, checked_offset, count, tags


def topic_problem(topic: object) -> str:
    """Why the store refuses ``topic`` (MESSAGE_ILLEGAL for a send), or ''. Not a str:
    `InvalidArgumentTypeError`. The store's rules only (see the module docstring): non-empty,
    usable as a consume-queue directory name, UTF-8 encodable, at most 127 bytes."""
    if type(topic) is not str:
        if not isinstance(topic, str):
            raise InvalidArgumentTypeError(f"topic must be a str, not {_type_name(topic)} ({topic!r})")
        topic = str(topic)
    if not topic or topic in (".", "..") or "/" in topic or "\0" in topic:
        return f"topic {topic!r} cannot name a consume-queue directory"
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return f"topic {topic!r} is not valid Unicode (a lone surrogate has no UTF-8 form)"
    if size > TOPIC_MAX_BYTES:
        return (
            f"topic is longer than {TOPIC_MAX_BYTES} UTF-8 bytes ({size}; DefaultMessageStore.checkMessage)"
        )
    return ""


def check_topic(topic: object, what: str = "topic", *, with_offsets: bool = False) -> str:
    """A topic argument of a read or an offset call: `InvalidArgumentError` for a topic the store
    can never hold, and, ``with_offsets``, one containing '@' (the ``topic@group`` key of
    consumerOffset.json could not be split back)."""
    if problem := topic_problem(topic):
        raise InvalidArgumentError(f"{what}: {problem}")
    assert isinstance(topic, str)  # topic_problem raised otherwise
    if with_offsets and TOPIC_GROUP_SEPARATOR in topic:
        raise InvalidArgumentError(
            f"{what} {topic!r} contains {TOPIC_GROUP_SEPARATOR!r}, the separator of consumerOffset.json's "
            f"topic@group keys: a group cannot keep offsets for it"
        )
    return topic


def check_group(group: object) -> str:
    """`Validators.checkGroup`: non-blank, at most 255 characters, only ``^[%|a-zA-Z0-9_-]+$``."""
    if not isinstance(group, str):
        raise InvalidArgumentTypeError(f"group must be a str, not {_type_name(group)} ({group!r})")
    if not group.strip():
        raise InvalidArgumentError("the specified group is blank (Validators.checkGroup)")
    if len(group) > GROUP_MAX_LENGTH:
        raise InvalidArgumentError(
            f"the specified group is longer than group max length {GROUP_MAX_LENGTH} "
            f"({len(group)} characters; Validators.checkGroup)"
        )
    if not _VALID_NAME.fullmatch(group):
        raise InvalidArgumentError(
            f"the specified group[{group}] contains illegal characters, allowing only "
            f"{VALID_NAME_PATTERN} (Validators.checkGroup)"
        )
    return group


def body_bytes(body: object, what: str = "body") -> bytes:
    """A message body: bytes or bytearray as given (typed bytes, as the encoders take both);
    another buffer as its bytes (a memoryview's ``len`` counts items, not bytes). Anything else:
    `InvalidArgumentTypeError`."""
    if type(body) is bytes or type(body) is bytearray:
        return cast(bytes, body)
    if isinstance(body, (str, int)) or body is None:
        raise InvalidArgumentTypeError(f"{what} must be bytes, not {_type_name(body)}")
    try:
        return memoryview(body).tobytes()  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentTypeError(f"{what} must be bytes, not {_type_name(body)}") from None


def flag_problem(flag: object) -> str:
    """Why a message flag cannot be stored ('' when it can): a Java int. Wrong type: raises."""
    value = integer(flag, "flag")
    if not -JAVA_INT_MAX - 1 <= value <= JAVA_INT_MAX:
        return f"flag {value} does not fit a Java int"
    return ""


def check_properties(tags: object, keys: object, properties: object) -> None:
    """The types of a message's tags (str), keys (str or a sequence of str) and properties (a
    mapping of str to str): `InvalidArgumentTypeError` naming the first that is wrong."""
    if tags is not None and not isinstance(tags, str):
        raise InvalidArgumentTypeError(f"tags must be a str, not {_type_name(tags)} ({tags!r})")
    if (keys is not None and not isinstance(keys, str)) and (
        not isinstance(keys, Sequence) or not all(isinstance(k, str) for k in keys)
    ):
        raise InvalidArgumentTypeError(f"keys must be a str or a sequence of str, not {keys!r}")
    if properties is not None:
        if not isinstance(properties, Mapping):
            raise InvalidArgumentTypeError(
                f"properties must be a mapping of str to str, not {_type_name(properties)}"
            )
        for name, value in properties.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise InvalidArgumentTypeError(
                    f"properties must map str to str: {name!r}: {value!r} is {_type_name(name)}: "
                    f"{_type_name(value)}"
                )


PROPERTY_SEPARATORS = (m.NAME_VALUE_SEPARATOR, m.PROPERTY_SEPARATOR)
"""``\\x01`` between a property's name and value, ``\\x02`` between properties: text holding one
would set other properties (``KEYS``, ``TAGS``) when the record is read back, so a message with
one in a property name or value, its tags or its keys is MESSAGE_ILLEGAL."""


def separator_problem(tags: object, keys: object, properties: object) -> str:
    """Which of tags, keys, a property name or a property value holds a property separator
    (the MESSAGE_ILLEGAL reason), '' when none does. The slow path: the encoders look at the
    whole properties string first (`message_batch.properties_text`, `message.stray_separators`)."""
    named: list[tuple[str, object]] = [("tags", tags)]
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        named.append(("keys", keys))
    else:
        named += [("keys", key) for key in keys]
    if isinstance(properties, Mapping):
        for name, value in properties.items():
            named += [(f"property name {name!r}", name), (f"value of property {name!r}", value)]
    for what, text in named:
        if isinstance(text, str):
            for separator in PROPERTY_SEPARATORS:
                if separator in text:
                    return (
                        f"{what} contains {separator!r}, a separator of the properties string: "
                        f"it would set other properties when read back"
                    )
    return ""


def send_problem(
    topic: object,
    body: object,
    queue_id: object,
    flag: object,
    tags: object = None,
    keys: object = None,
    properties: object = None,
) -> str:
    """What is wrong with a send's arguments, for the slow path after an encode failed: raises
    `InvalidArgumentTypeError` for a wrong type, returns the MESSAGE_ILLEGAL reason for a value
    the store refuses, '' when it finds nothing (the failure was not the caller's)."""
    problem = topic_problem(topic)
    body_bytes(body)
    if properties or tags or keys:  # falsy ones are "none given", as the send path takes them
        check_properties(tags, keys, properties)
    flag_reason = flag_problem(flag)  # every type is checked before any value is judged
    queue_reason = "" if queue_id is None else queue_id_problem(integer(queue_id, "queue_id"))
    problem = problem or _text_problem(tags, keys, properties) or separator_problem(tags, keys, properties)
    return problem or queue_reason or flag_reason


def _text_problem(tags: object, keys: object, properties: object) -> str:
    """Tags, keys or properties (of the right types) that have no UTF-8 form: a lone surrogate."""
    texts: list[str] = [tags] if isinstance(tags, str) else []
    texts += [keys] if isinstance(keys, str) else list(keys) if isinstance(keys, Sequence) else []
    if isinstance(properties, Mapping):
        texts += [f"{name}{value}" for name, value in properties.items()]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"properties are not valid Unicode (a lone surrogate has no UTF-8 form): {text!r}"
    return ""


def message_problem(message: Any) -> str:
    """`send_problem` for a `Message` handed to `send_batch` or `MessageStore.put_message`: its
    queue id is an int (None picks no queue there)."""
    integer(message.queue_id, "queue_id")
    problem = send_problem(
        message.topic, message.body, message.queue_id, message.flag, properties=message.properties
    )
    for what in ("sys_flag", "reconsume_times"):
        found = flag_problem(getattr(message, what)).replace("flag", what, 1)
        problem = problem or found
    for what in ("born_host", "store_host"):
        host = getattr(message, what)
        if host is None and what == "store_host":
            continue
        try:
            m.parse_host(host)
        except (TypeError, ValueError):
            problem = problem or f"{what} {host!r} is not an (IP address, port) pair"
    for what in ("born_timestamp", "prepared_transaction_offset"):
        value = integer(getattr(message, what), what)
        if not problem and not -JAVA_LONG_MAX - 1 <= value <= JAVA_LONG_MAX:
            problem = f"{what} {value} does not fit a Java long"
    return problem


def check_option_names(what: str, options: Mapping[str, str], valid: Iterable[str]) -> None:
    """`ConfigError` for an option the source or sink does not know, naming the closest valid
    one (as broker.conf typos are): Spark would pass a misspelled option on silently."""
    valid = tuple(valid)
    known = {name.lower() for name in valid}
    for key in options:
        if key.lower() not in known:
            close = closest_name(key, valid)
            hint = f"; did you mean {close!r}?" if close else f" (options: {', '.join(valid)})"
            raise ConfigError(f"{what}: unknown option {key!r}{hint}")
