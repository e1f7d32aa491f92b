"""ruff and mypy stay clean: run as tests so `.ci/run` (the README's test command) enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    """The whole tree, tests included (pyproject's exclude keeps .venv/ and build/ out): a test
    that misreads an API's types is a test that may not check what it says."""
    result = subprocess.run([sys.executable, "-m", "mypy", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
