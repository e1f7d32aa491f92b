"""`run.py status`: one read of a running store's shared memory, as a table or JSON."""

from __future__ import annotations

import json

from rmq_mp import file_modes
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.tools.store_status import (
    collect_status,
    format_delay_levels,
    format_dispatch_faults,
    format_table_levels,
    replication_summary,
)

__all__ = ["collect_status", "print_status"]


def host_port(address: str, port: int) -> str:
    """``host:port`` as a URL names it (an IPv6 address in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def print_status(config: MessageStoreConfig, *, as_json: bool) -> int:
    status = collect_status(config)
    access = config.store_group_access
    status["files"] = {
        "store_group_access": access,
        "looser": file_modes.looser_note(config.store_path_root_dir, access),
    }
    if as_json:
        print(json.dumps(status, indent=2))
        return 0
    print(
        f"store {status['store']}  shm {status['shm_name']}  {status['state']}  supervisor pid "
        f"{status['supervisor_pid']}  {status['flush_disk_type']}  broker {status['broker']}"
    )
    o, lag = status["offsets"], status["lags"]
    print(
        f"offsets  min {o['min']}  wrote {o['wrote']}  committed {o['committed']}  flushed {o['flushed']}  "
        f"reput {o['reput']}"
    )
    print(f"lags     commit {lag['commit']}  flush {lag['flush']}  reput {lag['reput']} bytes")
    p = status["pool"]
    print(f"pool     {p['in_use']}/{p['buffers']} buffers in use, mlock failed on {p['mlock_failed']}")
    print(f"tables   {format_table_levels(status['tables'])}")
    print(
        f"disk     {status['disk_used_ratio']:.0%} used   flags {' '.join(status['running_flags']) or 'none'}"
    )
    print(f"cleaner  {status['cleaner']['summary']}")
    print(f"files    {status['files']['looser'] or f'private as storeGroupAccess={access} says'}")
    for line in replication_summary(status["replication"]):
        print(line)
    print(f"{'worker':<10} {'pid':>8} {'state':<9} {'restarts':>8} {'heartbeat':>10} {'errors':>6}")
    for role, w in status["workers"].items():
        print(
            f"{role:<10} {w['pid']:>8} {w['state']:<9} {w['restarts']:>8} {w['heartbeat_age_ms']:>8}ms "
            f"{w['errors']:>6}"
        )
    for line in format_dispatch_faults(status["dispatch_faults"]):
        print(f"dispatch {line}")
    c = status["counters"]
    print("counters " + "  ".join(f"{k} {v}" for k, v in c.items()))
    m = status["producer_metrics"]
    if m:
        print(
            f"producers {m['puts']:,} message(s) in {m['put_calls']:,} call(s): put latency avg "
            f"{m['put_latency_per_message_avg_us']:,.1f} us a message, {m['put_latency_avg_us']:,} us a call  "
            f"lock hold avg {m['lock_hold_avg_us']:,} us a call  holds over 500 ms {m['lock_holds_over_500ms']}  "
            f"failures {m['put_failures']}"
        )
        reference = {why: n for why, n in m.get("reference_sends", {}).items() if n}
        print(
            "reference sends (not the compiled core) "
            + ("  ".join(f"{why} {n:,}" for why, n in reference.items()) if reference else "none")
        )
    for g in status["consumer_groups"]:
        print(
            f"group    {g['group']} on {g['topic']}: {g['queues']} queue(s), lag {g['lag']} message(s), "
            f"{g['members']} live member(s)"
        )
    for line in format_delay_levels(status["delay_levels"]):
        print(f"delay    {line}")
    port = status["metrics_port"]
    print(
        f"recovery {status['recovery_ms']} ms   metrics "
        + (f"http://{host_port(config.metrics_address, port)}/metrics" if port else "off (metricsPort=0)")
    )
    return 0
