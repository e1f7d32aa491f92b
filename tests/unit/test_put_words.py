"""PutWords: the put path's pointer-table words by name, checked for the producer role."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from shm import layout
from shm.layout import Role
from shm.pointer_table import PointerTable
from shm.put_words import STORED, Journal, PutWords
from shm.segment import SharedSegment


@pytest.fixture
def table_name() -> Iterator[str]:
    name = f"/rmqtest_putwords_{os.getpid()}_{time.monotonic_ns()}"
    created = PointerTable.create(name)
    created.set(layout.STATE, layout.RUNNING)  # past STARTING: the writer check applies to all
    try:
        yield name
    finally:
        created.close()
        SharedSegment.unlink(name)


def test_a_journalled_append_reads_back_by_name(table_name: str) -> None:
    table = PointerTable.attach(table_name, Role.PRODUCER)
    try:
        words = PutWords(table)
        assert words.state() == layout.RUNNING
        assert words.open_journal() is None
        words.journal_begin(100, 180, 3, 41)
        assert words.open_journal() == Journal(100, 180, 3, 41)
        assert words.wrote_position() == 0, "the write position moves only at the commit"
        words.journal_commit(180)
        words.count_puts(1234, records=2, size_bytes=80)
        words.count_puts(1240, records=1, size_bytes=20)
        assert words.open_journal() is None
        assert (
            table.get(layout.WROTE_POSITION),
            table.get(layout.PUT_COUNT),
            table.get(layout.PUT_BYTES),
        ) == (
            180,
            3,
            100,
        )
        assert table.get(layout.LAST_STORE_TIMESTAMP) == 1240
        assert words.dispatch_lag() == 180
        assert PutWords.native_indexes(("WROTE_POSITION",)) == {"WROTE_POSITION": layout.WROTE_POSITION.index}
    finally:
        table.close()


@pytest.mark.parametrize("role", [r for r in Role if r not in (Role.PRODUCER, Role.SUPERVISOR)])
def test_only_a_producer_may_hold_the_put_paths_words(table_name: str, role: Role) -> None:
    table = PointerTable.attach(table_name, role)
    try:
        with pytest.raises(PermissionError, match="may not write"):
            PutWords(table)
    finally:
        table.close()


def test_every_stored_field_is_a_producer_field_under_the_put_lock() -> None:
    for field in STORED:
        assert field.writers == {Role.PRODUCER}, field.name
        assert field.lock is layout.Lock.PUT, field.name
