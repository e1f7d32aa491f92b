"""rmq_mp.aio against a real store: ``async with``, ``await send`` (SYNC_FLUSH: each send waits
for its flush), ``async for`` over a consumer, and an event loop that keeps running while the
client waits: a ticking coroutine advances through a long poll and through SYNC sends."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from rmq_mp.aio import AsyncConsumer, AsyncProducer
from tests.service import running_service

TOPIC = "Aio"


class Ticker:
    """A coroutine that counts the event loop's turns while it runs."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.001)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def scenario(name: str) -> None:
    ticker = Ticker()
    ticker.start()
    async with AsyncConsumer(name, "aio") as consumer:
        await consumer.subscribe(TOPIC)
        before = ticker.ticks
        assert await consumer.poll(timeout_s=1.0) == []  # a long poll of a full second: nothing
        assert ticker.ticks - before >= 50  # the loop ran through it (a blocked loop: 0)

        async with AsyncProducer(name) as producer:
            before = ticker.ticks
            results = await asyncio.gather(
                *(producer.send(TOPIC, str(i).encode(), queue_id=i % 2) for i in range(200))
            )
            assert all(r.ok for r in results)
            assert ticker.ticks > before
        got = []
        async for msg in consumer:
            got.append(int(msg.body))
            if len(got) == 200:
                break
        assert sorted(got) == list(range(200))
        await consumer.commit()
        assert await consumer.call("lag") == {(TOPIC, 0): 0, (TOPIC, 1): 0}
    await ticker.stop()


def test_async_clients_never_block_the_loop(tmp_path: Path) -> None:
    with running_service(tmp_path, flushDiskType="SYNC_FLUSH") as service:
        asyncio.run(scenario(service.names.base))
