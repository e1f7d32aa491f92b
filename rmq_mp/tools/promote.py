"""`rmq-admin promote`: make a running SLAVE a master once its master is gone (workers/promotion.py).

    rmq-admin promote --name STORE [--broker-name NAME] [--role SYNC_MASTER|ASYNC_MASTER] [--force]

``--name`` is the running slave's store (its directory or shm name), as for every rmq-admin
command; ``--broker-name``, when given, must be its brokerName in broker.conf, so a script that
means one broker cannot promote another. The role is ``--role``, else SYNC_MASTER when the
slave's broker.conf sets haListenPort (it will serve slaves of its own) and ASYNC_MASTER
otherwise (a SYNC_MASTER with no slave answers a waiting put SLAVE_NOT_AVAILABLE, stored).

Refused, with one line, unless ``--force``:
- the store is not a running SLAVE (never forced);
- its log forks from its master's and is not cut yet (never forced: it restarts by itself to
  cut there first, workers/ha_fork.py);
- its log is not yet confirmed as its master's past some offset (HA_UNCONFIRMED_FROM: a returning
  old master, a slave re-pointed at a new master, before its first comparison; rmq_mp/store/ha_log.py);
- its master still answers on haMasterAddress, or the slave is connected to it (two masters);
- the slave holds less of the master's commit log than the master last said it had
  (HA_META_MASTER_END, from the metadata channel): the difference would be lost. Under
  SYNC_MASTER every message answered PUT_OK is below what a slave acknowledged, so what
  ``--force`` loses then was never acknowledged.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import Any

from rmq_mp.config.store_config import BrokerRole, parse_host_port
from rmq_mp.errors import StoreError
from rmq_mp.paths import StorePaths, fsync_dir
from rmq_mp.store.running_store import RunningStore
from rmq_mp.tools.admin_common import emit, is_running, need_running, open_store, refuse_if_running
from shm import layout
from shm.layout import Role

DONE_TIMEOUT_S = 60.0
CONNECT_PROBE_S = 1.0
DISPATCH_WAIT_S = 10.0


def master_answers(address: str) -> bool:
    """Whether something accepts a TCP connection at ``address`` (host:port) within a second."""
    try:
        host, port = parse_host_port(address)
        socket.create_connection((host, port), timeout=CONNECT_PROBE_S).close()
    except (OSError, ValueError):
        return False
    return True


def check(store: RunningStore, args: argparse.Namespace) -> tuple[BrokerRole, dict[str, Any]]:
    """The role to promote to and what the slave stands at; `StoreError` for a refusal."""
    cfg, t = store.config, store.table
    shown = f"store {store.paths.root} (brokerName {cfg.broker_name})"
    if args.broker_name is not None and args.broker_name != cfg.broker_name:
        raise StoreError(f"promote refused: {shown} is not broker {args.broker_name!r}")
    if cfg.broker_role is not BrokerRole.SLAVE:
        raise StoreError(f"promote refused: {shown} already runs as {cfg.broker_role.value}")
    role = BrokerRole(args.role) if args.role else (
        BrokerRole.SYNC_MASTER if cfg.ha_listen_port >= 0 else BrokerRole.ASYNC_MASTER
    )  # fmt: skip
    received, heard = t.get(layout.HA_SLAVE_RECEIVED_END), t.get(layout.HA_META_MASTER_END)
    facts = {
        "store": str(store.paths.root),
        "brokerName": cfg.broker_name,
        "role": role.value,
        "receivedEnd": received,
        "masterEndLastHeard": heard,
        "wrotePosition": t.get(layout.WROTE_POSITION),
        "metaSnapshotsApplied": t.get(layout.HA_META_APPLIED),
    }
    unconfirmed = t.get(layout.HA_UNCONFIRMED_FROM)
    if (fork_offset := t.get(layout.FORK_READ_END)) >= 0 and unconfirmed < 0:  # never forced: cut first
        raise StoreError(
            f"promote refused: {shown}'s log forks from its master's at {fork_offset} (what follows is "
            f"not the master's); it restarts by itself to cut there: promote it once it has"
        )
    if args.force:
        return role, facts
    if unconfirmed >= 0:
        raise StoreError(
            f"promote refused: {shown}'s log is confirmed as its master {cfg.ha_master_address}'s only "
            f"below {unconfirmed} (it has not compared its log with that master since it started, and "
            f"serves nothing past it); --force to promote it with its bytes from {unconfirmed} as its own"
        )
    if t.get(layout.HA_SLAVE_STATE) == layout.SLAVE_CONNECTED or (
        cfg.ha_master_address and master_answers(cfg.ha_master_address)
    ):
        raise StoreError(
            f"promote refused: {shown}'s master {cfg.ha_master_address} still answers: stop it first "
            f"(two masters would fork the log), or --force"
        )
    if received < heard:
        raise StoreError(
            f"promote refused: {shown} holds the master's commit log to {received}, the master last said "
            f"{heard}: {heard - received} bytes (never acknowledged under SYNC_MASTER) would be lost; "
            f"--force to promote anyway"
        )
    return role, facts


def promote(args: argparse.Namespace) -> int:
    need_running(args, "promote")
    store = RunningStore.attach(args.name, Role.CONSUMER)
    try:
        role, facts = check(store, args)
        t = store.table
        deadline = time.monotonic() + DISPATCH_WAIT_S  # its own readers first see all it holds
        while t.get(layout.REPUT_FROM_OFFSET) < t.get(layout.WROTE_POSITION) and time.monotonic() < deadline:
            time.sleep(0.01)
        done = t.get(layout.PROMOTIONS_DONE)
        with store.shm.flags_lock("request a promotion"):
            if t.get(layout.PROMOTE_REQUEST):
                raise StoreError("promote refused: a promotion of this store is under way already")
            t.set(layout.PROMOTE_REQUEST, layout.ROLE_CODES[role.value])
        deadline = time.monotonic() + DONE_TIMEOUT_S
        while t.get(layout.PROMOTIONS_DONE) == done:
            if time.monotonic() > deadline:
                raise StoreError(f"the supervisor did not carry out the promotion in {DONE_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        if t.get(layout.BROKER_ROLE_NOW) != layout.ROLE_CODES[role.value]:
            raise StoreError("the supervisor refused the promotion: see logs/supervisor.log")
        facts["wrotePosition"] = t.get(layout.WROTE_POSITION)
    finally:
        store.close()
    emit(
        [facts],
        as_json=args.json,
        columns={k: k for k in facts},
        footer=f"promoted {facts['store']} to {role.value}",
    )
    return 0


def demote(args: argparse.Namespace) -> int:
    """Retire a stopped store's promotion (`config/promotion.json`, kept as
    ``promotion.json.demoted-<UTC time>``): its next start is as its broker.conf says, a SLAVE
    rejoining its master (the fork check then sets aside what only it wrote as a master)."""
    if is_running(args):
        raise StoreError(
            f"demote needs a stopped store given as --store DIR, not --name {args.name} (a running "
            f"master is not made a slave in place: stop it, demote it, start it)"
        )
    with open_store(args) as store:
        refuse_if_running(store)
        config = store.config
    path = StorePaths.of(config.store_path_root_dir).promotion
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        what = f"its promotion to {record.get('brokerRole')} (made while a SLAVE of {record.get('haMasterAddress')})"
    except FileNotFoundError:
        print(
            f"store {config.store_path_root_dir}: not promoted ({path} absent): it starts as its broker.conf says"
        )
        return 0
    except (OSError, ValueError) as exc:
        what = f"its unreadable promotion record ({exc})"
    kept = path.with_name(f"{path.name}.demoted-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    os.replace(path, kept)
    fsync_dir(path.parent)
    print(
        f"store {config.store_path_root_dir}: {what} retired, kept as {kept.name}; its next start is "
        f"as its broker.conf says"
    )
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("promote", parents=[common], help="make a running SLAVE a master (its master gone)")
    p.add_argument(
        "--broker-name", "--brokerName", dest="broker_name", help="the slave's brokerName, checked"
    )
    p.add_argument("--role", choices=("SYNC_MASTER", "ASYNC_MASTER"), help="the master role to take")
    p.add_argument("--force", "-f", action="store_true", help="even when not caught up or the master answers")
    p = sub.add_parser(
        "demote", parents=[common], help="(stopped store) retire its promotion: it starts as broker.conf says"
    )
