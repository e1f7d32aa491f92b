"""`rmq_mp/format/` owns every on-disk byte layout (issue 30): outside it, no code reaches into a
format module's private names, defines a layout's struct or size again, or does arithmetic with
a bare layout number. These tests read the code (AST), so a new reach fails here, not in review.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORMAT = ROOT / "rmq_mp" / "format"
SOURCES = sorted(
    p
    for p in [
        *ROOT.joinpath("rmq_mp").rglob("*.py"),
        *ROOT.joinpath("workers").rglob("*.py"),
        ROOT / "run.py",
    ]
    if FORMAT not in p.parents
) + sorted(ROOT.joinpath("shm").rglob("*.py"))

LAYOUT_STRUCTS = {">qiq", ">qqqqii", ">iqii", ">ii"}
"""ConsumeQueue entry, index header, index entry, a record's TOTALSIZE and MAGICCODE."""
LAYOUT_NAMES = {
    "CQ_STORE_UNIT_SIZE",
    "PRE_BLANK_SIZE",
    "CQ_ENTRY",
    "CQ_ENTRY_DTYPE",
    "INDEX_HEADER_SIZE",
    "HASH_SLOT_SIZE",
    "INDEX_ENTRY_SIZE",
    "MESSAGE_MAGIC_CODE",
    "BLANK_MAGIC_CODE",
}
LAYOUT_NUMBERS = {20, 40}
"""A ConsumeQueue or index entry's size, the index header's: never bare in offset arithmetic."""


def _format_aliases(tree: ast.AST) -> set[str]:
    """Local names bound to a module of rmq_mp.format."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "rmq_mp.format":
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.asname for a in node.names if a.name.startswith("rmq_mp.format.") and a.asname)
    return names


def private_reaches(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = _format_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rmq_mp.format"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    yield f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
        ):
            yield f"{path.relative_to(ROOT)}:{node.lineno} reaches {node.value.id}.{node.attr}"


def layout_restatements(path: Path) -> Iterator[str]:
    where = path.relative_to(ROOT)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Struct"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in LAYOUT_STRUCTS
        ):
            yield f"{where}:{node.lineno} defines struct {node.args[0].value!r} again"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in LAYOUT_NAMES:
                    yield f"{where}:{node.lineno} defines {target.id} again"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.FloorDiv | ast.Mod | ast.Add):
            sides = (node.left, node.right)
            if any(isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides):
                continue  # a string repeated, not an offset
            for side in sides:
                if isinstance(side, ast.Constant) and side.value in LAYOUT_NUMBERS:
                    yield f"{where}:{node.lineno} computes with a bare {side.value}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_format_name_is_used_outside_format(path: Path) -> None:
    assert list(private_reaches(path)) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_layout_is_restated_outside_format(path: Path) -> None:
    assert list(layout_restatements(path)) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The two checks fire on each kind of reach (so an empty list above means something)."""
    bad = ROOT / "rmq_mp" / "_ownership_probe.py"
    text = (
        "import struct\n"
        "from rmq_mp.format import record\n"
        "from rmq_mp.format.record import _INT\n"
        "x = record._LONG\n"
        "CQ_STORE_UNIT_SIZE = 20\n"
        "E = struct.Struct('>qiq')\n"
        "def f(n: int) -> int:\n"
        "    return n * 20 + 40\n"
    )
    bad.write_text(text)
    try:
        reaches = list(private_reaches(bad))
        restated = list(layout_restatements(bad))
    finally:
        bad.unlink()
    assert len(reaches) == 2
    assert any("defines CQ_STORE_UNIT_SIZE" in r for r in restated)
    assert any("struct '>qiq'" in r for r in restated)
    assert sum("bare" in r for r in restated) == 2
