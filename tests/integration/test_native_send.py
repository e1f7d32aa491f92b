"""The compiled `send` and the Python reference give the same records, journal and results.

One producer on a real store sends each generated message twice: through `Producer.send` (the
compiled core takes it, or hands it to the reference, which the test sees in `Sender.sent`) and
through the reference itself (`Producer._send`). The two records, read back from the commit-log
file, are byte-identical once the fields that must differ are set aside (queue and physical
offset, born and store time, the time and counter of the UNIQ_KEY, and so the digits of the
whole-record CRC, each checked against the record's own bytes); the results agree; the put
journal in the pointer table describes each put the same way. Refusals are compared too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
import subprocess
import sys
import zlib
from collections import UserList
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.format import message as m
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.format.record import (
    CRC32_RESERVED_LEN,
    CRC_PLACEHOLDER,
    POS_BORN_TIMESTAMP,
    POS_PHY_OFFSET,
    POS_QUEUE_OFFSET,
    crc_digits,
    peek_sys_flag,
    store_timestamp_position,
)
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendResult
from rmq_mp.tools.monitoring import StoreCollector
from shm import layout
from shm.layout import Role
from shm.metrics import MetricsTable
from tests.service import ROOT, RunningService, running_service

pytestmark = pytest.mark.skipif(native.core is None, reason=f"no compiled core: {native.why_reference}")

QUEUES = 4
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
JOURNAL = (
    layout.JOURNAL_ACTIVE,
    layout.JOURNAL_WROTE_BEFORE,
    layout.JOURNAL_WROTE_AFTER,
    layout.JOURNAL_QUEUE_SLOT,
    layout.JOURNAL_QUEUE_OFFSET_BEFORE,
)


def _record(service: RunningService, phy_offset: int) -> bytes:
    """The record at ``phy_offset``, read from its commit-log file."""
    base = max(int(p.name) for p in (service.root / "commitlog").iterdir() if int(p.name) <= phy_offset)
    with (service.root / "commitlog" / f"{base:020d}").open("rb") as f:
        f.seek(phy_offset - base)
        size = struct.unpack(">i", f.read(4))[0]
        return struct.pack(">i", size) + f.read(size - 4)


def _checked(raw: bytes) -> bytes:
    """``raw`` up to its properties' end: the whole-record CRC tail (on by default) checked
    (digits and place as `record.fill_record_crc` writes them) and cut off."""
    assert raw.endswith(b"\x02"), "the properties end in the CRC tail"
    tail = raw[-CRC32_RESERVED_LEN:]
    assert tail[:9] == CRC_PLACEHOLDER[:9]
    assert tail[9:19] == crc_digits(zlib.crc32(raw[:-CRC32_RESERVED_LEN]) & 0x7FFFFFFF)
    assert raw[-CRC32_RESERVED_LEN - 1] == 2, "a separator before it"
    return raw[: -CRC32_RESERVED_LEN - 1]


def _comparable(raw: bytes, *, ours: bool = True) -> bytes:
    """``raw`` with the fields two sends of one message differ in zeroed (the CRC digits too;
    ``ours``: it has a UNIQ_KEY, the producer's)."""
    _checked(raw)
    data = bytearray(raw)
    data[-11:-1] = bytes(10)
    data[POS_QUEUE_OFFSET : POS_PHY_OFFSET + 8] = bytes(16)
    data[POS_BORN_TIMESTAMP : POS_BORN_TIMESTAMP + 8] = bytes(8)
    at = store_timestamp_position(peek_sys_flag(raw, 0))  # after the born host, IPv4 or IPv6
    data[at : at + 8] = bytes(8)
    at = data.rfind(b"UNIQ_KEY\x01")
    if at < 0 and not ours:
        return bytes(data)
    assert at > 0
    data[at + 9 + 20 : at + 9 + 32] = b"T" * 12  # time since the month began, counter
    return bytes(data)


def _journal(service: RunningService) -> tuple[int, ...]:
    table = service.table()
    try:
        return tuple(table.get(f) for f in JOURNAL)
    finally:
        table.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[RunningService, Producer]]:
    """One store for every example of a test (a store's processes end with each test)."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        assert producer.send("Warm", b"w", queue_id=0).ok  # maps the file
        yield service, producer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    topic=st.sampled_from(["Same", "Same2", "ünï"]),
    body=st.binary(max_size=600),
    tags=st.none() | TEXT,
    keys=st.none() | TEXT,
    queue_id=st.none() | st.integers(0, QUEUES + 2),
    flag=st.integers(-(2**31), 2**31 - 1),
)
def test_the_core_and_the_reference_store_the_same_bytes(
    store: tuple[RunningService, Producer],
    topic: str,
    body: bytes,
    tags: str | None,
    keys: str | None,
    queue_id: int | None,
    flag: int,
) -> None:
    service, producer = store
    core = producer._native
    assert core is not None
    sent_before = core.sent
    fast = producer.send(topic, body, tags=tags, keys=keys, queue_id=queue_id, flag=flag)
    fast_journal = _journal(service)
    took_core = core.sent == sent_before + 1
    qid = fast.queue_id if queue_id is None else queue_id
    slow = producer._send(topic, body, tags, keys, None, qid, flag, queue_id is not None)
    slow_journal = _journal(service)
    assert core.sent == sent_before + took_core, "the reference send never enters the core"
    assert (fast.status, fast.reason, fast.queue_id) == (slow.status, slow.reason, slow.queue_id)
    if not fast.ok:
        assert fast.commit_log_offset == slow.commit_log_offset == -1
        return
    assert slow.queue_offset == fast.queue_offset + 1
    assert fast.msg_id_prefix == slow.msg_id_prefix
    fast_raw, slow_raw = _record(service, fast.commit_log_offset), _record(service, slow.commit_log_offset)
    assert _comparable(fast_raw) == _comparable(slow_raw)
    assert struct.unpack_from(">qq", fast_raw, POS_QUEUE_OFFSET) == (
        fast.queue_offset,
        fast.commit_log_offset,
    )
    assert _checked(fast_raw).endswith(fast.uniq_key.encode()), "the UNIQ_KEY result is the one stored"
    if took_core:  # the journal describes each put the same way, cleared once committed
        assert fast_journal[0] == slow_journal[0] == 0
        assert fast_journal[1:3] == (fast.commit_log_offset, fast.commit_log_offset + len(fast_raw))
        assert slow_journal[1:3] == (slow.commit_log_offset, slow.commit_log_offset + len(slow_raw))
        assert fast_journal[3] == slow_journal[3]
        assert (fast_journal[4], slow_journal[4]) == (fast.queue_offset, slow.queue_offset)


def test_the_common_send_is_taken_by_the_core(store: tuple[RunningService, Producer]) -> None:
    """The fast path is really used: plain sends, with tags and keys, without a queue id."""
    _, producer = store
    core = producer._native
    assert core is not None
    before = core.sent
    results: list[SendResult] = [
        producer.send("Same", os.urandom(128), queue_id=i % QUEUES) for i in range(50)
    ]
    results += [producer.send("Same", b"t", tags="TagA", keys="k1", queue_id=1) for _ in range(50)]
    results += [producer.send("Same", b"r") for _ in range(50)]
    assert all(r.ok for r in results)
    queues = {(r.queue_id) for r in results}
    assert len(queues) == 8, "the rotation covers the topic's 8 queues (defaultTopicQueueNums)"
    assert core.sent - before == len(results) - len(queues), "only a queue's first send is the reference's"
    assert len({r.uniq_key for r in results}) == len(results)


@contextlib.contextmanager
def _reference_only(producer: Producer) -> Iterator[None]:
    """The reference put path for the sends inside (the compiled sender set aside, not closed)."""
    core, producer._native = producer._native, None
    try:
        yield
    finally:
        producer._native = core


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=40),
    uniform=st.booleans(),
    tags=st.none() | TEXT,
    queue_id=st.none() | st.integers(0, QUEUES - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
)
def test_a_batch_is_stored_the_same_by_the_core_and_the_reference(
    store: tuple[RunningService, Producer],
    bodies: list[bytes],
    uniform: bool,
    tags: str | None,
    queue_id: int | None,
    flag: int,
) -> None:
    service, producer = store
    core = producer._native
    assert core is not None
    if uniform:
        bodies = [bodies[0]] * len(bodies)
    batch = MessageBatch("Batch", bodies, queue_id=queue_id, tags=tags, flag=flag)
    sent_before = core.sent
    fast = producer.send_batch(batch)
    took_core = core.sent == sent_before + len(bodies)
    with _reference_only(producer):
        slow = producer.send_batch(dataclasses.replace(batch, queue_id=fast[0].queue_id))
    assert fast.ok == slow.ok
    assert fast.failures == slow.failures
    assert [(r.status, r.reason, r.queue_id) for r in fast] == [
        (r.status, r.reason, r.queue_id) for r in slow
    ]
    if not fast.ok:
        return
    assert list(slow.queue_offsets()) == [q + len(bodies) for q in fast.queue_offsets()]
    for a, b in zip(fast, slow, strict=True):
        fast_raw, slow_raw = _record(service, a.commit_log_offset), _record(service, b.commit_log_offset)
        assert _comparable(fast_raw) == _comparable(slow_raw)
        assert struct.unpack_from(">qq", fast_raw, POS_QUEUE_OFFSET) == (a.queue_offset, a.commit_log_offset)
        assert _checked(fast_raw).endswith(a.uniq_key.encode())
    assert list(fast.commit_log_offsets()) == [r.commit_log_offset for r in fast]
    if took_core:
        assert _journal(service)[0] == 0


def test_batches_are_taken_by_the_core(store: tuple[RunningService, Producer]) -> None:
    _, producer = store
    core = producer._native
    assert core is not None
    producer.send_batch(MessageBatch("B", [b"x"], queue_id=2))  # the queue's first: the reference's
    before = core.sent
    for size in (1, 100, 300):
        result = producer.send_batch(MessageBatch("B", [os.urandom(128)] * size, queue_id=2, tags="T"))
        assert result.ok
        assert len(result) == size
    assert core.sent - before == 401


PROPERTY_NAMES = st.sampled_from(
    ["a", "TAGS", "KEYS", "WAIT", "DELAY", "REAL_TOPIC", "REAL_QID", "UNIQ_KEY", "x\x01y", ""]
)
PROPERTY_VALUES = st.sampled_from(["true", "false", "0", "3", "+2", "99", "-1", "abc", "", "v\x02w"]) | TEXT
BODY_TYPES = st.sampled_from([bytes, bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8)])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(max_size=400),
    body_type=BODY_TYPES,
    tags=st.none() | TEXT,
    keys=st.none() | TEXT | st.lists(TEXT, max_size=3) | st.lists(TEXT, max_size=3).map(tuple),
    properties=st.none() | st.dictionaries(PROPERTY_NAMES | TEXT, PROPERTY_VALUES, max_size=4),
    queue_id=st.none() | st.integers(0, QUEUES - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
)
def test_every_send_shape_is_stored_the_same_by_the_core_and_the_reference(
    store: tuple[RunningService, Producer],
    body: bytes,
    body_type: Any,
    tags: str | None,
    keys: str | list[str] | tuple[str, ...] | None,
    properties: dict[str, str] | None,
    queue_id: int | None,
    flag: int,
) -> None:
    """Keys as a sequence, user properties (WAIT, UNIQ_KEY, TAGS and KEYS given twice, DELAY with
    its schedule rewrite, separators refused), buffer bodies: the same bytes and results."""
    service, producer = store
    core = producer._native
    assert core is not None
    given_body = body_type(body)
    fast = producer.send(
        "Shapes", given_body, tags=tags, keys=keys, properties=properties, queue_id=queue_id, flag=flag
    )
    qid = fast.queue_id if queue_id is None else queue_id
    slow = producer._send("Shapes", body_type(body), tags, keys, properties, qid, flag, queue_id is not None)
    assert (fast.status, fast.reason, fast.queue_id) == (slow.status, slow.reason, slow.queue_id)
    if not fast.ok:
        assert fast.commit_log_offset == slow.commit_log_offset == -1
        return
    if properties and "UNIQ_KEY" in properties:
        assert fast.uniq_key == slow.uniq_key == properties["UNIQ_KEY"]
    assert slow.queue_offset == fast.queue_offset + 1
    fast_raw, slow_raw = _record(service, fast.commit_log_offset), _record(service, slow.commit_log_offset)
    given_uniq = properties is not None and "UNIQ_KEY" in properties
    assert _comparable(fast_raw, ours=not given_uniq) == _comparable(slow_raw, ours=not given_uniq)
    assert fast.uniq_key.encode() in fast_raw, "the UNIQ_KEY result is the one stored"


# tags objects that recur across a sequence's sends (with other topics and keys: one template's
# key is the objects' identity, crc_rest_template), and fresh ones
SEQUENCE_TAGS = st.none() | st.sampled_from(["TagA", "TagB", "", "ü"]) | TEXT
SEQUENCE_KEYS = (
    st.none()
    | st.sampled_from(["k1", "k2", "k1 k2"])
    | TEXT
    | st.lists(TEXT, max_size=3)
    | st.lists(TEXT, max_size=3).map(tuple)
)
EMPTY_PROPERTIES: dict[str, str] = {}
SEQUENCE_PROPERTIES = (
    st.none()
    | st.just(EMPTY_PROPERTIES)
    | st.dictionaries(PROPERTY_NAMES | TEXT, PROPERTY_VALUES, max_size=3)
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sends=st.lists(
        st.tuples(
            st.sampled_from(["Seq", "Seq2", "ünï"]),
            st.integers(0, 700),
            SEQUENCE_TAGS,
            SEQUENCE_KEYS,
            SEQUENCE_PROPERTIES,
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=6,
    ),
    clmul=st.booleans(),
)
def test_a_sequence_of_sends_is_stored_the_same_by_the_core_and_the_reference(
    store: tuple[RunningService, Producer],
    sends: list[tuple[str, int, str | None, Any, dict[str, str] | None, int]],
    clmul: bool,
) -> None:
    """The whole-record CRC's topic and properties from the Sender's template (a constant per
    topic, tags and keys, the UNIQ_KEY's time and counter as products: `crc_rest_template`): a
    sequence of sends that repeat a message (the template taken), change topic, tags, keys (str,
    list, tuple; a list changed between two sends of it), properties or body size (the template
    made again or not used), by multiplication and by table (PCLMULQDQ off): every record the
    bytes the reference stores, its CRC digits zlib's."""
    service, producer = store
    assert native.lock_core is not None
    native.lock_core._set_clmul(clmul)
    try:
        for topic, body_size, tags, keys, properties, repeats in sends:
            body = os.urandom(body_size)
            fast = []
            for i in range(repeats):
                fast.append(
                    producer.send(topic, body, tags=tags, keys=keys, properties=properties, queue_id=i % 2)
                )
                if isinstance(keys, list):  # the same list object, other keys: no template of it
                    keys.append(f"m{i}")
            for i, result in enumerate(fast):
                sent_keys = keys[: len(keys) - repeats + i] if isinstance(keys, list) else keys
                slow = producer._send(topic, body, tags, sent_keys, properties, result.queue_id, 0, True)
                assert (result.status, result.reason) == (slow.status, slow.reason)
                if not result.ok:
                    continue
                given_uniq = properties is not None and "UNIQ_KEY" in properties
                fast_raw = _record(service, result.commit_log_offset)
                slow_raw = _record(service, slow.commit_log_offset)
                assert _comparable(fast_raw, ours=not given_uniq) == _comparable(
                    slow_raw, ours=not given_uniq
                )
    finally:
        native.lock_core._set_clmul(True)


def test_a_repeated_send_takes_its_crc_template(store: tuple[RunningService, Producer]) -> None:
    """Sends of one topic, tags and keys objects make the rest's CRC constant once
    (`crc_templates` counts them) and then take it; another topic, other tags or keys objects (one
    text in two str objects too), a list of keys or a batch's own shape make it again or do
    without; every record's CRC digits are zlib's."""
    service, producer = store
    core = producer._native
    assert core is not None
    assert native.lock_core is not None
    assert native.lock_core._set_clmul(True), "the template is the multiplying CRC's"
    for qid in range(2):  # each queue's first send is the reference's
        for topic in ("Tpl", "Tpl2"):
            assert producer.send(topic, b"q", queue_id=qid).ok
    tag_a, tag_b = "TagA", "".join(["Tag", "A"])  # one text, two objects
    assert tag_a == tag_b
    assert tag_a is not tag_b
    sends: list[tuple[str, str | None, Any, int]] = [  # topic, tags, keys, templates made
        ("Tpl", None, None, 1),
        ("Tpl", None, None, 0),
        ("Tpl", tag_a, "k1", 1),
        ("Tpl", tag_a, "k1", 0),
        ("Tpl2", tag_a, "k1", 1),
        ("Tpl2", tag_b, "k1", 1),
        ("Tpl2", tag_b, ["k1"], 0),  # a list: no template, the last kept
        ("Tpl2", tag_b, "k1", 0),
        ("Tpl2", tag_b, "k2", 1),  # as long as the last: only the objects tell
        ("Tpl2", "TagB", "k2", 1),
        ("Tpl", "TagB", "k2", 1),
    ]
    results: list[SendResult] = []
    for topic, tags, keys, made in sends:
        before, sent = core.crc_templates, core.sent
        for i in range(20):
            results.append(producer.send(topic, os.urandom(100 + i), tags=tags, keys=keys, queue_id=i % 2))
        assert core.sent - sent == 20, "the core's sends"
        assert core.crc_templates - before == made, (topic, tags, keys)
    before = core.crc_templates
    batch = producer.send_batch(MessageBatch("Tpl", [b"a", b"bb"] * 20, queue_id=1, tags=tag_a))
    assert batch.ok
    assert core.crc_templates - before == 1, "a batch's records share one template"
    results += list(batch)
    assert all(r.ok for r in results)
    for r in results:
        _checked(_record(service, r.commit_log_offset))


BATCH_KEYS = st.none() | TEXT | st.lists(TEXT, max_size=3) | st.lists(TEXT, max_size=2).map(tuple)
BATCH_PROPERTY_NAMES = st.sampled_from(["a", "TAGS", "KEYS", "WAIT", "DELAY", "UNIQ_KEY", "x\x01y", ""])
BATCH_PROPERTY_VALUES = st.sampled_from(["true", "false", "0", "-1", "3", "abc", "", "v\x02w"]) | TEXT


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=12),
    body_type=BODY_TYPES,
    as_tuple=st.booleans(),
    tags=st.none() | TEXT,
    keys=st.none() | st.lists(BATCH_KEYS, min_size=12, max_size=12),
    properties=st.none() | st.dictionaries(BATCH_PROPERTY_NAMES | TEXT, BATCH_PROPERTY_VALUES, max_size=3),
    queue_id=st.none() | st.integers(0, QUEUES - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
)
def test_every_batch_shape_is_stored_the_same_by_the_core_and_the_reference(
    store: tuple[RunningService, Producer],
    bodies: list[bytes],
    body_type: Any,
    as_tuple: bool,
    tags: str | None,
    keys: list[Any] | None,
    properties: dict[str, str] | None,
    queue_id: int | None,
    flag: int,
) -> None:
    """A `MessageBatch` with per-message keys (None, a str, a list or tuple of str), common tags
    and properties (WAIT, a given UNIQ_KEY, TAGS and KEYS given twice, DELAY 0 kept, a delay
    level refused, separators refused), buffer bodies in a list or tuple: the core stores the
    bytes and results the reference stores, and takes every batch the reference stores."""
    service, producer = store
    core = producer._native
    assert core is not None
    if properties and "DELAY" in properties:  # MessageBatch refuses a level when made; set after
        delay, properties = properties["DELAY"], {k: v for k, v in properties.items() if k != "DELAY"}
    else:
        delay = None

    def batch(qid: int | None) -> MessageBatch:
        made = MessageBatch(
            "Batches",
            (tuple if as_tuple else list)(body_type(b) for b in bodies),
            queue_id=qid,
            tags=tags,
            keys=keys[: len(bodies)] if keys is not None else None,
            properties=None if properties is None else dict(properties),
            flag=flag,
        )
        if delay is not None:  # as a caller could after making it: the put refuses a level above 0
            object.__setattr__(made, "properties", {**(made.properties or {}), "DELAY": delay})
        return made

    sent_before, references_before = core.sent, _reference_sends(producer)
    fast = producer.send_batch(batch(queue_id))
    took_core, references_after = core.sent == sent_before + len(bodies), _reference_sends(producer)
    with _reference_only(producer):
        slow = producer.send_batch(batch(fast[0].queue_id))
    assert [(r.status, r.reason, r.queue_id) for r in fast] == [
        (r.status, r.reason, r.queue_id) for r in slow
    ]
    if not fast.ok:
        return
    if not took_core:  # a queue's first put, or the periodic look at topics.json: by design
        after = references_after
        assert {k: n - references_before[k] for k, n in after.items() if n != references_before[k]} == {
            "new_queue": len(bodies)
        }, "a batch the reference stores is the core's"
    given_uniq = properties is not None and "UNIQ_KEY" in properties
    if given_uniq:
        assert properties is not None
        assert (
            [r.uniq_key for r in fast] == [r.uniq_key for r in slow] == [properties["UNIQ_KEY"]] * len(bodies)
        )
    assert list(slow.queue_offsets()) == [q + len(bodies) for q in fast.queue_offsets()]
    for a, b in zip(fast, slow, strict=True):
        fast_raw, slow_raw = _record(service, a.commit_log_offset), _record(service, b.commit_log_offset)
        assert _comparable(fast_raw, ours=not given_uniq) == _comparable(slow_raw, ours=not given_uniq)
        assert struct.unpack_from(">qq", fast_raw, POS_QUEUE_OFFSET) == (a.queue_offset, a.commit_log_offset)
        assert a.uniq_key.encode() in fast_raw, "the UNIQ_KEY result is the one stored"
    assert _journal(service)[0] == 0


def _reference_sends(producer: Producer) -> dict[str, int]:
    table = MetricsTable.attach(producer.store.names.metrics, Role.CONSUMER)
    try:
        return table.totals().reference_sends
    finally:
        table.close()


SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("tags", {"tags": "TagA"}),
    ("tags and a key", {"tags": "TagA", "keys": "k1"}),
    ("a key as a list", {"tags": "TagA", "keys": ["k1"]}),
    ("keys as a tuple", {"keys": ("k1", "x")}),
    ("a user property", {"properties": {"a": "1"}}),
    (
        "properties with tags, keys, WAIT",
        {"tags": "T", "keys": ["a", "b"], "properties": {"a": "1", "WAIT": "false"}},
    ),
    ("a given UNIQ_KEY", {"properties": {"UNIQ_KEY": "0123456789ABCDEF0123456789ABCDEF"}}),
    ("a flag", {"flag": 7}),
    ("a delay", {"properties": {"DELAY": "2"}}),
    ("a delay past the last level", {"properties": {"DELAY": "99"}}),
]
BATCH_SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("tags", {"tags": "TagA"}),
    ("a key each", {"keys": [f"k{i}" for i in range(10)]}),
    (
        "keys as lists, tuples, None",
        {"tags": "T", "keys": [["a", f"{i}"] if i % 3 else (None if i % 2 else ("b",)) for i in range(10)]},
    ),
    ("a user property", {"properties": {"a": "1"}}),
    (
        "properties, tags, keys, WAIT",
        {"tags": "T", "keys": ["k"] * 10, "properties": {"a": "1", "WAIT": "false"}},
    ),
    ("a given UNIQ_KEY", {"properties": {"UNIQ_KEY": "0123456789ABCDEF0123456789ABCDEF"}}),
    ("a flag", {"flag": 7}),
]
BODIES: list[tuple[str, Any]] = [
    ("bytes", lambda b: b),
    ("bytearray", bytearray),
    ("memoryview", memoryview),
    ("numpy", lambda b: np.frombuffer(b, dtype=np.uint8)),
]


def test_every_documented_send_shape_is_sent_by_the_core(store: tuple[RunningService, Producer]) -> None:
    """README's send shapes, each after its queue's first send: none is served by the reference,
    by the core's own count and by the reference_sends metric (per reason, all zero)."""
    _, producer = store
    core = producer._native
    assert core is not None
    for queue_id in range(8):  # a queue's first send is the reference's, by design (8: rotated over)
        producer.send("Shape", b"w", queue_id=queue_id)
    for level in (2, 18):
        producer.send("Shape", b"w", queue_id=0, properties={"DELAY": str(level)})
    producer.send_batch(MessageBatch("Shape", [b"w"], queue_id=0))
    before, sent = _reference_sends(producer), core.sent
    expected = 0
    for name, shape in SHAPES:
        for body_name, make in BODIES:
            for qid in (0, None):
                result = producer.send("Shape", make(os.urandom(128)), queue_id=qid, **shape)
                assert result.ok, (name, body_name, result)
                expected += 1
                assert core.sent == sent + expected, f"{name} with a {body_name} body went to the reference"
    items = [
        {
            "topic": "Shape",
            "body": os.urandom(64),
            "tags": f"T{i % 3}",
            "keys": [f"k{i}", "x"],
            "properties": {"i": str(i)},
        }
        for i in range(100)
    ]
    batch = producer.send_batch(items)
    assert batch.ok
    assert len(batch) == 100
    batch = producer.send_batch(dict(item, queue_id=i % QUEUES) for i, item in enumerate(items))
    assert batch.ok
    assert [r.queue_id for r in batch] == [i % QUEUES for i in range(100)]
    assert producer.send_batch(MessageBatch("Shape", [os.urandom(128)] * 10, queue_id=0, tags="TagA")).ok
    expected += 210
    assert core.sent == sent + expected, "a send_batch went to the reference"
    for name, shape in BATCH_SHAPES:
        for body_name, make in BODIES:
            for qid in (0, None):
                for container in (list, tuple):
                    made = container(make(os.urandom(64 + i % 3)) for i in range(10))
                    sent_batch = producer.send_batch(MessageBatch("Shape", made, queue_id=qid, **shape))
                    assert sent_batch.ok, (name, body_name, sent_batch)
                    expected += 10
                    assert core.sent == sent + expected, (
                        f"a batch with {name}, {body_name} bodies: the reference's"
                    )
    assert core.sent == sent + expected, "a send_batch went to the reference"
    assert _reference_sends(producer) == before, "no send of these shapes is served by the reference"
    assert producer.send(
        "Shape", b"x", queue_id=1, keys=UserList(["a"])
    ).ok  # a Sequence, no list: the reference's
    after = _reference_sends(producer)
    assert after["argument"] == before["argument"] + 1, after


def test_status_and_metrics_count_the_reference_sends(store: tuple[RunningService, Producer]) -> None:
    """`run.py status` (JSON and text) and the metrics endpoint's collector show reference sends."""
    service, producer = store
    producer.send("Counted", b"x", queue_id=0)  # the queue's first send: the reference's (new_queue)
    producer.send("Counted", b"x", queue_id=0, keys=UserList(["k"]))  # argument
    run = [sys.executable, str(ROOT / "run.py"), "status", "--conf", str(service.conf)]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    sends = json.loads(out.stdout)["producer_metrics"]["reference_sends"]
    assert sends["new_queue"] >= 1
    assert sends["argument"] == 1
    text = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60, check=True).stdout
    assert "reference sends (not the compiled core)" in text
    assert "argument 1" in text
    collected = {
        sample.labels["reason"]: sample.value
        for family in StoreCollector(service.config).collect()
        if family.name == "rmq_put_reference_sends"
        for sample in family.samples
    }
    assert collected["argument"] == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=6),
    delay=st.sampled_from([None, "0", "2", "99", "x"]),
    reconsume_times=st.integers(0, 16),
    sys_flag=st.sampled_from([0, 0x4]),  # 0x4: a PREPARED transaction half, not dispatched
    born_host=st.sampled_from([("10.1.2.3", 4567), ("::1", 80)]),
)
def test_messages_are_stored_the_same_by_the_core_and_the_reference(
    store: tuple[RunningService, Producer],
    bodies: list[bytes],
    delay: str | None,
    reconsume_times: int,
    sys_flag: int,
    born_host: tuple[str, int],
) -> None:
    """`send_batch` of `Message`s (the push consumer's send-back, the scheduler's re-put): the
    core puts what the reference's encoder made, the same bytes and results."""
    service, producer = store
    properties = {"KEYS": "a b", "UNIQ_KEY": "0123456789ABCDEF0123456789ABCDEF"}
    if delay is not None:
        properties["DELAY"] = delay
    messages = [
        m.Message(
            topic="%RETRY%g",
            body=body,
            queue_id=0,
            properties=properties,
            reconsume_times=reconsume_times,
            sys_flag=sys_flag,
            born_timestamp=1_700_000_000_000,
            born_host=born_host,
        )
        for body in bodies
    ]
    fast = producer.send_batch(messages)
    with _reference_only(producer):
        slow = producer.send_batch(messages)
    assert [(r.status, r.reason, r.queue_id, r.uniq_key) for r in fast] == [
        (r.status, r.reason, r.queue_id, r.uniq_key) for r in slow
    ]
    for a, b in zip(fast, slow, strict=True):
        if a.ok:
            fast_raw, slow_raw = _record(service, a.commit_log_offset), _record(service, b.commit_log_offset)
            assert _comparable(fast_raw, ours=False) == _comparable(slow_raw, ours=False)
            assert struct.unpack_from(">q", fast_raw, POS_QUEUE_OFFSET)[0] == a.queue_offset


def test_messages_are_put_by_the_core(store: tuple[RunningService, Producer]) -> None:
    """A send-back to a retry topic, delayed and not, after each queue's first put."""
    _, producer = store
    core = producer._native
    assert core is not None
    back = [
        m.Message(topic="%RETRY%g", body=b"b", properties={"DELAY": level, "WAIT": "false"}, born_timestamp=1)
        for level in ("0", "3")
    ]
    producer.send_batch(back)  # the queues' first: the reference's
    sent, before = core.sent, _reference_sends(producer)
    assert producer.send_batch(back * 10).ok
    assert core.sent == sent + 20
    assert _reference_sends(producer) == before


def test_a_topic_sent_only_delayed_messages_is_the_cores_after_its_first(
    store: tuple[RunningService, Producer],
) -> None:
    """A delayed send is stored on the schedule queue, never on its own, so no put teaches the
    core the sender's queue: the reference's first delayed send teaches it the topic's limit,
    and every later one, on any of the topic's queues, named or rotated, is the core's."""
    _, producer = store
    core = producer._native
    assert core is not None
    delay = {"DELAY": "3"}
    first = producer.send("OnlyDelayed", b"d", queue_id=0, properties=delay)  # new_queue: by design
    assert first.ok
    before, sent = _reference_sends(producer), core.sent
    results = [producer.send("OnlyDelayed", b"d", queue_id=q % 8, properties=delay) for q in range(40)]
    results += [producer.send("OnlyDelayed", b"d", properties=delay) for _ in range(40)]
    assert all(r.ok for r in results)
    assert sorted({r.queue_id for r in results}) == list(range(8))
    assert core.sent == sent + 80, "every delayed send after the first is the core's"
    assert _reference_sends(producer) == before
    refused = producer.send("OnlyDelayed", b"d", queue_id=8, properties=delay)  # past the topic's 8
    assert refused.status.name == "MESSAGE_ILLEGAL", refused
    assert "queue id 8 is illegal" in refused.reason
