"""SYNC_MASTER producers in threads of the test: every answer recorded with its body, each PUT_OK
checked at once against the master's acknowledged offset, and all of it checked at the end
against the slave's commit log."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from shm.layout import Role
from shm.pointer_table import PointerTable
from tests.service import RunningService, wait_until

ANSWERS = {
    PutMessageStatus.PUT_OK,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE,
}
"""What a SYNC_MASTER put may answer while its slaves come and go."""


@dataclass
class SyncLoad:
    """``threads`` producers sending unique bodies until ``stop``; ``answers`` in answer order."""

    master: RunningService
    threads: int = 2
    topic: str = "SyncLoad"
    answers: list[tuple[PutMessageStatus, bytes]] = field(default_factory=list)
    unacked_put_ok: list[bytes] = field(default_factory=list)
    """PUT_OK answers whose end the master's HA_ACKED_OFFSET did not yet cover: must stay empty."""
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers = [
            threading.Thread(target=self._run, args=(i,), name=f"sync-load-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for worker in self._workers:
            worker.start()

    def _run(self, index: int) -> None:
        table = PointerTable.attach(self.master.names.pointer_table, Role.CONSUMER)
        try:
            with Producer.attach(self.master.names.base) as producer:
                i = 0
                while not self._stop.is_set():
                    body = b"load-%d-%08d-" % (index, i) + bytes(range(i % 200))
                    result = producer.send(self.topic, body)
                    if (
                        result.status is PutMessageStatus.PUT_OK
                        and table.get(layout.HA_ACKED_OFFSET) <= result.commit_log_offset
                    ):
                        self.unacked_put_ok.append(body)
                    with self._lock:
                        self.answers.append((result.status, body))
                    i += 1
                    while table.get(layout.HA_CONNECTIONS) == 0 and not self._stop.wait(0.01):
                        pass  # no slave: store no more until one connects (not hundreds of MB)
        except BaseException as exc:  # surfaced by stop()
            self.errors.append(exc)
        finally:
            table.close()

    def put_ok(self) -> list[bytes]:
        with self._lock:
            return [body for status, body in self.answers if status is PutMessageStatus.PUT_OK]

    def wait_put_ok(self, more_than: int, timeout_s: float = 60) -> None:
        wait_until(lambda: len(self.put_ok()) > more_than, timeout_s, f"more than {more_than} PUT_OK answers")

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the producers; every one must come back (no put hangs)."""
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout_s)
        hung = [w.name for w in self._workers if w.is_alive()]
        assert not hung, f"puts never answered in {hung}"
        assert not self.errors, self.errors
        statuses = {status for status, _ in self.answers}
        assert statuses <= ANSWERS, statuses
        assert not self.unacked_put_ok, f"{len(self.unacked_put_ok)} PUT_OK before the slave acknowledged"

    def missing_on(self, log: bytes) -> list[bytes]:
        """PUT_OK bodies not in ``log`` (a slave's commit log, joined)."""
        return [body for body in self.put_ok() if body not in log]
