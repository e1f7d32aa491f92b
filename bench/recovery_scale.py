"""Recovery of a store of 12,000 queues beside a store of the same bytes in 8 queues.

    python -m bench.recovery_scale [--messages N] [--queues Q] [--cq-entries E] [--dir DIR]

Both stores hold the same messages (same bodies, topic names of one length, so every record has
the same size and the commit logs are byte for byte as long): Q queues (750 topics x 16 queue
ids for 12,000) round-robin, or 8 (one topic). Each is then opened by `MessageStore.open` in a
fresh child process, twice: after a clean close (normal recovery) and with the `abort` file
present (abnormal recovery: the commit log is CRC-checked from the checkpoint and every queue
is checked against it). The child reports the time `MessageStore.open` took, its peak RSS
(``ru_maxrss``) beside its RSS before opening and, once open, its anonymous and file-backed
RSS (mapped file pages count in RSS while mapped), the queue files it had mapped afterwards (lines
of /proc/self/maps) and how many it mapped again (``maxOpenConsumeQueueFiles`` at its default).

ConsumeQueue files of E entries (default 4,000: 80 KB; ``--cq-entries 300000`` is RocketMQ's
6 MB, which sparse files make cheap on disk too). Page cache warm (the stores were just
written); a figure, not a test: no assertion on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.store.message_store import MessageStore

QUEUE_IDS_PER_TOPIC = 16
COMMIT_LOG_FILE_BYTES = 64 << 20
BODY_BYTES = 128


def config_for(root: Path, cq_entries: int) -> MessageStoreConfig:
    return MessageStoreConfig().replace(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=COMMIT_LOG_FILE_BYTES,
        mapped_file_size_consume_queue=cq_entries * CQ_STORE_UNIT_SIZE,
    )


def queue_of(i: int, queues: int) -> tuple[str, int]:
    """Message i's topic and queue id: round-robin over ``queues``; names all 6 characters."""
    q = i % queues
    if queues <= QUEUE_IDS_PER_TOPIC:
        return "T00000", q
    return f"T{q // QUEUE_IDS_PER_TOPIC:05d}", q % QUEUE_IDS_PER_TOPIC


def build(root: Path, messages: int, queues: int, cq_entries: int) -> float:
    """Write the store; seconds taken."""
    body = os.urandom(BODY_BYTES)
    began = time.perf_counter()
    with MessageStore.open(config=config_for(root, cq_entries)) as store:
        for i in range(messages):
            topic, queue_id = queue_of(i, queues)
            result = store.put_message(m.Message(topic=topic, body=body, queue_id=queue_id))
            if not result.ok:
                raise SystemExit(f"put {i} to {topic}/{queue_id}: {result}")
    return time.perf_counter() - began


def allocated_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def child(root: Path, cq_entries: int) -> dict[str, Any]:
    """In a fresh process: open (recover) the store and say what it cost."""
    rss_before_kib = _status_kib("VmRSS")
    began = time.perf_counter()
    store = MessageStore.open(config=config_for(root, cq_entries))
    seconds = time.perf_counter() - began
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    prefix = str(root / "consumequeue") + "/"
    with open("/proc/self/maps") as maps:
        mapped = sum(1 for line in maps if prefix in line)
    report = store.recovery
    assert report is not None
    out = {
        "open_s": round(seconds, 3),
        "abnormal": report.abnormal,
        "rss_before_mib": round(rss_before_kib / 1024, 1),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "rss_anon_mib": round(_status_kib("RssAnon") / 1024, 1),
        "rss_file_mib": round(_status_kib("RssFile") / 1024, 1),
        "queue_files_mapped": mapped,
        "queues": len(store.cq_table.all()),
        "remaps": store.cq_table.pool.reopens,
        "max_open": store.cq_table.pool.max_open,
        "records_dispatched": report.records_dispatched,
    }
    store.close()
    return out


def measure(root: Path, cq_entries: int, *, abnormal: bool) -> dict[str, Any]:
    if abnormal:
        (root / "abort").touch()
    done = subprocess.run(
        [sys.executable, "-m", "bench.recovery_scale", "--child", str(root), "--cq-entries", str(cq_entries)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=240_000)
    parser.add_argument("--queues", type=int, default=12_000)
    parser.add_argument("--cq-entries", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each kind (all printed)")
    parser.add_argument("--dir", type=Path, default=None, help="where to build (deleted after)")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.cq_entries)))
        return
    base = Path(tempfile.mkdtemp(prefix="recovery-scale-", dir=args.dir))
    try:
        for queues in (args.queues, 8):
            root = base / f"q{queues}"
            build_s = build(root, args.messages, queues, args.cq_entries)
            print(
                f"{queues} queues: {args.messages} x {BODY_BYTES} B built in {build_s:.1f} s; commit log "
                f"{allocated_bytes(root / 'commitlog') >> 20} MiB, consumequeue "
                f"{allocated_bytes(root / 'consumequeue') >> 20} MiB allocated",
                flush=True,
            )
            for _round in range(args.rounds):
                for abnormal in (False, True):
                    row = measure(root, args.cq_entries, abnormal=abnormal)
                    print(f"  {'abnormal' if abnormal else 'normal  '} {json.dumps(row)}", flush=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
