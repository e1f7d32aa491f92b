"""The running store (supervisor and workers as OS processes, the compiled send) against a simple
model (hypothesis stateful), with kill -9 of any worker, of the whole tree, and clean restarts,
the producer and consumer staying attached throughout.

The model is a list of bodies per queue: what was stored (a send's `stored`, PUT_OK in ASYNC).
A send refused while the store is down or fenced (the kill's aftermath) is not in it and must
be nowhere. A read drawn anywhere in a queue must give the model's messages from there, in
order, at their queue offsets; a send's queue offset must be its queue's model length (no offset
reused after a kill). Small files (64 KiB commit log, 16-entry queues) with the pool on, so
kills land in rolls, commits and pre-allocated files."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from rmq_mp.client.consumer import Consumer
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.put.producer import Producer
from shm.roles import ROLES
from tests.service import (
    RunningService,
    cleanup_started,
    kill_tree,
    start_service,
    wait_until,
)

TOPICS = {"Model": 2, "Модель": 1}
SETTINGS = {
    "mappedFileSizeCommitLog": str(64 * 1024),
    "mappedFileSizeConsumeQueue": str(20 * 16),
    "transientStorePoolEnable": "true",
    "transientStorePoolSize": "3",
}
VICTIMS = sorted(r for r in ROLES if r != "ha")
BODIES = st.one_of(st.binary(min_size=1, max_size=64), st.binary(min_size=1000, max_size=6000))


class ServiceModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rmq-smodel-"))
        self.service: RunningService | None = None
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.queues: dict[tuple[str, int], list[bytes]] = {}

    @initialize()
    def start(self) -> None:
        self.service = start_service(self.tmp, **SETTINGS)
        self.producer = Producer.attach(self.service.root)
        self.consumer = Consumer.attach(self.service.root, "model-group")

    def teardown(self) -> None:
        try:
            for client in (self.producer, self.consumer):
                if client is not None:
                    client.close()
            if self.service is not None:
                assert self.service.stop() == 0, self.service.supervisor_log
        finally:
            cleanup_started()
            with contextlib.suppress(OSError):
                import shutil

                shutil.rmtree(self.tmp)

    @property
    def running(self) -> RunningService:
        assert self.service is not None
        return self.service

    def _stored(self, topic: str, queue: int, body: bytes, stored: bool, queue_offset: int) -> None:
        model = self.queues.setdefault((topic, queue), [])
        if stored:
            assert queue_offset == len(model), (topic, queue, queue_offset, len(model))
            model.append(body)

    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        queue=st.integers(0, 1),
        body=BODIES,
        shape=st.sampled_from(["plain", "tags+keys", "properties", "bytearray"]),
    )
    def send(self, topic: str, queue: int, body: bytes, shape: str) -> None:
        queue %= TOPICS[topic]
        assert self.producer is not None
        if shape == "plain":
            result = self.producer.send(topic, body, queue_id=queue)
        elif shape == "tags+keys":
            result = self.producer.send(topic, body, queue_id=queue, tags="TagA", keys=["k1", "k2"])
        elif shape == "properties":
            result = self.producer.send(topic, body, queue_id=queue, properties={"a": "1"})
        else:
            result = self.producer.send(topic, bytearray(body), queue_id=queue)
        self._stored(topic, queue, body, result.stored, result.queue_offset)

    @rule(topic=st.sampled_from(sorted(TOPICS)), bodies=st.lists(BODIES, min_size=1, max_size=6))
    def send_batch(self, topic: str, bodies: list[bytes]) -> None:
        assert self.producer is not None
        results = self.producer.send_batch(MessageBatch(topic, bodies, queue_id=0))
        for body, result in zip(bodies, results, strict=True):
            self._stored(topic, 0, body, result.stored, result.queue_offset)

    @precondition(lambda self: any(self.queues.values()))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        topic, queue = data.draw(st.sampled_from(sorted(k for k, v in self.queues.items() if v)))
        model = self.queues[(topic, queue)]
        offset = data.draw(st.integers(0, len(model) - 1))
        assert self.consumer is not None
        result = self.consumer.pull(topic, queue, offset, 8, timeout_s=30)  # reput may lag
        assert result.status is GetMessageStatus.FOUND, (offset, len(model), result.status)
        got = [bytes(msg.body) for msg in result.messages]
        assert got, (offset, result)
        assert got == model[offset : offset + len(got)], (topic, queue, offset)
        assert [msg.queue_offset for msg in result.messages] == list(range(offset, offset + len(got)))

    @rule(victim=st.sampled_from(VICTIMS))
    def kill_worker(self, victim: str) -> None:
        """SIGKILL one worker; the supervisor starts another."""
        service = self.running
        pid = service.worker_pid(victim)
        if not pid:
            return
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: service.worker_pid(victim) not in (0, pid), 60, f"a new {victim}")

    @rule()
    def kill_everything(self) -> None:
        """SIGKILL the supervisor and every worker at once, then the start a user would do; the
        clients stay attached (their sends meanwhile are refused, then go to the new start)."""
        kill_tree(self.running)
        self.service = start_service(self.tmp, **SETTINGS)

    @rule()
    def restart_clean(self) -> None:
        assert self.running.stop() == 0, self.running.supervisor_log
        self.service = start_service(self.tmp, **SETTINGS)


ServiceModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("RMQ_SERVICE_MODEL_EXAMPLES", "4")),  # more for a soak
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each step restarts processes
)
test_the_running_store_follows_its_model = ServiceModel.TestCase
