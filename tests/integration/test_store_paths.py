"""One line, never a traceback (issue 18, item 8).

A directory where a store file belongs or a file where a directory belongs, anywhere in the store;
a store root that is a file or lives under /proc; a brokerName RocketMQ could not hold: `run.py
start` (foreground and --daemon) prints one line on stderr and exits 2 without leaving a shared
segment behind, and `MessageStore.open` raises a typed error. Then the faults of a running store:
a config persist that fails keeps the supervisor alive, and a supervisor that died is cleaned up
by `run.py stop` and reported by `run.py status`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import loads
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ConfigError, StoreError
from rmq_mp.format import message as m
from rmq_mp.put.producer import Producer
from rmq_mp.store.message_store import MessageStore
from shm import layout
from shm.names import ShmNames
from tests.crash.test_fsync_failure import faulty_dir, fuse_unavailable  # noqa: F401 (a fixture)
from tests.service import (
    ROOT,
    RunningService,
    leftover_processes,
    poll_bodies,
    running_service,
    start_service,
    wait_until,
    write_conf,
)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store with every kind of path: commit log, queues, index, config/, logs/."""
    root = tmp_path_factory.mktemp("template") / "store"
    config = MessageStoreConfig.from_file(write_conf(root.parent / "t.conf", root))
    with MessageStore.open(config=config) as store:
        for i in range(20):
            message = m.Message(topic="T", body=b"x" * 100, queue_id=i % 2, properties={"KEYS": f"k{i}"})
            assert store.put_message(message).ok
    offsets = ConsumerOffsetManager(root / "config" / "consumerOffset.json")
    offsets.commit_offset("g", "T", 0, 3)
    offsets.persist()
    (root / "logs").mkdir()
    return root


def _dir(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.mkdir()
    (path / "inside").write_bytes(b"kept")


def _file(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    path.write_bytes(b"not a directory")


def _first(directory: Path) -> Path:
    return sorted(directory.iterdir())[0]


MISPLACED: dict[str, Callable[[Path], None]] = {
    "checkpoint is a directory": lambda r: _dir(r / "checkpoint"),
    "abort is a directory": lambda r: _dir(r / "abort"),
    "lock is a directory": lambda r: _dir(r / "lock"),
    "config is a file": lambda r: _file(r / "config"),
    "consumerOffset.json is a directory": lambda r: _dir(r / "config" / "consumerOffset.json"),
    "consumerOffset.json.bak is a directory": lambda r: _dir(r / "config" / "consumerOffset.json.bak"),
    "topics.json is a directory": lambda r: _dir(r / "config" / "topics.json"),
    "configChecksum.json is a directory": lambda r: _dir(r / "configChecksum.json"),
    "commitlog is a file": lambda r: _file(r / "commitlog"),
    "a commit-log file is a directory": lambda r: _dir(_first(r / "commitlog")),
    "consumequeue is a file": lambda r: _file(r / "consumequeue"),
    "a topic's queue directory is a file": lambda r: _file(r / "consumequeue" / "T"),
    "a queue's directory is a file": lambda r: _file(r / "consumequeue" / "T" / "0"),
    "index is a file": lambda r: _file(r / "index"),
    "an index file is a directory": lambda r: _dir(_first(r / "index")),
    "logs is a file": lambda r: _file(r / "logs"),
}


def run_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def assert_refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("run.py: error: ")
    assert "Traceback" not in result.stdout
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("mode", ["foreground", "daemon"])
@pytest.mark.parametrize("case", MISPLACED, ids=MISPLACED.keys())
def test_a_misplaced_path_is_one_line_and_exit_2(
    template: Path, tmp_path: Path, case: str, mode: str
) -> None:
    root = tmp_path / "store"
    shutil.copytree(template, root)
    MISPLACED[case](root)
    before = sorted((str(p), p.is_dir()) for p in root.rglob("*"))
    conf = write_conf(tmp_path / "store.conf", root)
    with pytest.raises(StoreError):
        MessageStore.open(config=MessageStoreConfig.from_file(conf))
    result = run_py("start", "--conf", str(conf), *(["--daemon"] if mode == "daemon" else []))
    assert_refused(result, str(root))
    assert ShmNames.for_store(str(root), "").leftovers() == []
    assert leftover_processes(ShmNames.for_store(str(root), "")) == []
    after = sorted((str(p), p.is_dir()) for p in root.rglob("*") if "logs" not in p.relative_to(root).parts)
    assert after == [entry for entry in before if "logs" not in Path(entry[0]).relative_to(root).parts]


@pytest.mark.parametrize("mode", ["foreground", "daemon"])
def test_a_store_root_that_is_a_file_or_under_proc(tmp_path: Path, mode: str) -> None:
    daemon = ["--daemon"] if mode == "daemon" else []
    a_file = tmp_path / "store"
    a_file.write_bytes(b"")
    for root, error, words in (
        (a_file, StoreError, "is a file"),
        (Path(f"/proc/rmq-mp-test-{os.getpid()}/store"), ConfigError, "proc pseudo-filesystem"),
    ):
        conf = write_conf(tmp_path / "store.conf", root)
        with pytest.raises(error, match=words):
            MessageStore.open(config=MessageStoreConfig.from_file(conf))
        assert_refused(run_py("start", "--conf", str(conf), *daemon), str(root), words)
        assert ShmNames.for_store(str(root), "").leftovers() == []
    assert a_file.read_bytes() == b""


@pytest.mark.parametrize("mode", ["foreground", "daemon"])
def test_an_oversized_broker_name_is_a_config_error(tmp_path: Path, mode: str) -> None:
    """RocketMQ's broker makes a topic of its name: 127 characters at most (TOPIC_MAX_LENGTH)."""
    assert MessageStoreConfig().replace(broker_name="b" * 127).broker_name == "b" * 127
    with pytest.raises(ConfigError, match="brokerName"):
        MessageStoreConfig().replace(broker_name="b" * 128)
    conf = write_conf(tmp_path / "store.conf", tmp_path / "store", brokerName="b" * 100_000)
    result = run_py("start", "--conf", str(conf), *(["--daemon"] if mode == "daemon" else []))
    assert_refused(result, "brokerName", "100000 characters")
    assert len(result.stderr) < 1000, "the value is not echoed whole"
    assert not (tmp_path / "store").exists()


# ------------------------------------------------------------------ a running store's faults


def persist_failures(service: RunningService) -> int:
    return service.read(layout.CONFIG_PERSIST_FAILURES)


def test_a_failing_config_persist_keeps_the_store_running(tmp_path: Path) -> None:
    """A directory in place of consumerOffset.json.tmp: every persist raises IsADirectoryError.
    Logged once, counted, the last good file kept, retried; at stop the failure is reported (exit
    1) and every shared object is still removed (running_service checks)."""
    with running_service(tmp_path, flushConsumerOffsetInterval="50") as service:
        path = service.root / "config" / "consumerOffset.json"
        log = service.root / "logs" / "supervisor.log"
        with Consumer.attach(service.root, "g") as consumer:
            consumer.commit({("T", 0): 1})
            wait_until(lambda: path.exists() and "T@g" in path.read_text(), 10, "the first persist")
            good = path.read_bytes()
            blocker = path.with_name("consumerOffset.json.tmp")
            blocker.mkdir()
            consumer.commit({("T", 0): 2})
            wait_until(lambda: persist_failures(service) >= 5, 10, "several failed persists")
            assert service.process.poll() is None, "the supervisor lives on"
            assert path.read_bytes() == good, "the last good file is kept"
            assert log.read_text().count("persist of") == 1, "logged once per distinct error"
            blocker.rmdir()
            wait_until(lambda: loads(path.read_text())["offsetTable"]["T@g"] == {0: 2}, 10, "the retry")
            # logged once the persist has returned: the file can be seen a moment before the line
            wait_until(lambda: "works again" in log.read_text(), 10, "the recovery logged")
            status = run_py("status", "--conf", str(service.conf), "--json")
            assert '"config_persist_failures"' in status.stdout
            blocker.mkdir()
            consumer.commit({("T", 0): 3})
        assert service.stop() == 1, "a stop that could not persist the offsets is not clean"
    assert "could not be persisted at stop" in log.read_text()
    assert loads(path.read_text())["offsetTable"]["T@g"] == {0: 2}


def test_stop_and_status_after_the_supervisor_died(tmp_path: Path) -> None:
    service = start_service(tmp_path, transientStorePoolEnable="true")
    with Producer.attach(service.root) as producer:
        assert producer.send("D", b"acknowledged before the crash").ok
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait(10)
    status = run_py("status", "--conf", str(service.conf))
    assert status.returncode == 1
    assert len(status.stderr.splitlines()) == 1
    assert f"supervisor {service.process.pid} is gone" in status.stderr
    stopped = run_py("stop", "--conf", str(service.conf))
    assert stopped.returncode == 1, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert f"supervisor {service.process.pid} was not running" in stopped.stdout
    assert service.names.leftovers() == []
    assert leftover_processes(service.names) == []
    not_running = run_py("stop", "--conf", str(service.conf))
    assert_refused(not_running)
    with running_service(tmp_path, transientStorePoolEnable="true") as again:
        with Consumer.attach(again.root, "g") as consumer:
            consumer.subscribe("D")
            got = poll_bodies(consumer, 1, 20, "the message")
        assert got == [b"acknowledged before the crash"]


@pytest.mark.skipif(bool(fuse_unavailable()), reason=fuse_unavailable() or "-")
def test_a_real_eio_in_a_config_persist_keeps_the_store_running(
    faulty_dir: tuple[Path, Path],  # noqa: F811 (the fixture imported above)
) -> None:
    """The store on a FUSE passthrough whose fsync returns EIO while the switch file exists."""
    mount, switch = faulty_dir
    with running_service(mount, flushConsumerOffsetInterval="50") as service:
        # Read what the store wrote through the backing directory: libfuse's high-level API
        # (faultfs) answers an open racing a rename with ENOENT, which a real file system never
        # does; the store itself only writes through the mount.
        path = switch.parent / service.root.relative_to(mount) / "config" / "consumerOffset.json"
        with Consumer.attach(service.root, "g") as consumer:
            consumer.commit({("T", 0): 1})
            wait_until(lambda: path.exists() and "T@g" in path.read_text(), 10, "the first persist")
            good = path.read_bytes()
            switch.write_bytes(b"")
            consumer.commit({("T", 0): 2})
            wait_until(lambda: persist_failures(service) >= 3, 10, "failed persists (EIO)")
            assert service.process.poll() is None
            assert path.read_bytes() == good
            log = (service.root / "logs" / "supervisor.log").read_text()
            assert "Input/output error" in log
            assert log.count("persist of") == 1
            switch.unlink()
            wait_until(lambda: loads(path.read_text())["offsetTable"]["T@g"] == {0: 2}, 10, "the retry")
