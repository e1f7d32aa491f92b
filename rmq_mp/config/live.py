"""The broker.conf settings a running store takes on a reload (SIGHUP, `rmq-mp reload`), and how
they travel to the workers.

A reload re-reads broker.conf whole and compares its effective values with the running ones:
when only keys listed here changed, they apply at once (all of them, or none); any other
changed key needs a restart and the reload is refused, naming it, with nothing applied. The
keys travel through the pointer table (one word each, `shm.layout.live_setting`, in
`PUBLISHED_KEYS` order; ``deleteWhen`` as a bit mask of hours), and each worker takes the new
values at its next pass when ``LIVE_SETTINGS_GENERATION`` moves (the supervisor's own keys have
words too, so `rmq-mp reload` compares the file with what runs).

Live, because every pass reads them again: the cleaner's expiry, schedule, disk ratio and pacing,
the flusher's and committer's intervals and page thresholds, the supervisor's persist intervals.
Not live: anything that sizes shared memory or files (file sizes, table capacities, the pool),
the flush mode, paths, names, ports (the metrics endpoint is bound once).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rmq_mp.config.store_config import MessageStoreConfig, camel_to_snake, snake_to_camel
from shm import layout

LIVE_WORKER_KEYS: tuple[str, ...] = (
    "file_reserved_time",
    "delete_when",
    "disk_max_used_space_ratio",
    "clean_resource_interval",
    "delete_commit_log_files_interval",
    "destroy_maped_file_interval_forcibly",
    "flush_interval_commit_log",
    "flush_commit_log_least_pages",
    "flush_commit_log_thorough_interval",
    "commit_interval_commit_log",
    "commit_commit_log_least_pages",
    "commit_commit_log_thorough_interval",
)
LIVE_SUPERVISOR_KEYS: tuple[str, ...] = ("flush_consumer_offset_interval", "flush_delay_offset_interval")
PUBLISHED_KEYS: tuple[str, ...] = LIVE_WORKER_KEYS + LIVE_SUPERVISOR_KEYS
"""Every live key has its word, the supervisor's too, so that `rmq-mp reload` reads what runs."""
LIVE_KEYS: frozenset[str] = frozenset(PUBLISHED_KEYS)
assert len(PUBLISHED_KEYS) <= layout.LIVE_SLOTS


def encode(name: str, value: Any) -> int:
    """A live worker setting as its pointer-table word."""
    if name == "delete_when":
        return sum(1 << int(hour) for hour in str(value).split(";"))
    return int(value)


def decode(name: str, word: int) -> Any:
    if name == "delete_when":
        return ";".join(f"{hour:02d}" for hour in range(24) if word >> hour & 1)
    return word


def published_words(config: MessageStoreConfig) -> list[int]:
    """The words the supervisor publishes, in `PUBLISHED_KEYS` order."""
    return [encode(name, getattr(config, name)) for name in PUBLISHED_KEYS]


def with_words(config: MessageStoreConfig, words: list[int]) -> MessageStoreConfig:
    """``config`` with the live settings the words hold (a worker's view after a reload)."""
    changed = {
        name: value
        for name, word in zip(PUBLISHED_KEYS, words, strict=False)
        if (value := decode(name, word)) != getattr(config, name)
    }
    return config.replace(**changed) if changed else config


def reload_plan(running: MessageStoreConfig, reread: MessageStoreConfig) -> tuple[dict[str, Any], list[str]]:
    """(live changes to apply, changed keys that need a restart as `key: old -> new`)."""
    live: dict[str, Any] = {}
    restart: list[str] = []
    before, after = running.to_properties(), reread.to_properties()
    for key in before:
        if before[key] == after[key]:
            continue
        name = camel_to_snake(key)
        old, new = getattr(running, name), getattr(reread, name)
        if name in LIVE_KEYS:
            live[name] = new
        else:
            restart.append(f"{snake_to_camel(name)}: {_shown(old)} -> {_shown(new)}")
    return live, restart


def describe(changes: Mapping[str, Any], running: MessageStoreConfig) -> str:
    """``key old -> new, ...`` in property names, for the log line and `rmq-mp reload`."""
    return ", ".join(
        f"{snake_to_camel(name)} {_shown(getattr(running, name))} -> {_shown(value)}"
        for name, value in changes.items()
    )


def _shown(value: Any) -> str:
    return getattr(value, "name", None) or str(value)
