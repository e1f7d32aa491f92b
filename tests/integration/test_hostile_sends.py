"""Hostile values for one argument at a time of `Producer.send` (both put paths) and
`Consumer.pull`, against a running store: each call answers a status or raises
`InvalidArgumentError` (typed), every PUT_OK reads back with its body, and the store keeps
serving. (The fuzz that wrote this found nothing in 1,400 sends and 700 pulls; this is its guard.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import InvalidArgumentError
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from tests.service import RunningService, running_service

EXAMPLES = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
SEPARATORS = ["\x00", "\x01", "\x02", "%", "@", "|", " ", "\n", "主", "\U0001f600"]
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.binary(max_size=40),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    st.sampled_from([np.int64(3), np.uint64(2**64 - 1), bytearray(b"ab"), memoryview(b"xy"), object(), 1.5]),
)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda a, sep, b: a + sep + b, st.text(max_size=10), st.sampled_from(SEPARATORS), st.text(max_size=10)
    ),
    st.text(min_size=120, max_size=300),
)
HUGE = st.integers(-(1 << 70), 1 << 70)
SEND_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "topic": st.one_of(HOSTILE_TEXT, ANYTHING, HUGE),
    "body": st.one_of(st.binary(max_size=2000), ANYTHING, st.just(b"x" * (4 * 1024 * 1024 + 1))),
    "tags": st.one_of(HOSTILE_TEXT, ANYTHING, HUGE),
    "keys": st.one_of(HOSTILE_TEXT, st.lists(HOSTILE_TEXT, max_size=3), ANYTHING),
    "properties": st.one_of(
        st.dictionaries(
            st.one_of(HOSTILE_TEXT, st.none(), st.integers(-5, 5), st.binary(max_size=4)),
            st.one_of(HOSTILE_TEXT, ANYTHING),
            max_size=3,
        ),
        ANYTHING,
    ),
    "queue_id": st.one_of(HUGE, ANYTHING),
    "flag": st.one_of(HUGE, ANYTHING),
}
PULL_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "topic": st.one_of(HOSTILE_TEXT, ANYTHING, HUGE),
    "queue_id": st.one_of(HUGE, ANYTHING),
    "offset": st.one_of(HUGE, ANYTHING),
    "max_msgs": st.one_of(HUGE, ANYTHING),
    "timeout_s": st.one_of(  # never a real wait: a long one is a legitimate pull
        st.floats(max_value=0.01),
        st.integers(-(1 << 70), -1),
        st.integers(1 << 63, 1 << 70),
        st.sampled_from([float("nan"), float("-inf"), "1", None, True, object()]),
    ),
    "tags": st.one_of(
        st.frozensets(HOSTILE_TEXT, max_size=3), st.sets(st.text(max_size=3), max_size=2), ANYTHING
    ),
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunningService]:
    with running_service(tmp_path) as service:
        yield service


def _read_back(service: RunningService, stored: list[tuple[str, int, int, bytes]]) -> None:
    with Consumer.attach(service.names.base, "readback") as consumer:
        for topic, queue_id, queue_offset, body in stored:
            result = consumer.pull(topic, queue_id, queue_offset, 1, timeout_s=20)  # until reput has it
            assert result.status is GetMessageStatus.FOUND, (topic, queue_id, queue_offset, result)
            assert result.messages[0].body == body


@pytest.mark.parametrize("path", ["core", "reference"])
def test_hostile_send_arguments_are_typed_refusals_and_lose_nothing(
    store: RunningService, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "reference":
        monkeypatch.setattr(native, "core", None)
    elif native.core is None:
        pytest.skip(f"no compiled core: {native.why_reference}")
    stored: list[tuple[str, int, int, bytes]] = []
    with Producer.attach(store.names.base) as producer:

        @EXAMPLES
        @given(
            data=st.data(),
            which=st.sampled_from(sorted(SEND_FIELDS)),
            topic=st.text("abcXYZ019_-%|", min_size=1, max_size=12),
            body=st.binary(max_size=100),
        )
        def send(data: st.DataObject, which: str, topic: str, body: bytes) -> None:
            args: dict[str, Any] = {"topic": topic, "body": body, "tags": None, "keys": None}
            args |= {"properties": None, "queue_id": None, "flag": 0}
            args[which] = data.draw(SEND_FIELDS[which], label=which)
            try:
                result = producer.send(
                    args["topic"], args["body"], tags=args["tags"], keys=args["keys"],
                    properties=args["properties"], queue_id=args["queue_id"], flag=args["flag"],
                )  # fmt: skip
            except InvalidArgumentError:
                return
            assert isinstance(result.status, PutMessageStatus)
            if result.status is PutMessageStatus.PUT_OK:
                assert isinstance(args["topic"], str)
                stored.append(
                    (args["topic"], result.queue_id, result.queue_offset, memoryview(args["body"]).tobytes())
                )

        send()
        assert producer.send("Afterwards", b"still serving").status is PutMessageStatus.PUT_OK
    assert stored  # the fuzz reached the store, not only the checks
    _read_back(store, stored)


def test_hostile_pull_arguments_are_typed_refusals(store: RunningService) -> None:
    with Producer.attach(store.names.base) as producer:
        for queue_id in range(4):
            assert producer.send("Pulled", b"m", queue_id=queue_id).status is PutMessageStatus.PUT_OK
    with Consumer.attach(store.names.base, "hostile") as consumer:

        @EXAMPLES
        @given(
            data=st.data(),
            which=st.sampled_from(sorted(PULL_FIELDS)),
            queue_id=st.integers(0, 7),
            offset=st.integers(0, 3),
        )
        def pull(data: st.DataObject, which: str, queue_id: int, offset: int) -> None:
            args: dict[str, Any] = {"topic": "Pulled", "queue_id": queue_id, "offset": offset}
            args |= {"max_msgs": 4, "timeout_s": 0.0, "tags": None}
            args[which] = data.draw(PULL_FIELDS[which], label=which)
            try:
                result = consumer.pull(
                    args["topic"], args["queue_id"], args["offset"], args["max_msgs"],
                    timeout_s=args["timeout_s"], tags=args["tags"],
                )  # fmt: skip
            except InvalidArgumentError:
                return
            assert isinstance(result.status, GetMessageStatus)

        pull()
        assert consumer.pull("Pulled", 0, 0, 1, timeout_s=20).status is GetMessageStatus.FOUND
