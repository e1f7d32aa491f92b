"""asyncio clients: `AsyncProducer` and `AsyncConsumer` (``async with``, ``await send``,
``async for`` over a consumer), as aiokafka and ``redis.asyncio`` offer.

The store is reached by shared memory, not a socket, so there is nothing for an event loop to
wait on: a SYNC_FLUSH send waits on a semaphore and a long poll parks on one. Each client
therefore owns one worker thread, and every call of its `Producer` or `Consumer` runs there
(those are one thread's at a time: rmq_mp/put/locked.py); the event loop only awaits the result,
so a SYNC wait or a long poll never blocks it. Calls of one client run in the order awaited.
A cancelled await does not stop a send already begun (it may be stored, as a send whose
caller died after the put); a cancelled poll's messages are kept for the next one (its
offsets moved past them).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rmq_mp.client.consumer import Consumer
from rmq_mp.format import message as m
from rmq_mp.format.message import MessageExt
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendBatchResult, SendResult

T = TypeVar("T")

ITER_POLL_S = 0.5
"""One poll of ``async for``: how long `AsyncConsumer.close` may wait behind it (new messages
end it at once)."""


class _Worker:
    """The client's one thread: its calls, in order, off the event loop."""

    def __init__(self, name: str) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)


class AsyncProducer:
    """``async with AsyncProducer(name) as producer: await producer.send(topic, body)``."""

    def __init__(self, name: str | os.PathLike[str], **attach: Any) -> None:
        self.name = name
        self._attach = attach
        self._worker = _Worker("AsyncProducer")
        self.producer: Producer | None = None

    async def start(self) -> AsyncProducer:
        """Attach (waits for a store still starting without blocking the loop)."""
        if self.producer is None:
            self.producer = await self._worker.call(Producer.attach, self.name, **self._attach)
        return self

    async def send(
        self, topic: str, body: m.Body, *, tags: str | None = None, keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None, queue_id: int | None = None, flag: int = 0,
    ) -> SendResult:  # fmt: skip
        """`Producer.send`; a SYNC_FLUSH send resolves once flushed."""
        producer = self._started()
        return await self._worker.call(
            producer.send,
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            queue_id=queue_id,
            flag=flag,
        )

    async def send_batch(
        self, messages: MessageBatch | Iterable[m.Message | Mapping[str, Any]]
    ) -> SendBatchResult:
        """`Producer.send_batch`."""
        producer = self._started()
        return await self._worker.call(producer.send_batch, messages)

    def _started(self) -> Producer:
        if self.producer is None:
            raise RuntimeError("AsyncProducer: await start() (or use async with) first")
        return self.producer

    async def close(self) -> None:
        """Detach after the sends awaited so far."""
        if self.producer is not None:
            producer, self.producer = self.producer, None
            await self._worker.call(producer.close)
        await asyncio.get_running_loop().run_in_executor(None, self._worker.shutdown)

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer:
    """``async with AsyncConsumer(name, group) as consumer``: `subscribe`, then ``async for
    msg in consumer`` (endless: each message once polled; `commit` records progress) or
    ``await consumer.poll()``. Keyword arguments go to `Consumer.attach`."""

    def __init__(self, name: str | os.PathLike[str], group: str, **attach: Any) -> None:
        self.name = name
        self.group = group
        self._attach = attach
        self._worker = _Worker("AsyncConsumer")
        self.consumer: Consumer | None = None
        self._buffer: list[MessageExt] = []
        self._closing = False

    async def start(self) -> AsyncConsumer:
        if self.consumer is None:
            self.consumer = await self._worker.call(Consumer.attach, self.name, self.group, **self._attach)
        return self

    def _started(self) -> Consumer:
        if self.consumer is None:
            raise RuntimeError("AsyncConsumer: await start() (or use async with) first")
        return self.consumer

    async def subscribe(self, topic: str, expression: str = "*", **kwargs: Any) -> None:
        await self._worker.call(self._started().subscribe, topic, expression, **kwargs)

    async def poll(self, timeout_s: float = 1.0, max_msgs: int = 32) -> list[MessageExt]:
        """`Consumer.poll`: the long poll parks the client's thread, never the loop."""
        if self._buffer:
            batch, self._buffer = self._buffer[:max_msgs], self._buffer[max_msgs:]
            return batch
        return await self._kept_poll(self._started(), timeout_s, max_msgs)

    async def _kept_poll(self, consumer: Consumer, timeout_s: float, max_msgs: int = 32) -> list[MessageExt]:
        """A poll on the client's thread whose messages, if the await is cancelled, go to the
        buffer the next poll serves first (the consumer's offsets moved past them already)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._worker.executor, consumer.poll, timeout_s, max_msgs)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._keep)
            raise

    def _keep(self, future: asyncio.Future[list[MessageExt]]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._buffer.extend(future.result())

    async def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        return await self._worker.call(self._started().commit, offsets)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Any other `Consumer` method by name on the client's thread (``await
        consumer.call("seek", topic, queue_id, offset)``, ``"lag"``, ``"pause"``...)."""
        return await self._worker.call(getattr(self._started(), method), *args, **kwargs)

    def __aiter__(self) -> AsyncIterator[MessageExt]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[MessageExt]:
        consumer = self._started()
        while not self._closing:
            if not self._buffer:
                self._buffer = await self._kept_poll(consumer, ITER_POLL_S)
            while self._buffer:
                yield self._buffer.pop(0)

    async def close(self) -> None:
        """Leave the group and detach, after the call in progress (a poll: at most its timeout)."""
        self._closing = True
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            await self._worker.call(consumer.close)
        await asyncio.get_running_loop().run_in_executor(None, self._worker.shutdown)

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
