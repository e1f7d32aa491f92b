"""Shared int64 fields are never read torn across processes (issue 6, found by `python -m bench`).

`struct.pack_into`/`unpack_from` copy a value byte by byte, so a reader in another process could
see half of a new value: the SYNC put path read FLUSHED_POSITION as 0 or as a value below an
offset the flusher had already completed. Pointer-table and slot-table fields are now single
8-byte loads and stores. A writer process raises a field through values whose low bytes carry
on every step while this process reads it: the value must never go backwards."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from shm import layout
from shm.flush_requests import NEXT_OFFSET, FlushRequestRing
from shm.layout import Role
from shm.pointer_table import PointerTable
from tests.service import wait_until

STEP = 0x1_0000_00FF  # every step carries across bytes 0-1 and 4
DURATION_S = 1.0


def _raise_fields(table_name: str, ring_name: str, stop_at: float) -> None:
    table = PointerTable.attach(table_name, Role.SUPERVISOR)  # table state STARTING: any field
    ring = FlushRequestRing.attach(ring_name, Role.PRODUCER)
    value = 0
    while time.monotonic() < stop_at:
        for _ in range(1000):
            value += STEP
            table.set(layout.FLUSHED_POSITION, value)
            ring.set(3, NEXT_OFFSET, value)
    table.close()
    ring.close()


def test_fields_written_by_one_process_never_read_backwards_in_another() -> None:
    suffix = f"{os.getpid()}_{time.monotonic_ns()}"
    table = PointerTable.create(f"/rmqtest_words_ptr_{suffix}")
    ring = FlushRequestRing.create(f"/rmqtest_words_ring_{suffix}", 8)
    try:
        writer = mp.get_context("spawn").Process(
            target=_raise_fields,
            args=(table.segment.name, ring.segment.name, time.monotonic() + 5 + DURATION_S),
        )
        writer.start()
        wait_until(lambda: table.get(layout.FLUSHED_POSITION) != 0, 60, "the writer to begin")
        backwards = reads = 0
        last_table = last_ring = 0
        deadline = time.monotonic() + DURATION_S
        while time.monotonic() < deadline:
            for _ in range(1000):
                a = table.get(layout.FLUSHED_POSITION)
                b = ring.get(3, NEXT_OFFSET)
                backwards += (a < last_table) + (b < last_ring) + (a % STEP != 0) + (b % STEP != 0)
                last_table, last_ring = max(a, last_table), max(b, last_ring)
                reads += 2
        writer.kill()
        writer.join(10)
        assert reads > 10_000
        assert backwards == 0, f"{backwards} torn reads in {reads}"
    finally:
        for shared in (table, ring):
            name = shared.segment.name
            shared.close()
            shared.segment.unlink(name)
