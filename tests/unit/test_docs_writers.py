"""docs/architecture.md "Who writes what" agrees with shm/layout.py: the table a newcomer reads
names, for each pointer-table field it lists, exactly the roles the layout lets write it (issue
30: the two had drifted; `running_flags` was said to be written by reput and the supervisor)."""

from __future__ import annotations

import re
from pathlib import Path

from shm import layout
from shm.layout import Role

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ROLE_WORDS = {
    "producer": Role.PRODUCER,
    "producers": Role.PRODUCER,
    "allocator": Role.ALLOCATOR,
    "committer": Role.COMMITTER,
    "flusher": Role.FLUSHER,
    "reput": Role.REPUT,
    "cleaner": Role.CLEANER,
    "scheduler": Role.SCHEDULER,
    "ha": Role.HA,
    "supervisor": Role.SUPERVISOR,
    "reader": Role.CONSUMER,
    "consumer": Role.CONSUMER,
    "consumers": Role.CONSUMER,
}


def writer_rows() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Who writes what", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("field", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def test_the_table_names_each_listed_fields_writers() -> None:
    fields = {f.name: f for f in layout.FIELDS}
    checked = 0
    for names, writers in writer_rows():
        # Pointer-table fields only: not a worker's own fields, not another table's (`version`).
        top_level = ";".join(
            part.split("table's", 1)[0] for part in names.split(";") if not part.strip().startswith("worker")
        )
        listed = [fields[n] for n in re.findall(r"`([a-z_]+)`", top_level) if n in fields]
        if not listed:
            continue
        said = {ROLE_WORDS[w] for w in re.findall(r"[a-z]+", writers.lower()) if w in ROLE_WORDS}
        expected = set().union(*(f.writers for f in listed))
        assert said == expected, (
            f"{names}: the doc says {sorted(r.value for r in said)}, the layout {sorted(r.value for r in expected)}"
        )
        checked += 1
    assert checked >= 8, "the table's rows were not found: did its heading or shape change?"
