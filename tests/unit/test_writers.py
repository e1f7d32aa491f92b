"""Writer declarations are true: each shared field names the roles that write it, and only those.

`shm/layout.py` names each pointer-table field's writers, each slot table its fields' (WRITERS).
At run time `set` refuses an undeclared writer; these tests read the code instead, so that a
write no test happens to run is caught too: every ``.set``/``.add`` of a named field, every raw
word store through a `PointerTable.words` view, and the compiled core's stores, mapped to the
role of the process that runs the code (MODULE_ROLES), must be declared; and every role declared
for a named pointer-table field must really write it somewhere.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from shm import flush_requests, layout, members, queue_offsets, schedule_offsets, waiters
from shm.flush_requests import FlushRequestRing
from shm.layout import Field, Role
from shm.members import MemberTable
from shm.queue_offsets import GroupOffsetTable, QueueOffsetTable
from shm.schedule_offsets import ScheduleOffsetTable
from shm.slot_table import SlotTable
from shm.waiters import WaiterTable

ROOT = Path(__file__).resolve().parents[2]

MODULE_ROLES: dict[str, frozenset[Role]] = {
    "rmq_mp/put/": frozenset({Role.PRODUCER}),
    "rmq_mp/client/": frozenset({Role.CONSUMER}),
    "rmq_mp/spark/": frozenset({Role.CONSUMER}),
    "rmq_mp/tools/admin_ops.py": frozenset({Role.CONSUMER}),  # rmq-admin opens the store as a consumer
    "rmq_mp/tools/admin_groups.py": frozenset({Role.CONSUMER}),  # rmq-admin deleteSubGroup and offsets
    "rmq_mp/tools/admin_common.py": frozenset(
        {Role.CONSUMER}
    ),  # rmq-admin: a moved offset stamped for slaves
    "rmq_mp/tools/admin_topics.py": frozenset({Role.CONSUMER}),  # rmq-admin deleteTopic asks the supervisor
    "rmq_mp/tools/monitoring.py": frozenset({Role.SUPERVISOR}),  # the metrics endpoint runs in the supervisor
    "rmq_mp/store/cleaning.py": frozenset({Role.CONSUMER}),  # request_manual_delete: rmq-admin
    "rmq_mp/store/read_damage.py": frozenset({Role.CONSUMER}),  # readers count what they skipped
    "workers/supervisor.py": frozenset({Role.SUPERVISOR}),
    "workers/topic_delete.py": frozenset({Role.SUPERVISOR}),  # the supervisor's half of rmq-admin deleteTopic
    "workers/allocator.py": frozenset({Role.ALLOCATOR}),
    "workers/committer.py": frozenset({Role.COMMITTER}),
    "workers/flusher.py": frozenset({Role.FLUSHER}),
    "workers/reput.py": frozenset({Role.REPUT}),
    "workers/cleaner.py": frozenset({Role.CLEANER}),
    "workers/scheduler.py": frozenset({Role.SCHEDULER}),
    "workers/ha.py": frozenset({Role.HA}),
    "workers/ha_start.py": frozenset({Role.HA}),
    "workers/ha_meta.py": frozenset({Role.HA}),  # a thread of the ha worker
    "workers/promotion.py": frozenset({Role.SUPERVISOR}),  # the supervisor's watch loop
    "rmq_mp/tools/promote.py": frozenset({Role.CONSUMER}),  # rmq-admin
    "shm/pointer_table.py::create": frozenset({Role.SUPERVISOR}),
    "shm/store_shm.py::create": frozenset({Role.SUPERVISOR}),
    "shm/store_shm.py::update_running_flags": frozenset(
        {Role.FLUSHER, Role.CLEANER}
    ),  # workers/flusher.py, cleaner.py
    "shm/store_shm.py::flags_lock": frozenset(Role),  # any process takes the flags lock
    "shm/store_shm.py::_take_flags_lock_over": frozenset(Role),
    "shm/transient_pool.py::borrow": frozenset({Role.PRODUCER}),
    "shm/transient_pool.py::give_back": frozenset({Role.COMMITTER}),
    "shm/semaphores.py": frozenset({Role.PRODUCER}),  # the put lock
    "shm/put_lock.py": frozenset({Role.PRODUCER}),
    "shm/put_journal.py": frozenset({Role.PRODUCER}),
    "shm/members.py": frozenset({Role.CONSUMER}),
    "shm/flush_requests.py::take": frozenset({Role.PRODUCER}),
    "shm/flush_requests.py::collect": frozenset({Role.PRODUCER}),
    "shm/flush_requests.py::abandon": frozenset({Role.PRODUCER}),
    "shm/flush_requests.py::complete": frozenset({Role.FLUSHER}),
    "shm/flush_requests.py::release": frozenset({Role.FLUSHER}),
}
"""Who runs a module's (or one function's) writes: the role its process opens the store in."""

STARTING = {
    "workers/supervisor.py::_create_shared_memory",
    "shm/store_shm.py::create",
    "shm/pointer_table.py::create",
}
"""The supervisor's initialisation of a fresh table, while its state is STARTING: `PointerTable.set`
lets it write any pointer-table field then (before the first worker or client attaches)."""

SLOT_MODULES = {
    "shm.flush_requests": FlushRequestRing,
    "shm.waiters": WaiterTable,
    "shm.members": MemberTable,
    "shm.schedule_offsets": ScheduleOffsetTable,
    "shm.queue_offsets": QueueOffsetTable,  # GroupOffsetTable when the table's name says group
}
_TABLE_MODULES = {flush_requests, waiters, members, schedule_offsets, queue_offsets}


def roles_of(module: str, function: str) -> frozenset[Role] | None:
    for key in (f"{module}::{function}", module):
        if key in MODULE_ROLES:
            return MODULE_ROLES[key]
    for key, roles in MODULE_ROLES.items():
        if "::" not in key and key.endswith("/") and module.startswith(key):
            return roles
    return None


@dataclass(frozen=True)
class Write:
    where: str
    """path:line"""
    module: str
    function: str
    table: str
    """"pointer", or a slot table's class name"""
    field: str
    writers: frozenset[Role]


def _layout_field(node: ast.expr, aliases: dict[str, str]) -> Field | None:
    """``layout.X``, ``layout.worker_field(..., "name")`` or ``layout.pool_file_offset(i)``."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and aliases.get(node.value.id) == "shm.layout"
    ):
        found = getattr(layout, node.attr, None)
        return found if isinstance(found, Field) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    ):
        if aliases.get(node.func.value.id) != "shm.layout":
            return None
        if node.func.attr == "pool_file_offset":
            return layout.pool_file_offset(0)
        if node.func.attr == "worker_field" and isinstance(node.args[1], ast.Constant):
            name = str(node.args[1].value)
            role = str(node.args[0].value) if isinstance(node.args[0], ast.Constant) else None
            if name in ("pid", "restarts", "stop", "notified"):
                return layout.worker_field("flusher", name)  # the same writers for every worker
            if role is not None:
                return layout.worker_field(role, name)
    return None


def _slot_field(
    node: ast.expr, receiver: str, aliases: dict[str, str], module: str
) -> tuple[type[SlotTable], str] | None:
    """``qo.NEXT_OFFSET`` (or a bare name inside the table's own module) -> (table, field name)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        source, name = aliases.get(node.value.id), node.attr
    elif isinstance(node, ast.Name):
        source, name = module.removesuffix(".py").replace("/", "."), node.id
    else:
        return None
    table = SLOT_MODULES.get(source or "")
    if table is None:
        return None
    if table is QueueOffsetTable and "group" in receiver.lower():
        table = GroupOffsetTable
    offset = getattr(next(m for m in _TABLE_MODULES if m.__name__ == source), name, None)
    fields = {o: n for n, o in table.FIELDS.items()}
    return (table, fields[offset]) if isinstance(offset, int) and offset in fields else None


def _aliases(tree: ast.Module) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                found[a.asname or a.name] = a.name
    return found


_SPANS: dict[int, list[tuple[int, int, str]]] = {}


def _innermost(tree: ast.Module, line: int) -> str:
    """The name of the innermost function holding ``line``."""
    spans = _SPANS.get(id(tree))
    if spans is None:
        spans = _SPANS[id(tree)] = [
            (node.lineno, node.end_lineno or 0, node.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
    best, best_start = "<module>", 0
    for start, end, name in spans:
        if start <= line <= end and start >= best_start:
            best, best_start = name, start
    return best


SCANNED_AS_CALLS = {"shm/queue_offsets.py::find_or_insert", "shm/queue_offsets.py::find_or_insert_all"}
"""Writes made for a caller whose own call is scanned as the write (``find_or_insert`` stores a
new entry's used/queue_id/key_length in whichever keyed table it is called on)."""
INSERT_FIELDS = ("used", "queue_id", "key_length")


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse((ROOT / module).read_text(), module)


@functools.cache
def python_writes() -> list[Write]:
    writes: dict[tuple[str, str, str], Write] = {}
    files = [p for d in ("rmq_mp", "workers", "shm") for p in (ROOT / d).rglob("*.py")] + [ROOT / "run.py"]
    for path in files:
        module = path.relative_to(ROOT).as_posix()
        if module == "shm/layout.py":
            continue
        tree = _tree(module)
        aliases = _aliases(tree)
        loops: dict[str, list[Field]] = {}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.For)
                and isinstance(node.target, ast.Name)
                and isinstance(node.iter, ast.Tuple)
            ):
                fields = [_layout_field(e, aliases) for e in node.iter.elts]
                loops[node.target.id] = [f for f in fields if f is not None]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            where = f"{module}:{node.lineno}"
            function = _innermost(tree, node.lineno)
            if f"{module}::{function}" in SCANNED_AS_CALLS:
                continue
            receiver = ast.unparse(node.func.value)
            if node.func.attr in ("find_or_insert", "find_or_insert_all"):
                keyed = GroupOffsetTable if "group" in receiver.lower() else QueueOffsetTable
                for name in INSERT_FIELDS:
                    roles = keyed.WRITERS[name].roles
                    writes[(where, keyed.__name__, name)] = Write(
                        where, module, function, keyed.__name__, name, roles
                    )
                continue
            if node.func.attr not in ("set", "add") or not node.args:
                continue
            first = node.args[0]
            targets = loops.get(first.id, []) if isinstance(first, ast.Name) else []
            field = _layout_field(first, aliases)
            for f in [field] if field else targets:
                writes[(where, "pointer", f.name)] = Write(
                    where, module, function, "pointer", f.name, f.writers
                )
            if node.func.attr == "set" and len(node.args) == 3:
                slot_field = _slot_field(node.args[1], receiver, aliases, module)
                if slot_field:
                    table, name = slot_field
                    roles = table.WRITERS[name].roles
                    writes[(where, table.__name__, name)] = Write(
                        where, module, function, table.__name__, name, roles
                    )
    return list(writes.values())


def test_every_field_names_a_writer_and_a_shared_one_its_lock_or_why_not() -> None:
    """Two writers of one word need a lock, or a docstring saying why none is needed."""
    reasoned = {
        "pool0_file_offset": layout.pool_file_offset.__doc__,
        "flusher.notified": layout.worker_field.__doc__,
        "min_offset": layout.MIN_OFFSET.doc,
    }
    for f in layout.all_fields():
        assert f.writers, f.name
        key = f.name if not f.name.endswith(".notified") else "flusher.notified"
        key = "pool0_file_offset" if f.name.startswith("pool") else key
        if len(f.writers - {Role.SUPERVISOR}) > 1 and f.lock is None:
            assert "without" in (reasoned.get(key) or "") or "benign race" in (reasoned.get(key) or ""), (
                f.name
            )
    for table in (
        FlushRequestRing,
        WaiterTable,
        MemberTable,
        ScheduleOffsetTable,
        QueueOffsetTable,
        GroupOffsetTable,
    ):
        assert set(table.WRITERS) == set(table.FIELDS), table.__name__
        for name, writers in table.WRITERS.items():
            assert writers.roles, f"{table.__name__}.{name}"


def test_every_write_in_the_code_is_by_a_declared_writer() -> None:
    writes = python_writes()
    assert len(writes) > 100, "the scan finds the code's writes"
    unmapped, wrong = [], []
    for w in writes:
        roles = roles_of(w.module, w.function)
        if w.table == "pointer" and f"{w.module}::{w.function}" in STARTING:
            continue
        if roles is None:
            unmapped.append(f"{w.where} ({w.function}) writes {w.table}.{w.field}")
        elif not roles <= w.writers:
            undeclared = sorted(r.value for r in roles - w.writers)
            wrong.append(
                f"{w.where}: {undeclared} write {w.table}.{w.field}, declared {sorted(r.value for r in w.writers)}"
            )
    assert not unmapped, "map these modules to the role they run in (MODULE_ROLES):\n" + "\n".join(unmapped)
    assert not wrong, "\n".join(wrong)


CORE = ROOT / "rmq_mp/put/_core.c"


@functools.cache
def core_pointer_writes() -> frozenset[str]:
    """Pointer-table fields the compiled core stores (``w[s->w[W_X]] =``, ``+=`` or an atomic
    store), by the names its WORD_NAMES gives the Python side."""
    source = CORE.read_text()
    enum = re.search(r"enum \{\s*(W_WROTE.*?)W_COUNT", source, re.S)
    names = re.search(r"WORD_NAMES\[W_COUNT\] = \{(.*?)\};", source, re.S)
    assert enum
    assert names
    keys = [k.strip() for k in enum.group(1).split(",") if k.strip()]
    values = re.findall(r'"([A-Z_]+)"', names.group(1))
    word_name = dict(zip(keys, values, strict=True))
    stored = set(re.findall(r"w\[s->w\[(W_\w+)\]\]\s*(?:=|\+=)[^=]", source))
    stored |= set(re.findall(r"__atomic_store_n\(&w\[s->w\[(W_\w+)\]\]", source))
    stored |= set(re.findall(r"\*\)&w\[s->w\[(W_\w+)\]\]", source))  # the lock word, taken by CAS
    return frozenset(word_name[k] for k in stored)


def test_the_compiled_core_stores_only_producer_fields() -> None:
    stored = core_pointer_writes()
    assert "WROTE_POSITION" in stored, "the scan reads the core"
    for name in stored:
        assert Role.PRODUCER in getattr(layout, name).writers, (
            f"_core.c stores {name}, not declared a producer field"
        )


@functools.cache
def raw_stores() -> list[tuple[str, Field, set[str]]]:
    """Each store into a pointer-table word view (``w[_X] = ...``, ``w[layout.X.index] += ...``)
    with the field it stores and the fields declared to `PointerTable.words` by any caller: a
    view is taken once and handed on (the producer's to the appender, the journal, the flush
    requests), so a store is checked against every declaration, each made in a role `words`
    checked."""
    modules = [
        p.relative_to(ROOT).as_posix() for d in ("rmq_mp", "workers", "shm") for p in (ROOT / d).rglob("*.py")
    ]
    dotted = {m.removesuffix(".py").replace("/", "."): m for m in modules}
    raw_tuples: dict[tuple[str, str], list[ast.expr]] = {}
    for module in modules:
        for statement in _tree(module).body:
            if (
                isinstance(statement, ast.Assign)
                and isinstance(statement.targets[0], ast.Name)
                and isinstance(statement.value, ast.Tuple)
            ):
                raw_tuples[(module, statement.targets[0].id)] = list(statement.value.elts)

    def fields_of(module: str, name: str) -> list[Field]:
        """A module-level tuple of fields, ``*other.TUPLE`` elements expanded."""
        aliases = _aliases(_tree(module))
        out = []
        for element in raw_tuples.get((module, name), []):
            if isinstance(element, ast.Starred):
                inner = element.value
                if isinstance(inner, ast.Name):
                    target = aliases.get(inner.id, "")
                    source, _, tuple_name = target.rpartition(".")
                    out += fields_of(dotted.get(source, module), tuple_name or inner.id)
                elif isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name):
                    out += fields_of(dotted.get(aliases.get(inner.value.id, ""), ""), inner.attr)
            elif (field := _layout_field(element, aliases)) is not None:
                out.append(field)
        return out

    declared: set[str] = set()
    for module in modules:
        tree = _tree(module)
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "words"
            ):
                for arg in node.args:
                    if isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
                        name = arg.value.id
                        source, _, imported = aliases.get(name, "").rpartition(".")
                        owner = dotted.get(source, module) if imported else module
                        declared |= {f.name for f in fields_of(owner, imported or name)}
                    elif (field := _layout_field(arg, aliases)) is not None:
                        declared.add(field.name)
    found = []
    for module in modules:
        tree = _tree(module)
        aliases = _aliases(tree)
        constants: dict[str, Field] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                value = node.value
                if isinstance(value, ast.Attribute) and value.attr == "index":
                    field = _layout_field(value.value, aliases)
                    if field:
                        constants[node.targets[0].id] = field
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign | ast.AugAssign):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Subscript):
                    continue
                index = target.slice
                field = None
                if isinstance(index, ast.Name):
                    field = constants.get(index.id)
                elif isinstance(index, ast.Attribute) and index.attr == "index":
                    field = _layout_field(index.value, aliases)
                if field is not None:
                    found.append((f"{module}:{node.lineno}", field, declared))
    return found


def test_every_raw_word_store_is_of_a_field_declared_to_words() -> None:
    """`PointerTable.words` checks the fields its caller declares; this checks that the caller
    stores no other (the view itself cannot refuse a store)."""
    stores = raw_stores()
    assert len(stores) > 15, "the scan finds the put path's stores"
    undeclared = [
        f"{where}: {field.name}" for where, field, declared in stores if field and field.name not in declared
    ]
    assert not undeclared, "stored through a words() view that did not declare them:\n" + "\n".join(
        undeclared
    )


NEVER_SEEN_WRITING: dict[str, set[Role]] = {}
"""Declared writers the scan cannot see write (none: each declaration is a real write)."""


def test_every_declared_writer_of_a_named_field_writes_it() -> None:
    """The other direction: a role named a writer of a field it never writes makes the layout
    lie about who may race on it. The supervisor may write any field while the store starts."""
    found: dict[str, set[Role]] = defaultdict(set)
    for w in python_writes():
        if w.table == "pointer":
            found[w.field] |= roles_of(w.module, w.function) or set()
    for name in core_pointer_writes():
        found[getattr(layout, name).name].add(Role.PRODUCER)
    for where, field, _ in raw_stores():
        module = where.split(":")[0]
        if field is not None:
            line = int(where.split(":")[1])
            found[field.name] |= roles_of(module, _innermost(_tree(module), line)) or set()
    lying = []
    for f in layout.FIELDS:
        extra = f.writers - found[f.name] - NEVER_SEEN_WRITING.get(f.name, set())
        if extra:
            lying.append(f"{f.name}: declared {sorted(r.value for r in extra)}, who never write it")
    assert not lying, "\n".join(lying)


@pytest.mark.parametrize("role", [r for r in Role if r not in (Role.PRODUCER, Role.SUPERVISOR)])
def test_a_role_that_is_no_producer_may_not_take_the_put_paths_words(role: Role) -> None:
    """The runtime half: `words` refuses the put path's stores to any other role, as `set` does."""
    from shm.pointer_table import PointerTable
    from shm.segment import SharedSegment

    name = f"/rmqtest_writers_{role.value}_{id(role)}"
    table = PointerTable.create(name)
    other = PointerTable.attach(name, role)
    try:
        table.set(layout.STATE, layout.RUNNING)
        if role is not Role.HA:  # a SLAVE's ha worker writes the log (its producers are refused)
            with pytest.raises(PermissionError, match="may not write wrote_position"):
                other.words(layout.WROTE_POSITION)
        with pytest.raises(PermissionError, match="may not write put_count"):
            other.set(layout.PUT_COUNT, 1)
    finally:
        other.close()
        table.close()
        SharedSegment.unlink(name)


SLOT_TABLES = ("queues", "groups", "ring", "waiters", "members", "schedule")
UNCHECKED_SLOT_STORES: set[str] = set()
"""Stores through a slot table's read view (`SlotTable.words`) rather than `writable_words`,
which checks the writer: none (the test fails when one is added)."""


def test_slot_table_word_stores_take_the_checked_view() -> None:
    found = set()
    for d in ("rmq_mp", "workers", "shm"):
        for path in (ROOT / d).rglob("*.py"):
            module = path.relative_to(ROOT).as_posix()
            tree = _tree(module)
            views = set()
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "words"
                    and ast.unparse(node.value.value).split(".")[-1] in SLOT_TABLES
                ):
                    views |= {ast.unparse(t) for t in node.targets}
            for node in ast.walk(tree):
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AugAssign)
                    else []
                )
                for target in targets:
                    if isinstance(target, ast.Subscript) and ast.unparse(target.value) in views:
                        found.add(f"{module}: {ast.unparse(target.value)}")
    assert found == UNCHECKED_SLOT_STORES
