"""The compiled parts below the put path (rmq_mp/format/_scan.c, rmq_mp/store/_index.c) are built
and used by a normal install, and a machine without them runs numpy, saying so once. That both
give the same bytes is tests/unit/test_record_batch.py's and test_dispatch_batch.py's job (every
test there runs with each)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rmq_mp.format import native


def test_a_normal_install_runs_the_compiled_parts() -> None:
    """`pip install -e .` builds both; only RMQ_PURE_PYTHON=1 may run without them."""
    if native.pure_requested:
        assert native.scan.active is None
        assert native.index.active is None
        pytest.skip("RMQ_PURE_PYTHON is set: this run tests the reference")
    assert native.scan.active is not None, native.scan.why_reference
    assert native.index.active is not None, native.index.why_reference
    assert native.scan.active.HAVE_CRC == 1, "built without zlib: recovery's CRC-checked scans run in numpy"


def test_the_scan_refuses_a_bad_layout_and_bad_ranges() -> None:
    scan = native.scan.built
    if scan is None:
        pytest.skip(f"no compiled scan: {native.scan.why_not_built}")
    bad = native.scan_layout()
    bad["BODY"] = (88, 100)
    with pytest.raises(ValueError, match="4-tuple"):
        scan.configure(bad)
    cols, keys = bytearray(8 * 8 * 4), bytearray(2 * 8 * 4)
    with pytest.raises(ValueError, match="out of range"):
        scan.scan(b"x" * 100, 0, 200, 1, False, {}, [], cols, 0, keys, 0)
    with pytest.raises(ValueError, match="out of range"):
        scan.scan(b"x" * 100, 0, 100, 5, False, {}, [], cols, 0, keys, 0)  # 5 rows, room for 4
    assert scan.scan(b"x" * 100, 0, 100, 4, False, {}, [], cols, 0, keys, 0) == (0, 0, 0, 1)


def test_without_a_compiler_numpy_runs_and_says_so_once() -> None:
    """A machine without a compiler: no compiled part imports; rmq-mp warns once (not once per
    part) and runs the references."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "for name in ('rmq_mp.format._scan', 'rmq_mp.store._index', 'rmq_mp.put._core'):\n"
        "    sys.modules[name] = None\n"  # what a failed build leaves
        "from rmq_mp.format import native, record_batch\n"
        "from rmq_mp.put import native as put_native\n"
        "assert native.scan.active is None and native.index.active is None and put_native.core is None\n"
        "scan = record_batch.scan_segment(b'', 0, 0, file_from_offset=0, check_crc=False, max_records=9)\n"
        "assert len(scan.batch) == 0\n"
        "print('reference:', native.scan.why_reference)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "compiled record scan is not built" in done.stdout
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "compiled record scan is not built" in done.stderr


def test_the_scan_hands_back_a_non_ascii_or_nul_byte_anywhere_in_topic_or_properties() -> None:
    """The compiled scan takes only plain ASCII topics and properties (no byte >= 0x80, no NUL;
    the numpy decoder reads the rest), checked eight bytes at a time with the last eight
    overlapping: every length to 40 and every position, with the bytes on either side of each
    bound."""
    scan = native.scan.active
    if scan is None:
        pytest.skip(f"no compiled scan: {native.scan.why_reference}")
    from rmq_mp.format.record import RecordEncoder

    encoder = RecordEncoder(("10.0.0.1", 10911), ("10.0.0.2", 5555))
    cols, keys = bytearray(8 * 8), bytearray(2 * 8)
    for n in range(1, 41):
        for at in range(n):
            for byte, plain in ((0x00, False), (0x01, True), (0x7F, True), (0x80, False), (0xFF, False)):
                text = bytearray(b"k" * n)
                text[at] = byte
                for topic, props in ((bytes(text), b"a\x01b"), (b"T", bytes(text))):
                    rec = bytes(encoder.encode_own(bytes([len(topic)]) + topic, b"body", 0, 0, 0, props))
                    got = scan.scan(rec, 0, len(rec), 1, False, {}, [], cols, 0, keys, 0)
                    assert (got[0] == 1) is plain, (n, at, byte, topic, props, got)
