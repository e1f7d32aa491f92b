"""Operator experience against real running stores: every rmq-admin subcommand in both output
forms, the Prometheus endpoint under real traffic, per-process logs, `status --watch`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendBatchResult
from rmq_mp.put.routing import TOPICS_RECHECK_S
from rmq_mp.tools.admin import main
from shm import layout
from tests.service import (
    ROOT,
    RunningService,
    acknowledged,
    running_service,
    start_producers,
    wait_until,
)


def admin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def fill(service: RunningService, count: int = 40) -> SendBatchResult:
    """``count`` messages to topic Orders (keys order-<i>), and group g1 consuming 10 of them."""
    with Producer.attach(service.names.base) as producer:
        results = producer.send_batch(
            dict(topic="Orders", body=f"order {i}".encode(), tags="TagA", keys=[f"order-{i}"])
            for i in range(count)
        )
    assert all(r.ok for r in results)
    wait_until(
        lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION), 30, "dispatch"
    )
    with Consumer.attach(service.names.base, "g1") as consumer:
        consumer.subscribe("Orders")
        assert len(consumer.poll(timeout_s=5, max_msgs=10)) == 10
        consumer.commit()
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_subcommand_against_a_running_store_both_forms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_service(tmp_path) as service:
        results = fill(service)
        name = ["--name", service.names.base]

        code, out, _ = admin(capsys, "topicList", *name)
        assert code == 0
        assert re.search(r"^Orders\s+8\s", out, re.M), out
        code, out, _ = admin(capsys, "topicList", *name, "--json")
        assert (
            json_lines(out)
            == [
                {
                    "topic": "Orders",
                    "queues": 8,
                    "readQueueNums": None,
                    "writeQueueNums": None,
                    "perm": None,
                    "messages": 40,
                }
            ]
            or json_lines(out)[0]["readQueueNums"] == 8
        )  # the supervisor may have persisted topics.json

        code, out, _ = admin(capsys, "topicStatus", *name, "--topic", "Orders", "--json")
        rows = json_lines(out)
        assert [r["queueId"] for r in rows] == list(range(8))
        assert sum(r["maxOffset"] for r in rows) == 40
        code, out, _ = admin(capsys, "topicStatus", *name)
        assert "MaxOffset" in out.splitlines()[0]

        code, out, _ = admin(
            capsys, "updateTopic", *name, "--topic", "Orders", "-r", "16", "-w", "12", "--json"
        )
        assert code == 0
        assert json_lines(out)[0] | {"created": None} == {
            "topic": "Orders", "readQueueNums": 16, "writeQueueNums": 12, "perm": 6, "created": None, "changed": True,
        }  # fmt: skip
        code, out, _ = admin(capsys, "updateTopic", *name, "--topic", "Payments", "-r", "4", "-w", "4")
        assert re.search(r"^Payments\s+4\s+4\s+6\s+True\s+True", out, re.M), out
        code, out, _ = admin(capsys, "topicList", *name, "--json")
        listed = {r["topic"]: r for r in json_lines(out)}
        assert (listed["Orders"]["readQueueNums"], listed["Orders"]["writeQueueNums"]) == (16, 12)
        assert listed["Payments"]["queues"] == 0

        first = results[0]
        code, out, _ = admin(capsys, "queryMsgById", *name, "--id", first.msg_id, "--json")
        assert json_lines(out)[0]["keys"] == "order-0"
        code, out, _ = admin(capsys, "queryMsgById", *name, "--id", first.msg_id)
        assert "'order 0'" in out
        code, out, _ = admin(
            capsys, "queryMsgByKey", *name, "--topic", "Orders", "--key", "order-7", "--json"
        )
        assert [m["body"] for m in json_lines(out)] == [b"order 7".hex()]
        code, out, _ = admin(capsys, "queryMsgByKey", *name, "--topic", "Orders", "--key", "order-7")
        assert "1 message(s)" in out
        offset_args = [
            "--topic",
            "Orders",
            "--queue",
            str(first.queue_id),
            "--offset",
            str(first.queue_offset),
        ]
        code, out, _ = admin(capsys, "queryMsgByOffset", *name, *offset_args, "--json")
        assert json_lines(out)[0]["msgId"] == first.msg_id
        code, out, _ = admin(capsys, "queryMsgByOffset", *name, *offset_args)
        assert out.splitlines()[0].split() == ["status:", "FOUND"]

        code, out, _ = admin(capsys, "printMsg", *name, "--json")
        printed = json_lines(out)
        assert len(printed) == 40
        middle = printed[20]["storeTimestamp"]
        code, out, err = admin(capsys, "printMsg", *name, "--begin", str(middle), "--end", str(middle))
        assert code == 0
        assert err == ""  # no progress bar without a terminal
        assert f"{sum(m['storeTimestamp'] == middle for m in printed)} message(s)" in out

        code, out, _ = admin(capsys, "consumerProgress", *name, "--json")
        progress = json_lines(out)
        assert {(r["group"], r["topic"]) for r in progress} == {("g1", "Orders")}
        assert sum(r["diff"] for r in progress) == 30
        assert all(r["brokerOffset"] == 5 for r in progress)
        code, out, _ = admin(capsys, "consumerProgress", *name, "--group", "g1")
        assert "Diff Total: 30" in out

        code, out, _ = admin(
            capsys,
            "resetOffsetByTime",
            *name,
            "--group",
            "g1",
            "--topic",
            "Orders",
            "--timestamp",
            "0",
            "--json",
        )
        assert code == 0
        assert {r["newOffset"] for r in json_lines(out)} == {0}
        code, out, _ = admin(capsys, "consumerProgress", *name, "--group", "g1")
        assert "Diff Total: 40" in out
        code, out, _ = admin(capsys, "resetOffsetByTime", *name, "-g", "g1", "-t", "Orders", "-s", "now")
        assert "reset to 20" in out

        code, out, _ = admin(capsys, "storeStatus", *name, "--json")
        status = json_lines(out)[0]
        assert status["state"] == "RUNNING"
        assert status["offsets"]["wrote"] == service.read(layout.WROTE_POSITION)
        assert set(status["flush_progress"]) >= {"commitlog_behind_flush_bytes", "dispatch_behind_bytes"}
        assert status["tables"]["maxConsumeQueueNum"]["capacity"] == 65536
        assert status["tables"]["maxConsumeQueueNum"]["used"] >= 1
        code, out, _ = admin(capsys, "storeStatus", *name)
        assert "flush progress:" in out
        assert "running flags:" in out
        assert re.search(r"maxConsumerOffsetNum [1-9][0-9]*/65,536", out)

        code, out, _ = admin(
            capsys, "sendMessage", *name, "--topic", "Quick", "--body", "hi", "--count", "2", "--json"
        )
        assert [r["status"] for r in json_lines(out)] == ["PUT_OK", "PUT_OK"]
        code, out, _ = admin(capsys, "sendMessage", *name, "--topic", "Quick", "--body", "hi")
        assert "PUT_OK" in out
        code, out, _ = admin(capsys, "consumeMessage", *name, "--topic", "Quick", "--group", "q", "--json")
        assert [bytes.fromhex(m["body"]) for m in json_lines(out)] == [b"hi"] * 3
        code, out, _ = admin(
            capsys, "consumeMessage", *name, "--topic", "Quick", "--group", "q", "--timeout", "0.2"
        )
        assert "0 message(s)" in out  # committed: the group starts after what it read

        # changes through --store are refused while the store runs, naming the way that works
        store = ["--store", str(service.root), "--conf", str(service.conf)]
        code, _, err = admin(capsys, "updateTopic", *store, "--topic", "Orders", "-r", "2")
        assert code == 2
        assert (
            f"store is running (supervisor pid {service.process.pid}): use --name {service.names.base}" in err
        )

    # the stopped store: the same commands from the files
    store = ["--store", str(service.root), "--conf", str(service.conf)]
    code, out, _ = admin(capsys, "topicList", *store, "--json")
    listed = {r["topic"]: r for r in json_lines(out)}
    assert (listed["Orders"]["readQueueNums"], listed["Payments"]["writeQueueNums"]) == (16, 4)
    code, out, _ = admin(capsys, "storeStatus", *store, "--json")
    offline = json_lines(out)[0]
    assert offline["state"] == "NOT RUNNING"
    assert offline["last_exit"] == "normal"
    code, out, _ = admin(capsys, "storeStatus", *store)
    assert "last exit:" in out
    code, out, _ = admin(capsys, "resetOffsetByTime", *store, "-g", "g1", "-t", "Orders", "-s", "0")
    assert code == 0
    code, out, _ = admin(capsys, "consumerProgress", *store, "--group", "g1", "--json")
    assert sum(r["diff"] for r in json_lines(out)) == 40
    code, out, _ = admin(capsys, "updateTopic", *store, "--topic", "Orders", "-w", "3", "--json")
    assert json_lines(out)[0]["writeQueueNums"] == 3
    code, _, err = admin(capsys, "sendMessage", *store, "--topic", "T", "--body", "x")
    assert code == 2
    assert "sendMessage needs a running store" in err
    code, _, err = admin(capsys, "consumerProgress", *store, "--group", "nobody")
    assert code == 2
    assert "consumer group 'nobody' has no offsets in this store" in err


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def test_metrics_endpoint_counters_move_with_real_traffic(tmp_path: Path) -> None:
    port = free_port()
    with running_service(tmp_path, metricsPort=str(port)) as service:
        assert service.read(layout.METRICS_PORT) == port
        before = scrape(port)
        assert before["rmq_put_messages_total"] == 0
        assert before["rmq_put_latency_seconds_count"] == 0
        assert before["rmq_recovery_seconds"] >= 0
        assert before['rmq_worker_restarts_total{role="flusher"}'] == 0
        procs, outs = start_producers(service, tmp_path, [150, 150], batch=[1, 5])
        for proc in procs:
            assert proc.wait(120) == 0
        acks = sum(len(acknowledged(out)) for out in outs)
        assert acks == 300
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION),
            30,
            "dispatch",
        )
        after = scrape(port)
        assert after["rmq_put_messages_total"] == 300
        assert after["rmq_dispatch_total"] == 300
        assert after["rmq_put_bytes_total"] == service.read(layout.WROTE_POSITION)
        # one observation per send/send_batch call: 150 single sends + 30 batches of 5
        assert after["rmq_put_latency_seconds_count"] == 180
        assert after['rmq_put_latency_seconds_bucket{le="+Inf"}'] == 180
        assert after["rmq_put_lock_hold_seconds_count"] == 180
        assert after["rmq_put_latency_seconds_sum"] > 0
        assert after["rmq_put_failures_total"] == 0
        assert after['rmq_commitlog_offset_bytes{position="wrote"}'] == service.read(layout.WROTE_POSITION)
        assert after["rmq_reput_lag_bytes"] == 0
        # a worker killed is restarted and counted
        flusher = service.worker_pid("flusher")
        subprocess.run(["kill", "-9", str(flusher)], check=True)
        wait_until(
            lambda: service.read(layout.worker_field("flusher", "restarts")) == 1, 30, "flusher restart"
        )
        assert scrape(port)['rmq_worker_restarts_total{role="flusher"}'] == 1


def test_metrics_port_in_use_is_a_clear_startup_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = tmp_path / "store.conf"
        conf.write_text(
            f"storePathRootDir={tmp_path / 'store'}\nmappedFileSizeCommitLog=1048576\nmetricsPort={port}\n"
        )
        result = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"run.py: error: metricsPort={port}: cannot listen on 127.0.0.1" in result.stderr


def test_each_process_logs_to_its_own_file_and_is_quiet_when_idle(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        logs = service.root / "logs"
        names = sorted(p.name for p in logs.glob("*.log"))
        assert names == [
            "allocator.log", "cleaner.log", "flusher.log", "reput.log", "scheduler.log", "supervisor.log"
        ]  # fmt: skip
        # The supervisor logs "running as" right after it sets RUNNING, which the fixture waits for.
        wait_until(
            lambda: f"running as {service.names.base}" in (logs / "supervisor.log").read_text(),
            60,
            "the supervisor's running line",
        )
        assert "recovery done" in (logs / "supervisor.log").read_text()
        sizes = {p.name: p.stat().st_size for p in logs.glob("*.log")}
        passes = service.read(layout.worker_field("flusher", "work_count"))
        reput = service.read(layout.worker_field("reput", "work_count"))
        wait_until(
            lambda: (
                service.read(layout.worker_field("flusher", "work_count")) >= passes + 4
                and service.read(layout.worker_field("reput", "work_count")) >= reput + 4
            ),
            60,
            "idle worker passes",
        )
        assert {p.name: p.stat().st_size for p in logs.glob("*.log")} == sizes, (
            "an idle store wrote log lines"
        )

        # a put lock held over 500 ms is reported by the supervisor, once per hold
        with Producer.attach(service.names.base) as producer:
            assert producer.lock.acquire(3.0)
            try:
                wait_until(
                    lambda: "put lock held for" in (logs / "supervisor.log").read_text(), 30, "the lock line"
                )
            finally:
                producer.lock.release()
    text = (logs / "supervisor.log").read_text()
    assert text.count("put lock held for") == 1
    assert "stopped cleanly" in text


COVERAGE_ENV = {k: v for k, v in os.environ.items() if k.startswith("COVERAGE")}
"""A bare environment still measured by .ci/coverage (its subprocess patch reads these)."""


def test_status_watch_renders_live_view(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        fill(service, 20)
        result = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "status", "--conf", str(service.conf), "--watch", "--count", "2", "--interval", "0.1"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env={**COVERAGE_ENV, "COLUMNS": "140", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        out = result.stdout
        for heading in (
            "throughput",
            "commit log (bytes)",
            "workers",
            "consumer groups",
            "delay levels",
            "pool",
            "disk",
        ):
            assert heading in out, heading
        for role in ("allocator", "flusher", "reput", "cleaner", "scheduler"):
            assert re.search(rf"{role}\s+│\s+\d+\s+│\s+ready", out), role
        assert re.search(r"g1\s+│\s+Orders\s+│\s+8\s+│\s+10", out), out
    stopped = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "status", "--conf", str(service.conf), "--watch"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert stopped.returncode == 2
    assert "is the store running?" in stopped.stderr


def test_operator_commands_name_the_store_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"rmq_missing_{tmp_path.name}"[:60]
    for command in (
        ["topicList"],
        ["consumerProgress"],
        ["storeStatus"],
        ["sendMessage", "-t", "T", "-p", "x"],
    ):
        code, out, err = admin(capsys, *command, "--name", missing)
        assert code == 2
        assert out == ""
        assert err.startswith(f"rmq-admin: error: {missing}: ")
        assert "is the store running?" in err
    code, _, err = admin(
        capsys, "resetOffsetByTime", "--name", missing, "-g", "g", "-t", "T", "-s", "yesterday"
    )
    assert code == 2
    assert "--timestamp 'yesterday': expected milliseconds since the epoch, 'now' or an ISO 8601 time" in err
    code, _, err = admin(capsys, "storeStatus", "--store", str(tmp_path / "nowhere"))
    assert code == 2
    assert err == f"rmq-admin: error: {tmp_path / 'nowhere'}: no such store directory\n"
    with pytest.raises(SystemExit):
        main(["updateTopic", "--name", missing, "--topic", "T", "-r", "0"])
    assert "queue count must be 1..1024, got 0" in capsys.readouterr().err


def test_metrics_show_the_pool_and_commits(tmp_path: Path) -> None:
    port = free_port()
    settings = {"metricsPort": str(port), "transientStorePoolEnable": "true", "transientStorePoolSize": "2"}
    with running_service(tmp_path, **settings) as service:
        assert scrape(port)["rmq_pool_buffers"] == 2
        with Producer.attach(service.names.base) as producer:
            assert all(r.ok for r in producer.send_batch(dict(topic="P", body=b"z" * 500) for _ in range(50)))
        wrote = service.read(layout.WROTE_POSITION)
        wait_until(lambda: service.read(layout.COMMITTED_POSITION) >= wrote, 30, "the committer")
        after = scrape(port)
        assert after["rmq_commit_total"] >= 1
        assert after["rmq_commit_lag_bytes"] == 0
        assert after["rmq_pool_buffers_in_use"] == 1
        assert after['rmq_worker_restarts_total{role="committer"}'] == 0
        assert after['rmq_table_entries{capacity_key="maxConsumeQueueNum"}'] == 8  # send rotates over 8
        assert after['rmq_table_capacity{capacity_key="maxConsumeQueueNum"}'] == 65536
        assert after['rmq_table_entries{capacity_key="transientStorePoolSize"}'] == 1


def test_send_without_a_queue_rotates_over_the_topics_write_queues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As RocketMQ's client rotates over the topic's route: writeQueueNums from topics.json (here
    changed by updateTopic while the producer is attached), defaultTopicQueueNums (8) before."""
    with running_service(tmp_path) as service, Producer.attach(service.names.base) as producer:
        assert [producer.send("Rot", b"x").queue_id for _ in range(3)] == [0, 1, 2]
        code, _, _ = admin(capsys, "updateTopic", "--name", service.names.base, "--topic", "Rot", "-w", "2")
        assert code == 0
        wait_until(  # the producer looks at topics.json at most every TOPICS_RECHECK_S
            lambda: time.monotonic() - producer.router._checked_s >= TOPICS_RECHECK_S,
            10,
            "the producer's next look at topics.json",
        )
        assert [producer.send("Rot", b"y").queue_id for _ in range(4)] == [1, 0, 1, 0]
        assert [r.queue_id for r in producer.send_batch([dict(topic="Rot", body=b"z")] * 2)] == [1, 0]
