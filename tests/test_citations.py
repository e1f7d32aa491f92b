"""Every section the code cites in docs/format.md or docs/durability.md exists there, and no
file cites a reference that lives outside the repository.

A citation is a doc name (``docs/format.md``, ``format.md``, ``docs/durability.md``,
``durability.md``, any path before it) followed by a section list: ``§2.1``, ``§7.7, §7.8``,
``§5.4-§5.6``, ``§3.2 and §12``, whitespace and line breaks allowed between the parts. A
section resolves when the cited doc has a ``##``/``###`` heading that starts with its number
(``## 2. ...``, ``### 2.1 ...``). Scanned: every tracked or untracked-but-not-ignored .py,
.pyi, .c and .md file and conf/broker.conf (`git ls-files`; a walk of the tree without git).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"format.md": ROOT / "docs" / "format.md", "durability.md": ROOT / "docs" / "durability.md"}
SUFFIXES = (".py", ".pyi", ".c", ".md")
EXTRA_FILES = ("conf/broker.conf",)
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", ".mypy_cache"}

_SECTION = r"§\s*\d+(?:\.\d+)*"
CITATION = re.compile(
    r"(?<![\w./-])(?:[\w.-]+/)*(?P<doc>format|durability)\.md"
    rf"(?P<sections>\s*{_SECTION}(?:\s*(?:,|-|–|and|or|to)\s*{_SECTION})*)"
)
SECTION_NUMBER = re.compile(r"§\s*(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,3}\s+(\d+(?:\.\d+)*)\.?(?:\s|$)", re.MULTILINE)
# Built from parts so that this file does not cite them itself.
OUTSIDE_REFERENCES = re.compile(
    r"(?<![\w-])(?:rocketmq-" + r"format|" + r"design|" + r"style|" + r"measurements|" + r"pyspark-notes)\.md"
)


def repository_files(root: Path = ROOT) -> list[Path]:
    """The files to scan, relative to ``root``."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode("utf-8")
        names = [name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for directory, subdirs, files in os.walk(root):
            subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS and not d.startswith(".")]
            names.extend(os.path.relpath(os.path.join(directory, f), root) for f in files)
    return sorted(
        Path(name)
        for name in set(names)
        if (name.endswith(SUFFIXES) or name in EXTRA_FILES) and (root / name).is_file()
    )


def headings(doc: Path) -> set[str]:
    """Section numbers that have a heading in ``doc``."""
    return set(HEADING.findall(doc.read_text(encoding="utf-8")))


def citations(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, doc name, section number) for every section cited in ``text``."""
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for number in SECTION_NUMBER.findall(match["sections"]):
            yield line, f"{match['doc']}.md", number


def unresolved(root: Path, files: list[Path], docs: dict[str, Path]) -> list[str]:
    """``file:line: doc §N`` for each cited section with no heading in its doc."""
    known = {name: headings(path) for name, path in docs.items()}
    problems = []
    for name in files:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        for line, doc, number in citations(text):
            if number not in known[doc]:
                problems.append(f"{name}:{line}: docs/{doc} §{number} has no heading")
    return problems


def outside_references(root: Path, files: list[Path]) -> list[str]:
    """``file:line: text`` for each mention of a reference document kept outside the repository."""
    found = []
    for name in files:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_REFERENCES.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


def test_docs_number_their_sections() -> None:
    """The numbering the code relies on is there (format: §1-§14; durability: §1-§6)."""
    assert {str(n) for n in range(1, 15)} <= headings(DOCS["format.md"])
    for number in ("2.1", "2.10", "3.4", "4.6", "5.6", "7.8", "8.5", "10.4", "14.2"):
        assert number in headings(DOCS["format.md"]), number
    assert {str(n) for n in range(1, 7)} <= headings(DOCS["durability.md"])


def test_citation_parsing() -> None:
    """The forms the tree uses, each read as the sections it names, and nothing else."""
    text = (
        "a (docs/format.md §2, §3.4, §7.3): b\n"
        "c format.md §5.4-§5.6 and rocketmq-" + "format.md " + "§99\n"
        "d ../docs/durability.md\n   §3. e docs/format.md §3.1 (x) and §12 (y)\n"
        "f (format.md §13, §14.2). [format.md](format.md) §9"
    )
    assert list(citations(text)) == [
        (1, "format.md", "2"),
        (1, "format.md", "3.4"),
        (1, "format.md", "7.3"),
        (2, "format.md", "5.4"),
        (2, "format.md", "5.6"),
        (3, "durability.md", "3"),
        (4, "format.md", "3.1"),
        (5, "format.md", "13"),
        (5, "format.md", "14.2"),
    ]


def test_every_cited_section_exists() -> None:
    problems = unresolved(ROOT, repository_files(), DOCS)
    assert not problems, "citations of missing sections:\n" + "\n".join(problems)


def test_no_citation_leaves_the_repository() -> None:
    """The team's shared notes (the RocketMQ format reference, the design contract, the style
    examples, measurements, PySpark notes) are not in a clone: cite docs/format.md and
    docs/durability.md instead (same section numbers), or say it in place."""
    found = outside_references(ROOT, repository_files())
    assert not found, "references to documents outside the repository:\n" + "\n".join(found)
