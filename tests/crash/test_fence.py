"""A store start is a fence (rmq_mp/put/fence.py): a supervisor killed while producers stay
attached, then what the README says to do, loses no acknowledged put (issue 29's minimal case).

The minimal case: a producer process sends in a loop; the supervisor gets SIGKILL; at once
`run.py stop` (armed beforehand, so it runs within milliseconds) then `run.py start`, or
`run.py start` alone. On the code before the fence, 3 of the 6 cases lost acknowledged puts
(async-pool stop+start: 3,070 of 14,030). The producer's sends after the fence
are refused naming it, its later sends go to the new start by themselves, and every PUT_OK it
ever got is in the files (an independent decoder) at its commit-log offset and queue offset,
with no queue offset served by two messages. Every flush mode, the pool on and off.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import loads
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put import native
from rmq_mp.put.fence import fence_start
from rmq_mp.put.producer import Producer
from shm import layout
from tests.integration.test_round_trip import independent_records
from tests.load import message_for
from tests.service import (
    ROOT,
    RunningService,
    acknowledged,
    drain_every_queue,
    json_lines,
    reference_put_path,
    running_service,
    start_producers,
    start_service,
    wait_processes_gone,
    wait_until,
)

MODES = {
    "sync": {"flushDiskType": "SYNC_FLUSH"},
    "async": {},
    "async-pool": {"transientStorePoolEnable": "true", "transientStorePoolSize": "3"},
}
ENDLESS = 10**9
"""A producer that sends until the test kills it."""


def run_py(service: RunningService, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), command, "--conf", str(service.conf)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def armed_run_py(service: RunningService, command: str) -> subprocess.Popen[str]:
    """`run.py <command>` imported and waiting for a line on stdin, so that it runs the moment
    the test says (no interpreter start between a kill and the operator's command)."""
    code = (
        "import sys, run\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        f"sys.exit(run.main([{command!r}, '--conf', {str(service.conf)!r}]))\n"
    )
    armed = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert armed.stdout is not None
    assert armed.stdout.readline() == "ready\n", armed.communicate(timeout=60)
    return armed


def kill_supervisor(service: RunningService) -> set[int]:
    """SIGKILL the supervisor (its workers stay, until they see it gone); returns their pids."""
    workers = {p.pid for p in psutil.Process(service.process.pid).children(recursive=True)}
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait(30)
    return workers


def stored_records(service: RunningService) -> dict[tuple[int, int], dict[str, Any]]:
    """(producer, seq) -> record, decoded from the files by the spec; each message at most once,
    and no (topic, queue, queue offset) held by two records."""
    records = independent_records(service.root / "commitlog", service.config.mapped_file_size_commit_log)
    stored: dict[tuple[int, int], dict[str, Any]] = {}
    slots: dict[tuple[str, int, int], tuple[int, int]] = {}
    for rec in records:
        props = dict(kv.split("\x01", 1) for kv in rec["props"].split("\x02")) if rec["props"] else {}
        slot = (rec["topic"], rec["queue_id"], rec["queue_offset"])
        key = (int(props["producer"]), int(props["seq"])) if "producer" in props else (-1, rec["phy"])
        assert slot not in slots, f"queue offset {slot} holds {slots[slot]} and {key}"
        slots[slot] = key
        if "producer" in props:  # a tests.load message
            assert key not in stored, f"{key} stored twice"
            stored[key] = rec
    return stored


def check_acknowledged(
    service: RunningService, acks: list[dict[str, Any]], producer: int = 0, expired_below: int = 0
) -> None:
    """Every PUT_OK of ``producer`` in the files of the stopped store, byte for byte, where its
    result said; one stored below ``expired_below`` may be gone (the cleaner deleted its file)."""
    stored = stored_records(service)
    ok = [a for a in acks if a["status"] == "PUT_OK"]
    missing = [a["seq"] for a in ok if (producer, a["seq"]) not in stored and a["phy"] >= expired_below]
    assert not missing, f"{len(missing)} of {len(ok)} acknowledged messages lost, e.g. {missing[:5]}"
    for a in ok:
        rec = stored.get((producer, a["seq"]))
        if rec is None:
            continue  # expired
        topic, queue_id, body = message_for(producer, a["seq"])
        assert (rec["topic"], rec["queue_id"], rec["body"]) == (topic, queue_id, body), a
        assert (rec["phy"], rec["queue_offset"]) == (a["phy"], a["queue_offset"]), a


@pytest.mark.parametrize("restart", ["stop-start", "start"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_supervisor_killed_with_a_producer_attached(tmp_path: Path, mode: str, restart: str) -> None:
    service = start_service(tmp_path, **MODES[mode])
    (loader,), (out,) = start_producers(service, tmp_path, [ENDLESS])
    try:
        wait_until(lambda: len(acknowledged(out)) > 300, 60, "the producer under way")
        stop = armed_run_py(service, "stop") if restart == "stop-start" else None
        workers = kill_supervisor(service)
        if stop is not None:
            out_text, err_text = stop.communicate("go\n", timeout=120)
            stopped = subprocess.CompletedProcess(stop.args, stop.returncode, out_text, err_text)
            assert stopped.returncode == 1, stopped.stdout + stopped.stderr
            assert "was not running" in stopped.stdout
            assert "fenced at write position" in stopped.stdout
            assert service.names.leftovers() == []
        service = start_service(tmp_path, **MODES[mode])
        wait_processes_gone(workers)
        before = len(acknowledged(out))
        # The producer goes on by itself on the new start: new PUT_OKs after the refusals.
        wait_until(
            lambda: any(a["status"] == "PUT_OK" for a in acknowledged(out)[before:]),
            60,
            "the producer's sends acknowledged by the new start",
        )
    finally:
        loader.kill()
        loader.wait(30)
    acks = acknowledged(out)
    refused = [a for a in acks if a["status"] != "PUT_OK"]
    assert all(
        a["status"] in ("SERVICE_NOT_AVAILABLE", "FLUSH_DISK_TIMEOUT", "OS_PAGECACHE_BUSY") for a in refused
    ), {a["status"] for a in refused}
    assert refused, "the producer's sends between the fence and the new start are refused"
    fenced_by = "run.py stop" if restart == "stop-start" else "a start over its dead supervisor"
    for a in refused:
        if a["status"] == "SERVICE_NOT_AVAILABLE":
            assert f"fenced by {fenced_by}" in a["reason"] or "supervisor is dead" in a["reason"], a
    assert service.stop() == 0, service.log.read_text()
    check_acknowledged(service, acks)
    stored = len(stored_records(service))
    with running_service(tmp_path, **MODES[mode]) as again, Consumer.attach(again.root, "verify") as consumer:
        assert drain_every_queue(consumer) == stored  # every queue contiguous from 0


@pytest.mark.parametrize("path", ["native", "reference"])
def test_a_fenced_start_takes_no_put(tmp_path: Path, path: str) -> None:
    """Once fenced, `send`, `send_batch` and the compiled send are refused naming the fence (no
    syscall needed: the word is read under the lock), and nothing more is written."""
    if path == "native" and native.core is None:
        pytest.skip(f"no compiled core: {native.why_reference}")
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        if path == "reference":
            reference_put_path(producer)
        assert producer.send("F", b"before", queue_id=0).ok
        sent_natively = producer._native.sent if producer._native is not None else 0
        fenced = fence_start(service.names.base, layout.FENCED_BY_STOP)
        assert fenced is not None
        assert (fenced.already, fenced.taken_over) == (False, 0)
        wrote = service.read(layout.WROTE_POSITION)
        assert fenced.wrote_position == wrote
        for result in (
            producer.send("F", b"after", queue_id=0),
            *producer.send_batch([{"topic": "F", "body": b"batch", "queue_id": 0}]),
        ):
            assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, result
            assert "fenced by run.py stop" in result.reason, result.reason
        assert service.read(layout.WROTE_POSITION) == wrote
        if producer._native is not None:
            assert producer._native.sent == sent_natively
        assert service.read(layout.FENCE) == layout.FENCED_BY_STOP
        assert service.read(layout.FENCE_PID) == os.getpid()
        again = fence_start(service.names.base, layout.FENCED_BY_START)
        assert again is not None
        assert again.already
        assert service.read(layout.FENCE) == layout.FENCED_BY_STOP  # the first fencer's word stays


def _stopped_holder(service: RunningService) -> subprocess.Popen[bytes]:
    """A producer process stopped (SIGSTOP, by the core's pause hook) holding the put lock, its
    journal written: a producer mid-put."""
    code = (
        "from rmq_mp.put.producer import Producer\n"
        "from rmq_mp.put import _core\n"
        f"p = Producer.attach({service.names.base!r})\n"
        "assert p.send('K', b'acked', queue_id=0).ok\n"
        "_core._set_pause(2)\n"  # PAUSE_JOURNALLED
        "p.send('K', b'victim' * 30, queue_id=0)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    wait_until(
        lambda: holder.poll() is not None or psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED,
        30,
        "the holder to stop inside its put",
    )
    assert holder.poll() is None, f"the holder exited with {holder.returncode}"
    return holder


@pytest.mark.skipif(native.core is None, reason=f"no compiled core: {native.why_reference}")
def test_stop_refuses_while_a_live_producer_is_mid_put_and_takes_a_dead_ones_lock_over(
    tmp_path: Path,
) -> None:
    """`run.py stop` of a dead supervisor's start whose put lock a live producer holds (stopped
    mid-put) refuses, naming its pid, and leaves everything as it was; once that producer is
    killed, the stop takes its lock over, undoes its half-done put and fences."""
    service = start_service(tmp_path, **MODES["async-pool"])
    holder = _stopped_holder(service)
    try:
        assert layout.lock_owner(service.read(layout.PUT_LOCK_OWNER_PID)) == holder.pid
        kill_supervisor(service)
        refused = run_py(service, "stop")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"producer pid {holder.pid} holds the put lock" in refused.stderr
        assert service.names.leftovers() != [], "a refused stop removes nothing"
        assert service.read(layout.FENCE) == layout.FENCE_OPEN
    finally:
        holder.kill()
        holder.wait(30)
    stopped = run_py(service, "stop")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "put lock taken over from a dead producer (1)" in stopped.stdout, stopped.stdout
    assert service.names.leftovers() == []
    with (
        running_service(tmp_path, **MODES["async-pool"]) as again,
        Consumer.attach(again.root, "g") as consumer,
    ):
        assert [m.body for m in consumer.pull("K", 0, 0, 10, timeout_s=5).messages] == [b"acked"]


def test_a_killed_supervisors_workers_are_gone_before_the_new_start_recovers(tmp_path: Path) -> None:
    """`run.py start` right after the supervisor's SIGKILL, with no stop: the old start's
    workers (which would otherwise write on until they see the heartbeat stale) are killed and
    gone before recovery reads a file, and the supervisor's log says what it found."""
    service = start_service(tmp_path, **MODES["async-pool"])
    with Producer.attach(service.root) as producer:
        assert producer.send("K", b"acked", queue_id=0).ok
        workers = kill_supervisor(service)
        again = start_service(tmp_path, **MODES["async-pool"])
        try:
            assert not any(psutil.pid_exists(w) and psutil.Process(w).status() != "zombie" for w in workers)
            text = again.supervisor_log()
            assert "a crashed run's shared memory" in text, text
            assert "fenced at write position" in text, text
            refused = producer.send("K", b"fenced or on the new start", queue_id=0)
            assert refused.ok or "fenced by a start over" in refused.reason, refused
        finally:
            with contextlib.suppress(Exception):
                producer.close()
            assert again.stop() == 0, again.log.read_text()


TEXT_PRODUCER = (
    "import json, sys\n"
    "from rmq_mp.put.producer import Producer\n"
    "with Producer.attach(sys.argv[1]) as p, open(sys.argv[2], 'w') as f:\n"
    "    n = 0\n"
    "    while True:\n"
    "        topic = ('GroupT', 'PushT')[n % 2]\n"
    "        r = p.send(topic, f'{topic}-{n}'.encode())\n"
    "        f.write(json.dumps({'t': topic, 'n': n, 's': r.status.name, 'q': r.queue_id,\n"
    "                            'o': r.queue_offset, 'phy': r.commit_log_offset}) + '\\n')\n"
    "        f.flush()\n"
    "        n += 1\n"
)
"""Sends text messages (the consumers decode bodies) to GroupT and PushT until killed."""


def _text_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.skipif(
    native.core is None,
    reason="the reference's fence is test_supervisor_killed_with_a_producer_attached's (the consumers here "
    "are the same on both paths; this file's second pass stays within CI's time)",
)
@pytest.mark.parametrize("restart", ["stop-start", "start"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_supervisor_killed_with_every_kind_of_client_attached(
    tmp_path: Path, mode: str, restart: str
) -> None:
    """Issue 29 point 5: producers, a consumer-group member and a push consumer stay attached
    and keep working across a supervisor's SIGKILL and an immediate stop+start (or a start
    alone). Afterwards every PUT_OK is in the files where its result said, every message a
    consumer read is the one stored at that queue offset (no offset served one message and
    later another), the group's committed offsets lie within its queues, and both consumers
    went on reading on the new start."""
    service = start_service(tmp_path, **MODES[mode])
    (loader,), (load_out,) = start_producers(service, tmp_path, [ENDLESS], batch=4)
    text_out, group_out, push_out, stop_file = (
        tmp_path / "text.jsonl",
        tmp_path / "group.jsonl",
        tmp_path / "push.txt",
        tmp_path / "stop",
    )
    base = service.names.base
    clients = [
        subprocess.Popen([sys.executable, "-c", TEXT_PRODUCER, base, str(text_out)], cwd=ROOT),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.group_member",
                base,
                "m1",
                "c1",
                str(group_out),
                str(stop_file),
                "--topic",
                "GroupT",
                "--interval-ms",
                "200",
                "--across-restarts",
            ],
            cwd=ROOT,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "tests.push_member", base, "pushers", "PushT", str(push_out)], cwd=ROOT
        ),
    ]
    text_producer, member, pusher = clients
    try:
        wait_until(
            lambda: (
                len(acknowledged(load_out)) > 200
                and any(e["e"] == "read" for e in json_lines(group_out))
                and len(_text_lines(push_out)) > 10
            ),
            90,
            "producers, the group member and the push consumer at work",
        )
        stop = armed_run_py(service, "stop") if restart == "stop-start" else None
        workers = kill_supervisor(service)
        if stop is not None:
            out_text, err_text = stop.communicate("go\n", timeout=120)
            assert stop.returncode == 1, out_text + err_text
        service = start_service(tmp_path, **MODES[mode])
        wait_processes_gone(workers)
        marks = (len(json_lines(text_out)), len(json_lines(group_out)), len(_text_lines(push_out)))
        behind = ["the producer", "the group member", "the push consumer"]

        def every_client_at_work() -> bool:
            at_work = (
                any(a["s"] == "PUT_OK" for a in json_lines(text_out)[marks[0] :]),
                any(e["e"] == "read" for e in json_lines(group_out)[marks[1] :]),
                len(_text_lines(push_out)) > marks[2],
            )
            behind[:] = [
                who
                for who, ok in zip(
                    ("the producer", "the group member", "the push consumer"), at_work, strict=True
                )
                if not ok
            ]
            return all(at_work)

        try:
            wait_until(every_client_at_work, 90, "every client at work on the new start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: not yet {behind}") from None
    finally:
        for proc in (loader, text_producer):
            proc.kill()
        stop_file.touch()
        for proc in (member, pusher):
            proc.send_signal(signal.SIGTERM)
        for proc in (loader, *clients):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert service.stop() == 0, service.log.read_text()
    check_acknowledged(service, acknowledged(load_out))
    records = independent_records(service.root / "commitlog", service.config.mapped_file_size_commit_log)
    by_slot = {(r["topic"], r["queue_id"], r["queue_offset"]): r for r in records}
    for a in json_lines(text_out):
        if a["s"] == "PUT_OK":
            rec = by_slot.get((a["t"], a["q"], a["o"]))
            assert rec is not None, f"acknowledged {a} lost"
            assert (rec["body"], rec["phy"]) == (f"{a['t']}-{a['n']}".encode(), a["phy"]), a
    for e in json_lines(group_out):
        if e["e"] == "read":
            rec = by_slot.get(("GroupT", e["q"], e["o"]))
            assert rec is not None, f"read {e}, not stored"
            assert rec["body"].decode() == e["b"], f"read {e}, stored {rec}"
    pushed = {r["body"].decode() for r in records if r["topic"] == "PushT"}
    assert set(_text_lines(push_out)) <= pushed, "the push consumer consumed only stored messages"
    ends: dict[int, int] = {}
    for topic, queue_id, offset in by_slot:
        if topic == "GroupT":
            ends[queue_id] = max(ends.get(queue_id, 0), offset + 1)
    offsets = loads((service.root / "config" / "consumerOffset.json").read_text())["offsetTable"]
    committed = offsets.get("GroupT@m1", {})
    assert committed, "the group committed"
    for queue_id, offset in committed.items():
        assert 0 <= offset <= ends.get(int(queue_id), 0), (queue_id, offset, ends)
