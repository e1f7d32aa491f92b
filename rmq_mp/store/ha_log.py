"""What a store's commit log is, as replication knows it: ``config/haLog.json`` (issue 32).

A slave must not serve bytes it has not confirmed as its current master's. A returning old
master started as a slave holds records only it has; a slave re-pointed at a new master may hold
a tail that master never had (two slaves, the one behind promoted). Until the ha worker's first
comparison with the master (workers/ha_fork.py) it cannot tell, so the store keeps a record of
what its log is, written with the project's atomic, checksummed config writes
(`ConfigManager.persist`)::

    {"brokerRole": "SLAVE", "haMasterAddress": "127.0.0.1:10912", "confirmed": "all"}

- ``brokerRole``: the role of the run that wrote it (a master's log is its own);
- ``haMasterAddress``: a SLAVE's master (host:port as `parse_host_port` reads it);
- ``confirmed``: ``"all"`` (every byte came from, or was compared equal with, that master's
  log, and it appends only that master's bytes) or an offset below which it is.

Who writes it: the supervisor at each start (`start_window`) when what it finds changes it (a
master retires a SLAVE's record; with none it writes none: a missing record confirms nothing); the
ha worker when a comparison ends ("equal": all of it; a fork at C: C) and the promotion (a
master from then on). A start as a SLAVE of address M caps its read window (`FORK_READ_END`,
and `HA_UNCONFIRMED_FROM` saying it is only unconfirmed) at the confirmed offset, or at its
log's first byte when nothing is confirmed for M: the last run was a master or promoted, it
followed another address, the record is missing (or damaged) on a non-empty log, or a fork was
found and not yet cut. The ha worker lifts the cap when its first comparison finds the logs
equal; a fork keeps it at C. A slave confirmed "all" for its master keeps serving its whole
log during a master outage, as RocketMQ's slaves do. A stopped store's readers
(`stopped_read_end`) honour the same record and a pending cut.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from rmq_mp.config.config_manager import ConfigManager, dumps, loads
from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig, parse_host_port
from rmq_mp.store import fork

log = logging.getLogger(__name__)

FILE_NAME = "haLog.json"
ALL = "all"


@dataclass(frozen=True, slots=True)
class LogRecord:
    role: str
    """`BrokerRole` value of the run that wrote it."""
    master: str = ""
    """SLAVE: the master it follows, ``host:port``; '' for a master."""
    confirmed_to: int | None = None
    """SLAVE: its log is that master's below this offset; None: all of it."""

    @property
    def unconfirmed_slave(self) -> bool:
        return self.role == BrokerRole.SLAVE.value and self.confirmed_to is not None


class HaLogFile(ConfigManager):
    """``config/haLog.json`` (one writer at a time: the supervisor while no ha worker runs, else
    the ha worker)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.record: LogRecord | None = None

    def encode(self) -> str:
        assert self.record is not None
        r = self.record
        content: dict[str, object] = {"brokerRole": r.role}
        if r.role == BrokerRole.SLAVE.value:
            content["haMasterAddress"] = r.master
            content["confirmed"] = ALL if r.confirmed_to is None else r.confirmed_to
        return dumps(content)

    def decode(self, text: str) -> None:
        data = loads(text)
        if not isinstance(data, dict):
            raise TypeError("expected an object")
        role = BrokerRole(data["brokerRole"]).value
        if role != BrokerRole.SLAVE.value:
            self.record = LogRecord(role)
            return
        master, confirmed = data["haMasterAddress"], data["confirmed"]
        if not isinstance(master, str):
            raise TypeError(f"haMasterAddress {master!r}")
        if confirmed == ALL:
            self.record = LogRecord(role, master, None)
        elif isinstance(confirmed, int) and not isinstance(confirmed, bool) and confirmed >= 0:
            self.record = LogRecord(role, master, confirmed)
        else:
            raise ValueError(f"confirmed {confirmed!r}: expected {ALL!r} or an offset")

    def reset(self) -> None:
        self.record = None


def path_of(root: Path) -> Path:
    return Path(root) / "config" / FILE_NAME


def load(root: Path) -> LogRecord | None:
    """The record, None when there is none or it cannot be read (then nothing is confirmed)."""
    f = HaLogFile(path_of(root))
    if not f.load():
        log.error("%s: %s: nothing of the log is taken as confirmed", f.path, f.last_load.describe())
        return None
    return f.record


def write(root: Path, record: LogRecord) -> None:
    """Persist ``record`` (atomic, fsynced, checksummed). Raises OSError."""
    f = HaLogFile(path_of(root))
    f.record = record
    f.persist()


def master_key(address: str) -> str:
    """``host:port`` as the ha worker connects to it (so '127.0.0.1:7' and ' 127.0.0.1:7' agree)."""
    host, port = parse_host_port(address)
    return f"{host}:{port}"


def start_window(config: MessageStoreConfig, root: Path, first_byte: int, end: int) -> int:
    """At a start (before any worker or client attaches): the offset from which this store's log
    is not confirmed as its master's, -1 when all of it is (or it follows no master), recording
    what the log is now. ``config`` carries the role this start runs as (a promotion's)."""
    record = load(root)
    if config.broker_role is not BrokerRole.SLAVE:
        if record is not None and record.role != config.broker_role.value:
            write(root, LogRecord(config.broker_role.value))  # what it appends is its own
        return -1
    if not config.ha_master_address:  # no master to compare with: nothing replicates
        return -1
    master = master_key(config.ha_master_address)
    confirmed: int | None
    if end <= first_byte:
        confirmed = None  # an empty log: all it will hold comes from this master
    elif record is not None and record.role == BrokerRole.SLAVE.value and record.master == master:
        confirmed = record.confirmed_to
    else:
        confirmed = first_byte
        log.warning(
            "this store's log [%d, %d) is not confirmed as %s's (%s): nothing of it is served until "
            "its first comparison with that master",
            first_byte, end, master, _why(record),
        )  # fmt: skip
    if confirmed is not None:
        confirmed = max(confirmed, first_byte)
        if confirmed >= end:
            confirmed = None  # a log cut at a fork: all it holds was compared equal
    new = LogRecord(BrokerRole.SLAVE.value, master, confirmed)
    if new != record:
        write(root, new)
    return -1 if confirmed is None else confirmed


def _why(record: LogRecord | None) -> str:
    if record is None:
        return f"no readable {FILE_NAME}"
    if record.role != BrokerRole.SLAVE.value:
        return f"its last run was a {record.role}"
    return f"it followed {record.master}"


def stopped_read_end(root: Path) -> int:
    """Where a stopped store's readers stop (-1: nowhere): a pending cut's fork offset, or the
    offset an unconfirmed slave's record holds (a store killed while its window was capped)."""
    ends = []
    try:
        cut = fork.pending_cut(Path(root))
    except (OSError, ValueError, KeyError, TypeError):
        cut = None
    if cut is not None:
        ends.append(cut.fork_offset)
    if path_of(root).exists():
        record = load(root)
        if record is not None and record.unconfirmed_slave:
            assert record.confirmed_to is not None
            ends.append(record.confirmed_to)
    return min(ends, default=-1)
