"""The recorded RocketMQ 4.9.8 HA exchange (tests/fixtures/rocketmq-4.9.8-ha.tar.xz) as chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SLAVE_TO_MASTER = "slave->master"
MASTER_TO_SLAVE = "master->slave"


@dataclass(frozen=True, slots=True)
class Chunk:
    direction: str
    t_ms: float
    data: bytes


def chunks(fixture: Path) -> list[Chunk]:
    out = []
    for line in (fixture / "transcript.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append(Chunk(rec["dir"], rec["t_ms"], bytes.fromhex(rec["hex"])))
    return out


def stream(fixture: Path, direction: str) -> bytes:
    return b"".join(c.data for c in chunks(fixture) if c.direction == direction)
