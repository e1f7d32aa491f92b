"""The put's cache lines (shm/layout.py, bench/NOTES.md "the put lock's cache lines"): what a put
writes under the lock shares one 64-byte line of the pointer table that no worker writes, and the
lock word is alone in its line, so that spinning waiters do not pull the holder's line. A field
added to either line later would cost every put on a many-core machine; this says so at once."""

from __future__ import annotations

from shm import layout
from shm.layout import Field, Role

LINE_WORDS = 8


def _line(field: Field) -> int:
    return field.index // LINE_WORDS


def _fields() -> list[Field]:
    return [v for v in vars(layout).values() if isinstance(v, Field)]


PER_PUT = [
    layout.WROTE_POSITION,
    layout.PUT_COUNT,
    layout.PUT_BYTES,
    layout.FLUSH_REQUEST_SEQ,
    layout.JOURNAL_ACTIVE,
    layout.LAST_STORE_TIMESTAMP,
    layout.PUT_LOCK_SINCE_MS,
]
"""What the compiled core's `append_locked` writes at every put, besides the journal's words."""


def test_a_puts_fields_share_one_line_that_no_worker_writes() -> None:
    assert {_line(f) for f in PER_PUT} == {_line(layout.WROTE_POSITION)}
    for field in _fields():
        if _line(field) == _line(layout.WROTE_POSITION):
            assert field.writers <= {Role.PRODUCER, Role.HA}, f"{field.name}: a worker writes the put's line"


def test_the_lock_word_is_alone_in_its_line() -> None:
    lock = layout.PUT_LOCK_OWNER_PID
    assert [f.name for f in _fields() if _line(f) == _line(lock)] == [lock.name]


def test_the_journal_is_one_line() -> None:
    journal = [
        layout.JOURNAL_WROTE_BEFORE,
        layout.JOURNAL_WROTE_AFTER,
        layout.JOURNAL_QUEUE_SLOT,
        layout.JOURNAL_QUEUE_OFFSET_BEFORE,
    ]
    assert len({_line(f) for f in journal}) == 1
