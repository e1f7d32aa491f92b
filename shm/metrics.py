"""Producer metrics: put latency and put-lock hold histograms, in one segment of their own.

Producers are separate processes, so their timings cannot live in a Prometheus registry: each
producer process claims a slot here and adds its observations; the supervisor's metrics endpoint
sums the slots on every scrape. A slot left by a dead producer is claimed by the next one and
keeps counting, so every total only grows (what Prometheus counters require).

Header (native int64):

    off field        writer
      0 magic        supervisor (create)
      8 generation   supervisor (create): the pointer table's GENERATION, so a producer that
                     outlived a store restart notices its mapping is stale
     16 slots        supervisor (create)

Slot ``i`` at ``HEADER_SIZE + i * SLOT_SIZE`` (native int64):

    off field                         writer
      0 owner_pid                     a producer, claiming a slot whose pid is 0 or dead under
                                      the flags lock
      8 puts                          owner: messages given to send/send_batch
     16 put_failures                  owner: of those, results other than PUT_OK
     24 latency_sum_us                owner: send_batch wall time (encode, lock wait, append,
                                      SYNC flush wait), per call
     32 latency_bucket[0..N]          owner: calls with latency <= BOUNDS_US[k] (not cumulative;
                                      the last bucket is +Inf)
     .. lock_hold_sum_us              owner: time the put lock was held, per hold
     .. lock_hold_bucket[0..N]        owner: as latency_bucket
     .. reference_sends[0..R]         owner: messages the pure-Python reference sent instead of
                                      the compiled core, per REFERENCE_REASONS
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from shm.layout import Lock, Role
from shm.segment import SharedSegment
from shm.slot_table import Writers

MAGIC = 0x524D514D45545231  # "RMQMETR1"
BOUNDS_US: tuple[int, ...] = (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
    100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
)  # fmt: skip
"""Histogram bucket upper bounds in microseconds (Prometheus ``le``), +Inf implied."""
BUCKETS = len(BOUNDS_US) + 1
LOCK_HELD_TOO_LONG_US = 500_000
"""RocketMQ logs a put whose lock hold exceeds 500 ms ("putMessage in lock cost time")."""

HEADER_SIZE = 64
H_MAGIC, H_GENERATION, H_SLOTS = 0, 8, 16
OWNER_PID, PUTS, PUT_FAILURES, LATENCY_SUM_US = 0, 8, 16, 24
LATENCY_BUCKETS = 32
LOCK_HOLD_SUM_US = LATENCY_BUCKETS + BUCKETS * 8
LOCK_HOLD_BUCKETS = LOCK_HOLD_SUM_US + 8
REFERENCE_REASONS: tuple[str, ...] = (
    "argument", "refused", "new_queue", "new_file", "store_busy", "month", "item", "no_core",
)  # fmt: skip
"""Why a send went to the reference, in the order of rmq_mp/put/_core.c's REF_* (its Sender checks
the count): an argument type the core does not take; a message the store refuses (the reference
words why); a queue the producer has not placed yet (or topics.json to read again); a new file
or reservation first; the store refusing puts or the lock busy past a slice; the UNIQ_KEY month
rolling over; a send_batch item the core does not encode; a producer without the core."""
REFERENCE_SENDS = LOCK_HOLD_BUCKETS + BUCKETS * 8
SLOT_SIZE = REFERENCE_SENDS + len(REFERENCE_REASONS) * 8
DEFAULT_SLOTS = 256

_Q = struct.Struct("=q")


def bucket_of(value_us: int) -> int:
    """Index of the first bucket whose bound holds ``value_us`` (BUCKETS - 1 for +Inf)."""
    return bisect.bisect_left(BOUNDS_US, value_us)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Summed over slots: per-bucket counts (not cumulative) and the sum, microseconds."""

    buckets: tuple[int, ...]
    sum_us: int

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le in seconds, cumulative count) pairs, +Inf last, as Prometheus exposes them."""
        total, out = 0, []
        for bound, count in zip([*(str(b / 1e6) for b in BOUNDS_US), "+Inf"], self.buckets, strict=True):
            total += count
            out.append((bound, total))
        return out

    def over(self, bound_us: int) -> int:
        """Observations above ``bound_us`` (which must be one of BOUNDS_US)."""
        return sum(self.buckets[BOUNDS_US.index(bound_us) + 1 :])


@dataclass(frozen=True, slots=True)
class MetricsTotals:
    puts: int
    put_failures: int
    producers: int
    latency: Histogram
    lock_hold: Histogram
    reference_sends: dict[str, int]
    """Per REFERENCE_REASONS: messages the pure-Python reference sent."""


WRITERS: dict[str, Writers] = {
    "header": Writers(Role.SUPERVISOR),
    "owner_pid": Writers(Role.PRODUCER, lock=Lock.FLAGS),
    "counts": Writers(Role.PRODUCER),
}
"""The layout's writers above: the header (magic, generation, slots), a slot's owner, and the
rest of a slot (its counts and histograms, by its owner alone)."""


class MetricsTable:
    """One process's view of the segment, opened in its `Role`: `claim`, `record` and
    `writable_words` refuse a role the layout does not name (WRITERS)."""

    def __init__(self, segment: SharedSegment, role: Role) -> None:
        self.segment = segment
        self.role = role
        self._buf = segment.mm
        self._words = segment.words
        self.slots = self._get(H_SLOTS)

    @classmethod
    def create(cls, name: str, generation: int, slots: int = DEFAULT_SLOTS) -> MetricsTable:
        """Supervisor only."""
        segment = SharedSegment.create(name, HEADER_SIZE + slots * SLOT_SIZE)
        _Q.pack_into(segment.mm, H_SLOTS, slots)
        _Q.pack_into(segment.mm, H_GENERATION, generation)
        _Q.pack_into(segment.mm, H_MAGIC, MAGIC)
        return cls(segment, Role.SUPERVISOR)

    @classmethod
    def attach(cls, name: str, role: Role) -> MetricsTable:
        from rmq_mp.errors import ShmAttachError

        segment = SharedSegment.attach(name)
        if _Q.unpack_from(segment.mm, H_MAGIC)[0] != MAGIC:
            segment.close()
            raise ShmAttachError(f"{name} is not an rmq-mp metrics segment")
        return cls(segment, role)

    @property
    def generation(self) -> int:
        return self._get(H_GENERATION)

    def _get(self, offset: int) -> int:
        return int(self._words[offset >> 3])

    def _base(self, slot: int) -> int:
        assert 0 <= slot < self.slots
        return HEADER_SIZE + slot * SLOT_SIZE

    def check_writes(self, *fields: str) -> None:
        """PermissionError for a field (a WRITERS name) this role is not declared to write."""
        for field in fields:
            if self.role not in WRITERS[field].roles:
                writers = sorted(r.value for r in WRITERS[field].roles)
                raise PermissionError(f"{self.role.value} may not write metrics {field} (writers: {writers})")

    @property
    def words(self) -> memoryview:
        """The segment as native int64 words, for reading."""
        return self._words

    def writable_words(self) -> memoryview:
        """`words` for the owner of a slot that records into it directly (the compiled core)."""
        self.check_writes("counts")
        return self._words

    def slot_word(self, slot: int) -> int:
        """Word index of slot ``slot``'s first field (its owner writes the rest from there)."""
        return self._base(slot) >> 3

    def owner(self, slot: int) -> int:
        return self._get(self._base(slot) + OWNER_PID)

    def claim(self, slot: int, pid: int) -> None:
        """Caller holds the flags lock and found the slot free or its owner dead."""
        self.check_writes("owner_pid")
        self._words[(self._base(slot) + OWNER_PID) >> 3] = pid

    def record(self, slot: int, *, puts: int, failures: int, latency_us: int, lock_hold_us: int) -> None:
        """Owner only. ``lock_hold_us`` < 0 when this call never held the lock. Whole-word
        stores (`SharedSegment.words`): every send records, and the scraper never sees a torn count.
        (The writer check is `writable_words`', which the owner's `ProducerMetrics` takes once.)"""
        w = self._words
        base = self._base(slot) >> 3
        w[base + PUTS // 8] += puts
        w[base + PUT_FAILURES // 8] += failures
        w[base + LATENCY_SUM_US // 8] += latency_us
        w[base + LATENCY_BUCKETS // 8 + bisect.bisect_left(BOUNDS_US, latency_us)] += 1
        if lock_hold_us >= 0:
            w[base + LOCK_HOLD_SUM_US // 8] += lock_hold_us
            w[base + LOCK_HOLD_BUCKETS // 8 + bisect.bisect_left(BOUNDS_US, lock_hold_us)] += 1

    def totals(self) -> MetricsTotals:
        """Every slot summed (any process; a torn read is off by one observation at most)."""
        puts = failures = producers = lat_sum = hold_sum = 0
        lat = [0] * BUCKETS
        hold = [0] * BUCKETS
        reference = [0] * len(REFERENCE_REASONS)
        for slot in range(self.slots):
            base = self._base(slot)
            if not self._get(base + OWNER_PID):
                continue
            producers += 1
            puts += self._get(base + PUTS)
            failures += self._get(base + PUT_FAILURES)
            lat_sum += self._get(base + LATENCY_SUM_US)
            hold_sum += self._get(base + LOCK_HOLD_SUM_US)
            for k in range(BUCKETS):
                lat[k] += self._get(base + LATENCY_BUCKETS + k * 8)
                hold[k] += self._get(base + LOCK_HOLD_BUCKETS + k * 8)
            for k in range(len(REFERENCE_REASONS)):
                reference[k] += self._get(base + REFERENCE_SENDS + k * 8)
        return MetricsTotals(
            puts,
            failures,
            producers,
            Histogram(tuple(lat), lat_sum),
            Histogram(tuple(hold), hold_sum),
            dict(zip(REFERENCE_REASONS, reference, strict=True)),
        )

    def close(self) -> None:
        self.segment.close()
