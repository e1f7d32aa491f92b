"""rmq-mp entry point: the supervisor of a store, and a library demo.

rmq-mp start  [--conf conf/broker.conf] [--store DIR]   run the store (foreground)
rmq-mp stop   [--conf ...] [--store DIR]                stop it cleanly
rmq-mp status [--conf ...] [--store DIR] [--json|--watch] workers, offsets, pool, flags
rmq-mp reload [--conf ...] [--store DIR]                re-read broker.conf's live settings
rmq-mp demo   [--conf ...] [--store DIR] [--messages N] the store as a library

`rmq-mp` is the installed command (pyproject's [project.scripts]); `python run.py ...` in a
checkout is the same program, and every line it prints starts with the name it was called by.

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

from rmq_mp import file_modes
from rmq_mp.client.consumer import Consumer
from rmq_mp.config import live
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ConfigError, InvalidArgumentError, ShmAttachError, StoreError, StoreNotRunningError
from rmq_mp.logs import log_dir, setup_process_logging
from rmq_mp.paths import StorePaths
from rmq_mp.put.producer import Producer
from rmq_mp.store.running_store import live_settings
from rmq_mp.tools.status_report import collect_status, print_status
from rmq_mp.tools.watch import watch
from shm import layout
from shm.layout import Role
from shm.names import ShmNames
from shm.pointer_table import PointerTable, pid_alive
from shm.store_shm import read_descriptor
from workers.notify import SystemdNotifier
from workers.supervisor import Supervisor, end_dead_start, lock_findings

EXIT_REFUSED = 2
EXIT_INTERNAL = 3
PROG = "run.py"
"""The name this process was called by (`main` sets it): what its lines start with."""
CHECKOUT = Path(__file__).resolve().parents[1]
"""The source checkout (or site-packages, installed): conf/ and run.py are there in a checkout."""


def default_conf() -> Path:
    """The checkout's conf/broker.conf; installed without a checkout, ./conf/broker.conf."""
    checkout_conf = CHECKOUT / "conf" / "broker.conf"
    return checkout_conf if checkout_conf.exists() else Path("conf") / "broker.conf"


def supervisor_command(conf: Path, root: str) -> list[str]:
    """How demo and `start --daemon` run the supervisor: this module, named as this process was."""
    return [
        sys.executable,
        "-m",
        "workers.cli",
        "--prog",
        PROG,
        "start",
        "--conf",
        str(conf),
        "--store",
        root,
    ]


def supervisor_env() -> dict[str, str]:
    """The child's environment: in a checkout run as `python run.py` without an install, the
    checkout goes on its path so `-m workers.cli` finds this package."""
    env = dict(os.environ)
    if (CHECKOUT / "run.py").exists():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH")) if p)
    return env


def demo(conf: Path, config: MessageStoreConfig, count: int) -> int:
    """Start the store as a service, send ``count`` messages from this process, consume them with
    a long-polling consumer from its group's committed offsets and commit the new ones (a second
    demo consumes only its own messages), look one up by msgId, print the status, stop cleanly."""
    root = config.store_path_root_dir
    check_store_paths(config)  # a misplaced store is refused in one line before anything starts
    supervisor = subprocess.Popen(supervisor_command(conf, root), env=supervisor_env())
    try:
        if not wait_running(config, supervisor):
            if supervisor.poll() == EXIT_REFUSED:
                return EXIT_REFUSED  # the supervisor's one line is on stderr already
            print(f"{PROG}: the store did not start", file=sys.stderr)
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
    logs.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
    out_path = logs / "supervisor.out"
    with out_path.open("ab") as out:
        written_before = out.tell()
        process = subprocess.Popen(
            supervisor_command(conf, config.store_path_root_dir),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=supervisor_env(),
        )
    if not wait_running(config, process):
        code = process.poll()
        with out_path.open("rb") as out:
            out.seek(written_before)
            lines = out.read().decode("utf-8", "replace").splitlines()
        errors = [line for line in lines if line.startswith(f"{PROG}: ")]
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
        print(f"{PROG}: {note}")
    return 0


def did_not_start(code: int | None, lines: list[str], log: Path, out_path: Path) -> str:
    """The one line `start --daemon` prints when the supervisor neither ran nor refused with a
    line of its own: the last thing it wrote (the reason, when it gave one) and where the rest is."""
    said = next((line.strip() for line in reversed(lines) if line.strip()), "")
    if code is None:
        what = f"the store is still starting after 60 s (`{PROG} status` shows when it runs)"
    else:
        what = f"the store did not start (supervisor exit code {code})"
    return f"{PROG}: {what}{': ' + said if said else ''}; see {log} and {out_path}"


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


def start_foreground(
    config: MessageStoreConfig, reread: Callable[[], MessageStoreConfig] | None = None
) -> int:
    check_store_paths(config)
    setup_process_logging(config.store_path_root_dir, "supervisor")
    held = HeldConsole.install()
    systemd = SystemdNotifier.from_environment()  # before the workers start: they do not inherit it

    def running() -> None:
        if held is not None:
            held.hand_back(show=True)
        systemd.ready(f"running store {config.store_path_root_dir} as shm {supervisor.names.base}")

    try:
        supervisor = Supervisor(config)
        supervisor.reload_config = reread
        supervisor.on_reloading = systemd.reloading
        supervisor.on_reloaded = lambda: systemd.ready(
            f"running store {config.store_path_root_dir} (reloaded)"
        )
        say(f"starting store {config.store_path_root_dir} as shm {supervisor.names.base}")
        if note := config.root_dir_note:
            say(f"{PROG}: {note}")
        code = supervisor.run(on_running=running, on_stopping=systemd.stopping)
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


def clean_after_dead_supervisor(config: MessageStoreConfig, names: ShmNames) -> int:
    """The supervisor died and left its shared memory: end its start (`end_dead_start`: fence,
    stop its workers, save the pool, unlink), saying what it found. Returns 1."""
    found = end_dead_start(names, config, layout.FENCED_BY_STOP)
    print(f"store {config.store_path_root_dir}: {found}; the next start recovers the store")
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
        table.close()
        return clean_after_dead_supervisor(config, names)
    found = lock_findings(table)
    table.close()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:  # it died between the check and the signal
        return clean_after_dead_supervisor(config, names)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid, start_ms):
        if time.monotonic() > deadline:
            print(f"{PROG}: supervisor {pid} still running after {timeout_s:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(
        f"stopped store {config.store_path_root_dir} (supervisor {pid})"
        + (f"; found: {found}" if found else "")
    )
    return 0


def reload_store(config: MessageStoreConfig, conf: Path | None = None, timeout_s: float = 30.0) -> int:
    """SIGHUP the supervisor (what systemd's ExecReload sends) and wait until it has handled it.
    A changed key that needs a restart is refused here first, in one line, with nothing sent:
    the supervisor, re-reading the same broker.conf, would refuse it too."""
    names, table = attach_table(config, conf)
    try:
        pid = table.get(layout.SUPERVISOR_PID)
        done = table.get(layout.RELOADS_DONE)
        generation = table.get(layout.LIVE_SETTINGS_GENERATION)
        running = live_settings(
            MessageStoreConfig.from_properties(
                read_descriptor(names)["properties"], source=f"shm {names.base}"
            ),
            table,
        )
        changes, restart = live.reload_plan(running, config)
        if restart:
            raise ConfigError(
                f"reload refused, nothing applied: {'; '.join(restart)} changed (needs a restart)"
            )
        if not pid or not pid_alive(pid):
            print(f"{PROG}: store {config.store_path_root_dir}: supervisor {pid} is gone", file=sys.stderr)
            return 1
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while table.get(layout.RELOADS_DONE) == done:
            if time.monotonic() > deadline or not pid_alive(pid):
                print(
                    f"{PROG}: supervisor {pid} did not handle the reload in {timeout_s:.0f} s",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.02)
        applied = table.get(layout.LIVE_SETTINGS_GENERATION) != generation
    finally:
        table.close()
    log = log_dir(config.store_path_root_dir) / "supervisor.log"
    if applied:
        print(f"reloaded store {config.store_path_root_dir}: {live.describe(changes, running)}")
        return 0
    if changes:  # the supervisor's broker.conf is not the one this command read, or did not load
        raise ConfigError(f"reload refused by supervisor {pid}, nothing applied: see {log}")
    print(f"reloaded store {config.store_path_root_dir}: no setting changed")
    return 0


def status(config: MessageStoreConfig, args: argparse.Namespace) -> int:
    _names, table = attach_table(config, args.conf)
    try:
        pid, start_ms = table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS)
    finally:
        table.close()
    if not pid_alive(pid, start_ms):
        print(
            f"{PROG}: store {config.store_path_root_dir}: supervisor {pid} is gone, its shared memory "
            f"remains; `{PROG} stop` cleans it up, `{PROG} start` recovers the store",
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
    record = logging.LogRecord(PROG, level, __file__, 0, message, None, exc_info)
    for handler in files:
        handler.handle(record)
    return [Path(h.baseFilename) for h in files]


def refused(exc: BaseException) -> int:
    """An expected error: one line on stderr (and in the log, if there is one); exit 2."""
    line = one_line(exc)
    log_files_only(logging.ERROR, f"refused: {line}")
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return EXIT_REFUSED


def internal_error() -> int:
    """An exception nobody expected: the traceback into the log file, one line on stderr."""
    exc_type, exc, _tb = sys.exc_info()
    files = log_files_only(logging.CRITICAL, "internal error", with_traceback=True)
    if not files:
        traceback.print_exc()
        return EXIT_INTERNAL
    print(
        f"{PROG}: internal error: {exc_type.__name__ if exc_type else '?'}: {one_line(exc) if exc else ''}; "
        f"traceback in {files[0]}",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def main(argv: list[str] | None = None, prog: str = "run.py") -> int:
    """`python run.py ...` (``prog`` run.py) and the installed `rmq-mp ...` (`installed_main`)."""
    global PROG
    PROG = prog
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--prog", help=argparse.SUPPRESS)  # a child supervisor speaks as its parent
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", type=Path, default=default_conf(), help="broker.conf to load")
    common.add_argument("--store", help="store directory (overrides storePathRootDir)")
    sub = parser.add_subparsers(dest="command", required=True)
    start_parser = sub.add_parser(
        "start", parents=[common], help="run the store (foreground unless --daemon)"
    )
    start_parser.add_argument(
        "--daemon", action="store_true", help="run in the background; log to <store>/logs"
    )
    sub.add_parser("stop", parents=[common], help="stop a running store cleanly")
    sub.add_parser(
        "reload", parents=[common], help="re-read broker.conf and apply the settings that can change live"
    )
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
    PROG = args.prog or prog
    setup_process_logging(None, PROG)
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


def load_config(conf: Path, store: str | None) -> MessageStoreConfig:
    """broker.conf with --store applied: at every command, and again at each reload."""
    config = MessageStoreConfig.from_file(conf)
    if store is not None:
        if not store.strip():  # Path("") is the current directory: start would make it a store
            raise InvalidArgumentError("--store is empty: name the store directory")
        config = config.replace(store_path_root_dir=str(Path(store).resolve()))
    return config


def run_command(args: argparse.Namespace) -> int:
    """The subcommand ``args`` names; `main` turns what it raises into one line and an exit code."""
    config = load_config(args.conf, args.store)
    file_modes.apply(config.store_group_access)  # before anything of the store is created
    if args.command == "demo" and args.messages < 1:
        raise InvalidArgumentError(f"--messages must be at least 1, got {args.messages}")
    if args.command == "start" and args.daemon:
        return start_daemon(args.conf, config)
    if args.command == "start":
        conf, store = args.conf.resolve(), args.store
        return start_foreground(config, lambda: load_config(conf, store))
    if args.command == "reload":
        return reload_store(config, args.conf)
    if args.command == "stop":
        return stop(config, conf=args.conf)
    if args.command == "status":
        return status(config, args)
    return demo(args.conf, config, args.messages)


def installed_main() -> int:
    """The `rmq-mp` console command."""
    return main(prog="rmq-mp")


def bench_main() -> int:
    """The `rmq-bench` console command: bench/ ships with the checkout, not as an installed
    top-level package (a generic name in site-packages), so it runs from an editable install."""
    if not (CHECKOUT / "bench" / "__main__.py").is_file():
        print(
            f"rmq-bench: the benchmarks are in the source checkout's bench/, not installed with the "
            f"package ({CHECKOUT}): run `pip install -e .` in a checkout, or `python -m bench` there",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    from bench.__main__ import main as bench

    return bench()


if __name__ == "__main__":
    sys.exit(main())
