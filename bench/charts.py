"""PNG charts of a bench run (matplotlib, the `bench` extra); skipped with a reason without it.

python -m bench.charts bench/results/bench-<time>.json    # redraw a past run's charts
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def write(results: dict[str, Any], prefix: Path) -> list[str]:
    """Write ``<prefix>-throughput.png`` and ``<prefix>-latency.png``; return lines to print."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["charts skipped: matplotlib is not installed (pip install -e '.[bench]')"]
    rows = results.get("put", [])
    lines = []
    if rows:
        body = 128 if any(r["body_bytes"] == 128 for r in rows) else rows[0]["body_bytes"]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
        for ax, api in zip(axes, ("send", "batch100"), strict=True):
            raw = {}
            for mode in dict.fromkeys(r["mode"] for r in rows):
                pts = sorted((r["producers"], r["msgs_per_s"], r) for r in rows
                             if r["mode"] == mode and r["api"] == api and r["body_bytes"] == body)  # fmt: skip
                if pts:
                    ax.plot([p for p, _v, _r in pts], [v / 1000 for _p, v, _r in pts], marker="o", label=mode)
                    for p, _v, r in pts:
                        if r["baseline"] == "raw append":
                            raw[p] = r["baseline_msgs_per_s"]
            if raw:
                xs = sorted(raw)
                ax.plot(xs, [raw[x] / 1000 for x in xs], "k--", label="raw append baseline")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")  # the baseline is 10-20x the store: a linear axis flattens the store
            ax.set_xlabel("producer processes")
            ax.set_ylabel("k msgs/s")
            ax.set_title(f"{'send' if api == 'send' else 'send_batch(100)'}, {body} B bodies")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"rmq-mp put throughput vs same-run baselines ({results.get('cpus')} CPUs)")
        fig.tight_layout()
        path = prefix.with_name(prefix.name + "-throughput.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        lines.append(f"wrote {path}")
    sync = [r for r in rows if r["mode"] == "SYNC" and r["api"] == "send"]
    if sync:
        body = min(r["body_bytes"] for r in sync)
        sync = sorted((r for r in sync if r["body_bytes"] == body), key=lambda r: r["producers"])
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = [r["producers"] for r in sync]
        for q, style in (("p50", "o-"), ("p99", "s-"), ("p99.9", "^-")):
            ax.plot(xs, [r["latency_us"][q] / 1000 for r in sync], style, label=f"rmq-mp SYNC {q}")
        ax.plot(xs, [r["baseline_p99_us"] / 1000 for r in sync], "k--", label="group-commit baseline p99")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("producer processes")
        ax.set_ylabel("send latency, ms")
        ax.set_title(f"SYNC_FLUSH send latency, {body} B bodies")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = prefix.with_name(prefix.name + "-latency.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        lines.append(f"wrote {path}")
    return lines or ["charts skipped: no put rows in this run"]


if __name__ == "__main__":
    source = Path(sys.argv[1])
    for line in write(json.loads(source.read_text()), source.with_suffix("")):
        print(line)
