"""Store files are as private as the shared memory (issue 35): every directory 0700, every file
and shared object 0600 by default, whichever process made it and when (supervisor, allocator,
reput's queues and index, cleaner, scheduler, config/*.json, logs, lock, abort, checkpoint);
`storeGroupAccess` opens files and shared memory alike to the group; a store already more open
is named at start and by `run.py status`, and still starts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from rmq_mp.client.consumer import Consumer, MessageModel
from rmq_mp.put.producer import Producer
from shm import layout
from tests.integration.test_cleaner import ALWAYS, CLEANER, age_files, write_files
from tests.service import ROOT, RunningService, running_service, wait_until


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself included) → its permission bits."""
    found = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            found[str(path.relative_to(root))] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def wrong_modes(root: Path, dir_mode: int, file_mode: int) -> dict[str, str]:
    wrong = {}
    for rel, mode in modes(root).items():
        want = dir_mode if (root / rel).is_dir() else file_mode
        if mode != want:
            wrong[rel] = f"{mode:04o}, want {want:04o}"
    return wrong


def shm_modes(service: RunningService) -> dict[str, int]:
    return {e: stat.S_IMODE(os.stat(f"/dev/shm/{e}").st_mode) for e in service.names.leftovers()}


def worker_umasks(service: RunningService) -> dict[str, str]:
    """The umask of the supervisor and each worker (a file a worker writes with no mode gets it)."""
    pids = {"supervisor": service.process.pid}
    pids |= {r: service.worker_pid(r) for r in ("allocator", "flusher", "reput", "cleaner", "scheduler")}
    umasks = {}
    for role, pid in pids.items():
        status = Path(f"/proc/{pid}/status").read_text()
        umasks[role] = next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:"))
    return umasks


def test_every_file_of_a_store_that_ran_every_feature_is_owner_only(tmp_path: Path) -> None:
    """Files rolled by the allocator, queues and index by reput, a delayed message delivered by
    the scheduler, files deleted by the cleaner, offsets committed and persisted (a broadcasting
    member's by its own process, whose umask is the user's), a clean stop:
    all 0700/0600, and so is every shared object; each process's umask is 077, so a file written
    with no explicit mode (or by a worker added later) is private too."""
    old_umask = os.umask(0o022)  # the test's own (a usual shell's): the store must not depend on it
    try:
        settings = CLEANER | {"deleteWhen": ALWAYS, "messageDelayLevel": "1s"}
        with (
            running_service(tmp_path, **settings) as service,
            Producer.attach(service.root) as producer,
            Consumer.attach(service.root, "g") as consumer,
        ):
            assert producer.send("Late", b"later", properties={"DELAY": "1"}, queue_id=0).ok
            wait_until(lambda: bool(consumer.pull("Late", 0, 0, timeout_s=0.2).messages), 30, "delivery")
            consumer.commit({("Late", 0): 1})
            with Consumer.attach(
                service.root, "b", message_model=MessageModel.BROADCASTING, client_id="own"
            ) as broadcasting:  # its progress is written by this process, under the test's umask
                broadcasting.subscribe("Late")
                wait_until(lambda: bool(broadcasting.poll(timeout_s=0.2)), 30, "broadcast read")
                broadcasting.commit()
            write_files(service, producer, 4)
            age_files(service, 0, 2)
            size = service.config.mapped_file_size_commit_log
            wait_until(lambda: service.read(layout.MIN_OFFSET) >= 2 * size, 30, "expired files deleted")
            assert worker_umasks(service) == dict.fromkeys(
                ("supervisor", "allocator", "flusher", "reput", "cleaner", "scheduler"), "0077"
            )
            shared = shm_modes(service)
            assert shared, "no shared objects found"
            assert set(shared.values()) == {0o600}, shared
            running = wrong_modes(service.root, 0o700, 0o600)
            assert running == {}, running
        kinds = set(modes(service.root))
        for expected in ("commitlog", "consumequeue", "index", "config", "logs", "checkpoint", "lock"):
            assert expected in kinds
        assert any(k.startswith("config/consumerOffset.json") for k in kinds)
        assert any(k.startswith("config/delayOffset.json") for k in kinds)
        assert "broadcastOffsets/own/b/offsets.json" in kinds
        assert any(k.startswith("consumequeue/SCHEDULE_TOPIC_XXXX/") for k in kinds)
        assert any(k.startswith("index/") and k != "index" for k in kinds)
        stopped = wrong_modes(service.root, 0o700, 0o600)
        assert stopped == {}, stopped
    finally:
        os.umask(old_umask)


def test_group_access_read_opens_files_and_shared_memory_to_the_group(tmp_path: Path) -> None:
    with running_service(tmp_path, storeGroupAccess="read") as service:
        with Producer.attach(service.root) as producer:
            assert producer.send("T", b"x", keys="k").ok
            wait_until(lambda: service.read(layout.REPUT_FROM_OFFSET) > 0, 20, "dispatched")
        shared = shm_modes(service)
        assert shared, "no shared objects found"
        assert set(shared.values()) == {0o640}, shared
        assert set(worker_umasks(service).values()) == {"0027"}
        wrong = wrong_modes(service.root, 0o750, 0o640)
        assert wrong == {}, wrong


def test_a_store_more_open_than_configured_is_named_at_start_and_by_status(tmp_path: Path) -> None:
    """A store written before (0644 files, a 0755 root) starts, with one log line naming the count
    and examples; `run.py status` says the same; nothing is changed."""
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        assert producer.send("T", b"x").ok
    os.chmod(service.root, 0o755)
    first = service.root / "commitlog" / f"{0:020d}"
    os.chmod(first, 0o644)
    with running_service(tmp_path) as service:
        log = (service.root / "logs" / "supervisor.log").read_text()
        lines = [line for line in log.splitlines() if "more open than storeGroupAccess=none" in line]
        assert len(lines) == 1, lines
        assert "2 store file(s)" in lines[0], lines
        assert "commitlog/" in lines[0], lines
        status = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "status", "--conf", str(service.conf)],
            capture_output=True, text=True, cwd=ROOT, check=True,
        )  # fmt: skip
        assert "2 store file(s) more open than storeGroupAccess=none" in status.stdout, status.stdout
        as_json = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "status", "--json", "--conf", str(service.conf)],
            capture_output=True, text=True, cwd=ROOT, check=True,
        )  # fmt: skip
        files = json.loads(as_json.stdout)["files"]
        assert files["store_group_access"] == "none"
        assert files["looser"].startswith("2 store file(s)")
        assert stat.S_IMODE(os.stat(first).st_mode) == 0o644, "reported, not changed"
