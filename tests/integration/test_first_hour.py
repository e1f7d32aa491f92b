"""A user's first hour (issue 19): what `run.py start --daemon`, `run.py demo`, the status line and
the supervisor's log tell a newcomer, and how producers and consumers behave across a restart."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.config.config_manager import loads
from shm import layout
from shm.names import ShmNames
from tests.service import ROOT, leftover_processes, poll_bodies, running_service, write_conf

RUN = [sys.executable, str(ROOT / "run.py")]


def run_py(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_daemon_start_prints_the_shm_name_and_why_a_second_start_fails(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "d.conf", tmp_path / "d")
    names = ShmNames.for_store(str(tmp_path / "d"))
    started = run_py("start", "--daemon", "--conf", str(conf))
    try:
        assert started.returncode == 0, started.stderr
        assert f"running as shm {names.base}," in started.stdout
        again = run_py("start", "--daemon", "--conf", str(conf))
        assert again.returncode == 2, again.stdout + again.stderr
        assert again.stderr.startswith("run.py: error: "), again.stderr
        assert "already running" in again.stderr or "already started" in again.stderr, again.stderr
        assert len(again.stderr.splitlines()) == 1, again.stderr
    finally:
        stopped = run_py("stop", "--conf", str(conf))
    assert stopped.returncode == 0, stopped.stderr
    assert names.leftovers() == []
    assert leftover_processes(names) == []


def test_daemon_start_prints_a_busy_metrics_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = write_conf(tmp_path / "d.conf", tmp_path / "d", metricsPort=str(port))
        result = run_py("start", "--daemon", "--conf", str(conf))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"run.py: error: metricsPort={port}: cannot listen on 127.0.0.1")
    assert ShmNames.for_store(str(tmp_path / "d")).leftovers() == []


def test_adjusted_and_ignored_settings_are_in_the_supervisor_log(tmp_path: Path) -> None:
    settings = {
        "flushDiskType": "SYNC_FLUSH",
        "transientStorePoolEnable": "true",
        "namesrvAddr": "127.0.0.1:9876",
    }
    with running_service(tmp_path, **settings) as service:
        log = (service.root / "logs" / "supervisor.log").read_text()
    assert "setting adjusted" in log
    assert "transientStorePoolEnable: true -> false (the pool is used only under ASYNC_FLUSH)" in log
    assert "setting ignored" in log
    assert "namesrvAddr=127.0.0.1:9876 (name-server registration" in log


def test_a_store_without_adjustments_logs_none(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        log = (service.root / "logs" / "supervisor.log").read_text()
    assert "setting adjusted" not in log
    assert "setting ignored" not in log


def test_demo_commits_so_a_second_demo_consumes_only_its_own(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "demo.conf", tmp_path / "demo")
    outputs = []
    for _ in range(2):
        result = run_py("demo", "--conf", str(conf), "--messages", "300", timeout_s=240)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs.append(result.stdout)
    for output in outputs:
        assert "consumed 300 messages" in output, output
        assert "committed its offsets" in output, output
    offsets = loads((tmp_path / "demo" / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert sum(offsets["DemoOrders@demo-group"].values()) == 600
    # The status line says what a batch's latency is: per message and per call, never unlabelled.
    status_line = next(line for line in outputs[0].splitlines() if line.startswith("producers "))
    assert "300 message(s) in 1 call(s): put latency avg " in status_line
    assert " us a message, " in status_line
    assert " us a call " in status_line


def test_a_queue_id_outside_the_topic_is_refused_and_never_grows_it(tmp_path: Path) -> None:
    from rmq_mp import Message, MessageBatch, Producer
    from rmq_mp.outcomes import PutMessageStatus
    from rmq_mp.tools.admin import main as rmq_admin
    from tests.service import wait_until

    illegal = PutMessageStatus.MESSAGE_ILLEGAL
    with running_service(tmp_path, flushConsumerOffsetInterval="100") as service:
        topics = service.root / "config" / "topics.json"
        with Producer.attach(service.names.base) as producer:
            # A topic not configured yet: its queues are the defaultTopicQueueNums it is created with.
            refused = producer.send("Orders", b"x", queue_id=8)
            assert refused.status is illegal, refused
            assert "topic Orders is not configured yet" in refused.reason
            assert "defaultTopicQueueNums = 8 queues (0..7)" in refused.reason
            assert producer.send("Orders", b"x", queue_id=7).ok
            wait_until(
                lambda: topics.exists() and "Orders" in loads(topics.read_text())["topicConfigTable"],
                20,
                "the auto-created topic persisted",
            )
            puts = service.read(layout.PUT_COUNT)
            for result in [
                producer.send("Orders", b"x", queue_id=99),
                *producer.send_batch([{"topic": "Orders", "body": b"x", "queue_id": 99}]),
                *producer.send_batch(MessageBatch("Orders", [b"a", b"b"], queue_id=99)),
                *producer.send_batch([Message(topic="Orders", body=b"x", queue_id=99)]),
            ]:
                assert result.status is illegal, result
                assert "queue id 99 is illegal: topic Orders has writeQueueNums = 8" in result.reason
            assert service.read(layout.PUT_COUNT) == puts  # nothing stored
            # Bad input keeps its own, earlier reason.
            negative = producer.send("Orders", b"x", queue_id=-1)
            assert negative.status is illegal
            assert "negative" in negative.reason
            # More queues: at once, without waiting for the producer's periodic look at the file.
            update = [
                "updateTopic",
                "--name",
                service.names.base,
                "--topic",
                "Orders",
                "-w",
                "16",
                "-r",
                "16",
            ]
            assert rmq_admin(update) == 0
            assert producer.send("Orders", b"x", queue_id=12).ok
    # The stop's final persist writes the topic as configured, not grown to queue 99.
    config = loads(topics.read_text())["topicConfigTable"]["Orders"]
    assert (config["writeQueueNums"], config["readQueueNums"]) == (16, 16)
    assert not (service.root / "consumequeue" / "Orders" / "99").exists()


def test_producer_and_consumer_carry_on_across_a_restart(tmp_path: Path) -> None:
    from rmq_mp import Consumer, Producer
    from rmq_mp.errors import StoreNotRunningError
    from rmq_mp.outcomes import PutMessageStatus
    from tests.service import start_service

    first = start_service(tmp_path, flushConsumerOffsetInterval="100")
    name = first.names.base
    producer = Producer.attach(name)
    consumer = Consumer.attach(name, "carry-on")
    try:
        assert all(producer.send("Restart", b"before %d" % i, queue_id=0).ok for i in range(3))
        consumer.subscribe("Restart")
        got = poll_bodies(consumer, 3, 30, "three", poll_s=1)
        assert got == [b"before %d" % i for i in range(3)]
        consumer.commit()
        assert first.stop() == 0

        # Stopped: the producer says so and what it will do; the consumer raises, typed.
        stopped = producer.send("Restart", b"while stopped", queue_id=0)
        assert stopped.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "store is not running (stopped)" in stopped.reason
        assert "attaches again by itself" in stopped.reason
        with pytest.raises(StoreNotRunningError, match="attaches again by itself"):
            consumer.poll(0)

        second = start_service(tmp_path, flushConsumerOffsetInterval="100")
        try:
            assert second.names.base == name
            after = producer.send("Restart", b"after", queue_id=0)  # no new attach
            assert after.ok, after
            assert after.queue_offset == 3
            got = poll_bodies(consumer, 1, 30, "after", poll_s=1)
            assert got == [b"after"]  # from where it was
            consumer.commit()
            producer.close()
            consumer.close()
            assert second.stop() == 0
        finally:
            second.stop()
    finally:
        producer.close()
        consumer.close()
        first.stop()
    offsets = loads((first.root / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert offsets["Restart@carry-on"] == {0: 4}
    assert first.names.leftovers() == []


def test_a_parked_consumer_wakes_when_its_store_stops(tmp_path: Path) -> None:
    import threading

    from rmq_mp import Consumer
    from rmq_mp.errors import StoreNotRunningError
    from tests.service import start_service, wait_until

    service = start_service(tmp_path)
    outcome: list[BaseException | None] = []
    try:
        with Consumer.attach(service.names.base, "parked") as consumer:
            consumer.subscribe("Quiet")

            def poll() -> None:
                try:
                    consumer.poll(600)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=poll)
            thread.start()
            wait_until(lambda: consumer.waiters.waiting_slots() != [], 30, "the consumer to park")
            assert service.stop() == 0
            thread.join(30)  # woken by the stop, not by its 600 s timeout
            assert not thread.is_alive()
    finally:
        service.stop()
    assert len(outcome) == 1
    assert isinstance(outcome[0], StoreNotRunningError), outcome


def test_attach_waits_for_a_store_that_is_still_starting(tmp_path: Path) -> None:
    from rmq_mp import Consumer, Producer
    from rmq_mp.config.store_config import MessageStoreConfig
    from rmq_mp.errors import StoreNotRunningError
    from rmq_mp.store.running_store import Instance
    from tests.service import STARTED, RunningService, wait_until

    conf = write_conf(tmp_path / "s.conf", tmp_path / "s")
    config = MessageStoreConfig.from_file(conf)
    names = ShmNames.for_store(config.store_path_root_dir)
    log = tmp_path / "s.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*RUN, "start", "--conf", str(conf)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )
    service = RunningService(conf, config, names, process, log)
    STARTED.append(service)
    try:
        wait_until(
            lambda: (i := Instance.of(names)) is not None and i.starting, 60, "the store to be starting"
        )
        with pytest.raises(StoreNotRunningError, match="is still starting after 0 s"):
            Producer.attach(names.base, start_timeout_s=0)
        with Producer.attach(names.base) as producer:  # waits
            assert service.read(layout.STATE) == layout.RUNNING
            assert producer.send("Early", b"first").ok
        with Consumer.attach(names.base, "early") as consumer:
            assert consumer.pull("Early", 0, 0, timeout_s=5).messages[0].body == b"first"
    finally:
        assert service.stop() == 0
    assert names.leftovers() == []


def test_the_readme_consumer_snippet_commits_its_group(tmp_path: Path) -> None:
    """The README's first producer/consumer snippet, run as written against ./store: a second run
    of its consumer starts where the first committed."""
    import re

    from rmq_mp import Consumer

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("From any local process", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    assert "consumer.commit()" in block.group(1)
    iterated = []
    with running_service(tmp_path, "store") as service:
        for _ in range(2):
            ran = subprocess.run(
                [sys.executable, "-c", block.group(1)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert ran.returncode == 0, ran.stderr
            iterated.append(re.findall(r"^(\d+) b'hello'$", ran.stdout, re.M))
        # Each run sends one message to queue 0; its loop starts where the last run committed.
        assert iterated == [["0"], ["1"]]
        with Consumer.attach(service.names.base, "my-group") as consumer:
            committed = [consumer.committed_offset("Orders", q) for q in range(8)]
    assert sum(c for c in committed if c > 0) == 2  # both runs' messages, each consumed once


def test_a_daemon_start_that_fails_without_a_refusal_line_shows_the_supervisors_last_words() -> None:
    from run import did_not_start

    lines = ["starting store /s as shm rmq_x", "Killed", ""]
    assert did_not_start(-9, lines, Path("/s/logs/supervisor.log"), Path("/s/logs/supervisor.out")) == (
        "run.py: the store did not start (supervisor exit code -9): Killed; "
        "see /s/logs/supervisor.log and /s/logs/supervisor.out"
    )
    assert did_not_start(None, [], Path("l"), Path("o")).startswith(
        "run.py: the store is still starting after 60 s (`run.py status` shows when it runs); see l"
    )
