"""The put journal: what makes the put lock's critical section undoable when its holder dies.

Every append under the put lock goes in four steps, in this order:

1. `begin`: the journal (the write position before, the end the put means to reach, the queue
   slot whose next offset it moves and that offset before) and JOURNAL_ACTIVE = 1;
2. the bytes, into the pool buffer or the file, past the write position (nobody reads there);
3. the queue's next offset;
4. `commit`: WROTE_POSITION = the end (the commit point: readers see the records from here on),
   then JOURNAL_ACTIVE = 0.

A holder killed anywhere in 1-4 leaves JOURNAL_ACTIVE set. The next lock taker (`interrupted`)
finds either the write position moved (the put committed: nothing to undo) or not (its queue
offset is restored and its bytes zeroed by the caller, which knows the file), then `close`s
the journal. The compiled core follows the same words in the same order (rmq_mp/put/_core.c),
so either path undoes the other's half-done put.
"""

from __future__ import annotations

from typing import NamedTuple

from shm import layout
from shm.pointer_table import PointerTable

_WROTE = layout.WROTE_POSITION.index
_ACTIVE = layout.JOURNAL_ACTIVE.index
_BEFORE = layout.JOURNAL_WROTE_BEFORE.index
_AFTER = layout.JOURNAL_WROTE_AFTER.index
_SLOT = layout.JOURNAL_QUEUE_SLOT.index
_QUEUE_OFFSET = layout.JOURNAL_QUEUE_OFFSET_BEFORE.index

FIELDS = (
    layout.WROTE_POSITION,
    layout.JOURNAL_ACTIVE,
    layout.JOURNAL_WROTE_BEFORE,
    layout.JOURNAL_WROTE_AFTER,
    layout.JOURNAL_QUEUE_SLOT,
    layout.JOURNAL_QUEUE_OFFSET_BEFORE,
)
"""The words a put writes through this module (the caller's `PointerTable.words` view of them,
writer check done once: these are written under the put lock only)."""


def begin(words: memoryview, wrote: int, end: int, queue_slot: int, queue_offset: int) -> None:
    """Step 1: a put from ``wrote`` to ``end`` that moves ``queue_slot``'s next offset from
    ``queue_offset`` (``queue_slot`` -1: no queue, as a BLANK record closing a file)."""
    words[_BEFORE] = wrote
    words[_AFTER] = end
    words[_SLOT] = queue_slot
    words[_QUEUE_OFFSET] = queue_offset
    words[_ACTIVE] = 1


def commit(words: memoryview, end: int) -> None:
    """Step 4: the put is done; the write position is its end."""
    words[_WROTE] = end
    words[_ACTIVE] = 0


class Interrupted(NamedTuple):
    """A dead holder's put that did not reach its commit point."""

    wrote: int
    """The write position, where its bytes begin."""
    end: int
    """Where they were to end."""
    queue_slot: int
    queue_offset: int
    """The queue slot's next offset before the put (restore it if ``queue_slot`` >= 0)."""


def interrupted(table: PointerTable) -> Interrupted | None:
    """After a takeover (put lock held): the dead holder's put to undo, or None when there is
    none (no journal, or the put committed). `close` it once undone."""
    if not table.get(layout.JOURNAL_ACTIVE):
        return None
    wrote = table.get(layout.WROTE_POSITION)
    if wrote != table.get(layout.JOURNAL_WROTE_BEFORE):
        return None
    return Interrupted(
        wrote,
        table.get(layout.JOURNAL_WROTE_AFTER),
        table.get(layout.JOURNAL_QUEUE_SLOT),
        table.get(layout.JOURNAL_QUEUE_OFFSET_BEFORE),
    )


def close(table: PointerTable) -> None:
    """The journal is no longer needed (undone, or committed by its dead writer)."""
    table.set(layout.JOURNAL_ACTIVE, 0)
