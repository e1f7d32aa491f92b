"""tests/REGRESSIONS.md names, for each defect fixed, the test that pins it: every row's test
must still exist (a renamed or deleted regression test is found here, not in a later release)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def test_every_regression_row_names_an_existing_test() -> None:
    rows = ROW.findall((ROOT / "tests" / "REGRESSIONS.md").read_text(encoding="utf-8"))
    assert len(rows) >= 10, "the index lost its rows"
    missing = []
    for path, name in rows:
        source = ROOT / path
        tree = ast.parse(source.read_text(encoding="utf-8")) if source.exists() else ast.Module([], [])
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        if name not in defined:
            missing.append(f"{path}::{name}")
    assert not missing, f"tests/REGRESSIONS.md names tests that do not exist: {missing}"
