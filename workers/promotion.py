"""Promotion: a running SLAVE becomes a master without a restart (`rmq-admin promote`).

RocketMQ 4.x needs brokerRole changed in broker.conf and a restart; RocketMQ 5's controller
elects a master. Here `rmq-admin promote` checks the slave (rmq_mp/tools/promote.py) and sets
PROMOTE_REQUEST; the supervisor, in its watch loop, then (`promote`):

1. stops the ha worker (the slave's one writer of the commit log: after it, nothing writes the
   log until a producer does, so the records below WROTE_POSITION are the master's, whole),
   and moves each delay level past what the dead master delivered after the last delay
   offsets it sent (`skip_delivered_delays`), so no delayed message is delivered twice;
2. persists the new role in ``<store>/config/promotion.json`` (atomic, fsynced), so a restart
   with the same broker.conf keeps it (`persisted_role`);
3. sets BROKER_ROLE_NOW: every attach from now on reads the new role (`promoted_role`), and a
   producer attached as a slave's, refused until now, binds to the store as a master's at its
   next send (`Producer._refusal`), the scheduler's included, which starts delivering delays
   from the offsets the metadata channel followed;
4. starts the ha worker again when the master role runs one (haListenPort set), now serving
   slaves (and haMetaListenPort: the metadata channel);
5. counts PROMOTIONS_DONE, which the command waits for.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Protocol

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from rmq_mp.errors import StoreError
from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.paths import StorePaths
from rmq_mp.store import ha_log, schedule
from rmq_mp.store.running_store import RunningStore
from rmq_mp.tools.promote import master_answers
from shm import layout
from shm import schedule_offsets as so
from shm.names import ShmNames
from shm.pointer_table import PointerTable
from shm.store_shm import StoreShm
from workers.worker_handle import WorkerHandle, replicates


class Supervisor(Protocol):
    """What a promotion uses of workers/supervisor.py's Supervisor (a Protocol: the supervisor
    imports this module, so this one does not import it back)."""

    config: MessageStoreConfig
    names: ShmNames
    shm: StoreShm | None
    workers: dict[str, WorkerHandle]

    def _start_worker(self, handle: WorkerHandle) -> None: ...

    def _stop_worker(self, handle: WorkerHandle) -> bool: ...


log = logging.getLogger("rmq_mp.supervisor")


def promotion_path(config: MessageStoreConfig) -> Path:
    return StorePaths.of(config.store_path_root_dir).promotion


def persisted_role(config: MessageStoreConfig) -> MessageStoreConfig:
    """broker.conf's settings with the role a promotion persisted: applied while broker.conf
    still says SLAVE of the same haMasterAddress as when it was promoted (an operator who points
    it at a new master, to make it a slave again, has the file ignored and said so). When that
    master answers again (it came back, or was promoted itself: the same address now names a
    master), the start is refused with one line (`StoreError`) rather than made a second
    master: `rmq-admin demote` retires the file, and the store then starts as the SLAVE its
    broker.conf says."""
    path = promotion_path(config)
    if config.broker_role is not BrokerRole.SLAVE or not path.exists():
        return config
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        role = BrokerRole(record["brokerRole"])
        master = str(record["haMasterAddress"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("%s is unreadable (%s): starting as broker.conf says (SLAVE)", path, exc)
        return config
    if master != config.ha_master_address:
        log.warning(
            "%s: promoted to %s while a slave of %s; broker.conf now names %s: starting as a SLAVE",
            path, role.value, master, config.ha_master_address,
        )  # fmt: skip
        return config
    if config.ha_master_address and master_answers(config.ha_master_address):
        raise StoreError(
            f"store {config.store_path_root_dir} was promoted to {role.value} while a SLAVE of {master} "
            f"({path}), and {master} answers now: started as a master too, the two would fork the log. "
            f"To rejoin it as that master's slave: rmq-admin demote --store {config.store_path_root_dir}, "
            f"then start it; to keep it the master, stop the store at {master} first"
        )
    log.warning("promoted to %s by rmq-admin promote (%s): starting as one", role.value, path)
    return config.replace(broker_role=role)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delivered_keys(store: RunningStore, start: int, end: int) -> set[str]:
    """UNIQ_KEYs of the delayed messages delivered in the commit log's [start, end): a record
    on its REAL_TOPIC still carrying DELAY (the scheduler stores the schedule record's
    properties). Stops, logged, at a record it cannot read."""
    keys: set[str] = set()
    size = store.config.mapped_file_size_commit_log
    pos = start
    while pos < end:
        mf = store.commit_log.file_at(pos)
        at = pos - mf.file_from_offset
        if size - at < record.END_FILE_MIN_BLANK_LENGTH:
            pos = mf.file_from_offset + size
            continue
        total, magic = record.peek_size_magic(mf.buf, at)
        if magic == record.BLANK_MAGIC_CODE:
            pos = mf.file_from_offset + size
            continue
        try:
            ext = record.decode_message(mf.buf, at, at + total, file_position=pos)
        except StoreError as exc:
            log.error("promotion: delivered delays looked for up to %d only: %s", pos, exc)
            break
        props = ext.properties
        if m.PROPERTY_DELAY_TIME_LEVEL in props and props.get(m.PROPERTY_REAL_TOPIC) == ext.topic:
            keys.add(props.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ""))
        pos += total
    keys.discard("")
    return keys


def skip_delivered_delays(supervisor: Supervisor) -> int:
    """Move each delay level past the entries its dead master delivered after the last offsets
    the metadata channel brought (HA_META_DELAY_FROM: a delivery below it is counted in them),
    found in the log above it: so a delayed message is delivered once, not again by this store.
    Returns the entries skipped."""
    from rmq_mp.client.consumer import Consumer

    shm = supervisor.shm
    assert shm is not None
    table, sched = shm.table, shm.schedule
    skipped = 0
    with Consumer.attach(supervisor.names.base, "PROMOTION_DELAY_CHECK") as reader:
        end = reader.store.sync_log()
        start = max(table.get(layout.HA_META_DELAY_FROM), table.get(layout.MIN_OFFSET))
        delivered = _delivered_keys(reader.store, start, end) if start < end else set()
        for queue_id in range(sched.levels):
            offset = moved = sched.get(queue_id, so.OFFSET)
            while delivered:
                got = reader.pull(schedule.SCHEDULE_TOPIC, queue_id, moved, 32)
                if got.status is not GetMessageStatus.FOUND:
                    break
                for ext in got.messages:
                    if ext.properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) not in delivered:
                        break
                    moved = ext.queue_offset + 1
                else:
                    continue
                break
            if moved > offset:
                sched.set(queue_id, so.OFFSET, moved)
                skipped += moved - offset
                log.warning(
                    "promotion: delay level %d: entries %d..%d were delivered by the old master after its "
                    "last offsets reached this store; moved past them",
                    schedule.delay_level_of(queue_id), offset, moved - 1,
                )  # fmt: skip
    return skipped


def _forked(table: PointerTable, role: BrokerRole) -> bool:
    """A fork found and not cut yet (the read window ends at it and is not merely unconfirmed):
    refused, said once."""
    fork_offset = table.get(layout.FORK_READ_END)
    if fork_offset < 0 or table.get(layout.HA_UNCONFIRMED_FROM) >= 0:
        return False
    log.error(
        "promotion to %s refused: this slave's log forks from its master's at %d (what follows "
        "is not the master's); the store restarts to cut it there",
        role.value, fork_offset,
    )  # fmt: skip
    return True


def promote(supervisor: Supervisor) -> None:
    """Carry out PROMOTE_REQUEST (module docstring); the request word is cleared either way."""
    shm = supervisor.shm
    assert shm is not None
    table = shm.table
    code = table.get(layout.PROMOTE_REQUEST)
    names = {v: k for k, v in layout.ROLE_CODES.items()}
    role = BrokerRole(names.get(code, "SLAVE"))
    config = supervisor.config
    try:
        if role is BrokerRole.SLAVE or config.broker_role is not BrokerRole.SLAVE:
            log.error("promotion to %s refused: this store runs as %s", role.value, config.broker_role.value)
            return
        if _forked(table, role):  # its own restart cuts it first
            return
        began = time.monotonic()
        handle = supervisor.workers.pop("ha", None)
        if handle is not None and handle.process is not None:
            supervisor._stop_worker(handle)
        if _forked(table, role):  # found while the worker stopped: it goes on as a slave
            raise StoreError("the slave found a fork while its ha worker stopped")
        ha_log.write(Path(config.store_path_root_dir), ha_log.LogRecord(role.value))  # its own log now
        if (unconfirmed := table.get(layout.HA_UNCONFIRMED_FROM)) >= 0:  # rmq-admin promote --force
            log.warning(
                "promoted with its log confirmed as its master's only below %d (--force): what follows "
                "is served as this master's own",
                unconfirmed,
            )
            table.set(layout.HA_UNCONFIRMED_FROM, -1)
            table.set(layout.FORK_READ_END, -1)
        skip_delivered_delays(supervisor)  # the scheduler delivers nothing until the role changes
        promoted = config.replace(broker_role=role)
        _write_atomically(
            promotion_path(config),
            json.dumps(
                {
                    "brokerRole": role.value,
                    "haMasterAddress": config.ha_master_address,
                    "promotedAtMs": int(time.time() * 1000),
                    "wrotePosition": table.get(layout.WROTE_POSITION),
                },
                indent=1,
            ).encode(),
        )
        supervisor.config = promoted
        table.set(layout.BROKER_ROLE_NOW, code)
        if replicates(promoted):
            supervisor.workers["ha"] = handle = WorkerHandle("ha")
            supervisor._start_worker(handle)
        log.warning(
            "promoted to %s in %.0f ms at commit-log end %d (was a SLAVE of %s)",
            role.value, (time.monotonic() - began) * 1000, table.get(layout.WROTE_POSITION),
            config.ha_master_address,
        )  # fmt: skip
    except Exception:  # the store goes on as it was (a slave whose ha worker restarts) and says why
        log.exception("promotion to %s failed", role.value)
        if (
            "ha" not in supervisor.workers
            and replicates(config)
            and table.get(layout.BROKER_ROLE_NOW) != code
        ):
            supervisor.workers["ha"] = WorkerHandle("ha")
            supervisor._start_worker(supervisor.workers["ha"])
    finally:
        table.set(layout.PROMOTE_REQUEST, 0)
        table.add(layout.PROMOTIONS_DONE, 1)
