"""The compiled put core against the Python reference: one definition of the bytes, one lock.

- A normal install runs the core (this fails when the build silently fell back).
- CRC-32 and the record encoding equal zlib's and `RecordEncoder.encode_own`'s for any input;
  the whole-record CRC finished under the lock from one computed before it is the record's.
- The atomic put lock excludes: processes incrementing a shared counter without atomics under
  it lose no increment; a dead owner's lock is taken over by exactly one compare-and-swap.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import platform
import subprocess
import sys
import zlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rmq_mp.format import record
from rmq_mp.format.record import RecordEncoder
from rmq_mp.put import native
from shm import layout

core = native.lock_core
needs_core = pytest.mark.skipif(core is None, reason=f"no compiled core: {native.why_reference}")

JAVA_INT = st.integers(-(2**31), 2**31 - 1)
JAVA_LONG = st.integers(-(2**63), 2**63 - 1)


def test_a_normal_install_runs_the_compiled_core() -> None:
    """`pip install -e .` builds rmq_mp/put/_core.c; only RMQ_PURE_PYTHON=1 may run without it."""
    if native.pure_requested:
        assert native.core is None
        pytest.skip("RMQ_PURE_PYTHON is set: this run tests the reference")
    assert native.core is not None, native.why_reference
    assert native.store_lock_kind() == layout.LOCK_ATOMIC


@needs_core
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.booleans())
def test_crc32_is_zlibs(data: bytes, start: int, clmul: bool) -> None:
    """By carry-less multiplication (from 64 bytes, where the CPU has PCLMULQDQ) and by table."""
    assert core is not None
    try:
        core._set_clmul(clmul)
        assert core.crc32(data, start) == zlib.crc32(data, start)
    finally:
        core._set_clmul(True)


@needs_core
@pytest.mark.skipif(platform.machine() != "x86_64", reason="PCLMULQDQ is x86-64's")
def test_this_cpu_takes_the_multiplying_crc() -> None:
    """The x86-64 machines this runs on have PCLMULQDQ: the fast CRC is the one really used."""
    assert core is not None
    assert core._set_clmul(True), "no PCLMULQDQ on this CPU: the CRC runs by table (3x slower at 128 B)"


@needs_core
@settings(max_examples=500)
@given(
    covered=st.binary(min_size=64, max_size=5000),
    queue_offset=JAVA_LONG,
    phy_offset=JAVA_LONG,
    store_ms=JAVA_LONG,
    clmul=st.booleans(),
    guess=st.one_of(
        st.none(),
        st.just("right"),
        st.tuples(JAVA_LONG, JAVA_LONG, JAVA_LONG),
        st.sampled_from([(0, 1, 0), (1, 0, 0)]),
    ),
)
@example(covered=bytes(range(256)) * 18, queue_offset=1, phy_offset=-2, store_ms=3, clmul=True, guess=None)
@example(covered=bytes(range(256)) * 18, queue_offset=1, phy_offset=-2, store_ms=3, clmul=False, guess=None)
@example(covered=bytes(range(256)) * 18, queue_offset=1, phy_offset=-2, store_ms=3, clmul=True, guess="right")
@example(
    covered=bytes(range(256)) * 18, queue_offset=1, phy_offset=-2, store_ms=3, clmul=False, guess=(1, -2, 4)
)
def test_the_crc_prepared_before_the_lock_is_the_whole_records(
    covered: bytes,
    queue_offset: int,
    phy_offset: int,
    store_ms: int,
    clmul: bool,
    guess: str | tuple[int, int, int] | None,
) -> None:
    """The put computes the whole-record CRC before the lock, over the record with the fields
    the lock fixes (QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP) guessed, and finishes it under
    the lock from what differs in those 24 bytes: the digits are `record.fill_record_crc`'s of
    the patched record whether the guess held ("right": the digits written before the lock
    stand), was wrong (another producer's put came first) or was not made (the bytes as they
    came in), by multiplication and by the table, whatever the length's remainder by 16 (read
    in place: the first block shuffled, no copy)."""
    assert core is not None
    data = bytearray(covered + record.CRC_PLACEHOLDER)
    want = bytearray(data)
    record.patch_record(want, 0, queue_offset, phy_offset, store_ms, 0)
    record.fill_record_crc(want, 0, len(want))
    guessed = (queue_offset, phy_offset, store_ms) if guess == "right" else guess
    try:
        core._set_clmul(clmul)
        core._crc_fill_prepared(data, record.CRC32_RESERVED_LEN, queue_offset, phy_offset, store_ms, guessed)
    finally:
        core._set_clmul(True)
    assert data == want


@needs_core
@settings(max_examples=500)
@given(
    head=st.binary(min_size=100, max_size=100),
    fixed=st.sampled_from([88, 100]),
    body=st.one_of(st.binary(max_size=200), st.binary(max_size=5000)),
    rest=st.binary(min_size=1, max_size=300),
    fields=st.tuples(JAVA_LONG, JAVA_LONG, JAVA_LONG),
    clmul=st.booleans(),
    guess=st.sampled_from(["right", "wrong", None]),
)
@example(head=bytes(100), fixed=88, body=b"", rest=b"\x02", fields=(1, 2, 3), clmul=True, guess="right")
@example(head=bytes(100), fixed=88, body=bytes(128), rest=bytes(54), fields=(1, 2, 3), clmul=True, guess=None)
@example(head=bytes(100), fixed=100, body=b"x", rest=bytes(64), fields=(1, 2, 3), clmul=False, guess="wrong")
def test_the_crc_combined_with_the_bodys_is_the_whole_records(
    head: bytes,
    fixed: int,
    body: bytes,
    rest: bytes,
    fields: tuple[int, int, int],
    clmul: bool,
    guess: str | None,
) -> None:
    """A send's record is read once: encode_into leaves the body CRC field 0 and one pass reads
    header, body and rest (topic and properties, often under 64 bytes) side by side; the body's
    raw CRC gives the body CRC field (zlib's CRC-32, masked) and, combined with the other two,
    the whole-record CRC with that field in it. Field and digits are what RocketMQ's (and
    `record.fill_record_crc`) make of the record whatever the lengths (an empty body, one under
    64 bytes, a rest of one byte to several blocks), the header's (IPv4 or IPv6 store host) and
    the guess."""
    assert core is not None
    header = bytearray(head[:fixed])
    header[fixed - 4 : fixed] = len(body).to_bytes(4, "big")
    data = bytearray(header + body + rest + record.CRC_PLACEHOLDER)
    want = bytearray(data)
    want[8:12] = (zlib.crc32(body) & 0x7FFFFFFF).to_bytes(4, "big")
    record.patch_record(want, 0, *fields, 0)
    record.fill_record_crc(want, 0, len(want))
    guessed = {"right": fields, "wrong": (fields[0] ^ 1, fields[1], fields[2] ^ 7), None: None}[guess]
    try:
        core._set_clmul(clmul)
        core._crc_fill_prepared(data, record.CRC32_RESERVED_LEN, *fields, guessed, fixed)
    finally:
        core._set_clmul(True)
    assert data == want


@needs_core
def test_the_crc_digits_are_createCrc32s_for_every_five_digit_half() -> None:
    """The core writes the ten digits as two halves of five, each digit one multiplication of a
    fixed-point fraction (no division chain): exact for every half 0..99,999 (each value below
    covers every low half once and every high half to 21,473), and the 31-bit CRC's ends (2^31 - 1: high half 21,474)."""
    assert core is not None
    for y in range(100_000):
        crc = (y % 21_474) * 100_000 + y
        assert core._crc_digits(crc) == record.crc_digits(crc), crc
    for crc in (0, 1, 9, 10, 99_999, 100_000, 2**31 - 1):
        assert core._crc_digits(crc) == record.crc_digits(crc)
    with pytest.raises(ValueError, match="31 bits"):
        core._crc_digits(2**31)


@needs_core
def test_a_header_shorter_than_the_lock_fields_or_a_body_past_the_record_is_refused() -> None:
    """The hook's own checks: the split needs the 64 bytes the lock fixes in the header and a
    BODYLENGTH that fits; bad input is a ValueError, not a read past the buffer."""
    assert core is not None
    data = bytearray(bytes(90) + record.CRC_PLACEHOLDER)
    with pytest.raises(ValueError, match="header"):
        core._crc_fill_prepared(data, record.CRC32_RESERVED_LEN, 0, 0, 0, None, 60)
    with pytest.raises(ValueError, match="header"):
        core._crc_fill_prepared(data, record.CRC32_RESERVED_LEN, 0, 0, 0, None, 91)
    data[84:88] = (3).to_bytes(4, "big")
    with pytest.raises(ValueError, match="header"):
        core._crc_fill_prepared(data, record.CRC32_RESERVED_LEN, 0, 0, 0, None, 88)


@needs_core
@settings(max_examples=300)
@given(
    topic=st.text(st.characters(categories=("L", "N")), min_size=1, max_size=40).filter(
        lambda t: len(t.encode()) <= 127
    ),
    body=st.binary(max_size=3000),
    queue_id=JAVA_INT,
    flag=JAVA_INT,
    born_ms=JAVA_LONG,
    props=st.binary(max_size=300),
    born_port=JAVA_INT,
    store=st.sampled_from([("10.1.2.3", 10911), ("::1", 10911), ("fe80::7:8", -5)]),
)
def test_encode_own_is_the_references(
    topic: str,
    body: bytes,
    queue_id: int,
    flag: int,
    born_ms: int,
    props: bytes,
    born_port: int,
    store: tuple[str, int],
) -> None:
    assert core is not None
    encoder = RecordEncoder(store, ("192.168.7.9", born_port))
    field = encoder.topic_field(topic)
    want = encoder.encode_own(field, body, queue_id, flag, born_ms, props)
    got = core.encode_own(
        field,
        body,
        queue_id,
        flag,
        born_ms,
        props,
        bytes([192, 168, 7, 9]),
        born_port,
        encoder.store_ip,
        store[1],
    )
    assert type(got) is bytearray
    assert got == want


@needs_core
def test_the_core_agrees_with_rmq_mp_record() -> None:
    assert core is not None
    assert native._layout_problem(core) == ""


def _count_under_lock(path: str, pid_slot: int, rounds: int) -> None:
    assert core is not None
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 4096)
    words = memoryview(mm).cast("q")
    pid = os.getpid()
    for _ in range(rounds):
        assert core.lock_acquire(mm, pid_slot, pid, 20_000, 10_000)
        value = words[1]  # a read-modify-write no other holder may interleave with
        os.sched_yield()
        words[1] = value + 1
        core.lock_release(mm, pid_slot)
    words.release()
    mm.close()


@needs_core
def test_the_atomic_lock_excludes_across_processes(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "words")
    with open(path, "wb") as f:
        f.write(bytes(4096))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_count_under_lock, args=(path, 0, 3000)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with open(path, "rb") as f:
        raw = f.read(16)
    assert int.from_bytes(raw[:8], "little") == 0, "the lock is free"
    assert int.from_bytes(raw[8:], "little") == 4 * 3000, "no increment lost"


@needs_core
def test_a_dead_owners_lock_is_taken_over_by_one_cas() -> None:
    assert core is not None
    mm = mmap.mmap(-1, 4096)
    try:
        dead = 4_000_000  # above the pid ceiling: no such process
        assert core.lock_acquire(mm, 3, dead, 0, 0)
        assert not core.lock_acquire(mm, 3, os.getpid(), 1000, 1), "held"
        word = int.from_bytes(mm[24:28], "little")
        assert layout.lock_owner(word) == dead
        assert word & layout.LOCK_WAITERS_BIT, "a sleeper marked the word"
        mine = os.getpid() | layout.LOCK_WAITERS_BIT
        assert core.lock_cas(mm, 3, word, mine)
        assert not core.lock_cas(mm, 3, word, mine), "a second taker loses"
        core.lock_release(mm, 3)
        assert mm[24:32] == bytes(8)
    finally:
        mm.close()


def test_without_the_core_the_reference_runs_and_says_so_once(tmp_path: os.PathLike[str]) -> None:
    """A machine without a compiler: the import of the core fails; rmq-mp warns once, runs the
    reference put path and creates stores with the semaphore lock."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "sys.modules['rmq_mp.put._core'] = None\n"  # what a failed build leaves: no importable core
        "from rmq_mp.put import native\n"
        "from shm import layout\n"
        "assert native.core is None and native.lock_core is None\n"
        "assert native.store_lock_kind() == layout.LOCK_SEMAPHORE\n"
        "print('reference:', native.why_reference)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "compiled put core is not built" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "pure-Python put path" in line]
    assert len(warnings) == 1, done.stderr
