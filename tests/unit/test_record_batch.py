"""record_batch decodes exactly what record.check_record reads one record at a time.

Logs are built byte by byte (v1 and v2 magic, IPv4 and IPv6 hosts, raw properties strings with
odd separators, NUL tails, bad CRCs, wrong lengths, blank records), scanned in one call, and
compared field by field, key hash by key hash, with the per-record walk, including where and why
each stops. Uniform logs must take the column-wise path (``one_by_one == 0``). Every test runs
twice: with the compiled scan (rmq_mp/format/_scan.c, which hands unusual records to numpy) and
with the numpy decoder alone (the reference)."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.format import message as m
from rmq_mp.format import native, record, record_batch
from rmq_mp.store.index_service import index_keys

STORE_TS = 1_795_345_092_000
ANY_FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
"""The scanner fixture is set once per test, not per example: nothing to reset between them."""


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def scanner(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with the compiled scan, then with numpy alone."""
    saved = native.scan.active
    if request.param == "compiled":
        if native.scan.built is None:
            pytest.skip(f"no compiled scan: {native.scan.why_not_built}")
        native.scan.active = native.scan.built
    else:
        native.scan.active = None
    try:
        yield request.param
    finally:
        native.scan.active = saved


@dataclass
class Spec:
    """One record to build; ``props``/``topic`` are raw bytes so anything can be written."""

    topic: bytes = b"BenchTopic"
    props: bytes = b""
    body: bytes = b"body"
    sys_flag: int = 0
    queue_id: int = 0
    queue_offset: int = 0
    store_ts: int = STORE_TS
    v2: bool = False
    bad_crc: bool = False
    size_delta: int = 0


def build(spec: Spec, phy_offset: int) -> bytes:
    """A record as the put path lays it out (record.py's table), with optional damage."""
    born = b"\x20\x01\x0d\xb8" + bytes(12) if spec.sys_flag & m.BORNHOST_V6_FLAG else b"\x0a\x00\x00\x01"
    store = (
        b"\x20\x01\x0d\xb8" + bytes(11) + b"\x05"
        if spec.sys_flag & m.STOREHOSTADDRESS_V6_FLAG
        else b"\x0a\x00\x00\x05"
    )
    crc = record.body_crc(spec.body) ^ (1 if spec.bad_crc else 0)
    topic_len = struct.pack(">H", len(spec.topic)) if spec.v2 else bytes([len(spec.topic)])
    parts = [
        struct.pack(">iii", crc, spec.queue_id, 7),
        struct.pack(">qqiq", spec.queue_offset, phy_offset, spec.sys_flag, spec.store_ts - 3),
        born,
        struct.pack(">i", 40000),
        struct.pack(">q", spec.store_ts),
        store,
        struct.pack(">iiqi", 10911, 0, 0, len(spec.body)),
        spec.body,
        topic_len,
        spec.topic,
        struct.pack(">h", len(spec.props)),
        spec.props,
    ]
    rest = b"".join(parts)
    magic = record.MESSAGE_MAGIC_CODE_V2 if spec.v2 else record.MESSAGE_MAGIC_CODE
    return struct.pack(">ii", 8 + len(rest) + spec.size_delta, magic) + rest


def build_log(specs: list[Spec], *, blank_after: int = -1, tail: bytes = b"") -> bytearray:
    log = bytearray()
    for i, spec in enumerate(specs):
        log += build(spec, len(log))
        if i == blank_after:
            log += record.encode_blank(64) + bytes(56)
    return log + tail


def per_record(buf: bytes, pos: int, limit: int, check_crc: bool, max_records: int):
    """The reference: `check_record` one at a time."""
    found: list[tuple[int, record.DispatchRequest]] = []
    while pos < limit and len(found) < max_records:
        req = record.check_record(buf, pos, limit, check_crc=check_crc)
        if not (req.success and req.size > 0):
            return found, pos, req
        found.append((pos, req))
        pos += req.size
    return found, pos, None


def assert_same_as_per_record(
    buf: bytes, *, check_crc: bool = True, max_records: int = 1 << 30, pos: int = 0
) -> record_batch.SegmentScan:
    limit = len(buf)
    scan = record_batch.scan_segment(
        buf, pos, limit, file_from_offset=1 << 20, check_crc=check_crc, max_records=max_records
    )
    found, stop, tail = per_record(buf, pos, limit, check_crc, max_records)
    batch = scan.batch
    assert len(batch) == len(found)
    keys = []
    for i, (position, req) in enumerate(found):
        assert batch.position[i] == position + (1 << 20)
        assert batch.phy_offset[i] == batch.position[i], "dispatch writes a record's place"
        assert batch.topics[batch.topic_index[i]] == req.topic
        got = tuple(
            int(getattr(batch, f)[i])
            for f in (
                "queue_id",
                "size",
                "queue_offset",
                "sys_flag",
                "store_timestamp",
                "tags_code",
            )
        )
        assert got == (
            req.queue_id, req.size, req.queue_offset, req.sys_flag, req.store_timestamp, req.tags_code
        ), i  # fmt: skip
        assert bool(batch.ends_in_nul[i]) == req.ends_in_nul
        keys += [(i, m.index_key_hash(k)) for k in index_keys(req)]
    assert list(zip(batch.key_record.tolist(), batch.key_hash.tolist(), strict=True)) == keys
    assert scan.stop == stop
    if tail is None:
        assert scan.tail is None
    else:
        assert scan.tail is not None
        assert (scan.tail.size, scan.tail.success, scan.tail.reason) == (tail.size, tail.success, tail.reason)
    return scan


def props(*pairs: tuple[str, str]) -> bytes:
    return m.properties_to_string(dict(pairs)).encode()


def uniq(i: int) -> str:
    return f"7F00000112AB{i:020X}"


# ------------------------------------------------------------------------------ uniform logs


def test_producer_records_take_the_column_wise_path() -> None:
    specs = [
        Spec(props=props(("UNIQ_KEY", uniq(i))), queue_id=i % 8, queue_offset=i // 8, body=bytes(128))
        for i in range(3000)
    ]
    scan = assert_same_as_per_record(bytes(build_log(specs)))
    assert len(scan.batch) == 3000
    assert scan.one_by_one == 0
    assert len(scan.batch.key_hash) == 3000


def test_tags_and_multi_word_keys_column_wise() -> None:
    words = ["a", "bb", "ccc", "ORD12", "k", "订"]
    rnd = random.Random(4)
    specs = []
    for i in range(2000):
        keys = " ".join(rnd.choice(words[:5]) for _ in range(rnd.randint(1, 3)))
        if i % 7 == 0:
            keys = "  " + keys + "  x "  # empty words between, before and after
        specs.append(
            Spec(
                topic=rnd.choice([b"T1", b"Topic-2", "主题-τ".encode()]),
                props=props(("TAGS", rnd.choice(["TagA", "TagB"])), ("KEYS", keys), ("UNIQ_KEY", uniq(i))),
                body=rnd.randbytes(rnd.randint(0, 300)),
                queue_id=rnd.randrange(4),
                sys_flag=rnd.choice([0, 0, 0, m.TRANSACTION_PREPARED_TYPE, m.TRANSACTION_COMMIT_TYPE]),
            )
        )
    scan = assert_same_as_per_record(bytes(build_log(specs)))
    assert scan.one_by_one == 0, "ASCII properties and any topic: all column-wise"


def test_a_record_with_thousands_of_keys_grows_the_key_columns() -> None:
    many = " ".join(f"k{i}" for i in range(3000))
    specs = [
        Spec(props=props(("UNIQ_KEY", uniq(i)), ("KEYS", many if i % 5 == 2 else "a b"))) for i in range(12)
    ]
    scan = assert_same_as_per_record(bytes(build_log(specs)))
    assert len(scan.batch.key_hash) == 12 + 2 * 3000 + 10 * 2


def test_the_compiled_scan_reads_common_records_alone(scanner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer records never reach numpy when the scan is compiled; an unusual record does,
    and the compiled scan takes over again after FALLBACK_RECORDS."""
    calls: list[int] = []
    numpy_scan = record_batch.scan_segment_numpy

    def counted(*args: object, **kwargs: object) -> record_batch.SegmentScan:
        calls.append(1)
        return numpy_scan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(record_batch, "scan_segment_numpy", counted)
    plain = [Spec(props=props(("UNIQ_KEY", uniq(i))), queue_offset=i) for i in range(2000)]
    assert_same_as_per_record(bytes(build_log(plain)))
    assert len(calls) == (0 if scanner == "compiled" else 1)
    calls.clear()
    delayed = [  # SCHEDULE_TOPIC_XXXX: the delivery time is computed in the scan too
        Spec(topic=m.SCHEDULE_TOPIC.encode(), props=props(("DELAY", d), ("UNIQ_KEY", uniq(i)), ("TAGS", "t")))
        for i, d in enumerate(["3", "18", "99", "0", "-2", "+4", "007"] * 20)
    ]
    assert_same_as_per_record(bytes(build_log([*plain[:10], *delayed, *plain[:10]])))
    assert len(calls) == (0 if scanner == "compiled" else 1)
    calls.clear()
    odd = Spec(topic="主题".encode(), props=b"KEYS\x01k")
    scan = assert_same_as_per_record(bytes(build_log([*plain[:10], odd, *plain])))
    assert len(calls) == 1
    assert len(scan.batch) == 2011


def test_a_store_s_own_delay_levels_give_the_delivery_times() -> None:
    """messageDelayLevel of the store (not the default): the same delivery time both ways."""
    levels = [250, 4000, 90_000]
    specs = [
        Spec(
            topic=m.SCHEDULE_TOPIC.encode(),
            props=props(("DELAY", d), ("UNIQ_KEY", uniq(i))),
            store_ts=STORE_TS + i,
        )
        for i, d in enumerate(["1", "2", "3", "4", "18", "0", "x", " 2"] * 5)
    ]
    buf = bytes(build_log(specs))
    scan = record_batch.scan_segment(
        buf, 0, len(buf), file_from_offset=0, check_crc=True, delay_level_ms=levels, max_records=1000
    )
    pos, expected = 0, []
    while pos < len(buf):
        req = record.check_record(buf, pos, len(buf), check_crc=True, delay_level_ms=levels)
        expected.append(req.tags_code)
        pos += req.size
    assert scan.batch.tags_code.tolist() == expected
    clamped = [STORE_TS + 2 + 90_000, STORE_TS + 3 + 90_000, STORE_TS + 4 + 90_000]
    assert expected[:5] == [STORE_TS + 250, STORE_TS + 1 + 4000, *clamped]


def test_batch_limits_and_start_positions() -> None:
    specs = [Spec(props=props(("UNIQ_KEY", uniq(i)), ("KEYS", f"k{i} j{i}"))) for i in range(50)]
    log = bytes(build_log(specs))
    sizes = [len(build(s, 0)) for s in specs]
    for max_records in (1, 3, 17, 50, 51):
        assert_same_as_per_record(log, max_records=max_records)
    assert_same_as_per_record(log, pos=sum(sizes[:10]))


# ------------------------------------------------------------------------------ odd records


ODD_PROPERTIES = [
    b"",
    b"KEYS\x01a\x01b c",  # the value holds \x01: everything after the first one
    b"TAGS\x01x\x02TAGS\x01y",  # the last one wins
    b"TAGS\x01\x02KEYS\x01k",  # an empty value does not count
    b"TAGS\x01x\x02TAGS\x01\x02KEYS\x01k\x02KEYS\x01",  # nor overrides an earlier one
    b"UNIQ_KEY\x01U1\x02UNIQ_KEY\x01",
    b"\x01v\x02KEYS\x01k2",  # nor an empty name
    b"UNIQ_KEY\x01U1\x02\x02\x02",  # trailing separators
    b"KEYSX\x01no\x02TAG\x01no\x02UNIQ_KE\x01no",  # near-miss names
    b"just text",
    b"\x02\x02\x01\x01",
    "TAGS\x01标签\x02KEYS\x01订单-1 ORD2".encode(),  # non-ASCII values
    "city\x01Zürich\x02KEYS\x01a b".encode(),  # non-ASCII elsewhere
    "TAGS\x01tag-😀".encode(),  # a surrogate pair in UTF-16
    b"KEYS\x01a\x00",  # ends in NUL: a torn tail if last
    b"\x00\x00\x00",  # all zero: invalid
    b"KEYS\x01\xff\xfe",  # not UTF-8: invalid
    b"DELAY\x013\x02TAGS\x01t",
]


@pytest.mark.parametrize("raw", ODD_PROPERTIES)
@pytest.mark.parametrize("copies", [1, 40])
def test_odd_properties_read_as_string_to_properties_reads_them(raw: bytes, copies: int) -> None:
    plain = [Spec(props=props(("UNIQ_KEY", uniq(i)))) for i in range(30)]
    odd = [Spec(props=raw, queue_offset=i) for i in range(copies)]
    assert_same_as_per_record(bytes(build_log(plain + odd + plain)))


@pytest.mark.parametrize(
    "spec",
    [
        Spec(v2=True, props=b"TAGS\x01v2"),
        Spec(sys_flag=m.BORNHOST_V6_FLAG, props=b"KEYS\x01six"),
        Spec(sys_flag=m.STOREHOSTADDRESS_V6_FLAG | m.BORNHOST_V6_FLAG, props=b"KEYS\x01six"),
        Spec(topic=m.SCHEDULE_TOPIC.encode(), props=b"DELAY\x013\x02TAGS\x01t"),
        Spec(topic=m.SCHEDULE_TOPIC.encode(), props=b"DELAY\x0199"),
        Spec(topic="主题-τ".encode(), props=b"KEYS\x01k"),
        Spec(sys_flag=m.TRANSACTION_ROLLBACK_TYPE, props=b"KEYS\x01rolled"),
        Spec(body=b""),
    ],
    ids=["v2", "born-v6", "both-v6", "schedule", "schedule-clamped", "utf8-topic", "rollback", "empty-body"],
)
def test_unusual_records_match(spec: Spec) -> None:
    plain = [Spec(props=props(("UNIQ_KEY", uniq(i)))) for i in range(20)]
    assert_same_as_per_record(bytes(build_log([*plain, spec, *plain, spec, spec])))


@pytest.mark.parametrize(
    "bad",
    [
        Spec(bad_crc=True),
        Spec(size_delta=1),
        Spec(size_delta=-1),
        Spec(topic=b""),
        Spec(topic=b"a\x00b"),
        Spec(topic=b"\xff\xfe"),
        Spec(props=b"\x00\x00"),
    ],
    ids=["crc", "long", "short", "empty-topic", "nul-topic", "not-utf8-topic", "zero-props"],
)
@pytest.mark.parametrize("check_crc", [True, False])
def test_scan_stops_where_per_record_stops(bad: Spec, check_crc: bool) -> None:
    plain = [Spec(props=props(("UNIQ_KEY", uniq(i)))) for i in range(30)]
    assert_same_as_per_record(bytes(build_log([*plain, bad, *plain])), check_crc=check_crc)


def test_blank_torn_and_garbage_ends() -> None:
    plain = [Spec(props=props(("UNIQ_KEY", uniq(i)))) for i in range(30)]
    log = bytes(build_log(plain, blank_after=9))
    scan = assert_same_as_per_record(log)
    assert scan.tail is record.BLANK
    assert len(scan.batch) == 10
    whole = bytes(build_log(plain))
    for cut in (len(whole) - 1, len(whole) - 40, len(whole) - 100):
        assert_same_as_per_record(whole[:cut])  # a torn last record
    assert_same_as_per_record(whole + random.Random(1).randbytes(300))
    assert_same_as_per_record(whole + bytes(64))


# ------------------------------------------------------------------------------ property tests

TOPICS = [b"A", b"Topic-B", "主题-τ".encode(), m.SCHEDULE_TOPIC.encode(), b"t" * 127]
VALUE = st.one_of(
    st.text(alphabet="abcXYZ019- ", min_size=0, max_size=12),
    st.text(min_size=0, max_size=6),  # any unicode, separators and surrogates included
)
PROPERTY = st.tuples(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "city", "", "K"]), VALUE)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    pairs = draw(st.lists(PROPERTY, max_size=5))
    raw = "\x02".join(f"{k}\x01{v}" for k, v in pairs).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        raw = m.properties_to_string({k: v for k, v in pairs if k and v}).encode("utf-8", "surrogatepass")
    return Spec(
        topic=draw(st.sampled_from(TOPICS)),
        props=raw,
        body=draw(st.binary(max_size=40)),
        sys_flag=draw(st.sampled_from([0, 0x4, 0x8, 0xC, 0x10, 0x20, 0x30])),
        queue_id=draw(st.integers(0, 3)),
        queue_offset=draw(st.integers(0, 5)),
        store_ts=draw(st.integers(0, 2**42)),
        v2=draw(st.booleans()) and draw(st.booleans()),
        bad_crc=draw(st.integers(0, 30)) == 0,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(specs(), min_size=1, max_size=12), st.integers(1, 40), st.booleans())
def test_any_log_decodes_as_per_record(template: list[Spec], repeat: int, check_crc: bool) -> None:
    """Layouts repeat (so groups are column-wise) and mix (so they are not)."""
    log = build_log([template[i % len(template)] for i in range(repeat * len(template))])
    assert_same_as_per_record(bytes(log), check_crc=check_crc)


@ANY_FIXTURE
@given(st.lists(st.text(max_size=20), max_size=30))
def test_java_hash_strings_is_string_hash_code(texts: list[str]) -> None:
    expected = [m.java_string_hash(t) & 0xFFFFFFFF for t in texts]
    assert record_batch.java_hash_strings(texts).tolist() == expected
    assert record_batch.index_hash_strings(texts).tolist() == [m.index_key_hash(t) for t in texts]


@ANY_FIXTURE
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=127), min_size=0, max_size=20), max_size=30))
def test_column_hash_of_ascii_rows(texts: list[str]) -> None:
    for length in {len(t) for t in texts}:
        same = [t for t in texts if len(t) == length]
        rows = np.frombuffer("".join(same).encode(), dtype=np.uint8).reshape(len(same), length)
        expected = [m.java_string_hash(t) & 0xFFFFFFFF for t in same]
        assert record_batch.java_hash_rows(rows).tolist() == expected
        prefix = np.full(len(same), m.java_string_hash("T#") & 0xFFFFFFFF, dtype=np.uint32)
        combined = record_batch.index_hash(prefix, length, record_batch.java_hash_rows(rows))
        assert combined.tolist() == [m.index_key_hash("T#" + t) for t in same]


def test_integer_min_value_hash_indexes_as_zero() -> None:
    """`indexKeyHashMethod`: abs(Integer.MIN_VALUE) stays negative, so the key hash is 0."""
    text = "polygenelubricants"  # String.hashCode() == Integer.MIN_VALUE
    assert m.java_string_hash(text) == -(2**31)
    assert record_batch.index_hash_strings([text]).tolist() == [0]
    rows = np.frombuffer(text.encode(), dtype=np.uint8).reshape(1, -1)
    assert record_batch.index_hash(
        np.zeros(1, dtype=np.uint32), len(text), record_batch.java_hash_rows(rows)
    ).tolist() == [0]
