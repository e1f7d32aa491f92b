"""Import rules that keep the data flow readable (docs/architecture.md "Layers").

Every import counts: at module level, inside functions, and under ``TYPE_CHECKING`` (a type-only
cycle is still two modules that cannot be read apart). Layers, lowest first; a module may import
its own layer and those below, never above:

    0  rmq_mp.errors, file_modes         what every layer raises; who may read the store
    1  shm                               shared memory: names, layouts, tables, locks
    2  rmq_mp.format, outcomes, validators, config, paths, progress, logs: the vocabulary
    3  rmq_mp.store                      the store directory's files, dispatch, recovery
    4  rmq_mp.put                        a producer appends to a running store
    5  rmq_mp.client                     consumers of a running store
    6  rmq_mp.tools, rmq_mp.spark, aio  operators', Spark's and asyncio's entry points
    7  workers, run, bench               processes
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rmq_mp", "workers", "shm", "bench")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rmq_mp.errors", "rmq_mp.file_modes"),
    ("shm",),
    (
        "rmq_mp.format",
        "rmq_mp.outcomes",
        "rmq_mp.validators",
        "rmq_mp.config",
        "rmq_mp.paths",
        "rmq_mp.progress",
        "rmq_mp.logs",
    ),
    ("rmq_mp.store",),
    ("rmq_mp.put",),
    ("rmq_mp.client",),
    ("rmq_mp.tools", "rmq_mp.spark", "rmq_mp.aio"),
    ("workers", "run", "bench"),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")] + [ROOT / "run.py"]
    return {module_name(p): p for p in files}


MODULES = project_modules()


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as a.b where b is a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in MODULES else node.module)
    return names


def project_imports(module: str) -> set[str]:
    return {name for name in imports_of(MODULES[module]) if name.split(".")[0] in (*PACKAGES, "run", "tests")}


def layer_of(module: str) -> int:
    for number, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return number
    raise AssertionError(f"{module} is on no layer: add it to LAYERS and docs/architecture.md")


def library_modules() -> Iterator[str]:
    """Every module but the public face (rmq_mp/__init__.py, which only names what others define)."""
    return (m for m in MODULES if m != "rmq_mp")


def test_every_module_is_on_a_layer() -> None:
    for module in library_modules():
        layer_of(module)


def test_layers_import_only_downward() -> None:
    wrong = [
        f"{module} (layer {layer_of(module)}) imports {name} (layer {layer_of(name)})"
        for module in library_modules()
        for name in project_imports(module)
        if name != "rmq_mp" and not name.startswith("tests") and layer_of(name) > layer_of(module)
    ]
    assert wrong == []


def test_no_import_cycle() -> None:
    graph = {m: {n for n in project_imports(m) if n in MODULES and n != "rmq_mp"} for m in library_modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_library_does_not_import_its_own_face() -> None:
    """`from rmq_mp import X` inside the library would run the facade (and its lazy loads) from
    the middle of an import: modules import where a name is defined."""
    assert [m for m in library_modules() if "rmq_mp" in project_imports(m)] == []


def test_shm_imports_only_the_errors_module_of_the_library() -> None:
    """And the file modes, which the shared memory shares with the store's files."""
    for module in (m for m in MODULES if m.split(".")[0] == "shm"):
        outside = {n for n in project_imports(module) if n.split(".")[0] != "shm"}
        assert outside <= {"rmq_mp.errors", "rmq_mp.file_modes"}, module


def test_errors_is_a_leaf() -> None:
    assert project_imports("rmq_mp.errors") == set()


def test_nothing_imports_tests() -> None:
    assert [m for m in MODULES if any(n.split(".")[0] == "tests" for n in project_imports(m))] == []


def test_library_never_imports_workers() -> None:
    for module in (m for m in MODULES if m.split(".")[0] == "rmq_mp"):
        assert not any(n.split(".")[0] == "workers" for n in project_imports(module)), module


def test_only_shm_uses_posix_ipc() -> None:
    """(bench/wakeup.py's one-hop baseline is a plain semaphore on purpose: it measures one.)"""
    for module, path in MODULES.items():
        if module.split(".")[0] in ("rmq_mp", "workers") or module == "run":
            assert "posix_ipc" not in imports_of(path), module


@pytest.mark.parametrize("name", __import__("rmq_mp").__all__)
def test_public_api_is_importable(name: str) -> None:
    import rmq_mp

    assert getattr(rmq_mp, name) is not None
