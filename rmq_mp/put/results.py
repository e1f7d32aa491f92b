"""What a send is answered: `SendResult` for one message, `SendBatchResult` for a `send_batch`.

The compiled core (rmq_mp/put/_core.c) builds `SendResult` by storing its slots (its
``__init__`` only assigns them), and a batch's result from its placement like the reference's.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from rmq_mp.errors import SendRefusedError
from rmq_mp.format.message_batch import EncodedRun, Placement
from rmq_mp.outcomes import PutMessageStatus

_PUT_OK = PutMessageStatus.PUT_OK


@dataclass(slots=True, repr=False)
class SendResult:
    """Outcome of one message. ``msg_id`` is the store's offset msgId (built when read: most
    senders never look at it); ``uniq_key`` the client id."""

    status: PutMessageStatus
    queue_id: int = -1
    queue_offset: int = -1
    commit_log_offset: int = -1
    uniq_key: str = ""
    reason: str = ""
    msg_id_prefix: str = field(default="", compare=False)
    """Hex of the store host (ip and port): a msgId is this and the offset's 16 hex digits."""

    @property
    def ok(self) -> bool:
        """`PutMessageStatus.ok`: PUT_OK (under SYNC_FLUSH: flushed)."""
        return self.status is _PUT_OK

    @property
    def stored(self) -> bool:
        """`PutMessageStatus.stored`: in the log, maybe not flushed (FLUSH_DISK_TIMEOUT...)."""
        return self.status.stored

    def raise_for_status(self) -> SendResult:
        """This result if ok, else `SendRefusedError` with its status and reason: a refused send
        that cannot be dropped silently (``producer.send(...).raise_for_status()``)."""
        if self.status is not _PUT_OK:
            what = "stored, but not acknowledged" if self.status.stored else "not stored"
            raise SendRefusedError(
                f"send {what}: {self.status.name}{': ' + self.reason if self.reason else ''}",
                self.status, self.reason, self.status.stored,
            )  # fmt: skip
        return self

    @property
    def msg_id(self) -> str:
        """`MessageDecoder.createMessageId` of the stored record ('' when nothing was stored)."""
        return f"{self.msg_id_prefix}{self.commit_log_offset:016X}" if self.commit_log_offset >= 0 else ""

    def __repr__(self) -> str:
        return (
            f"SendResult(status={self.status.name}, msg_id={self.msg_id!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, commit_log_offset={self.commit_log_offset}, "
            f"uniq_key={self.uniq_key!r}, reason={self.reason!r})"
        )


class SendBatchResult(Sequence[SendResult]):
    """Outcomes of one `send_batch`, one per message in order. Items are built on access, so a
    batch's result costs nothing per message until read; ``ok``, ``failures`` and the offset
    arrays answer for the whole batch."""

    def __init__(self, runs: Sequence[EncodedRun], msg_id_prefix: str) -> None:
        self._runs = runs
        self._msg_id_prefix = msg_id_prefix
        self._chunks: list[tuple[EncodedRun, Placement]] = []
        self._firsts: list[int] = []
        index = failures = 0
        for run in runs:
            for placement in run.placements:
                self._chunks.append((run, placement))
                self._firsts.append(index + placement.first)
                if placement.status is not _PUT_OK:
                    failures += placement.records
            index += run.count
        self._count = index
        self.failures = failures
        """Messages not ok (not PUT_OK; some of them may be `stored`)."""

    @property
    def ok(self) -> bool:
        """Every message is ok (`PutMessageStatus.ok`: PUT_OK; under SYNC_FLUSH, flushed)."""
        return self.failures == 0

    def raise_for_status(self) -> SendBatchResult:
        """This result if every message is ok, else `SendRefusedError` for the first that is
        not (the message names how many failed; the rest of the result stays readable)."""
        if self.failures:
            first = next(r for r in self if r.status is not _PUT_OK)
            what = "stored, but not acknowledged" if first.status.stored else "not stored"
            raise SendRefusedError(
                f"{self.failures} of {self._count} messages not ok; the first {what}: "
                f"{first.status.name}{': ' + first.reason if first.reason else ''}",
                first.status, first.reason, first.status.stored,
            )  # fmt: skip
        return self

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> SendResult: ...
    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...
    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        index %= self._count
        chunk = bisect.bisect_right(self._firsts, index) - 1
        run, placement = self._chunks[chunk]
        in_chunk = index - self._firsts[chunk]
        in_run = placement.first + in_chunk
        uniq = run.uniq_keys[in_run] if run.uniq_keys else ""
        if placement.phy_offset < 0:
            return SendResult(placement.status, run.answer_queue_id, -1, -1, uniq, placement.reason)
        phy = placement.phy_offset + run.start(in_run) - run.start(placement.first)
        queue_offset = placement.queue_offset + in_chunk if run.dispatchable else 0
        return SendResult(
            placement.status,
            run.answer_queue_id,
            queue_offset,
            phy,
            uniq,
            placement.reason,
            self._msg_id_prefix,
        )

    def __iter__(self) -> Iterator[SendResult]:
        prefix = self._msg_id_prefix
        for run, p in self._chunks:
            for i in range(p.first, p.first + p.records):
                uniq = run.uniq_keys[i] if run.uniq_keys else ""
                if p.phy_offset < 0:
                    yield SendResult(p.status, run.answer_queue_id, -1, -1, uniq, p.reason)
                    continue
                phy = p.phy_offset + run.start(i) - run.start(p.first)
                queue_offset = p.queue_offset + i - p.first if run.dispatchable else 0
                yield SendResult(p.status, run.answer_queue_id, queue_offset, phy, uniq, p.reason, prefix)

    def commit_log_offsets(self) -> np.ndarray:
        """Each message's commit-log offset, -1 where it was not stored."""
        out = np.full(self._count, -1, dtype=np.int64)
        for (run, placement), first in zip(self._chunks, self._firsts, strict=True):
            if placement.phy_offset >= 0:
                out[first : first + placement.records] = run.phy_offsets(placement)
        return out

    def queue_offsets(self) -> np.ndarray:
        """Each message's queue offset, -1 where it was not stored."""
        out = np.full(self._count, -1, dtype=np.int64)
        for (run, placement), first in zip(self._chunks, self._firsts, strict=True):
            if placement.phy_offset >= 0:
                base = placement.queue_offset if run.dispatchable else 0
                step = 1 if run.dispatchable else 0
                out[first : first + placement.records] = base + step * np.arange(placement.records)
        return out

    def __repr__(self) -> str:
        return f"SendBatchResult({self._count} messages, {self.failures} failed)"


class SendResultList(SendBatchResult):
    """`SendBatchResult` of messages sent one by one (the compiled core's `send_batch` of keyword
    dicts: a `SendResult` each, already built), with the same answers."""

    def __init__(self, results: list[SendResult]) -> None:
        self._results = results
        self._count = len(results)
        self.failures = sum(1 for r in results if r.status is not _PUT_OK)

    @overload
    def __getitem__(self, index: int) -> SendResult: ...
    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...
    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        return self._results[index]

    def __iter__(self) -> Iterator[SendResult]:
        return iter(self._results)

    def commit_log_offsets(self) -> np.ndarray:
        return np.array([r.commit_log_offset for r in self._results], dtype=np.int64)

    def queue_offsets(self) -> np.ndarray:
        return np.array([r.queue_offset for r in self._results], dtype=np.int64)
