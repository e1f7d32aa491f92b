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
