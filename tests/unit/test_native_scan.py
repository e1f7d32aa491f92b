"""The compiled record scan (rmq_mp/format/_scan.c) is built and used by a normal install, and a
machine without it decodes with numpy, saying so once. That both give the same batches is
tests/unit/test_record_batch.py's job (every test there runs with each)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rmq_mp.format import native


def test_a_normal_install_runs_the_compiled_scan() -> None:
    """`pip install -e .` builds rmq_mp/format/_scan.c; only RMQ_PURE_PYTHON=1 may run without it."""
    if native.pure_requested:
        assert native.scanner is None
        pytest.skip("RMQ_PURE_PYTHON is set: this run tests the reference")
    assert native.scanner is not None, native.why_reference
    assert native.scanner.HAVE_CRC == 1, "built without zlib: recovery's CRC-checked scans run in numpy"


def test_the_scan_refuses_a_bad_layout_and_bad_ranges() -> None:
    scan = native._built
    if scan is None:
        pytest.skip(f"no compiled scan: {native.why_not_built}")
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


def test_without_the_scan_numpy_decodes_and_says_so_once() -> None:
    """A machine without a compiler: the import fails; rmq-mp warns once and decodes with numpy."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "sys.modules['rmq_mp.format._scan'] = None\n"  # what a failed build leaves
        "from rmq_mp.format import native, record_batch\n"
        "assert native.scanner is None\n"
        "scan = record_batch.scan_segment(b'', 0, 0, file_from_offset=0, check_crc=False, max_records=9)\n"
        "assert len(scan.batch) == 0\n"
        "print('reference:', native.why_reference)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "compiled record scan is not built" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "decodes CommitLog runs in Python" in line]
    assert len(warnings) == 1, done.stderr
