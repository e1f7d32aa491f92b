"""An error on a path that closes store files is reported as itself (issue 29 point 3): a
mapping still exported when it is closed (a numpy view alive in the frames of an exception in
flight: recovery's `last_nonzero` when a file changed under it) is left to the garbage collector
instead of `BufferError: cannot close exported pointers exist` replacing the real error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rmq_mp.store.mapped_file import MappedFile, close_mapping


def _scan_that_fails(mf: MappedFile) -> None:
    assert mf.mapping is not None
    view = np.frombuffer(mf.mapping, dtype=np.uint8)  # exported while this frame lives
    raise ValueError(f"the real error, {view.size} bytes in")


def _scan_then_close(mf: MappedFile) -> None:
    """Recovery's shape: a scan, its files closed whatever happens."""
    try:
        _scan_that_fails(mf)
    finally:
        mf.close()  # the traceback still holds the view: BufferError here before the fix


def test_the_real_error_is_not_masked_by_closing_an_exported_mapping(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "00000000000000000000", 1 << 16, writable=True, create=True)
    with pytest.raises(ValueError, match="the real error"):
        _scan_then_close(mf)
    assert mf.mapping is None


def test_close_mapping_says_whether_it_closed(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "00000000000000000000", 1 << 16, writable=True, create=True)
    mm = mf.mapping
    assert mm is not None
    view = np.frombuffer(mm, dtype=np.uint8)
    assert close_mapping(mm) is False
    assert not mm.closed
    del view
    assert close_mapping(mm) is True
    assert mm.closed
    mf.close()
