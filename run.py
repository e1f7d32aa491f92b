"""rmq-mp entry point: the supervisor of a store, and a library demo.

python run.py start  [--conf conf/broker.conf] [--store DIR]   run the store (foreground)
python run.py stop   [--conf ...] [--store DIR]                stop it cleanly
python run.py status [--conf ...] [--store DIR] [--json|--watch] workers, offsets, pool, flags
python run.py demo   [--conf ...] [--store DIR] [--messages N] the store as a library

Exit codes: 0 done; 1 stopped but not cleanly (abort kept, or config not persisted), or a
supervisor found dead; 2 refused: a bad setting, a damaged or misplaced store file, lost consumer
offsets, a store already running or not running (one line on stderr, nothing changed); 3 an
internal error (one line on stderr naming the log that holds the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import InvalidArgumentError, ShmAttachError, StoreError, StoreNotRunningError
from rmq_mp.logs import log_dir, setup_process_logging
from rmq_mp.paths import StorePaths
from rmq_mp.put.producer import Producer
from rmq_mp.tools.status_report import collect_status, print_status
from rmq_mp.tools.watch import watch
from shm import layout
from shm.layout import Role
from shm.names import ROLES, ShmNames
from shm.pointer_table import PointerTable, pid_alive
from shm.store_shm import StoreShm
from workers.supervisor import Supervisor, salvage_crashed_run

EXIT_REFUSED = 2
EXIT_INTERNAL = 3
ERROR_PREFIX = "run.py: error: "

DEFAULT_CONF = Path(__file__).resolve().parent / "conf" / "broker.conf"


def demo(conf: Path, config: MessageStoreConfig, count: int) -> int:
    """Start the store as a service, send ``count`` messages from this process, consume them with
    a long-polling consumer from its group's committed offsets and commit the new ones (a second
    demo consumes only its own messages), look one up by msgId, print the status, stop cleanly."""
    root = config.store_path_root_dir
    check_store_paths(config)  # a misplaced store is refused in one line before anything starts
    command = [sys.executable, str(Path(__file__).resolve()), "start", "--conf", str(conf), "--store", root]
    supervisor = subprocess.Popen(command)
    try:
        if not wait_running(config, supervisor):
            if supervisor.poll() == EXIT_REFUSED:
                return EXIT_REFUSED  # the supervisor's one line is on stderr already
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
            committed = consumer.commit()  # the group's next offsets: a second demo starts there
            print(
                f"consumed {received} messages with a long-polling consumer (group demo-group) and "
                f"committed its offsets on {len(committed)} queue(s) (`rmq-admin consumerProgress` shows them)"
            )
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


def check_store_paths(config: MessageStoreConfig) -> None:
    """Refuse a store whose root or logs/ cannot be what they must, before logging creates them."""
    StorePaths.of(config.store_path_root_dir, config.commit_log_dir).check_kinds()


def start_daemon(conf: Path, config: MessageStoreConfig) -> int:
    """Start the supervisor detached; return once running. It logs to <store>/logs/supervisor.log
    (rotated); its stdout and stderr (a traceback, were it to crash) go to supervisor.out. A
    supervisor that refuses to start exits 2 and its one error line is repeated here."""
    check_store_paths(config)
    logs = log_dir(config.store_path_root_dir)
    logs.mkdir(parents=True, exist_ok=True)
    out_path = logs / "supervisor.out"
    with out_path.open("ab") as out:
        written_before = out.tell()
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
        code = process.poll()
        with out_path.open("rb") as out:
            out.seek(written_before)
            lines = out.read().decode("utf-8", "replace").splitlines()
        errors = [line for line in lines if line.startswith("run.py: ")]
        if code is not None and code in (EXIT_REFUSED, EXIT_INTERNAL) and errors:
            print(errors[-1], file=sys.stderr)
            return code
        print(did_not_start(code, lines, logs / "supervisor.log", out_path), file=sys.stderr)
        return 1
    name = ShmNames.for_store(config.store_path_root_dir, config.shm_name).base
    print(
        f"store {config.store_path_root_dir} running as shm {name}, supervisor pid {process.pid}, "
        f"log {logs / 'supervisor.log'}"
    )
    if note := config.root_dir_note:
        print(f"run.py: {note}")
    return 0


def did_not_start(code: int | None, lines: list[str], log: Path, out_path: Path) -> str:
    """The one line `start --daemon` prints when the supervisor neither ran nor refused with a
    line of its own: the last thing it wrote (the reason, when it gave one) and where the rest is."""
    said = next((line.strip() for line in reversed(lines) if line.strip()), "")
    if code is None:
        what = "the store is still starting after 60 s (`run.py status` shows when it runs)"
    else:
        what = f"the store did not start (supervisor exit code {code})"
    return f"run.py: {what}{': ' + said if said else ''}; see {log} and {out_path}"


class HeldConsole(logging.Handler):
    """Stands in for the console handler while the store starts: what would go to stderr is held,
    shown once the store runs, and dropped (it is in the log file) if the start is refused, so a
    refusal is one line on stderr."""

    def __init__(self, console: logging.Handler) -> None:
        super().__init__(console.level)
        self.console = console
        self.held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.held.append(record)

    def hand_back(self, *, show: bool) -> None:
        root = logging.getLogger()
        if self in root.handlers:
            root.removeHandler(self)
            root.addHandler(self.console)
        for record in self.held if show else []:
            self.console.handle(record)
        self.held.clear()

    @classmethod
    def install(cls) -> HeldConsole | None:
        root = logging.getLogger()
        consoles = [h for h in root.handlers if type(h) is logging.StreamHandler]
        if not consoles:
            return None
        held = cls(consoles[0])
        root.removeHandler(consoles[0])
        root.addHandler(held)
        return held


def start_foreground(config: MessageStoreConfig) -> int:
    check_store_paths(config)
    setup_process_logging(config.store_path_root_dir, "supervisor")
    held = HeldConsole.install()
    release: Callable[[], None] = (lambda: held.hand_back(show=True)) if held else (lambda: None)
    try:
        supervisor = Supervisor(config)
        say(f"starting store {config.store_path_root_dir} as shm {supervisor.names.base}")
        if note := config.root_dir_note:
            say(f"run.py: {note}")
        code = supervisor.run(on_running=release)
    finally:
        if held is not None:
            held.hand_back(show=False)
    say(
        f"stopped store {config.store_path_root_dir} "
        f"{'cleanly' if code == 0 else 'not cleanly (see ' + str(log_dir(config.store_path_root_dir) / 'supervisor.log') + ')'}"
    )
    return code


def say(line: str) -> None:
    """A foreground supervisor's line on stdout. A reader that has gone (`start | head -0`, or
    demo's, whose stdout this supervisor shares) must not stop the store from starting or
    stopping cleanly: the rest goes to /dev/null."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _worker_pids(names: ShmNames, table: PointerTable) -> list[int]:
    """Live worker processes of this store (by the pids its table lists and their command lines)."""
    pids = []
    for role in ROLES:
        pid = table.get(layout.worker_field(role, "pid"))
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace") if pid else ""
        except OSError:
            continue
        if names.base in cmdline.split("\0") and pid_alive(pid):
            pids.append(pid)
    return pids


def clean_after_dead_supervisor(config: MessageStoreConfig, names: ShmNames, table: PointerTable) -> int:
    """The supervisor died and left its shared memory: stop its workers, save what the pool
    buffers hold into the files (as the next start would), unlink everything. Returns 1."""
    pid = table.get(layout.SUPERVISOR_PID)
    workers = _worker_pids(names, table)
    table.close()
    for worker in workers:
        os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pid_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    saved = salvage_crashed_run(names, config)
    removed = StoreShm.unlink_all(names)
    print(
        f"store {config.store_path_root_dir}: supervisor {pid} was not running; stopped {len(workers)} "
        f"worker(s), saved {saved} pool byte(s) into the commit log, removed {len(removed)} shared "
        f"object(s); the next start recovers the store"
    )
    return 1


def attach_table(config: MessageStoreConfig, conf: Path | None) -> tuple[ShmNames, PointerTable]:
    """The running store's pointer table. Not running: one line naming the store directory, the
    shm name and the conf file it came from (run from another directory, the default conf names
    another store), and how to name the right one."""
    names = ShmNames.for_store(config.store_path_root_dir, config.shm_name)
    try:
        return names, PointerTable.attach(names.pointer_table, Role.CONSUMER)
    except ShmAttachError as exc:
        settings = f"settings from {conf.resolve()}" if conf is not None else "default settings"
        raise StoreNotRunningError(
            f"no store running at {config.store_path_root_dir} (shm {names.base}; {settings}): "
            f"{exc}; --store DIR or --conf FILE names another store"
        ) from None


def stop(config: MessageStoreConfig, timeout_s: float = 60.0, conf: Path | None = None) -> int:
    """SIGTERM the store's supervisor and wait for it to finish its clean shutdown; if it is
    already dead, clean up what it left."""
    names, table = attach_table(config, conf)
    pid, start_ms = table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS)
    if not pid_alive(pid, start_ms):  # a pid another process took since is not our supervisor
        return clean_after_dead_supervisor(config, names, table)
    table.close()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:  # it died between the check and the signal
        return clean_after_dead_supervisor(
            config, names, PointerTable.attach(names.pointer_table, Role.CONSUMER)
        )
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid, start_ms):
        if time.monotonic() > deadline:
            print(f"run.py: supervisor {pid} still running after {timeout_s:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"stopped store {config.store_path_root_dir} (supervisor {pid})")
    return 0


def status(config: MessageStoreConfig, args: argparse.Namespace) -> int:
    _names, table = attach_table(config, args.conf)
    try:
        pid, start_ms = table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS)
    finally:
        table.close()
    if not pid_alive(pid, start_ms):
        print(
            f"run.py: store {config.store_path_root_dir}: supervisor {pid} is gone, its shared memory "
            f"remains; `run.py stop` cleans it up, `run.py start` recovers the store",
            file=sys.stderr,
        )
        return 1
    if args.watch:
        return watch(config, interval_s=args.interval, count=args.count)
    return print_status(config, as_json=args.json)


def one_line(exc: BaseException) -> str:
    """An expected error as one line: its message, or for an OSError the path and the reason."""
    if isinstance(exc, OSError) and not isinstance(exc, StoreError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        text = f"{where}: {exc.strerror}" if where and exc.strerror else str(exc)
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def log_files_only(level: int, message: str, *, with_traceback: bool = False) -> list[Path]:
    """Write one record to this process's log files, not to the console (which gets one line)."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    exc_info = sys.exc_info() if with_traceback else None
    record = logging.LogRecord("run.py", level, __file__, 0, message, None, exc_info)
    for handler in files:
        handler.handle(record)
    return [Path(h.baseFilename) for h in files]


def refused(exc: BaseException) -> int:
    """An expected error: one line on stderr (and in the log, if there is one); exit 2."""
    line = one_line(exc)
    log_files_only(logging.ERROR, f"refused: {line}")
    print(ERROR_PREFIX + line, file=sys.stderr)
    return EXIT_REFUSED


def internal_error() -> int:
    """An exception nobody expected: the traceback into the log file, one line on stderr."""
    exc_type, exc, _tb = sys.exc_info()
    files = log_files_only(logging.CRITICAL, "internal error", with_traceback=True)
    if not files:
        traceback.print_exc()
        return EXIT_INTERNAL
    print(
        f"run.py: internal error: {exc_type.__name__ if exc_type else '?'}: {one_line(exc) if exc else ''}; "
        f"traceback in {files[0]}",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", type=Path, default=DEFAULT_CONF, help="broker.conf to load")
    common.add_argument("--store", help="store directory (overrides storePathRootDir)")
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
        code = run_command(args)
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's final flush
        return code
    except StoreError as exc:
        return refused(exc)
    except BrokenPipeError:
        # The reader (`| head -1`) went away: stop quietly, and keep the interpreter's final
        # flush of stdout from failing again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        return refused(exc) if exc.filename is not None else internal_error()
    except KeyboardInterrupt:
        return 130
    except Exception:
        return internal_error()


def run_command(args: argparse.Namespace) -> int:
    """The subcommand ``args`` names; `main` turns what it raises into one line and an exit code."""
    config = MessageStoreConfig.from_file(args.conf)
    if args.store is not None:
        if not args.store.strip():  # Path("") is the current directory: start would make it a store
            raise InvalidArgumentError("--store is empty: name the store directory")
        config = config.replace(store_path_root_dir=str(Path(args.store).resolve()))
    if args.command == "demo" and args.messages < 1:
        raise InvalidArgumentError(f"--messages must be at least 1, got {args.messages}")
    if args.command == "start" and args.daemon:
        return start_daemon(args.conf, config)
    if args.command == "start":
        return start_foreground(config)
    if args.command == "stop":
        return stop(config, conf=args.conf)
    if args.command == "status":
        return status(config, args)
    return demo(args.conf, config, args.messages)


if __name__ == "__main__":
    sys.exit(main())
