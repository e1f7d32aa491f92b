"""MessageStoreConfig: `conf/broker.conf` → validated, frozen, effective store settings.

Mirrors RocketMQ 4.9.8 `MessageStoreConfig` plus the few `BrokerConfig` keys the store reads
(docs/format.md §13, §14.2). RocketMQ applies `broker.conf` with `MixAll.properties2Object`,
which silently ignores unknown keys and unparseable values (issue #2260) and hides its
effective-value rules in getters. rmq-mp instead:

* maps camelCase property names to snake_case fields mechanically (`camel_to_snake`,
  `snake_to_camel`), so `grep` finds a setting from either side;
* rejects unknown keys (naming the closest valid one), values that do not parse as the field's
  type, and values the store cannot run with, all as `ConfigError`;
* computes RocketMQ's effective values in one named step, `effective_values`, run when every
  instance is built; what it changed is kept in `adjustments` and logged in one INFO record.

Every `MessageStoreConfig` instance therefore holds effective, validated values. Relative paths
are resolved against the current working directory when the instance is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import ipaddress
import logging
import os
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar, get_type_hints

from rmq_mp.errors import ConfigError
from rmq_mp.file_modes import ACCESS_VALUES
from rmq_mp.format.index_layout import index_file_size
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE, effective_file_size
from rmq_mp.paths import StorePaths

__all__ = [
    "IGNORED_PROPERTIES",
    "PROPERTY_NAMES",
    "UNSUPPORTED_PROPERTIES",
    "BrokerRole",
    "FlushDiskType",
    "MessageStoreConfig",
    "camel_to_snake",
    "effective_values",
    "parse_properties",
    "snake_to_camel",
]

_log = logging.getLogger(__name__)

MULTI_PATH_SPLITTER: Final = ","  # system property rocketmq.broker.multiPathSplitter default
_JAVA_INT = (-(2**31), 2**31 - 1)
_JAVA_LONG = (-(2**63), 2**63 - 1)


class FlushDiskType(enum.Enum):
    """`FlushDiskType`: ASYNC_FLUSH acknowledges after the page-cache write; SYNC_FLUSH waits for
    the group-commit flush (up to `syncFlushTimeout`)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    """`BrokerRole`: SLAVE refuses puts (SERVICE_NOT_AVAILABLE) and replicates its master's
    commit log; SYNC_MASTER answers a put that waits for the store once a slave acknowledged it
    (docs/replication.md)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


# --------------------------------------------------------------------------------------------
# Names: camelCase property <-> snake_case field, mechanically.

# Words RocketMQ spells as upper-case acronyms inside property names (`checkCRCOnRecover`,
# `brokerIP1`); the only knowledge `snake_to_camel` needs beyond the mechanical rule.
_ACRONYMS: Final = frozenset({"crc", "ip"})
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def camel_to_snake(name: str) -> str:
    """`mappedFileSizeCommitLog` → `mapped_file_size_commit_log`; acronym runs become one word
    (`checkCRCOnRecover` → `check_crc_on_recover`, `brokerIP1` → `broker_ip1`)."""
    return _CAMEL_BOUNDARY.sub("_", name).lower()


def snake_to_camel(name: str) -> str:
    """Inverse of `camel_to_snake` for RocketMQ's names: words in `_ACRONYMS` (with any digits
    that follow) are upper-cased, other words capitalised."""
    first, *rest = name.split("_")
    words = []
    for word in rest:
        letters = word.rstrip(string.digits)
        words.append(word.upper() if letters in _ACRONYMS else word[:1].upper() + word[1:])
    return first + "".join(words)


# --------------------------------------------------------------------------------------------
# java.util.Properties.load


_PROPS_WS: Final = " \t\f"
_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_NEWLINE = re.compile(r"\r\n|\r|\n")


def parse_properties(text: str, *, source: str = "<properties>") -> dict[str, str]:
    """Parse Java properties text as `java.util.Properties.load` does (docs/format.md §14.2).

    `key=value`, `key: value` and `key value`; whitespace around the separator skipped; `#`/`!`
    comment lines (only at the start of a logical line); a line ending in an odd number of
    backslashes continues on the next one, whose leading whitespace is dropped; escapes `\\t \\n
    \\r \\f \\uXXXX`, and a backslash before any other character yields that character (so `\\=`,
    `\\:`, `\\ ` and `\\\\` escape separators and the backslash). A later duplicate key wins.

    Deviations from Java, on purpose: the caller passes text (`MessageStoreConfig.from_file`
    decodes UTF-8, not ISO-8859-1), and unescaped trailing whitespace of a value is stripped:
    Java keeps it, so `brokerRole = ASYNC_MASTER ` fails `valueOf` in RocketMQ and is silently
    ignored. A malformed `\\uXXXX` raises `ConfigError` (Java: IllegalArgumentException).
    """
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        key_raw, value_raw = _split_key_value(line)
        key, _ = _unescape(key_raw, source=source)
        value, significant = _unescape(value_raw, source=source)
        result[key] = value[:significant]
    return result


def _logical_lines(text: str) -> list[str]:
    """`Properties.LineReader`: join continued natural lines, drop blank and comment lines.
    Escapes are kept for `_unescape`; only the continuation backslash is removed."""
    lines: list[str] = []
    pending: str | None = None  # a logical line whose last natural line ended in a continuation
    for natural in _NEWLINE.split(text):
        content = natural.lstrip(_PROPS_WS)
        if pending is None and (not content or content[0] in "#!"):
            continue  # blank or comment line; a comment never continues
        trailing_backslashes = len(content) - len(content.rstrip("\\"))
        if trailing_backslashes % 2 == 1:
            pending = (pending or "") + content[:-1]
            continue
        logical = (pending or "") + content
        pending = None
        if logical:
            lines.append(logical)
    if pending:  # continuation at end of input: Java drops the backslash and keeps the line
        lines.append(pending)
    return lines


def _split_key_value(line: str) -> tuple[str, str]:
    """`Properties.load0`: the key ends at the first unescaped `=`, `:` or whitespace; then
    whitespace and at most one `=`/`:` are skipped before the value."""
    key_end = value_start = len(line)
    has_separator = False
    preceding_backslash = False
    for index, char in enumerate(line):
        if not preceding_backslash and char in "=:":
            key_end, value_start, has_separator = index, index + 1, True
            break
        if not preceding_backslash and char in _PROPS_WS:
            key_end, value_start = index, index + 1
            break
        preceding_backslash = char == "\\" and not preceding_backslash
    while value_start < len(line):
        char = line[value_start]
        if char not in _PROPS_WS:
            if has_separator or char not in "=:":
                break
            has_separator = True
        value_start += 1
    return line[:key_end], line[value_start:]


def _unescape(raw: str, *, source: str) -> tuple[str, int]:
    """`Properties.loadConvert`. Returns the text and the length up to its last character that
    is not unescaped whitespace (the caller strips values to it)."""
    out: list[str] = []
    significant = 0
    index = 0
    while index < len(raw):
        char = raw[index]
        index += 1
        escaped = char == "\\" and index < len(raw)
        if escaped:
            char = raw[index]
            index += 1
            if char == "u":
                digits = raw[index : index + 4]
                if len(digits) != 4 or any(d not in string.hexdigits for d in digits):
                    raise ConfigError(f"{source}: malformed \\uxxxx encoding in {raw!r}")
                char = chr(int(digits, 16))
                index += 4
            else:
                char = _ESCAPES.get(char, char)
        out.append(char)
        if escaped or char not in _PROPS_WS:
            significant = len(out)
    text = "".join(out)
    if any("\ud800" <= c <= "\udfff" for c in text):  # \uXXXX escapes are UTF-16 code units
        try:
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}: unpaired UTF-16 surrogate escape in {raw!r}") from exc
        significant = len(text) - (len("".join(out)) - significant)
    return text, significant


# --------------------------------------------------------------------------------------------
# Fields

_T = TypeVar("_T")
MAX_TRANSIENT_STORE_POOL_SIZE: Final = 32
"""The pointer table's pool slots (`shm.layout.POOL_SLOTS`; a test keeps the two equal)."""
TOPIC_NAME_MAX_LENGTH: Final = 127
"""RocketMQ's TopicValidator.TOPIC_MAX_LENGTH, which brokerName and brokerClusterName must keep."""
MIN_COMMIT_LOG_FILE_BYTES: Final = 4096
"""The smallest mappedFileSizeCommitLog accepted: one page (RocketMQ accepts any positive size,
and a file too small for a record refuses every put)."""
_META_KEY: Final = "rmq_mp.meta"  # not a property: provenance kept beside the values


def _prop(default: _T, *, ge: int | None = None, le: int | None = None, java_long: bool = False) -> _T:
    """A property field with its range rule (checked on the value as written, before the
    adjustment step) and Java width (`int` unless `java_long`)."""
    return field(default=default, metadata={"ge": ge, "le": le, "java_long": java_long})


def _meta(default: _T, *, init: bool = True) -> _T:
    return field(default=default, init=init, compare=False, metadata={_META_KEY: True})


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageStoreConfig:
    """RocketMQ 4.9.8 `MessageStoreConfig` (+ the `BrokerConfig` keys the store needs), with
    effective values. Field = `camel_to_snake(<broker.conf key>)`; defaults are RocketMQ's.

    Build with `from_file`, `from_properties`, `MessageStoreConfig(**fields)` or `replace`; all
    validate and apply `effective_values`. Intervals and timeouts are milliseconds unless the
    comment says otherwise; RocketMQ's names are kept even where they omit the unit.
    """

    # -- store paths ----------------------------------------------------------------------------
    # Root of every store file. RocketMQ: ${user.home}/store. Relative → against the cwd; `~`
    # expanded (rmq-mp; Java would create a directory named `~`).
    store_path_root_dir: str = os.path.expanduser("~/store")
    # Commit-log directory; "" = `<root>/commitlog` (see `commit_log_dirs`). RocketMQ's
    # `,`-separated multi-path list is parsed but refused by `MessageStore` (not supported yet).
    store_path_commit_log: str = ""
    # Extra read-only commit-log directories: not supported yet, must be "" (`MessageStore`).
    read_only_commit_log_store_paths: str = ""

    # -- commit log -----------------------------------------------------------------------------
    # Bytes per commit-log file (1 GiB). At least 4096 (rmq-mp; RocketMQ accepts 1, and then
    # refuses every put): a page, room for a few small records. Not required to be a multiple of
    # 4096 (RocketMQ neither).
    mapped_file_size_commit_log: int = _prop(1073741824, ge=MIN_COMMIT_LOG_FILE_BYTES)
    # Largest message body accepted, bytes (4 MiB); a record may be up to 64 KiB larger.
    max_message_size: int = _prop(4194304, ge=1)
    # Verify each record's body CRC during recovery (slower startup, catches bit rot).
    check_crc_on_recover: bool = True
    # rmq-mp: at start, check every ConsumeQueue entry against its record's header (a read of 36
    # bytes per record); false: only entries into the files recovery scans, and each file's first
    # and last. A damaged entry is cut and its queue rebuilt from the commit log either way.
    check_consume_queue_on_recover: bool = True
    # Put lock: true = mutex (watch 20 us, then sleep), false = spin lock (never sleeps).
    use_reentrant_lock_when_put_message: bool = True
    # The allocator pre-touches, reserves whole and mlocks each file it creates ahead, until writes pass it.
    warm_maped_file_enable: bool = False
    # Pages (4 KiB) between forced flushes while warming a file under SYNC_FLUSH.
    flush_least_pages_when_warm_maped_file: int = _prop(4096, ge=0)
    # Put-lock hold time, ms, above which puts get OS_PAGECACHE_BUSY.
    os_page_cache_busy_time_out_mills: int = _prop(1000, ge=0, java_long=True)

    # -- flush ----------------------------------------------------------------------------------
    # ASYNC_FLUSH (ack after page-cache write) or SYNC_FLUSH (ack after fsync).
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    # Async commit-log flush period, ms.
    flush_interval_commit_log: int = _prop(500, ge=0)
    # true: async flusher sleeps its interval (not wakeable); false: waits, woken by puts.
    flush_commit_log_timed: bool = True
    # Dirty pages (4 KiB) needed before an async commit-log flush.
    flush_commit_log_least_pages: int = _prop(4, ge=0)
    # Flush regardless of dirty pages after this long, ms.
    flush_commit_log_thorough_interval: int = _prop(10000, ge=0)
    # SYNC_FLUSH put deadline, ms, before FLUSH_DISK_TIMEOUT.
    sync_flush_timeout: int = _prop(5000, ge=0)
    # A failed commit-log fsync marks the store NOT_WRITEABLE until restart (RocketMQ 5.x name;
    # 4.9.8 ignores flush errors, issue #2706). Off: puts continue and SYNC puts time out.
    enable_running_flags_in_flush: bool = False
    # ConsumeQueue flush period, ms.
    flush_interval_consume_queue: int = _prop(1000, ge=0)
    # Dirty pages (4 KiB) a ConsumeQueue needs before the periodic (not thorough) flush.
    flush_consume_queue_least_pages: int = _prop(2, ge=0)
    # Thorough ConsumeQueue + checkpoint flush period, ms.
    flush_consume_queue_thorough_interval: int = _prop(60000, ge=0)

    # -- transient store pool -------------------------------------------------------------------
    # Write puts into pool buffers, committed to the file later (ASYNC_FLUSH master only).
    transient_store_pool_enable: bool = False
    # Number of pool buffers, each `mapped_file_size_commit_log` bytes (at most 32: the
    # pointer table has 32 pool slots).
    transient_store_pool_size: int = _prop(5, ge=0, le=MAX_TRANSIENT_STORE_POOL_SIZE)
    # No free pool buffer for a new file: CREATE_MAPEDFILE_FAILED at once instead of waiting 1 s.
    fast_fail_if_no_buffer_in_store_pool: bool = False
    # Longest wait between the committer's checks, ms (puts wake it).
    commit_interval_commit_log: int = _prop(200, ge=0)
    # Uncommitted pages (4 KiB) needed before a commit.
    commit_commit_log_least_pages: int = _prop(4, ge=0)
    # Commit regardless of pages after this long, ms.
    commit_commit_log_thorough_interval: int = _prop(200, ge=0)

    # -- consume queue --------------------------------------------------------------------------
    # Bytes per ConsumeQueue file (300,000 entries × 20); at least one 20-byte entry, rounded up
    # to a multiple of 20 (as RocketMQ's getter rounds it). A store whose queue files have
    # another size is refused at startup (as for mappedFileSizeCommitLog), never rewritten.
    mapped_file_size_consume_queue: int = _prop(6000000, ge=CQ_STORE_UNIT_SIZE)

    # -- index ----------------------------------------------------------------------------------
    # Build index files (UNIQ_KEY and KEYS) during dispatch.
    message_index_enable: bool = True
    # Hash slots per index file (4 bytes each).
    max_hash_slot_num: int = _prop(5000000, ge=1)
    # Entries per index file (20 bytes each; one fewer usable).
    max_index_num: int = _prop(20000000, ge=1)
    # Cap on results of one key query.
    max_msgs_num_batch: int = _prop(64, ge=1)
    # Abnormal recovery also waits for the index timestamp in the checkpoint.
    message_index_safe: bool = False
    # Results of a key query that names no maximum.
    default_query_max_num: int = _prop(32, ge=1)

    # -- cleaning and disk ----------------------------------------------------------------------
    # Cleaner period, ms.
    clean_resource_interval: int = _prop(10000, ge=0)
    # rmq-mp addition: ms between disk-space checks (DISK_FULL above diskSpaceWarningLevelRatio),
    # on their own schedule whatever cleanResourceInterval is; RocketMQ's isSpaceFull runs every
    # 10 s (fixed).
    disk_check_interval_ms: int = _prop(10000, ge=1, le=3600000)
    # Sleep between two commit-log file deletions, ms.
    delete_commit_log_files_interval: int = _prop(100, ge=0)
    # Sleep after a ConsumeQueue deleted files, ms.
    delete_consume_queue_files_interval: int = _prop(100, ge=0)
    # Delete a file still referenced after this long, ms.
    destroy_maped_file_interval_forcibly: int = _prop(120000, ge=0)
    # No effect in rmq-mp: no deletion hangs (see conf/broker.conf).
    redelete_hanged_file_interval: int = _prop(120000, ge=0)
    # Local hours (`;`-separated, 0..23) when time-based deletion runs.
    delete_when: str = "04"
    # Keep commit-log files this many hours after their last modification.
    file_reserved_time: int = _prop(72, ge=0)
    # Percent of disk used above which expired files are deleted; effective [10, 95].
    disk_max_used_space_ratio: int = _prop(75, ge=0, le=100)
    # Allow deleting unexpired files when the disk is above the clean-forcibly ratio.
    clean_file_forcibly_enable: bool = True
    # rmq-mp addition (RocketMQ 5.x field; 4.9.8: system property, fraction 0.90): percent of
    # disk used above which the store is flagged DISK_FULL and refuses puts; effective [35, 90].
    disk_space_warning_level_ratio: int = _prop(90, ge=0, le=100)
    # rmq-mp addition (RocketMQ 5.x field; 4.9.8: system property, fraction 0.85): percent of
    # disk used above which unexpired files may be deleted; effective [30, 85].
    disk_space_clean_forcibly_ratio: int = _prop(85, ge=0, le=100)
    # rmq-mp addition (RocketMQ #4549): keep commit-log files holding messages a known consumer
    # group has not consumed yet, unless the disk is above the warning ratio. Off = RocketMQ.
    clean_protect_consumer_offsets: bool = False

    # -- limits (pull) --------------------------------------------------------------------------
    # Bytes per pull when the data is hot (in page cache).
    max_transfer_bytes_on_message_in_memory: int = _prop(262144, ge=1)
    # Messages per pull when hot.
    max_transfer_count_on_message_in_memory: int = _prop(32, ge=1)
    # Bytes per pull when cold (on disk).
    max_transfer_bytes_on_message_in_disk: int = _prop(65536, ge=1)
    # Messages per pull when cold.
    max_transfer_count_on_message_in_disk: int = _prop(8, ge=1)
    # Percent of physical RAM considered "in memory" for hot/cold.
    access_message_in_memory_max_ratio: int = _prop(40, ge=0, le=100)

    # -- role, delay, dispatch ------------------------------------------------------------------
    # ASYNC_MASTER or SYNC_MASTER (a put that waits for the store is answered once a slave
    # acknowledged it, docs/replication.md), or SLAVE (puts refused; the commit log is the
    # master's at haMasterAddress, replicated by the ha worker).
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    # Delay levels (space-separated `<n>s|m|h|d`), level 1 first: a put with DELAY=<level> is
    # delivered that long after it was stored (the scheduler worker); the level count is the
    # maximum level (a higher one is clamped to it).
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # How often the supervisor persists the delay levels' progress to config/delayOffset.json
    # (also at stop); a crash delivers what was delivered since again.
    flush_delay_offset_interval: int = _prop(10000, ge=0, java_long=True)

    # -- replication (RocketMQ's store/ha; docs/replication.md) ---------------------------------
    # Port a master's ha worker serves slaves on. RocketMQ always listens, on listenPort + 1
    # (10912); rmq-mp only where this is set: -1 = no HA listener, 0 = an ephemeral port (shown by
    # `run.py status`).
    ha_listen_port: int = _prop(-1, ge=-1, le=65535)
    # rmq-mp addition: address the HA listener binds; "" = every interface, as RocketMQ.
    ha_listen_address: str = ""
    # rmq-mp addition: slaves a master serves, `,`-separated addresses or CIDRs (IPv4/IPv6); ""
    # = any, as RocketMQ. A refused peer is logged and closed before it is sent anything.
    ha_allowed_slaves: str = ""
    # A SLAVE's master, `host:port` of its haListenPort; "" = no replication (a SLAVE then only
    # serves what its files hold).
    ha_master_address: str = ""
    # rmq-mp addition: port a master serves its metadata channel on (consumer offsets, topic
    # configs, delay-level progress; docs/replication.md), beside haListenPort, whose bytes stay
    # RocketMQ's: -1 = none, 0 = an ephemeral port (shown by `run.py status`). Peers outside
    # haAllowedSlaves are refused as on the HA port.
    ha_meta_listen_port: int = _prop(-1, ge=-1, le=65535)
    # rmq-mp addition: a SLAVE's master's metadata channel, `host:port` of its haMetaListenPort;
    # "" = no metadata follows (the slave then holds the log only: groups start from 0 after a
    # promotion).
    ha_master_meta_address: str = ""
    # A slave reports its end at least this often, ms, and a master sends a heartbeat frame
    # after this long without a write.
    ha_send_heartbeat_interval: int = _prop(5000, ge=1)
    # A master drops a slave it has heard nothing from for this long, ms.
    ha_housekeeping_interval: int = _prop(20000, ge=1)
    # Most commit-log bytes in one frame (a frame never crosses a file). At most 4 MiB - 12: a
    # RocketMQ slave reads into a 4 MiB buffer (rmq-mp addition: refused above, as no Java slave
    # could take it in).
    ha_transfer_batch_size: int = _prop(32768, ge=1, le=4 * 1024 * 1024 - 12)
    # SYNC_MASTER: a waiting put is answered SLAVE_NOT_AVAILABLE at once when the best slave is
    # this many bytes or more behind the master's end.
    ha_slave_fallbehind_max: int = _prop(268435456, ge=0)
    # SYNC_MASTER: how long a put waits for a slave's acknowledgement, ms from the put, before
    # FLUSH_SLAVE_TIMEOUT (the message is stored either way).
    slave_timeout: int = _prop(3000, ge=0)

    # -- broker identity (BrokerConfig / NettyServerConfig keys the store reads) ----------------
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    # Store-host address written into every record. RocketMQ defaults to the machine's address;
    # rmq-mp to loopback so a store's records do not depend on the host it was written on.
    broker_ip1: str = "127.0.0.1"
    # Store-host port written into every record (NettyServerConfig.listenPort).
    listen_port: int = _prop(10911, ge=1, le=65535)
    # Queues of an auto-created topic (and those `send` rotates over until topics.json has it).
    default_topic_queue_nums: int = _prop(8, ge=1)
    # consumerOffset.json persist period, ms.
    flush_consumer_offset_interval: int = _prop(5000, ge=0)
    # A waiting pull is woken on arrival (true) or looks again every second (false).
    long_polling_enable: bool = True

    # -- rmq-mp additions -----------------------------------------------------------------------
    # rmq-mp addition: prefix of the store's shared-memory and semaphore names; "" = derived from
    # the store path.
    shm_name: str = ""
    # rmq-mp addition: start although config/consumerOffset.json is missing, damaged or older
    # than last persisted while the commit log holds messages, with the offsets salvaged (the
    # damaged file kept as .damaged-<time>); false = refuse to start and say what was salvaged.
    accept_consumer_offset_loss: bool = False
    # rmq-mp addition: port of the supervisor's Prometheus endpoint on `metricsAddress`; 0 = off.
    metrics_port: int = _prop(0, ge=0, le=65535)
    # rmq-mp addition: the IP address the Prometheus endpoint listens on: 127.0.0.1 (this host
    # only), an interface's address, or 0.0.0.0 / :: for every interface (the endpoint has no
    # authentication: expose it only to a network that may read the store's metrics).
    metrics_address: str = "127.0.0.1"
    # rmq-mp addition: bytes the commit log may run ahead of dispatch before puts wait for reput
    # (and are refused OS_PAGECACHE_BUSY if it does not catch up); 0 = no limit.
    max_dispatch_lag_bytes: int = _prop(64 << 20, ge=0, java_long=True)
    # rmq-mp addition: under SYNC_FLUSH or with the TransientStorePool, where records become
    # readable in bursts (at each flush or commit), reput starts a pass at most every this many
    # ms, so one pass dispatches many records (RocketMQ's reput sleeps 1 ms before every pass);
    # 0 = a pass at every wake. Plain ASYNC_FLUSH dispatches at once (consumer latency).
    reput_batch_interval_ms: int = _prop(1, ge=0, le=1000)
    # rmq-mp addition: the nice value reput runs at under SYNC_FLUSH (0 = the other workers'). A
    # SYNC put's acknowledgement waits for the flusher and for its producer to be scheduled again;
    # reput's passes (0.4 of a core at 8 SYNC producers on 2 cores) delayed both and tripled the
    # put p99, while its records only become readable at each flush anyway. At 19 it runs on the
    # CPU time they leave and still keeps up, for more consumer delay at full load (bench/NOTES.md,
    # 2026-11-26 sync20). Only raised: a reput already nicer (started under `nice`) keeps its own.
    reput_sync_flush_nice: int = _prop(19, ge=0, le=19)
    # rmq-mp addition: under SYNC_FLUSH reput also runs SCHED_IDLE. A CPU running only
    # SCHED_IDLE tasks counts as idle when the kernel places a woken task, which then preempts
    # them: a producer woken by its flush no longer waits out a reput pass (17 records and
    # ~0.4 ms of CPU at 4 SYNC producers), which at nice 19 still held a CPU until it ended.
    # 2-core VM, 4 producers, put p99 flushing at once 444-490 us against 713-2,096 at nice 19
    # alone, gathering 509-581 against 641-777 (bench/NOTES.md, 2026-11-27 syncp99). Consumers
    # wait longer for dispatch while other work keeps every CPU busy, so a pass that starts 64
    # KiB behind runs SCHED_OTHER (beside two CPU-bound processes, up to 0.73 s after the last
    # of 3,000 sends, against 0.21 s at nice 19 alone and 2.5 s always idle). Only where reput
    # can leave SCHED_IDLE again (root, CAP_SYS_NICE, or RLIMIT_NICE >= 20 - reputSyncFlushNice);
    # an unprivileged process cannot, so there it runs at the nice value alone (logged once).
    reput_sync_flush_sched_idle: bool = True
    # rmq-mp addition: under SYNC_FLUSH, before a flush, the flusher waits up to this many us for
    # the producers its last flush woke to put again (never once the oldest send waiting began
    # 1.25 passes ago, a flush and its completions, and only while they are at most two a CPU),
    # so one fsync serves them all (bench/NOTES.md, 2026-11-27 syncgrp, syncp99, syncstart);
    # 0 = flush as soon as a request waits (RocketMQ's GroupCommitService), which splits
    # closed-loop producers into two groups that each wait through the other's fsync.
    sync_flush_gather_max_us: int = _prop(500, ge=0, le=100_000)
    # rmq-mp addition: topic/queue pairs the store holds (its shared queue-offset table, sized at
    # start, 264 B of shared memory each). A send to one more queue is refused
    # LMQ_CONSUME_QUEUE_NUM_EXCEEDED naming this key.
    max_consume_queue_num: int = _prop(65536, ge=1, le=1 << 22)
    # rmq-mp addition: group/topic/queue committed offsets the store holds (573 B of shared
    # memory each, with the clustering owner word); a commit past it (or a consumer-group member
    # claiming a queue) raises OffsetTableFullError naming this key.
    max_consumer_offset_num: int = _prop(65536, ge=1, le=1 << 22)
    # rmq-mp addition: `Consumer` objects attached at once, over all processes, and so
    # consumer-group members (472 B and one semaphore, a 4 KiB page of /dev/shm, each); a dead
    # process's consumers are reclaimed. The scheduler worker takes one from the first delayed
    # message on.
    max_consumer_num: int = _prop(1024, ge=1, le=65536)
    # rmq-mp addition: SYNC_FLUSH lock holds that can wait for their flush at once (one per
    # waiting producer; 40 B and one 4 KiB semaphore each); past it a put gets FLUSH_DISK_TIMEOUT.
    max_sync_flush_request_num: int = _prop(1024, ge=1, le=65536)
    # rmq-mp addition: producer processes whose puts the metrics count (~0.4 KiB each); the rest
    # send as usual, unmeasured, with a warning. The scheduler worker is one from the first
    # delayed message on.
    max_producer_num: int = _prop(1024, ge=1, le=65536)
    # rmq-mp addition: ConsumeQueue files a process keeps mapped at once; the least recently used
    # idle one is unmapped (and its descriptor closed) when another is opened, and mapped again on
    # use. Each costs one of the 65,530 mappings Linux allows a process and one or two descriptors
    # (capped at half of `ulimit -n`). Below the number of queues written round-robin, reput maps
    # files again.
    max_open_consume_queue_files: int = _prop(8192, ge=16, le=60000)
    # rmq-mp addition: who besides the owner may use the store: none (directories 0700, files and
    # shared memory 0600), read (the owner's group reads the files: 0750/0640) or write (the group
    # may also attach producers and consumers, which write shared memory: 0770/0660). Applied as
    # the umask of every store process and the mode of every file and segment it creates; files
    # already more open are named at start (the log, `run.py status`), not changed.
    store_group_access: str = "none"
    # RocketMQ 5.x key: append a `__CRC32#` property to every record, a CRC-32 over the whole
    # record before it (every header field, body, topic, other properties), checked on every read,
    # recovery and scan as the body CRC is (a mismatch is damage). RocketMQ 4.9.8 reads the records
    # with one more property. rmq-mp's default is true (RocketMQ's false): a flipped topic, queue
    # id or property byte is otherwise served as if intact.
    enabled_append_prop_crc: bool = True

    # -- provenance (not properties; excluded from ==, `to_properties`) -------------------------
    # Where the values came from, for messages and logs.
    source: str = _meta("<defaults>")
    # `from_properties` found no storePathRootDir: the store is RocketMQ's default ~/store, and
    # the supervisor says so at start (`root_dir_note`).
    root_dir_defaulted: bool = _meta(False)
    # `broker.conf` keys accepted but not used (`IGNORED_PROPERTIES`), as `key=value`.
    ignored_properties: tuple[str, ...] = _meta(())
    # What `effective_values` changed, one `key: written -> effective (rule)` string each.
    adjustments: tuple[str, ...] = _meta((), init=False)
    # The written values of the adjusted fields, so `replace` re-runs the step from them.
    unadjusted: tuple[tuple[str, object], ...] = _meta((), init=False)

    def __post_init__(self) -> None:
        values = {name: getattr(self, name) for name in _SPECS}
        _raise_problems(self.source, _type_problems(values))
        _raise_problems(self.source, _rule_problems(values))
        resolved = _resolve_paths(values)
        changes, adjustments = effective_values({**values, **resolved})
        for name, value in {**resolved, **changes}.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "adjustments", adjustments)
        object.__setattr__(self, "unadjusted", tuple((name, values[name]) for name in changes))
        if adjustments:
            _log.info(
                "MessageStoreConfig from %s: %d RocketMQ effective-value adjustment(s): %s",
                self.source,
                len(adjustments),
                "; ".join(adjustments),
            )

    # -- constructors ---------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> MessageStoreConfig:
        """Load a `broker.conf` (UTF-8; a BOM is skipped). Relative paths in it resolve against
        the current working directory, not the file's directory."""
        try:
            text = Path(path).read_bytes().decode("utf-8-sig")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
        return cls.from_properties(parse_properties(text, source=str(path)), source=str(path))

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str], source: str = "<properties>"
    ) -> MessageStoreConfig:
        """Build from `broker.conf` key → text. Unknown keys, unparseable values and rule
        violations are all reported in one `ConfigError`."""
        kwargs: dict[str, Any] = {}
        ignored: list[str] = []
        problems: list[str] = []
        for key, text in properties.items():
            spec = _BY_PROPERTY.get(key)
            if spec is not None:
                try:
                    kwargs[spec.name] = spec.parse(text)
                except ValueError as exc:
                    problems.append(f"property {key}={text!r}: {exc}")
            elif key in IGNORED_PROPERTIES:
                ignored.append(f"{key}={text}")
            elif key in UNSUPPORTED_PROPERTIES:
                if text.strip().lower() != "false":
                    problems.append(f"property {key}={text!r}: {UNSUPPORTED_PROPERTIES[key]}")
                ignored.append(f"{key}={text}")
            else:
                problems.append(_unknown_property_message(key))
        _raise_problems(source, problems)
        config = cls(
            **kwargs,
            source=source,
            ignored_properties=tuple(ignored),
            root_dir_defaulted="store_path_root_dir" not in kwargs,
        )
        _log.info(
            "MessageStoreConfig loaded from %s: %d store properties set, %d ignored by rmq-mp%s, "
            "%d adjustment(s)",
            source,
            len(kwargs),
            len(ignored),
            f" ({', '.join(ignored)})" if ignored else "",
            len(config.adjustments),
        )
        return config

    def replace(self, **overrides: Any) -> MessageStoreConfig:
        """A copy with snake_case fields overridden (typed values, e.g. `FlushDiskType.SYNC_FLUSH`),
        validated and adjusted again from the values as written."""
        unknown = [name for name in overrides if name not in _SPECS]
        if unknown:
            messages = []
            for name in unknown:
                close = difflib.get_close_matches(name, list(_SPECS), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                messages.append(f"unknown field {name!r}{hint}")
            raise ConfigError(f"{self.source}: replace(): {'; '.join(messages)}")
        values: dict[str, Any] = {name: getattr(self, name) for name in _SPECS}
        values.update(dict(self.unadjusted))
        values.update(overrides)
        return type(self)(
            **values,
            source=self.source,
            ignored_properties=self.ignored_properties,
            root_dir_defaulted=self.root_dir_defaulted and "store_path_root_dir" not in overrides,
        )

    def to_properties(self) -> dict[str, str]:
        """camelCase key → text for every property, effective values; round-trips through
        `from_properties`."""
        return {spec.key: spec.format(getattr(self, spec.name)) for spec in _SPECS.values()}

    # -- derived paths (docs/format.md §1) --------------------------------------------------

    @property
    def root_dir(self) -> Path:
        return Path(self.store_path_root_dir)

    @property
    def root_dir_note(self) -> str:
        """'' unless the store's root is RocketMQ's default because the file set no
        storePathRootDir: then the line the supervisor logs and prints, so that a store never
        lands in the home directory unannounced."""
        if not self.root_dir_defaulted:
            return ""
        return (
            f"{self.source} does not set storePathRootDir: the store is RocketMQ's default "
            f"${{user.home}}/store = {self.store_path_root_dir}"
        )

    @property
    def commit_log_dirs(self) -> tuple[Path, ...]:
        """Writable commit-log directories: `store_path_commit_log` split on `,`, or
        `<root>/commitlog` when empty."""
        paths = _split_paths(self.store_path_commit_log)
        return tuple(Path(p) for p in paths) if paths else (StorePaths.of(self.root_dir).commit_log,)

    @property
    def commit_log_dir(self) -> Path:
        """The (first) commit-log directory."""
        return self.commit_log_dirs[0]

    @property
    def read_only_commit_log_dirs(self) -> tuple[Path, ...]:
        return tuple(Path(p) for p in _split_paths(self.read_only_commit_log_store_paths))

    @property
    def paths(self) -> StorePaths:
        """The store directory's layout (`rmq_mp.paths`, its one definition) for these settings."""
        return StorePaths.of(self.root_dir, self.commit_log_dir)

    @property
    def consume_queue_dir(self) -> Path:
        return self.paths.consume_queue

    @property
    def index_dir(self) -> Path:
        return self.paths.index

    @property
    def checkpoint_path(self) -> Path:
        return self.paths.checkpoint

    @property
    def abort_path(self) -> Path:
        return self.paths.abort

    @property
    def lock_path(self) -> Path:
        return self.paths.lock

    @property
    def config_dir(self) -> Path:
        return self.paths.config

    # -- other derived values -------------------------------------------------------------------

    @property
    def delete_when_hours(self) -> frozenset[int]:
        """Local hours of day at which time-based deletion runs."""
        return frozenset(int(part) for part in self.delete_when.split(";"))

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """`messageDelayLevel` in ms; index 0 is delay level 1."""
        tokens = self.message_delay_level.split()
        return tuple(int(token[:-1]) * _DELAY_UNIT_MS[token[-1]] for token in tokens)

    @property
    def index_file_size_bytes(self) -> int:
        """Bytes of one index file (`rmq_mp.format.index_layout`)."""
        return index_file_size(self.max_hash_slot_num, self.max_index_num)


# --------------------------------------------------------------------------------------------
# Keys accepted but not used, and keys accepted only at their RocketMQ default.

#: Keys a real RocketMQ `broker.conf` commonly carries that configure broker parts rmq-mp does
#: not have. Accepted (any value) so such a file loads; recorded in `ignored_properties`.
IGNORED_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "brokerId": "master/slave id for name-server routing; brokerRole decides the store's role",
        "namesrvAddr": "name-server registration; rmq-mp has no remoting or routing",
        "brokerIP2": "the address a broker tells its slaves through the name server; a slave of rmq-mp names "
        "its master in haMasterAddress",
        "autoCreateTopicEnable": "broker topic routing, above the store",
        "autoCreateSubscriptionGroup": "broker consumer-group management, above the store",
        "sendMessageThreadPoolNums": "broker send-processor threads; rmq-mp producers are processes",
        "pullMessageThreadPoolNums": "broker pull-processor threads; rmq-mp consumers read directly",
    }
)

#: RocketMQ features rmq-mp does not implement: accepted only as `false` (their default).
UNSUPPORTED_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "enableDLegerCommitLog": "the DLedger commit log is not supported by rmq-mp; only false is accepted",
        "enableConsumeQueueExt": "ConsumeQueueExt files are not supported by rmq-mp; only false is accepted",
        "duplicationEnable": "dispatch below a replication confirm offset needs replication, which rmq-mp "
        "does not have; only false is accepted",
    }
)

#: Keys that do nothing in RocketMQ 4.9.8 either, though user configs carry them.
_NO_EFFECT_IN_ROCKETMQ: Final = {
    "storePathConsumeQueue": "always <storePathRootDir>/consumequeue",
    "storePathIndex": "always <storePathRootDir>/index",
    "abortFile": "always <storePathRootDir>/abort",
}


# --------------------------------------------------------------------------------------------
# Field specs, parsing and formatting


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str  # snake_case field
    key: str  # camelCase property
    kind: type  # int, float, bool, str or an Enum
    ge: int | None
    le: int | None
    java_long: bool

    def parse(self, text: str) -> Any:
        """Strict text → value; ValueError names the expected type."""
        if self.kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false"):
                raise ValueError(f"expected {self.type_name}")
            return lowered == "true"
        if self.kind is int:
            if not re.fullmatch(r"[+-]?[0-9]+", text):
                raise ValueError(f"expected {self.type_name} (decimal digits)")
            return int(text)
        if self.kind is float:
            if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
                raise ValueError("expected a decimal number")
            return float(text)
        if issubclass(self.kind, enum.Enum):
            members: Mapping[str, enum.Enum] = self.kind.__members__
            try:
                return members[text]
            except KeyError:
                raise ValueError(f"expected {self.type_name}") from None
        return text

    def format(self, value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, enum.Enum):
            return value.name
        return str(value)

    @property
    def type_name(self) -> str:
        if issubclass(self.kind, enum.Enum):
            return f"one of {', '.join(self.kind.__members__)}"
        if self.kind is int:
            return "long" if self.java_long else "int"
        if self.kind is bool:
            return "boolean true or false"
        return self.kind.__name__

    def type_problem(self, value: Any) -> str | None:
        ok = isinstance(value, self.kind) and (self.kind is bool or not isinstance(value, bool))
        if self.kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            return f"{self.key} ({self.name}) = {value!r}: expected {self.type_name}"
        if self.kind is int:
            low, high = _JAVA_LONG if self.java_long else _JAVA_INT
            if not low <= value <= high:
                return f"{self.key} = {value}: outside the Java {self.type_name} range [{low}, {high}]"
        return None


def _build_specs() -> dict[str, _FieldSpec]:
    hints = get_type_hints(MessageStoreConfig)
    specs = {}
    for f in dataclasses.fields(MessageStoreConfig):
        if f.metadata.get(_META_KEY):
            continue
        key = snake_to_camel(f.name)
        assert camel_to_snake(key) == f.name, f"{f.name} does not round-trip through {key}"
        specs[f.name] = _FieldSpec(
            name=f.name,
            key=key,
            kind=hints[f.name],
            ge=f.metadata.get("ge"),
            le=f.metadata.get("le"),
            java_long=bool(f.metadata.get("java_long")),
        )
    return specs


_SPECS: Final = _build_specs()  # snake_case name → spec, in field order
_BY_PROPERTY: Final = {spec.key: spec for spec in _SPECS.values()}
#: Every broker.conf key that sets a `MessageStoreConfig` field, in field order.
PROPERTY_NAMES: Final = tuple(_BY_PROPERTY)
_DELAY_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def closest_name(key: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``key``, case-insensitively (difflib, cutoff 0.6), as spelled in
    ``candidates``; None when none is close. Names a typo's fix (broker.conf, Spark options)."""
    by_lower = {name.lower(): name for name in candidates}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def _unknown_property_message(key: str) -> str:
    """Name the key and the closest valid name, case-insensitively."""
    if key in _NO_EFFECT_IN_ROCKETMQ:
        return (
            f"unknown property {key!r} (it does nothing in RocketMQ 4.9.8 either: "
            f"{_NO_EFFECT_IN_ROCKETMQ[key]})"
        )
    close = closest_name(key, [*PROPERTY_NAMES, *IGNORED_PROPERTIES, *UNSUPPORTED_PROPERTIES])
    if close:
        return f"unknown property {key!r}; did you mean {close!r}?"
    return f"unknown property {key!r} (no similar property; conf/broker.conf lists them all)"


def _raise_problems(source: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


def _split_paths(paths: str) -> list[str]:
    return [p for p in paths.split(MULTI_PATH_SPLITTER) if p]


def _resolve_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


# --------------------------------------------------------------------------------------------
# Validation


def _type_problems(values: Mapping[str, Any]) -> list[str]:
    return [p for name, value in values.items() if (p := _SPECS[name].type_problem(value)) is not None]


def _rule_problems(values: Mapping[str, Any]) -> list[str]:
    """Values the store cannot run with, checked as written (before `effective_values`)."""
    problems = []
    for name, value in values.items():
        spec = _SPECS[name]
        if spec.ge is not None and value < spec.ge:
            problems.append(f"{spec.key} = {value}: must be >= {spec.ge}")
        if spec.le is not None and value > spec.le:
            problems.append(f"{spec.key} = {value}: must be <= {spec.le}")
    if values["transient_store_pool_enable"] and values["transient_store_pool_size"] <= 0:
        problems.append(
            f"transientStorePoolEnable = true needs transientStorePoolSize > 0 "
            f"(got {values['transient_store_pool_size']})"
        )
    if values["store_group_access"] not in ACCESS_VALUES:
        problems.append(
            f"storeGroupAccess = {values['store_group_access']!r}: must be one of {', '.join(ACCESS_VALUES)}"
        )
    delete_when = values["delete_when"]
    parts = delete_when.split(";")
    if not all(re.fullmatch(r"[0-9]{1,2}", p) and int(p) <= 23 for p in parts):
        problems.append(f"deleteWhen = {delete_when!r}: must be hours 0..23 separated by ';' (e.g. 04;05)")
    delay = values["message_delay_level"]
    tokens = delay.split()
    if not tokens or not all(re.fullmatch(r"[0-9]+[smhd]", t) for t in tokens):
        problems.append(f"messageDelayLevel = {delay!r}: must be space-separated <n>s|m|h|d tokens")
    try:
        ipaddress.ip_address(values["broker_ip1"])
    except ValueError:
        problems.append(f"brokerIP1 = {values['broker_ip1']!r}: must be an IPv4 or IPv6 address (store host)")
    try:
        ipaddress.ip_address(values["metrics_address"])
    except ValueError:
        problems.append(
            f"metricsAddress = {values['metrics_address']!r}: must be an IPv4 or IPv6 address "
            f"(127.0.0.1, 0.0.0.0, ::)"
        )
    if not values["store_path_root_dir"]:
        problems.append("storePathRootDir is empty")
    problems += _ha_problems(values)
    for name, key in (("broker_name", "brokerName"), ("broker_cluster_name", "brokerClusterName")):
        # RocketMQ's broker creates a topic of each name (TopicConfigManager): a topic's limit.
        if not 0 < len(values[name]) <= TOPIC_NAME_MAX_LENGTH or not values[name].isprintable():
            problems.append(
                f"{key} = {values[name][:40]!r}{'...' if len(values[name]) > 40 else ''} "
                f"({len(values[name])} characters): must be 1 to {TOPIC_NAME_MAX_LENGTH} printable "
                f"characters (RocketMQ makes it a topic name)"
            )
    for name in ("store_path_root_dir", "store_path_commit_log", "read_only_commit_log_store_paths"):
        if "\0" in values[name]:
            problems.append(f"{_SPECS[name].key} = {values[name]!r}: a path cannot hold a NUL character")
    index_size = index_file_size(values["max_hash_slot_num"], values["max_index_num"])
    if index_size > _JAVA_INT[1]:
        problems.append(
            f"maxHashSlotNum * 4 + maxIndexNum * 20 + 40 = {index_size}: an index file must be "
            f"< 2 GiB (Java int size)"
        )
    return problems


def parse_allowed_slaves(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """`haAllowedSlaves`: `,`-separated addresses or CIDRs (empty: any peer). ValueError names a bad one."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if item:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError as exc:
                raise ValueError(f"{item!r} is not an address or CIDR ({exc})") from None
    return tuple(networks)


def peer_allowed(host: str, allowed: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    """Whether a peer's address is in `haAllowedSlaves` (parsed; empty allows any), an IPv4
    peer seen as IPv4-mapped IPv6 included."""
    if not allowed:
        return True
    ip = ipaddress.ip_address(host.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in allowed)


def parse_host_port(text: str) -> tuple[str, int]:
    """`haMasterAddress` = host:port ([v6]:port for IPv6). ValueError when it is not one."""
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)


def _ha_problems(values: Mapping[str, Any]) -> list[str]:
    problems = []
    try:
        parse_allowed_slaves(values["ha_allowed_slaves"])
    except ValueError as exc:
        problems.append(f"haAllowedSlaves = {values['ha_allowed_slaves']!r}: {exc}")
    if values["ha_master_address"]:
        try:
            parse_host_port(values["ha_master_address"])
        except ValueError as exc:
            problems.append(f"haMasterAddress: {exc}")
    if values["ha_master_meta_address"]:
        try:
            parse_host_port(values["ha_master_meta_address"])
        except ValueError as exc:
            problems.append(f"haMasterMetaAddress: {exc}")
    if values["ha_listen_address"]:
        try:
            ipaddress.ip_address(values["ha_listen_address"])
        except ValueError:
            problems.append(
                f"haListenAddress = {values['ha_listen_address']!r}: must be an IPv4 or IPv6 address"
            )
    return problems


def _resolve_paths(values: Mapping[str, Any]) -> dict[str, str]:
    """Absolute store paths (cwd-relative, `~` expanded); only the changed ones returned."""
    resolved = {"store_path_root_dir": _resolve_path(values["store_path_root_dir"])}
    for name in ("store_path_commit_log", "read_only_commit_log_store_paths"):
        resolved[name] = MULTI_PATH_SPLITTER.join(_resolve_path(p) for p in _split_paths(values[name]))
    return {name: path for name, path in resolved.items() if path != values[name]}


# --------------------------------------------------------------------------------------------
# The effective-value step


def effective_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """RocketMQ's effective-value rules, in one place instead of hidden in getters.

    Takes validated field values (snake_case); returns the fields to change and one
    `key: written -> effective (rule)` line per change:

    * `mappedFileSizeConsumeQueue` rounded up to a multiple of 20 (`getMappedFileSizeConsumeQueue`);
    * `transientStorePoolEnable` off unless ASYNC_FLUSH and not SLAVE (`isTransientStorePoolEnable`);
    * `diskMaxUsedSpaceRatio` clamped to [10, 95] (`getDiskMaxUsedSpaceRatio`);
    * `diskSpaceWarningLevelRatio` to [35, 90], `diskSpaceCleanForciblyRatio` to [30, 85]
      (RocketMQ 5.x `DefaultMessageStore` rule).
    """
    changes: dict[str, Any] = {}
    notes: list[str] = []

    def change(name: str, value: Any, rule: str) -> None:
        spec = _SPECS[name]
        changes[name] = value
        notes.append(f"{spec.key}: {spec.format(values[name])} -> {spec.format(value)} ({rule})")

    cq_size = values["mapped_file_size_consume_queue"]
    rounded = effective_file_size(cq_size)
    if rounded != cq_size:
        change(
            "mapped_file_size_consume_queue",
            rounded,
            f"rounded up to a multiple of the {CQ_STORE_UNIT_SIZE}-byte entry",
        )

    if values["transient_store_pool_enable"]:
        if values["flush_disk_type"] is not FlushDiskType.ASYNC_FLUSH:
            change("transient_store_pool_enable", False, "the pool is used only under ASYNC_FLUSH")
        elif values["broker_role"] is BrokerRole.SLAVE:
            change("transient_store_pool_enable", False, "the pool is not used on a SLAVE")

    for name, low, high, origin in (
        ("disk_max_used_space_ratio", 10, 95, "RocketMQ 4.9.8"),
        ("disk_space_warning_level_ratio", 35, 90, "RocketMQ 5.x"),
        ("disk_space_clean_forcibly_ratio", 30, 85, "RocketMQ 5.x"),
    ):
        clamped = min(max(values[name], low), high)
        if clamped != values[name]:
            change(name, clamped, f"clamped to [{low}, {high}] as {origin}")

    return changes, tuple(notes)
