"""rmq-mp entry point: the supervisor of a store, and a library demo.

python run.py start  [--conf conf/broker.conf] [--store DIR]   run the store (foreground)
python run.py stop   [--conf ...] [--store DIR]                stop it cleanly
python run.py status [--conf ...] [--store DIR] [--json|--watch] workers, offsets, pool, flags
python run.py demo   [--conf ...] [--store DIR] [--messages N] the store as a library
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rmq_mp.config import MessageStoreConfig
from rmq_mp.consumer import Consumer
from rmq_mp.errors import StoreError
from rmq_mp.logs import log_dir, setup_process_logging
from rmq_mp.producer import Producer
from shm import layout
from shm.layout import Role
from shm.names import ShmNames
from shm.pointer_table import PointerTable, pid_alive
from workers.status import collect_status, print_status
from workers.supervisor import Supervisor
from workers.watch import watch

DEFAULT_CONF = Path(__file__).resolve().parent / "conf" / "broker.conf"


def demo(conf: Path, config: MessageStoreConfig, count: int) -> int:
    """Start the store as a service, send ``count`` messages from this process, consume them with
    a long-polling consumer, look one up by key and by msgId, print the status, stop cleanly."""
    root = config.store_path_root_dir
    command = [sys.executable, str(Path(__file__).resolve()), "start", "--conf", str(conf), "--store", root]
    supervisor = subprocess.Popen(command)
    try:
        if not wait_running(config, supervisor):
            print("run.py: the store did not start", file=sys.stderr)
            return 1
        name = ShmNames.for_store(root, config.shm_name).base  # shmName, when set, names it
        with Producer.attach(name) as producer, Consumer.attach(name, "demo-group") as consumer:
            consumer.subscribe("DemoOrders", "TagA || TagB")
            started = time.monotonic()
            results = producer.send_batch(
                dict(
                    topic="DemoOrders",
                    body=f"order {i} at {time.time():.3f}".encode(),
                    tags="TagA" if i % 2 else "TagB",
                    keys=[f"order-{i}"],
                )
                for i in range(count)
            )
            sent_s = time.monotonic() - started
            ok = sum(r.ok for r in results)
            print(f"sent {ok}/{count} messages in {sent_s:.2f} s ({count / max(sent_s, 1e-9):,.0f} msgs/s)")
            received = 0
            while received < ok and (batch := consumer.poll(timeout_s=5)):
                received += len(batch)
            print(f"consumed {received} messages with a long-polling consumer (group demo-group)")
            last = results[-1]
            print(
                f"by msgId {last.msg_id}: {consumer.store.commit_log.look_message_by_offset(last.commit_log_offset).body!r}"
            )
        print()
        print_status(config, as_json=False)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(60)
    print(f"\nstopped (supervisor exit code {supervisor.returncode}); files in {root}")
    return supervisor.returncode


def wait_running(config: MessageStoreConfig, process: subprocess.Popen[bytes], timeout_s: float = 60) -> bool:
    """Until the store runs under this supervisor (a crashed run's table may say RUNNING too)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            status = collect_status(config)
            if status["state"] == "RUNNING" and status["supervisor_pid"] == process.pid:
                return True
        except StoreError:
            pass
        time.sleep(0.05)
    return False


def start_daemon(conf: Path, config: MessageStoreConfig) -> int:
    """Start the supervisor detached; return once running. It logs to <store>/logs/supervisor.log
    (rotated); its stdout and stderr (a traceback, were it to crash) go to supervisor.out."""
    logs = log_dir(config.store_path_root_dir)
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / "supervisor.out").open("ab") as out:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "start",
            "--conf",
            str(conf),
            "--store",
            config.store_path_root_dir,
        ]
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    if not wait_running(config, process):
        print(
            f"run.py: the store did not start; see {logs / 'supervisor.log'} and {logs / 'supervisor.out'}",
            file=sys.stderr,
        )
        return 1
    print(
        f"store {config.store_path_root_dir} running, supervisor pid {process.pid}, log {logs / 'supervisor.log'}"
    )
    if note := config.root_dir_note:
        print(f"run.py: {note}")
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
    start_parser = sub.add_parser(
        "start", parents=[common], help="run the store (foreground unless --daemon)"
    )
    start_parser.add_argument(
        "--daemon", action="store_true", help="run in the background; log to <store>/logs"
    )
    sub.add_parser("stop", parents=[common], help="stop a running store cleanly")
    status_parser = sub.add_parser("status", parents=[common], help="show a running store")
    status_parser.add_argument("--json", action="store_true", help="machine-readable output")
    status_parser.add_argument(
        "--watch", action="store_true", help="live view: throughput, lags, workers, pool, disk (Ctrl-C ends)"
    )
    status_parser.add_argument("--interval", type=float, default=1.0, help="--watch refresh period, seconds")
    status_parser.add_argument("--count", type=int, default=0, help="--watch: stop after N refreshes")
    demo_parser = sub.add_parser("demo", parents=[common], help="start the store, produce, consume, stop")
    demo_parser.add_argument("--messages", type=int, default=10_000, help="messages to write")
    args = parser.parse_args(argv)
    setup_process_logging(None, "run.py")
    try:
        config = MessageStoreConfig.from_file(args.conf)
        if args.store is not None:
            config = config.replace(store_path_root_dir=str(args.store.resolve()))
        if args.command == "start" and args.daemon:
            return start_daemon(args.conf, config)
        if args.command == "start":
            setup_process_logging(config.store_path_root_dir, "supervisor")
            supervisor = Supervisor(config)
            print(f"starting store {config.store_path_root_dir} as shm {supervisor.names.base}", flush=True)
            if note := config.root_dir_note:
                print(f"run.py: {note}", flush=True)
            code = supervisor.run()
            print(
                f"stopped store {config.store_path_root_dir} {'cleanly' if code == 0 else 'with abort kept'}"
            )
            return code
        if args.command == "stop":
            return stop(config)
        if args.command == "status" and args.watch:
            return watch(config, interval_s=args.interval, count=args.count)
        if args.command == "status":
            return print_status(config, as_json=args.json)
        return demo(args.conf, config, args.messages)
    except StoreError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
