"""Hostile arguments against a real running store: every public call answers a RocketMQ status
or raises a typed error (`InvalidArgumentError`, `InvalidArgumentTypeError` for a wrong type),
never a bare assert or a traceback from deep inside, and a refused send stores nothing.

The expected outcome is computed here from RocketMQ's rules (docs/format.md §3.2 and
`Validators.checkGroup`), independently of `rmq_mp.validators`: a topic of at most 127 UTF-8
bytes that can name a directory, queue ids 0..2^31-1, flags Java ints, offsets Java longs, groups
of 1-255 characters of ``[%|a-zA-Z0-9_-]``.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError, StoreNotRunningError
from rmq_mp.format import message as m
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendResult
from shm import layout
from tests.service import RunningService, running_service, wait_until

T = TypeVar("T")
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
GROUP_CHARS = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
TOPIC_127_ASCII = "t" * 127
TOPIC_127_UTF8 = "é" * 63 + "t"  # 127 bytes in 64 characters
TOPIC_128_ASCII = "t" * 128
TOPIC_128_UTF8 = "é" * 64  # 128 bytes in 64 characters: RocketMQ 4.9.8 counts 64 chars, the record bytes
EXAMPLES = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# ------------------------------------------------------------------ the rules, stated here


def topic_refused(topic: str) -> bool:
    """The store refuses it (MESSAGE_ILLEGAL): no directory can be named so, or over 127 bytes."""
    if topic in ("", ".", "..") or "/" in topic or "\0" in topic:
        return True
    try:
        return len(topic.encode("utf-8")) > 127
    except UnicodeEncodeError:
        return True


def is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_bytes(value: object) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def property_types_wrong(tags: object, keys: object, properties: object) -> bool:
    if not (properties or tags or keys):
        return False  # nothing given (falsy values are "none")
    if tags is not None and not isinstance(tags, str):
        return True
    if (keys is not None and not isinstance(keys, str)) and (
        not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)
    ):
        return True
    if properties is not None:
        if not isinstance(properties, Mapping):
            return True
        return not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items())
    return False


def send_type_wrong(args: dict[str, Any]) -> bool:
    return (
        not isinstance(args["topic"], str)
        or not is_bytes(args["body"])
        or not (args["queue_id"] is None or is_int(args["queue_id"]))
        or not is_int(args["flag"])
        or property_types_wrong(args["tags"], args["keys"], args["properties"])
    )


def texts_of(*values: object) -> list[str]:
    """The texts among tags, keys (a str or a list) and properties (names and values)."""
    texts: list[str] = []
    for value in values:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            texts += value
        elif isinstance(value, dict):
            texts += [*value, *value.values()]
    return texts


def unencodable(*values: object) -> bool:
    """A text among tags, keys and properties with no UTF-8 form (a lone surrogate)."""
    return any(re.search("[\ud800-\udfff]", text) for text in texts_of(*values))


def separators(*values: object) -> bool:
    """A text among tags, keys, property names and values holding \\x01 or \\x02, RocketMQ's
    properties-string separators (reading it back would set other properties)."""
    return any("\x01" in text or "\x02" in text for text in texts_of(*values))


def send_value_refused(args: dict[str, Any]) -> bool:
    queue_id = args["queue_id"]
    given = args["properties"] or args["tags"] or args["keys"]
    return (
        topic_refused(args["topic"])
        or (bool(given) and unencodable(args["tags"], args["keys"], args["properties"]))
        or (bool(given) and separators(args["tags"], args["keys"], args["properties"]))
        or (queue_id is not None and not 0 <= queue_id <= INT_MAX)
        or (queue_id is not None and queue_id >= 8)  # not one of the topic's defaultTopicQueueNums queues
        or not -INT_MAX - 1 <= args["flag"] <= INT_MAX
    )


def group_ok(group: object) -> bool:
    return (
        isinstance(group, str)
        and 1 <= len(group) <= 255
        and re.fullmatch(r"[%|a-zA-Z0-9_-]+", group) is not None
    )


# ------------------------------------------------------------------ hostile values

ODD = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3), st.binary(max_size=3),
    st.lists(st.integers(), max_size=2), st.just(object()),
)  # fmt: skip
TOPICS = st.one_of(
    st.text(alphabet="ABCab_-%|", min_size=1, max_size=12),
    st.sampled_from([TOPIC_127_ASCII, TOPIC_127_UTF8, TOPIC_128_ASCII, TOPIC_128_UTF8, "主题-τ", "a@b",
                     "", ".", "..", "a/b", "a\0b", "a\udc80", "t" * 300]),
    st.text(max_size=140),
    ODD,
)  # fmt: skip
QUEUE_IDS = st.one_of(
    st.integers(0, 7),
    st.sampled_from([-1, INT_MAX, INT_MAX + 1, -(2**31), 2**63, -(2**70)]),
    st.integers(-(2**70), 2**70),
    st.builds(np.int64, st.integers(0, 7)),
    ODD,
)
INTS = st.one_of(st.integers(-(2**33), 2**33), st.sampled_from([INT_MAX, INT_MAX + 1, -(2**31) - 1]), ODD)
BODIES = st.one_of(
    st.binary(max_size=40),
    st.builds(bytearray, st.binary(max_size=8)),
    st.binary(max_size=8).map(lambda b: memoryview(b)),
    st.builds(lambda: memoryview(array("i", [1, 2]))),
    st.text(max_size=4),
    st.none(),
    st.integers(),
)
INJECTED = ["x\x02KEYS\x01injected\x02y", "v\x02TAGS\x01Z", "\x01", "a\x02", "TAGS\x01Z"]
"""Issue 18's injections: each would set KEYS or TAGS (or cut a property) when read back."""
TAGS = st.one_of(
    st.none(), st.text(alphabet="AB", max_size=3), st.integers(), st.lists(st.text(max_size=2), max_size=2),
    st.sampled_from(INJECTED),
)  # fmt: skip
KEYS = st.one_of(
    st.none(), st.text(alphabet="k1 ", max_size=4), st.lists(st.text(alphabet="k2", min_size=1, max_size=3), max_size=3),
    st.integers(), st.lists(st.integers(), min_size=1, max_size=2), st.sampled_from(INJECTED),
    st.lists(st.sampled_from(["k", *INJECTED]), min_size=1, max_size=2),
)  # fmt: skip
PROPERTIES = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["a", "b", "cc"]), st.text(alphabet="xyz", min_size=1, max_size=3), max_size=2
    ),
    st.dictionaries(
        st.sampled_from(["a", 1]), st.one_of(st.integers(), st.text(max_size=2)), min_size=1, max_size=2
    ),
    st.lists(st.tuples(st.text(max_size=2), st.text(max_size=2)), min_size=1, max_size=2),
    st.dictionaries(
        st.sampled_from(["a", *INJECTED]), st.sampled_from(["v", *INJECTED]), min_size=1, max_size=2
    ),
)
SEND_ARGS = st.fixed_dictionaries(
    {
        "topic": TOPICS,
        "body": BODIES,
        "queue_id": st.one_of(st.none(), QUEUE_IDS),
        "flag": st.one_of(st.just(0), INTS),
        "tags": TAGS,
        "keys": KEYS,
        "properties": PROPERTIES,
    }
)


def attempt(call: Callable[[], T]) -> T | InvalidArgumentError:
    """What ``call`` returned, or the typed error it raised (any other exception propagates)."""
    try:
        return call()
    except InvalidArgumentError as exc:
        return exc


def wrote(service: RunningService) -> int:
    return service.read(layout.WROTE_POSITION)


def check_send_outcome(args: dict[str, Any], outcome: SendResult | Exception) -> None:
    """The outcome RocketMQ's rules give ``args`` (a send, or one item of a batch)."""
    type_wrong = send_type_wrong(args)
    refused = not type_wrong and send_value_refused(args)
    if type_wrong:
        assert isinstance(outcome, InvalidArgumentTypeError), (args, outcome)
        assert isinstance(outcome, TypeError)
    elif refused:
        assert isinstance(outcome, SendResult), (args, outcome)
        assert outcome.status is PutMessageStatus.MESSAGE_ILLEGAL, (args, outcome)
        assert outcome.reason
        assert outcome.commit_log_offset == -1
        assert outcome.msg_id == ""
    else:
        assert isinstance(outcome, SendResult), (args, outcome)
        assert outcome.status is PutMessageStatus.PUT_OK, (args, outcome)


# ------------------------------------------------------------------ send / send_batch


def test_hostile_sends_get_a_status_or_a_typed_error_and_refused_ones_store_nothing(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:

        @EXAMPLES
        @given(args=SEND_ARGS)
        def one(args: dict[str, Any]) -> None:
            before = wrote(service)
            outcome = attempt(lambda: producer.send(**args))
            check_send_outcome(args, outcome)
            if not (isinstance(outcome, SendResult) and outcome.ok):
                assert wrote(service) == before, f"a refused send stored something: {args}"
            else:
                assert wrote(service) > before

        one()


def test_hostile_batches_are_refused_whole_for_a_wrong_type_and_per_item_for_a_value(tmp_path: Path) -> None:
    """A wrong type anywhere raises before anything is stored; a value the store refuses is
    that item's MESSAGE_ILLEGAL, the others are stored (each item of a list is its own put)."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:

        @EXAMPLES
        @given(items=st.lists(SEND_ARGS, min_size=1, max_size=4))
        def batch(items: list[dict[str, Any]]) -> None:
            before = wrote(service)
            results = attempt(lambda: list(producer.send_batch([dict(item) for item in items])))
            if isinstance(results, InvalidArgumentError):
                assert isinstance(results, InvalidArgumentTypeError), (items, results)
                assert any(send_type_wrong(item) for item in items), (items, results)
                assert wrote(service) == before, "a batch refused for a type stored something"
                return
            assert not any(send_type_wrong(item) for item in items), items
            for item, result in zip(items, results, strict=True):
                check_send_outcome(item, result)
            if not any(r.ok for r in results):
                assert wrote(service) == before

        batch()


def test_a_wrong_type_raises_even_where_a_value_is_refused_too(tmp_path: Path) -> None:
    """A wrong type is a programming error and raises whatever else is wrong: a send never
    answers MESSAGE_ILLEGAL for a call that would not compile in Java."""
    both: list[dict[str, Any]] = [
        dict(topic=TOPIC_128_UTF8, body=b"x", queue_id=0, flag="1"),
        dict(topic=TOPIC_128_ASCII, body="text", queue_id=0),
        dict(topic="", body=b"x", queue_id=0, tags=5),
        dict(topic="a/b", body=b"x", keys=[1]),
        dict(topic="T", body=None, queue_id=-1),
        dict(topic="T", body=b"x", queue_id=2**40, flag=1.5),
        dict(topic="T", body=b"x", queue_id=-1, properties={"a": 1}),
        dict(topic=None, body=b"x", queue_id=-1),
    ]
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        for args in both:
            with pytest.raises(InvalidArgumentTypeError):
                producer.send(**args)
            with pytest.raises(InvalidArgumentTypeError):
                producer.send_batch([dict(topic="T", body=b"first", queue_id=0), args])
        assert wrote(service) == 0


def test_buffers_are_stored_as_their_bytes(tmp_path: Path) -> None:
    """A memoryview of ints has ``len`` items but 4x as many bytes: stored as its bytes (BODYLEN
    and CRC of those), never a record whose length field disagrees with its body."""
    wide = [memoryview(array("i", [1, 2])), memoryview(array("i", [3, 4]))]
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        # Any buffer is a body (`Body`, which type checkers take too); how they are stored is the point.
        assert producer.send("Buf", wide[0], queue_id=0).ok
        assert producer.send_batch(MessageBatch("Buf", wide, queue_id=0)).ok
        assert producer.send_batch(MessageBatch("Buf", [wide[0], b"xyz"], queue_id=0)).ok
        assert producer.send_batch([dict(topic="Buf", body=wide[1], queue_id=0)]).ok
        expected = [bytes(wide[0]), bytes(wide[0]), bytes(wide[1]), bytes(wide[0]), b"xyz", bytes(wide[1])]
        wait_until(lambda: len(consumer.pull("Buf", 0, 0).messages) == 6, 10, "six dispatched")
        assert [x.body for x in consumer.pull("Buf", 0, 0).messages] == expected
        assert service.read(layout.WROTE_POSITION) > 0


def test_a_message_batch_with_hostile_fields(tmp_path: Path) -> None:
    """RocketMQ's batch: stored whole or refused whole."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:

        @EXAMPLES
        @given(topic=TOPICS, queue_id=st.one_of(st.none(), QUEUE_IDS), flag=st.one_of(st.just(0), INTS),
               bodies=st.lists(BODIES, min_size=1, max_size=3))  # fmt: skip
        def batch(topic: Any, queue_id: Any, flag: Any, bodies: list[Any]) -> None:
            args = dict(
                topic=topic, body=b"", queue_id=queue_id, flag=flag, tags=None, keys=None, properties=None
            )
            type_wrong = send_type_wrong(args) or not all(is_bytes(b) for b in bodies)
            before = wrote(service)
            results = attempt(
                lambda: list(producer.send_batch(MessageBatch(topic, bodies, queue_id=queue_id, flag=flag)))
            )
            if isinstance(results, InvalidArgumentError):
                assert isinstance(results, InvalidArgumentTypeError), (args, bodies, results)
                assert type_wrong, (args, bodies, results)
                assert wrote(service) == before
                return
            assert not type_wrong, (args, bodies)
            statuses = {r.status for r in results}
            expected = (
                PutMessageStatus.MESSAGE_ILLEGAL if send_value_refused(args) else PutMessageStatus.PUT_OK
            )
            assert statuses == {expected}, (args, results)
            if expected is not PutMessageStatus.PUT_OK:
                assert wrote(service) == before

        batch()


def test_messages_with_hostile_fields_in_a_batch(tmp_path: Path) -> None:
    """`Message` items (stored as given): a status or a typed error, never a deep traceback."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        cases: list[tuple[m.Message, PutMessageStatus | type[Exception]]] = [
            (m.Message(topic="M", body=b"ok"), PutMessageStatus.PUT_OK),
            (m.Message(topic=TOPIC_128_UTF8, body=b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
            (m.Message(topic="M", body=b"x", queue_id=2**40), PutMessageStatus.MESSAGE_ILLEGAL),
            (m.Message(topic="M", body=b"x", queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL),
            (m.Message(topic="M", body=b"x", sys_flag=2**40), PutMessageStatus.MESSAGE_ILLEGAL),
            (m.Message(topic="M", body=b"x", born_timestamp=2**64), PutMessageStatus.MESSAGE_ILLEGAL),
            (m.Message(topic="M", body=b"x", born_host=("not-an-ip", 1)), PutMessageStatus.MESSAGE_ILLEGAL),
            (m.Message(topic="M", body="text"), InvalidArgumentTypeError),  # type: ignore[arg-type]
            (m.Message(topic=None, body=b"x"), InvalidArgumentTypeError),  # type: ignore[arg-type]
            (m.Message(topic="M", body=b"x", queue_id=1.5), InvalidArgumentTypeError),  # type: ignore[arg-type]
        ]
        for message, expected in cases:
            before = wrote(service)
            if isinstance(expected, PutMessageStatus):
                result = producer.send_batch([message])[0]
                assert result.status is expected, (message, result)
                if expected is not PutMessageStatus.PUT_OK:
                    assert result.reason
                    assert wrote(service) == before
            else:
                with pytest.raises(expected):
                    producer.send_batch([message])
                assert wrote(service) == before
        not_messages: object
        for not_messages in (
            None,
            5,
            "abc",
            b"abc",
            {"topic": "M", "body": b"x"},
            [None],
            [{}],
            [{"topic": "M"}],
        ):
            with pytest.raises(InvalidArgumentTypeError):
                producer.send_batch(not_messages)  # type: ignore[arg-type]


def found(consumer: Consumer, topic: str, queue_id: int) -> Callable[[], bool]:
    """Whether offset 0 of the queue is readable (a predicate for `wait_until`)."""
    return lambda: consumer.pull(topic, queue_id, 0).status is GetMessageStatus.FOUND


def test_topics_at_and_past_127_bytes(tmp_path: Path) -> None:
    """127 UTF-8 bytes (ASCII, and 64 characters of which 63 are two bytes) are stored, read and
    committed; 128 bytes are MESSAGE_ILLEGAL for a send (nothing stored, no queue created) and
    an `InvalidArgumentError` for a pull or a commit."""
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        for topic in (TOPIC_127_ASCII, TOPIC_127_UTF8):
            assert producer.send(topic, b"kept", queue_id=3).ok
            wait_until(found(consumer, topic, 3), 10, "dispatched")
            assert [x.topic for x in consumer.pull(topic, 3, 0).messages] == [topic]
            consumer.commit({(topic, 3): 1})
            assert consumer.committed_offset(topic, 3) == 1
        for topic in (TOPIC_128_ASCII, TOPIC_128_UTF8):
            before = wrote(service)
            result = producer.send(topic, b"refused", queue_id=3)
            assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
            assert "127 UTF-8 bytes" in result.reason
            batch = producer.send_batch(MessageBatch(topic, [b"a", b"b"], queue_id=3))
            assert [r.status for r in batch] == [PutMessageStatus.MESSAGE_ILLEGAL] * 2
            assert wrote(service) == before
            assert consumer.queues.find(topic, 3) < 0, "no queue for a refused topic"
            with pytest.raises(InvalidArgumentError, match="127 UTF-8 bytes"):
                consumer.pull(topic, 3, 0)
            with pytest.raises(InvalidArgumentError, match="127 UTF-8 bytes"):
                consumer.commit({(topic, 3): 1})


# ------------------------------------------------------------------ pull / commit / subscribe

BAD_TIMEOUTS = [-1, -0.5, math.nan, math.inf, -math.inf, 2**70, 1e300]
"""Refused waits: negative, NaN, infinite, or beyond Long.MAX_VALUE milliseconds (posix_ipc once
raised ExistentialError for NaN and gave up at once past what a timespec holds)."""
PULL_ARGS = st.fixed_dictionaries(
    {
        "topic": TOPICS,
        "queue_id": QUEUE_IDS,
        "offset": st.one_of(st.integers(-3, 3), st.sampled_from([LONG_MAX, LONG_MAX + 1, -(2**63) - 1]), ODD),
        "max_msgs": st.one_of(st.integers(-2, 40), st.just(2**40), ODD),
        "tags": st.one_of(st.none(), st.frozensets(st.sampled_from(["A", "B"])), st.sets(st.just("A")),
                          st.text(max_size=2), st.lists(st.just("A"), max_size=1), st.frozensets(st.integers(), min_size=1)),
        "timeout_s": st.one_of(st.sampled_from([0, 0.0, 0.001, *BAD_TIMEOUTS]), st.none(), st.text(max_size=1), st.just(True)),
    }
)  # fmt: skip


def pull_problems(args: dict[str, Any]) -> tuple[bool, bool]:
    """(a wrong type, a value RocketMQ refuses) among a pull's arguments."""
    topic, queue_id, offset, max_msgs, tags = (
        args[k] for k in ("topic", "queue_id", "offset", "max_msgs", "tags")
    )
    timeout = args["timeout_s"]
    type_wrong = (
        not isinstance(topic, str)
        or not is_int(queue_id)
        or not is_int(offset)
        or not is_int(max_msgs)
        or not (
            tags is None or (isinstance(tags, (set, frozenset)) and all(isinstance(t, str) for t in tags))
        )
        or not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool))
    )
    value_wrong = (
        (isinstance(topic, str) and topic_refused(topic))
        or (is_int(queue_id) and not 0 <= queue_id <= INT_MAX)
        or (is_int(offset) and not -(2**63) <= offset <= LONG_MAX)
        or (is_int(max_msgs) and max_msgs < 1)
        or (isinstance(timeout, (int, float)) and not 0 <= timeout <= LONG_MAX // 1000)
    )
    return type_wrong, value_wrong


def test_hostile_pulls_get_a_status_or_a_typed_error(tmp_path: Path) -> None:
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        for i in range(3):
            assert producer.send("AB", f"m{i}".encode(), queue_id=0, tags="A").ok
        wait_until(lambda: len(consumer.pull("AB", 0, 0).messages) == 3, 10, "three dispatched")

        @EXAMPLES
        @given(args=PULL_ARGS)
        def one(args: dict[str, Any]) -> None:
            type_wrong, value_wrong = pull_problems(args)
            result = attempt(lambda: consumer.pull(**args))
            if isinstance(result, InvalidArgumentError):
                assert type_wrong or value_wrong, (args, result)
                if not value_wrong:
                    assert isinstance(result, InvalidArgumentTypeError), (args, result)
                if not type_wrong:
                    assert not isinstance(result, TypeError), (args, result)
                return
            assert not type_wrong, (args, result)
            assert not value_wrong, (args, result)
            assert isinstance(result.status, GetMessageStatus)
            if args["offset"] < 0 and consumer.queues.find(args["topic"], int(args["queue_id"])) >= 0:
                assert result.status is GetMessageStatus.OFFSET_TOO_SMALL, (args, result)
            if result.status is GetMessageStatus.FOUND:
                assert 1 <= len(result.messages) <= args["max_msgs"]

        one()


def commit_entry_problems(key: Any, offset: Any) -> tuple[bool, bool]:
    if not isinstance(key, tuple) or len(key) != 2:
        return True, False
    topic, queue_id = key
    type_wrong = not isinstance(topic, str) or not is_int(queue_id) or not is_int(offset)
    value_wrong = (
        (isinstance(topic, str) and (topic_refused(topic) or "@" in topic))
        or (is_int(queue_id) and not 0 <= queue_id <= INT_MAX)
        or (is_int(offset) and not 0 <= offset <= LONG_MAX)
    )
    return type_wrong, value_wrong


def test_hostile_commits_record_all_or_nothing(tmp_path: Path) -> None:
    """A commit with any bad entry raises a typed error and records none of its entries."""
    with running_service(tmp_path) as service, Consumer.attach(service.root, "g") as consumer:
        keys = st.one_of(st.tuples(TOPICS, QUEUE_IDS), st.tuples(st.just("C"), st.integers(0, 3)), ODD)
        offsets = st.one_of(st.integers(-2, 100), st.sampled_from([LONG_MAX, LONG_MAX + 1]), ODD)

        @EXAMPLES
        @given(entries=st.lists(st.tuples(keys, offsets), max_size=4))
        def one(entries: list[tuple[Any, Any]]) -> None:
            try:
                offsets_given = dict(entries)
            except TypeError:
                return  # not hashable: no dict to commit
            before = dict(consumer.committed)
            table_before = {q: consumer.committed_offset("C", q) for q in range(4)}
            problems = [commit_entry_problems(k, o) for k, o in offsets_given.items()]
            committed = attempt(lambda: consumer.commit(offsets_given))
            if isinstance(committed, InvalidArgumentError):
                assert any(t or v for t, v in problems), (entries, committed)
                if not any(v for _t, v in problems):
                    assert isinstance(committed, InvalidArgumentTypeError), (entries, committed)
                assert consumer.committed == before, "a refused commit recorded something"
                assert {q: consumer.committed_offset("C", q) for q in range(4)} == table_before
                return
            assert not any(t or v for t, v in problems), (entries, committed)
            for (topic, queue_id), offset in offsets_given.items():
                assert consumer.committed_offset(topic, int(queue_id)) == offset

        one()
        for not_offsets in ([("C", 0, 1)], "C", 5, {"C": 1}, {("C",): 1}):
            with pytest.raises(InvalidArgumentTypeError):
                consumer.commit(not_offsets)  # type: ignore[arg-type]


def test_hostile_subscriptions_and_offset_queries(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Consumer.attach(service.root, "g") as consumer:

        @EXAMPLES
        @given(topic=TOPICS, expression=st.one_of(st.just("*"), st.just("A || B"), ODD),
               starts=st.one_of(st.none(), st.dictionaries(st.integers(-2, 3), st.integers(-2, 3), max_size=2),
                                st.dictionaries(st.integers(0, 3), ODD, min_size=1, max_size=1), ODD))  # fmt: skip
        def one(topic: Any, expression: Any, starts: Any) -> None:
            bad_topic = not isinstance(topic, str) or topic_refused(topic) or "@" in topic
            bad_expression = not isinstance(expression, str)
            bad_starts = bool(starts) and not (
                isinstance(starts, dict) and all(is_int(q) and q >= 0 and is_int(o) and o >= 0 for q, o in starts.items())
            )  # fmt: skip
            bad = bad_topic or bad_expression or bad_starts
            subscribed = attempt(lambda: consumer.subscribe(topic, expression, from_offsets=starts))
            assert isinstance(subscribed, InvalidArgumentError) == bad, (
                topic,
                expression,
                starts,
                subscribed,
            )
            if not bad:
                assert consumer.subscriptions[topic].next_offsets == dict(starts or {})
            committed = attempt(lambda: consumer.committed_offset(topic, 0))
            assert committed == -1 or bad_topic, (topic, committed)
            assert isinstance(committed, InvalidArgumentError) == bad_topic, (topic, committed)

        one()
        with pytest.raises(InvalidArgumentError, match="maxNums"):
            consumer.poll(0, max_msgs=0)
        with pytest.raises(InvalidArgumentTypeError):
            consumer.poll("1")  # type: ignore[arg-type]


# ------------------------------------------------------------------ attach

GROUPS = st.one_of(
    st.text(alphabet=GROUP_CHARS, min_size=1, max_size=255),
    st.sampled_from(
        ["g" * 255, "g" * 256, "", " ", "a b", "a@b", "é", "组", "a.b", "a/b", "a\0b", "%RETRY%g"]
    ),
    st.text(max_size=300),
    ODD,
)


def test_groups_follow_validators_check_group(tmp_path: Path) -> None:
    """`Validators.checkGroup`: 1-255 characters of ``^[%|a-zA-Z0-9_-]+$``; anything else raises
    before the store is attached (no waiter slot, no mapping taken)."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        assert producer.send("G", b"x", queue_id=0).ok

        @settings(max_examples=60, deadline=None, database=None)
        @given(group=GROUPS)
        def one(group: Any) -> None:
            consumer = attempt(lambda: Consumer.attach(service.root, group))
            if isinstance(consumer, InvalidArgumentError):
                assert not group_ok(group), (group, consumer)
                assert isinstance(consumer, TypeError) == (not isinstance(group, str))
                if isinstance(group, str):
                    assert "Validators.checkGroup" in str(consumer)
                return
            with consumer:
                assert group_ok(group), group
                wait_until(lambda: consumer.pull("G", 0, 0).status is GetMessageStatus.FOUND, 10, "readable")

        one()
        with pytest.raises(InvalidArgumentError, match="longer than group max length 255"):
            Consumer.attach(service.root, "g" * 256)
        with Consumer.attach(service.root, "g" * 255) as longest:
            assert longest.pull("G", 0, 0).status is GetMessageStatus.FOUND
            longest.commit({(TOPIC_127_UTF8, 0): 1, ("G", 0): 1})  # the longest key: 127 + 1 + 255 bytes
            assert longest.committed_offset(TOPIC_127_UTF8, 0) == 1
        with Consumer.attach(service.root, "g" * 255) as again:  # another view of the table
            assert (again.committed_offset(TOPIC_127_UTF8, 0), again.committed_offset("G", 0)) == (1, 1)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        (None, InvalidArgumentTypeError),
        (5, InvalidArgumentTypeError),
        (b"rmq_x", InvalidArgumentTypeError),
        ("", InvalidArgumentError),
        ("rmq_\0bad", InvalidArgumentError),  # once a segmentation fault in the shm library
        ("a b", InvalidArgumentError),
        ("x" * 65, InvalidArgumentError),
        ("/no/such/store/dir", StoreNotRunningError),
        ("rmq_nosuchstore", StoreNotRunningError),
    ],
)
def test_attach_by_a_hostile_name(name: Any, error: type[Exception]) -> None:
    for attach in (Producer.attach, lambda n: Consumer.attach(n, "g")):
        with pytest.raises(error):
            attach(name)


def test_falsy_tags_are_none_given_also_when_a_value_is_refused(tmp_path: Path) -> None:
    """``tags=0`` is "no tags" on the send path; the diagnosis of a refused value (here a flag
    past a Java int) took it for a wrong type and raised (found by hypothesis in a CI-like run)."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        result = producer.send("A", b"x", tags=0, flag=2**31)  # type: ignore[arg-type]
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "Java int" in result.reason
        assert producer.send("A", b"x", tags=0).ok  # type: ignore[arg-type]
