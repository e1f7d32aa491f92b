"""rmq-mp entry point: the supervisor of a store, and a library demo.

python run.py start  [--conf conf/broker.conf] [--store DIR]   run the store (foreground)
python run.py stop   [--conf ...] [--store DIR]                stop it cleanly
python run.py status [--conf ...] [--store DIR] [--json]       workers, offsets, pool, flags
python run.py demo   [--conf ...] [--store DIR] [--messages N] the store as a library
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from rmq_mp.audit import digest_report
from rmq_mp.config import MessageStoreConfig
from rmq_mp.errors import StoreError
from rmq_mp.message import PROPERTY_KEYS, PROPERTY_TAGS, Message, UniqueIdGenerator
from rmq_mp.message_store import MessageStore
from rmq_mp.status import GetMessageStatus, PutMessageStatus
from shm import layout
from shm.layout import Role
from shm.names import ShmNames
from shm.pointer_table import PointerTable, pid_alive
from workers.status import print_status
from workers.supervisor import Supervisor

DEFAULT_CONF = Path(__file__).resolve().parent / "conf" / "broker.conf"


def demo(config: MessageStoreConfig, count: int) -> int:
    """Write ``count`` messages over two topics, read them back, print a summary."""
    uniq = UniqueIdGenerator()
    started = time.monotonic()
    with MessageStore.open(config=config) as store:
        report = store.recovery
        assert report is not None
        print(
            f"store {store.paths.root}: recovered {'ABNORMALLY' if report.abnormal else 'normally'}, "
            f"commit log [{store.min_phy_offset()}, {store.max_phy_offset()}), {report.duration_ms} ms"
        )
        last_id = ""
        for i in range(count):
            topic = "DemoOrders" if i % 3 else "DemoPayments"
            message = Message(
                topic=topic,
                body=f"demo message {i} written at {time.time():.3f}".encode(),
                queue_id=i % 4,
                properties={
                    PROPERTY_TAGS: "TagA" if i % 2 else "TagB",
                    PROPERTY_KEYS: f"order-{i}",
                    "UNIQ_KEY": uniq.next_id(),
                },
            )
            result = store.put_message(message)
            if result.status is not PutMessageStatus.PUT_OK:
                print(f"put failed: {result.status.name} {result.reason}", file=sys.stderr)
                return 1
            last_id = result.msg_id
        store.flush()
        wrote_s = time.monotonic() - started
        print(
            f"wrote {count} messages in {wrote_s:.2f} s ({count / max(wrote_s, 1e-9):,.0f} msgs/s), flushed"
        )
        for topic in store.topics():
            for q in store.queue_status(topic):
                got = store.get_message(topic, q.queue_id, max(q.min_offset, q.max_offset - 2), 2)
                bodies = [m.body.decode(errors="replace") for m in got.messages]
                assert got.status is GetMessageStatus.FOUND
                print(
                    f"  {topic}/{q.queue_id}: offsets [{q.min_offset}, {q.max_offset}) last: {bodies[-1]!r}"
                )
        by_id = store.view_message_by_id(last_id)
        print(f"by msgId {last_id}: {by_id.body.decode()!r}")
        key = f"order-{count - 1}"
        hits = store.query_message("DemoOrders" if (count - 1) % 3 else "DemoPayments", key)
        print(f"by key {key}: {[m.body.decode() for m in hits]}")
        print("digests (as RocketMQ's queues.txt):", digest_report(store)[-1])
    print("closed cleanly (abort file removed)")
    return 0


def stop(config: MessageStoreConfig, timeout_s: float = 60.0) -> int:
    """SIGTERM the store's supervisor and wait for it to finish its clean shutdown."""
    names = ShmNames.for_store(config.store_path_root_dir, config.shm_name)
    table = PointerTable.attach(names.pointer_table, Role.CONSUMER)
    pid = table.get(layout.SUPERVISOR_PID)
    table.close()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            print(f"run.py: supervisor {pid} still running after {timeout_s:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"stopped store {config.store_path_root_dir} (supervisor {pid})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", type=Path, default=DEFAULT_CONF, help="broker.conf to load")
    common.add_argument("--store", type=Path, help="store directory (overrides storePathRootDir)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", parents=[common], help="run the store in the foreground until SIGTERM/SIGINT")
    sub.add_parser("stop", parents=[common], help="stop a running store cleanly")
    status_parser = sub.add_parser("status", parents=[common], help="show a running store")
    status_parser.add_argument("--json", action="store_true", help="machine-readable output")
    demo_parser = sub.add_parser("demo", parents=[common], help="write and read the store as a library")
    demo_parser.add_argument("--messages", type=int, default=10_000, help="messages to write")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RMQ_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = MessageStoreConfig.from_file(args.conf)
        if args.store is not None:
            config = config.replace(store_path_root_dir=str(args.store.resolve()))
        if args.command == "start":
            supervisor = Supervisor(config)
            print(f"starting store {config.store_path_root_dir} as shm {supervisor.names.base}", flush=True)
            return supervisor.run()
        if args.command == "stop":
            return stop(config)
        if args.command == "status":
            return print_status(config, as_json=args.json)
        return demo(config, args.messages)
    except StoreError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
