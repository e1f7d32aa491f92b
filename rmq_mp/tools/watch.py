"""`run.py status --watch`: a live terminal view of a running store (rich).

Each refresh is one `collect_status` read; rates are the difference of two reads divided by the
time between them, so the view costs the store nothing. Shows throughput, commit-log offsets and
lags, consumer lag per group, worker health and restarts, pool occupancy and the disk ratio.
``--count N`` stops after N refreshes (scripts, tests); otherwise Ctrl-C, or the store stopping.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ShmAttachError, StoreError
from rmq_mp.tools.store_status import collect_status, replication_summary


def _rate(current: dict[str, Any], before: dict[str, Any] | None, key: str, seconds: float) -> float:
    if before is None or seconds <= 0:
        return 0.0
    return max(current["counters"][key] - before["counters"][key], 0) / seconds


def render(status: dict[str, Any], before: dict[str, Any] | None, seconds: float) -> Group:
    """One frame from two consecutive reads (``before`` None on the first)."""
    header = Text.assemble(
        (f"{status['state']}", "bold green" if status["state"] == "RUNNING" else "bold red"),
        f"  {status['store']}  shm {status['shm_name']}  {status['flush_disk_type']}  supervisor pid "
        f"{status['supervisor_pid']}",
    )
    rates = Table(title="throughput", expand=True)
    for column in ("puts/s", "MB/s", "dispatch/s", "flushes/s", "latency/message", "lock hold avg"):
        rates.add_column(column, justify="right")
    m = status["producer_metrics"]
    rates.add_row(
        f"{_rate(status, before, 'put_count', seconds):,.0f}",
        f"{_rate(status, before, 'put_bytes', seconds) / 1e6:,.2f}",
        f"{_rate(status, before, 'dispatch_count', seconds):,.0f}",
        f"{_rate(status, before, 'flush_count', seconds):,.1f}",
        f"{m.get('put_latency_per_message_avg_us', 0):,.1f} us",
        f"{m.get('lock_hold_avg_us', 0)} us",
    )
    # One row per pointer, so three columns of numbers fit any terminal: a number is never cut.
    offsets = Table(title="commit log (bytes)", expand=True)
    o, lag = status["offsets"], status["lags"]
    offsets.add_column("pointer")
    offsets.add_column("offset", justify="right", no_wrap=True, min_width=len(f"{max(o.values()):,}"))
    offsets.add_column("lag", justify="right", no_wrap=True)
    for key, behind in (
        ("min", ""),
        ("wrote", ""),
        ("committed", "commit"),
        ("flushed", "flush"),
        ("reput", "reput"),
    ):
        offsets.add_row(key, f"{o[key]:,}", f"{lag[behind]:,}" if behind else "")
    workers = Table(title="workers", expand=True)
    for column in ("worker", "pid", "state", "restarts", "heartbeat", "errors", "passes"):
        workers.add_column(column, justify="left" if column in ("worker", "state") else "right")
    for role, w in status["workers"].items():
        style = "red" if w["state"] != "ready" or w["heartbeat_age_ms"] > 5000 else ""
        workers.add_row(
            role,
            str(w["pid"]),
            w["state"],
            str(w["restarts"]),
            f"{w['heartbeat_age_ms']} ms",
            str(w["errors"]),
            str(w["work_count"]),
            style=style,
        )
    groups = Table(title="consumer groups", expand=True)
    for column in ("group", "topic", "queues", "lag (messages)"):
        groups.add_column(column, justify="right" if column in ("queues", "lag (messages)") else "left")
    for g in status["consumer_groups"]:
        groups.add_row(g["group"], g["topic"], str(g["queues"]), f"{g['lag']:,}")
    delays = Table(title="delay levels", expand=True)
    for column in ("level", "delay", "backlog", "lag", "delivered"):
        delays.add_column(column, justify="right")
    for d in status["delay_levels"]:
        if d["max_offset"] or d["offset"]:  # levels that hold or held messages
            delays.add_row(
                str(d["level"]),
                f"{d['delay_ms'] / 1000:g} s",
                f"{d['backlog']:,}",
                f"{d['lag_ms']:,} ms",
                f"{d['delivered']:,}",
                style="yellow" if d["lag_ms"] > 1000 else "",
            )
    pool, disk = status["pool"], status["disk_used_ratio"]
    gauges = Table.grid(padding=(0, 2))
    gauges.add_row(
        "pool",
        ProgressBar(total=max(pool["buffers"], 1), completed=pool["in_use"], width=30),
        f"{pool['in_use']}/{pool['buffers']} buffers" + ("" if pool["buffers"] else " (pool off)"),
    )
    gauges.add_row("disk", ProgressBar(total=100, completed=max(disk, 0) * 100, width=30), f"{disk:.0%} used")
    flags = " ".join(status["running_flags"]) or "none"
    gauges.add_row("flags", Text(flags, style="red" if status["running_flags"] else ""), "")
    replication = Table(title="replication", expand=True)
    replication.add_column("", no_wrap=False)
    for line in replication_summary(status["replication"]):
        replication.add_row(line.strip())
    return Group(Panel(header), rates, offsets, workers, replication, groups, delays, gauges)


def watch(
    config: MessageStoreConfig, *, interval_s: float = 1.0, count: int = 0, console: Console | None = None
) -> int:
    """Refresh until Ctrl-C, the store stopping, or ``count`` frames (0 = no limit)."""
    # The terminal's width (COLUMNS, else the terminal's, else 80), as `shutil` reads it.
    console = console or Console(width=shutil.get_terminal_size().columns)
    before: dict[str, Any] | None = None
    before_at = time.monotonic()
    frames = 0
    try:
        status = collect_status(config)
    except (ShmAttachError, StoreError) as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2
    try:
        with Live(render(status, None, 0), console=console, auto_refresh=False) as live:
            while True:
                frames += 1
                if count and frames >= count:
                    return 0
                time.sleep(interval_s)
                before, status = status, collect_status(config)
                now_s = time.monotonic()
                live.update(render(status, before, now_s - before_at), refresh=True)
                before_at = now_s
    except KeyboardInterrupt:
        return 0
    except (ShmAttachError, StoreError):
        console.print("the store stopped")
        return 0
