"""One place where damage found on disk is reported: logged once and counted.

LevelDB's `log::Reader::Reporter` idea: recovery, reput and loaders never
silently skip bytes; every dropped byte range, truncated entry and repaired file goes through a
`Reporter`, so `statistics()` and `run.py status` can show what happened and tests can assert it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

log = logging.getLogger("rmq_mp.damage")


@dataclass(frozen=True, slots=True)
class Damage:
    """One finding. ``start``/``end`` are byte offsets in the file's own address space
    (commit-log phy offsets, consume-queue byte positions, index entry numbers)."""

    kind: str
    path: str
    start: int
    end: int
    reason: str


@dataclass(slots=True)
class Reporter:
    """Collects `Damage` records; thread-safe, cheap when nothing is wrong."""

    findings: list[Damage] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, kind: str, path: str, start: int, end: int, reason: str) -> None:
        damage = Damage(kind, path, start, end, reason)
        with self._lock:
            self.findings.append(damage)
        log.warning("%s in %s: [%d, %d) %s", kind, path, start, end, reason)

    def count(self, kind: str | None = None) -> int:
        return sum(1 for d in self.findings if kind is None or d.kind == kind)

    def bytes_dropped(self, kind: str) -> int:
        return sum(d.end - d.start for d in self.findings if d.kind == kind)
