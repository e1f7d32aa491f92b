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
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.format.record import (
    CRC32_RESERVED_LEN,
    CRC_PLACEHOLDER,
    POS_BORN_TIMESTAMP,
    POS_PHY_OFFSET,
    POS_QUEUE_OFFSET,
    crc_digits,
)
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendResult
from shm import layout
from tests.service import RunningService, running_service

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


def _comparable(raw: bytes) -> bytes:
    """``raw`` with the fields two sends of one message differ in zeroed (the CRC digits too)."""
    _checked(raw)
    data = bytearray(raw)
    data[-11:-1] = bytes(10)
    data[POS_QUEUE_OFFSET : POS_PHY_OFFSET + 8] = bytes(16)
    data[POS_BORN_TIMESTAMP : POS_BORN_TIMESTAMP + 8] = bytes(8)
    data[56:64] = bytes(8)  # STORETIMESTAMP (IPv4 born host)
    at = data.rfind(b"UNIQ_KEY\x01")
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
