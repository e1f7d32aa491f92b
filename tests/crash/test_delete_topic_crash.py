"""kill -9 inside rmq-admin deleteTopic: the supervisor at each step of its half of the delete
(workers/topic_delete.py: before it begins, once the tombstone is written, once the queue
offsets are reset, once the group offsets and topics.json entry are gone), and reput between
removing the old queue files and resetting the queue table. A supervisor killed mid-delete is
finished by the next start; a reput killed mid-delete by the reput the supervisor restarts.
Either way the topic is gone with its offsets and config, every other topic is whole, and a
send to the same name starts again at queue offset 0, also after one more clean restart."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from rmq_mp.config.deleted_topics import DONE
from rmq_mp.tools.admin import main
from shm import layout
from tests.integration.test_delete_topic import (
    DEL,
    SETTINGS,
    assert_deleted,
    dispatched,
    fill,
    persisted_offsets,
    send,
    tombstone_state,
    topics_json,
)
from tests.service import running_service, start_service, wait_processes_gone, wait_until

SUPERVISOR_STEPS = ["begin", "tombstone", "queues", "config"]


def check_finished(tmp_path: Path) -> None:
    with running_service(tmp_path, **SETTINGS) as service:
        assert_deleted(service)
        assert DEL not in topics_json(service.root)
        assert f"{DEL}@G" not in persisted_offsets(service.root)
        assert tombstone_state(service.root) == DONE
        assert send(service.names.base, DEL, ["new0", "new1"]) == [0, 0]
        dispatched(service, DEL, 2)
        assert_deleted(service, ("new0", "new1"))
    with running_service(tmp_path, **SETTINGS) as service:
        assert_deleted(service, ("new0", "new1"))


@pytest.mark.parametrize("step", SUPERVISOR_STEPS)
def test_supervisor_killed_inside_a_delete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    monkeypatch.setenv("RMQ_CRASH_AT", f"deleteTopic:{step}")
    service = start_service(tmp_path, **SETTINGS)
    monkeypatch.delenv("RMQ_CRASH_AT")
    fill(service)
    workers = [p.pid for p in psutil.Process(service.process.pid).children(recursive=True)]
    code = main(["deleteTopic", "-n", service.names.base, "-t", DEL])
    assert code == 2
    assert "next start" in capsys.readouterr().err
    assert service.process.wait(30) == -9
    wait_processes_gone(workers)
    check_finished(tmp_path)


def test_reput_killed_inside_a_delete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RMQ_CRASH_AT", "deleteTopic:reput")
    monkeypatch.setenv("RMQ_CRASH_ONCE", str(tmp_path / "reput-killed"))
    with running_service(tmp_path, **SETTINGS) as service:
        fill(service)
        reput = service.worker_pid("reput")
        code = main(["deleteTopic", "-n", service.names.base, "-t", DEL])
        assert code == 0, capsys.readouterr().err
        assert (tmp_path / "reput-killed").exists()
        assert service.worker_pid("reput") != reput  # it died inside the delete and was restarted
        assert not psutil.pid_exists(reput)
        assert_deleted(service)
        # QUEUE_RESETS was odd when it died; the restarted reput's first pass makes it even, or
        # the cleaner would never clean a queue again
        wait_until(lambda: service.read(layout.QUEUE_RESETS) % 2 == 0, 30, "queue resets even")
        assert service.read(layout.QUEUE_RESETS) > 0
        assert tombstone_state(service.root) == DONE
    check_finished(tmp_path)
