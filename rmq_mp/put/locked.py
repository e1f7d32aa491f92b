"""ThreadSafeProducer: one `Producer` shared by several threads of a process.

A `Producer` is one thread's at a time. Its compiled send encodes a record into the producer's
one scratch buffer and then, when another process holds the store's put lock, waits for it with
the GIL released: a second thread's send in that window would encode over the first one's
record. The Python reference keeps per-producer state between its steps too. So sharing goes
through this wrapper, whose lock lets one send (or batch) of the producer run at a time; an
unshared producer pays nothing for it. Threads that each need their own SYNC flush wait in
parallel (they then share one group commit) are better served by a `Producer` each: several per
process are fine.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rmq_mp.format import message as m
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendBatchResult, SendResult
from rmq_mp.store.running_store import START_TIMEOUT_S


class ThreadSafeProducer:
    """`Producer`'s `send` and `send_batch` under one lock; ``producer`` is the one shared."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._lock = threading.Lock()

    @classmethod
    def attach(
        cls, name: str | os.PathLike[str], *, start_timeout_s: float = START_TIMEOUT_S
    ) -> ThreadSafeProducer:
        """`Producer.attach`, shared."""
        return cls(Producer.attach(name, start_timeout_s=start_timeout_s))

    def send(
        self,
        topic: str,
        body: m.Body,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        flag: int = 0,
    ) -> SendResult:
        """`Producer.send`, one thread at a time."""
        with self._lock:
            return self.producer.send(
                topic, body, tags=tags, keys=keys, properties=properties, queue_id=queue_id, flag=flag
            )

    def send_batch(self, messages: MessageBatch | Iterable[m.Message | Mapping[str, Any]]) -> SendBatchResult:
        """`Producer.send_batch`, one thread at a time."""
        with self._lock:
            return self.producer.send_batch(messages)

    def close(self) -> None:
        """Detach, after any send in progress."""
        with self._lock:
            self.producer.close()

    def __enter__(self) -> ThreadSafeProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
