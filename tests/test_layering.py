"""Import rules that keep the data flow readable (design.md §6, style.md item 15)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_library_never_imports_workers() -> None:
    for path in (ROOT / "rmq_mp").rglob("*.py"):
        assert not any(n == "workers" or n.startswith("workers.") for n in imports_of(path)), path


def test_only_shm_uses_posix_ipc() -> None:
    for package in ("rmq_mp", "workers"):
        for path in (ROOT / package).rglob("*.py"):
            assert "posix_ipc" not in imports_of(path), path


def test_public_api_is_importable() -> None:
    import rmq_mp

    for name in rmq_mp.__all__:
        assert getattr(rmq_mp, name) is not None
