"""Seeded random damage of every file kind, with and without a crash marker, checked against what
was acknowledged.

Each case writes a store of `COUNT` messages (small files: many commit-log, queue and index
files), damages one file (or directory) chosen by the case's seed, and reopens the store. The
store must then either refuse with a typed `StoreError` (one line, nothing touched), or start
and give: no record served twice, none served that is not byte for byte an acknowledged one (so
never a body failing its CRC) but one damaged only in bytes RocketMQ's format has no check for
(then with its acknowledged body, topic, queue and offset), every acknowledged record whose bytes
survive served by its queue at its offset and found by its unique keys, and every acknowledged
record not served covered by a finding of the store's `Reporter` that names its commit-log
offset (a cut's range, a lost tail's range, a skipped record, a skipped queue entry pointing at it).

Every case prints its seed; replay one with ``RMQ_DAMAGE_SEED=<seed> pytest tests/crash/test_seeded_damage.py``.
``RMQ_DAMAGE_CASES`` sets how many cases run (default 64, a few seconds per worker)."""

from __future__ import annotations

import os
import random
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import StoreError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.store.message_store import MessageStore
from tests.damage_check import assert_intact_served, write_store

COUNT = 600
MESSAGE_SEED = 23
CASES = int(os.environ.get("RMQ_DAMAGE_CASES", "64"))
SEEDS = [int(os.environ["RMQ_DAMAGE_SEED"])] if "RMQ_DAMAGE_SEED" in os.environ else list(range(1, CASES + 1))

KINDS = ["commitlog", "consumequeue", "index", "checkpoint", "offsets", "marker", "junk", "swap"]
OFFSETS = {("OrderTopic", "g1", 0): 7, ("Payments", "g1", 3): 40, ("Payments", "g-two", 1): 12}
"""Committed before the damage: a store that starts must still hold exactly these."""
OPS = ["flip", "zero", "random", "truncate", "delete"]


@dataclass
class Damage:
    kind: str
    op: str
    path: Path
    detail: str


def pick_file(rnd: random.Random, root: Path, kind: str) -> Path:
    if kind == "commitlog":
        return rnd.choice(sorted((root / "commitlog").iterdir()))
    if kind == "consumequeue":
        return rnd.choice(sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file()))
    if kind == "index":
        return rnd.choice(sorted((root / "index").iterdir()))
    if kind == "offsets":
        return rnd.choice(
            [p for p in (root / "config").iterdir() if p.name.startswith("consumerOffset")]
            + [root / "configChecksum.json"]
        )
    return root / "checkpoint"


def damage_file(rnd: random.Random, path: Path, op: str) -> str:
    size = path.stat().st_size
    data = path.read_bytes()
    used = len(data.rstrip(b"\0")) or size  # damage where the data is, mostly
    at = rnd.randrange(max(1, min(size, used + 64)))
    if op == "flip":
        flips = rnd.randint(1, 3)
        with path.open("r+b") as f:
            for _ in range(flips):
                pos = min(size - 1, at + rnd.randrange(64))
                f.seek(pos)
                f.write(bytes([data[pos] ^ (1 << rnd.randrange(8))]))
        return f"{flips} bit(s) flipped near {at}"
    if op in ("zero", "random"):
        length = min(rnd.randint(1, 300), size - at)
        with path.open("r+b") as f:
            f.seek(at)
            f.write(bytes(length) if op == "zero" else rnd.randbytes(length))
        return f"{length} byte(s) {'zeroed' if op == 'zero' else 'randomised'} at {at}"
    if op == "truncate":
        os.truncate(path, at)
        return f"cut to {at} bytes"
    if path.name != "checkpoint" and path.parent.name == "commitlog" and path == min(path.parent.iterdir()):
        path.unlink()  # the first commit-log file gone looks exactly like expiry
        return "deleted (first commit-log file: as expired)"
    path.unlink()
    return "deleted"


def apply(rnd: random.Random, root: Path) -> Damage:
    kind = rnd.choice(KINDS)
    if kind == "marker":
        abort = root / "abort"
        if abort.exists():
            abort.unlink()
            return Damage(kind, "delete", abort, "crash marker removed")
        abort.touch()
        return Damage(kind, "create", abort, "crash marker added")
    if kind == "junk":
        queue_dirs = [p for p in (root / "consumequeue").rglob("*") if p.is_dir()][:20]
        parent = rnd.choice([root, root / "commitlog", root / "index", root / "consumequeue", *queue_dirs])
        junk = parent / rnd.choice(
            ["junk", ".hidden", "12345", "00000000000000000007", "999999999999999999999"]
        )
        if junk.exists():
            return Damage(kind, "none", junk, "already there")
        junk.write_bytes(rnd.randbytes(rnd.randint(0, 100)))
        return Damage(kind, "add", junk, "junk file added")
    if kind == "swap":
        victim = rnd.choice(
            [
                root / "checkpoint",
                root / "commitlog",
                root / "index",
                root / "consumequeue",
                *sorted((root / "commitlog").iterdir())[-1:],
                *sorted((root / "index").iterdir())[-1:],
            ]
        )
        if victim.is_dir():
            shutil.rmtree(victim)
            victim.write_bytes(b"not a directory")
            return Damage(kind, "dir->file", victim, "a file where a directory belongs")
        victim.unlink()
        victim.mkdir()
        return Damage(kind, "file->dir", victim, "a directory where a file belongs")
    op = rnd.choice(OPS)
    path = pick_file(rnd, root, kind)
    return Damage(kind, op, path, damage_file(rnd, path, op))


def record_intact(
    before: dict[Path, bytes], root: Path, file_size: int, phy: int, size: int, *, checked_only: bool = False
) -> bool:
    """The record's bytes are in its commit-log file, unchanged; with ``checked_only``, those a
    read can check are: TOTALSIZE to QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG's used byte,
    the body and the topic. RocketMQ's format has no check of the rest (FLAG, timestamps, hosts,
    reconsume times, properties), so a record damaged only there may be served as it now is."""
    path = root / "commitlog" / f"{phy - phy % file_size:020d}"
    original = before[path]
    if not path.is_file():
        return False
    now = path.read_bytes()
    start = phy % file_size
    if not checked_only:
        return now[start : start + size] == original[start : start + size]
    sys_flag = int.from_bytes(original[start + 36 : start + 40], "big")
    body_at = start + 48 + (20 if sys_flag & 0x10 else 8) + 8 + (20 if sys_flag & 0x20 else 8) + 12
    body_len = int.from_bytes(original[body_at : body_at + 4], "big")
    topic_end = body_at + 4 + body_len + 1 + original[body_at + 4 + body_len]
    checked = [(0, 16), (20, 36), (39, 40), (body_at - start, topic_end - start)]
    return all(now[start + a : start + b] == original[start + a : start + b] for a, b in checked)


PHY_RANGED = ("commitlog-truncated", "commitlog-missing", "record-invalid", "record-crc-failed")
"""Findings whose range is in commit-log offsets."""


def reported(findings: list, phy: int) -> bool:
    """A finding names the record at ``phy``: its commit-log range holds it (a last file cut short
    reports its zero-filled range in the file's bytes), or a skipped queue entry points at it."""
    return any(
        (d.kind in PHY_RANGED and d.start <= phy < max(d.end, d.start + 1))
        or (d.kind == "short-file-extended" and d.start <= phy - int(Path(d.path).name) < d.end)
        or (d.kind == "index-entry-invalid" and d.start == phy)
        or (d.kind == "queue-entry-invalid" and f"(commit-log offset {phy}," in d.reason)
        for d in findings
    )


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_seeded_damage(small_config: MessageStoreConfig, seed: int) -> None:
    rnd = random.Random(seed)
    crash = rnd.random() < 0.5
    config = small_config
    messages, results = write_store(config, COUNT, MESSAGE_SEED, crash=crash, commits=OFFSETS)
    root = Path(config.store_path_root_dir)
    before = {p: p.read_bytes() for p in (root / "commitlog").iterdir()}
    damage = apply(rnd, root)
    print(
        f"seed={seed} crash={crash} damage={damage.kind}/{damage.op} {damage.path.relative_to(root)}: {damage.detail}"
    )
    check_reopened(config, messages, results, before, strict=config.enabled_append_prop_crc)


@dataclass(frozen=True)
class Served:
    """What a reopened damaged store served (commit-log offsets), and what it had to."""

    surviving: set[int]
    tolerated: set[int]
    served: set[int]


def check_reopened(
    config: MessageStoreConfig,
    messages: list[m.Message],
    results: list,
    before: dict[Path, bytes],
    *,
    strict: bool,
) -> Served | None:
    """Reopen the damaged store: a one-line refusal (None), or the promises of the module
    docstring (what it served, for a restart to compare). ``strict`` (records with the
    whole-record CRC): nothing tolerated, and every record served is byte for byte in its file
    as written, in every field."""
    root = Path(config.store_path_root_dir)
    refusal: str | None
    try:
        reopened = MessageStore.open(config=config)
    except StoreError as exc:
        refusal = str(exc)
    else:
        refusal = None
    if refusal is not None:
        assert refusal
        assert "\n" not in refusal, refusal
        print(f"refused: {refusal}")
        return None
    with reopened:
        assert reopened.recovery is not None
        end = reopened.recovery.recovered_end_offset
        file_size = config.mapped_file_size_commit_log
        surviving = {
            r.phy_offset
            for r in results
            if r.phy_offset + r.wrote_bytes <= end
            and record_intact(before, root, file_size, r.phy_offset, r.wrote_bytes)
        }
        cut = [d for d in reopened.reporter.findings if d.kind == "commitlog-truncated"]
        for r in results:
            if r.phy_offset not in surviving and record_intact(
                before, root, file_size, r.phy_offset, r.wrote_bytes
            ):
                assert (
                    any(d.start <= r.phy_offset < d.end for d in cut)
                    or r.phy_offset < reopened.min_phy_offset()
                ), f"intact record at {r.phy_offset} dropped without a report"
        tolerated = (
            set()
            if strict
            else {
                r.phy_offset
                for r in results
                if r.phy_offset not in surviving
                and r.phy_offset + r.wrote_bytes <= end
                and record_intact(before, root, file_size, r.phy_offset, r.wrote_bytes, checked_only=True)
            }
        )
        served = {
            msg.commit_log_offset
            for msg in assert_intact_served(reopened, messages, results, surviving, tolerated)
        }
        sizes = {r.phy_offset: r.wrote_bytes for r in results}
        damaged = [phy for phy in served if not record_intact(before, root, file_size, phy, sizes[phy])]
        assert not (strict and damaged), f"damaged records served as intact: {damaged}"
        min_phy = reopened.min_phy_offset()
        for msg, r in zip(messages, results, strict=True):
            if r.phy_offset >= min_phy and r.phy_offset not in served and m.is_dispatchable(msg.sys_flag):
                assert reported(reopened.reporter.findings, r.phy_offset), (
                    f"record at {r.phy_offset} dropped without a report: {reopened.reporter.findings}"
                )
        offsets = reopened.consumer_offsets
        assert {key: offsets.query_offset(key[1], key[0], key[2]) for key in OFFSETS} == OFFSETS, (
            "a store that starts keeps every committed offset"
        )
        return Served(surviving, tolerated, served)


FIELD_CASES = int(os.environ.get("RMQ_FIELD_DAMAGE_CASES", "48"))
FIELD_SEEDS = (
    [int(os.environ["RMQ_FIELD_DAMAGE_SEED"])]
    if "RMQ_FIELD_DAMAGE_SEED" in os.environ
    else list(range(1, FIELD_CASES + 1))
)


def record_fields(data: bytes, start: int) -> dict[str, tuple[int, int]]:
    """Every field of the record at ``data[start:]``, as [begin, end) in ``data``: record.py's
    fixed fields, BODY, TOPICLEN, TOPIC, PROPLEN, PROPERTIES and the whole-record CRC's tail."""
    sys_flag = int.from_bytes(data[start + 36 : start + 40], "big")
    born_v6, store_v6 = bool(sys_flag & m.BORNHOST_V6_FLAG), bool(sys_flag & m.STOREHOSTADDRESS_V6_FLAG)
    fields: dict[str, tuple[int, int]] = {}
    p = start
    for name, code in record.fixed_fields(born_v6, store_v6):
        size = struct.calcsize(">" + code)
        fields[name] = (p, p + size)
        p += size
    body_len = int.from_bytes(data[fields["BODYLEN"][0] : fields["BODYLEN"][1]], "big")
    fields["BODY"] = (p, p + body_len)
    p += body_len
    fields["TOPICLEN"] = (p, p + 1)
    fields["TOPIC"] = (p + 1, p + 1 + data[p])
    p += 1 + data[p]
    props_len = int.from_bytes(data[p : p + 2], "big")
    fields["PROPLEN"] = (p, p + 2)
    end = p + 2 + props_len
    fields["PROPERTIES"] = (p + 2, end - record.CRC32_RESERVED_LEN)
    fields["__CRC32#"] = (end - record.CRC32_RESERVED_LEN, end)
    return {name: span for name, span in fields.items() if span[1] > span[0]}


@pytest.mark.parametrize("seed", FIELD_SEEDS, ids=[f"seed{s}" for s in FIELD_SEEDS])
def test_seeded_damage_of_each_record_field(small_config: MessageStoreConfig, seed: int) -> None:
    """One field of one record damaged (a bit flipped, zeroed, or randomised, in part or whole),
    the record in the last commit-log file half of the time (read by recovery), else anywhere:
    with the whole-record CRC no damaged record is served, whatever the field."""
    rnd = random.Random(seed)
    crash = rnd.random() < 0.5
    config = small_config
    assert config.enabled_append_prop_crc, "the default writes the whole-record CRC"
    messages, results = write_store(config, COUNT, MESSAGE_SEED, crash=crash, commits=OFFSETS)
    root = Path(config.store_path_root_dir)
    before = {p: p.read_bytes() for p in (root / "commitlog").iterdir()}
    file_size = config.mapped_file_size_commit_log
    last_file = max(r.phy_offset for r in results) // file_size
    candidates = (
        [r for r in results if r.phy_offset // file_size == last_file] if rnd.random() < 0.5 else results
    )
    victim = rnd.choice(candidates)
    path = root / "commitlog" / f"{victim.phy_offset - victim.phy_offset % file_size:020d}"
    data = bytearray(before[path])
    fields = record_fields(bytes(data), victim.phy_offset % file_size)
    name = rnd.choice(sorted(fields))
    begin, end = fields[name]
    op = rnd.choice(["flip", "zero", "random"])
    if op == "flip":
        at = rnd.randrange(begin, end)
        data[at] ^= 1 << rnd.randrange(8)
    else:
        a = rnd.randrange(begin, end)
        b = rnd.randint(a + 1, end) if rnd.random() < 0.5 else end
        a = begin if rnd.random() < 0.3 else a
        data[a:b] = bytes(b - a) if op == "zero" else rnd.randbytes(b - a)
    path.write_bytes(data)
    print(f"seed={seed} crash={crash} {op} {name} of the record at {victim.phy_offset} ({path.name})")
    check_reopened(config, messages, results, before, strict=True)
