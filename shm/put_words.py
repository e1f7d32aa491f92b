"""PutWords: the pointer-table words a producer's put path reads and stores, by name.

Only shm/ knows offsets into shared memory; the put path touches a dozen words per record, so
it cannot afford `PointerTable.set` (about 0.3 us each, its writer check included). This class
takes the table's word view once, through `PointerTable.words`, which checks that the role may
store every field in STORED (the producer, under the put lock), and gives each step of a put one
method: admission reads, the journalled append (shm/layout.py: the put journal), the counters,
the crash undo's reading of a dead owner's journal. The compiled core
(rmq_mp/put/_core.c) makes the same stores; it gets its word indexes from `native_indexes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shm import layout
from shm.pointer_table import PointerTable

STORED = (
    layout.WROTE_POSITION,
    layout.JOURNAL_ACTIVE,
    layout.JOURNAL_WROTE_BEFORE,
    layout.JOURNAL_WROTE_AFTER,
    layout.JOURNAL_QUEUE_SLOT,
    layout.JOURNAL_QUEUE_OFFSET_BEFORE,
    layout.LAST_STORE_TIMESTAMP,
    layout.PUT_COUNT,
    layout.PUT_BYTES,
    layout.FLUSH_REQUEST_SEQ,
)
"""The fields the put path stores, all under the put lock."""

_WROTE = layout.WROTE_POSITION.index
_J_ACTIVE = layout.JOURNAL_ACTIVE.index
_J_BEFORE = layout.JOURNAL_WROTE_BEFORE.index
_J_AFTER = layout.JOURNAL_WROTE_AFTER.index
_J_SLOT = layout.JOURNAL_QUEUE_SLOT.index
_J_QUEUE_OFFSET = layout.JOURNAL_QUEUE_OFFSET_BEFORE.index
_LAST_STORE_TS = layout.LAST_STORE_TIMESTAMP.index
_PUT_COUNT = layout.PUT_COUNT.index
_PUT_BYTES = layout.PUT_BYTES.index
_STATE = layout.STATE.index
_HEARTBEAT = layout.SUPERVISOR_HEARTBEAT_MS.index
_SUPERVISOR_PID = layout.SUPERVISOR_PID.index
_FLAGS = layout.RUNNING_FLAGS.index
_DISK_USED = layout.DISK_USED_PERMILLE.index
_REPUT_FROM = layout.REPUT_FROM_OFFSET.index
_FLUSHED = layout.FLUSHED_POSITION.index
_ALLOCATED = layout.ALLOCATED_UNTIL.index


@dataclass(frozen=True, slots=True)
class Journal:
    """A put journal found active: the put that wrote it meant to move the write position from
    ``wrote_before`` to ``wrote_after`` and queue ``queue_slot``'s next offset (-1: none) on
    from ``queue_offset_before``."""

    wrote_before: int
    wrote_after: int
    queue_slot: int
    queue_offset_before: int


class PutWords:
    """One producer's view; stores only with the put lock held."""

    __slots__ = ("_w",)

    def __init__(self, table: PointerTable) -> None:
        self._w = table.words(*STORED)

    # ------------------------------------------------------------------ reads (no lock)

    def state(self) -> int:
        return int(self._w[_STATE])

    def supervisor_heartbeat_ms(self) -> int:
        return int(self._w[_HEARTBEAT])

    def supervisor_pid(self) -> int:
        return int(self._w[_SUPERVISOR_PID])

    def running_flags(self) -> int:
        return int(self._w[_FLAGS])

    def disk_used_permille(self) -> int:
        return int(self._w[_DISK_USED])

    def wrote_position(self) -> int:
        return int(self._w[_WROTE])

    def reput_from_offset(self) -> int:
        return int(self._w[_REPUT_FROM])

    def dispatch_lag(self) -> int:
        """Bytes appended but not yet dispatched (maxDispatchLagBytes' measure)."""
        w = self._w
        return int(w[_WROTE] - w[_REPUT_FROM])

    def flushed_position(self) -> int:
        return int(self._w[_FLUSHED])

    def allocated_until(self) -> int:
        return int(self._w[_ALLOCATED])

    # ------------------------------------------------------------------ the append (put lock held)

    def journal_begin(self, wrote: int, end: int, queue_slot: int, queue_offset_before: int) -> None:
        """Before the bytes and the queue offset change: what to undo if this process dies
        before `journal_commit` (the journal is whole before it says active)."""
        w = self._w
        w[_J_BEFORE] = wrote
        w[_J_AFTER] = end
        w[_J_SLOT] = queue_slot
        w[_J_QUEUE_OFFSET] = queue_offset_before
        w[_J_ACTIVE] = 1

    def journal_commit(self, end: int) -> None:
        """The write position moves to ``end`` (the commit point), then the journal closes."""
        w = self._w
        w[_WROTE] = end
        w[_J_ACTIVE] = 0

    def count_puts(self, store_timestamp: int, records: int, size_bytes: int) -> None:
        w = self._w
        w[_LAST_STORE_TS] = store_timestamp
        w[_PUT_COUNT] += records
        w[_PUT_BYTES] += size_bytes

    # ------------------------------------------------------------------ the undo (lock taken over)

    def open_journal(self) -> Journal | None:
        """The journal a dead lock owner left active, or None."""
        w = self._w
        if not w[_J_ACTIVE]:
            return None
        return Journal(int(w[_J_BEFORE]), int(w[_J_AFTER]), int(w[_J_SLOT]), int(w[_J_QUEUE_OFFSET]))

    def close_journal(self) -> None:
        self._w[_J_ACTIVE] = 0

    @staticmethod
    def native_indexes(names: tuple[str, ...]) -> dict[str, int]:
        """Word index of each named field, for the compiled core (it stores only STORED ones and
        the put lock's words: tests/unit/test_writers.py checks the core's stores)."""
        return {name: getattr(layout, name).index for name in names}
