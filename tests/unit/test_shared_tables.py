"""The shared tables against plain models (issue 17): the keyed offset tables against a dict,
the consumer table against a set of live pids, and the layouts' self-checks.

The keyed tables are checked by hypothesis state machines on small capacities (so probes
collide and the capacity edge is met often), with keys up to the longest RocketMQ allows
(a 127-byte topic, ``topic@group`` with a 255-character group), read through two views of the
segment (each with its own caches, as two processes have) and, at the end, by a second process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rmq_mp.config.store_config import MAX_TRANSIENT_STORE_POOL_SIZE, MessageStoreConfig
from rmq_mp.errors import ConfigError, OffsetTableFullError
from shm import layout
from shm import queue_offsets as qo
from shm import waiters as wt
from shm.flush_requests import FlushRequestRing
from shm.layout import Role
from shm.queue_offsets import GroupOffsetTable, KeyedOffsetTable, QueueOffsetTable
from shm.slot_table import Writers, check_slot_layout
from shm.waiters import WaiterTable

_names = iter(range(1 << 30))


def _segment_name(what: str) -> str:
    return f"/rmqtest_{what}_{os.getpid()}_{time.monotonic_ns()}_{next(_names)}"


LONGEST_TOPIC = "t" * 127
LONGEST_TOPIC_MULTIBYTE = "主" * 42 + "x"  # 42 x 3 + 1 = 127 UTF-8 bytes
LONGEST_GROUP = "g" * 255
topics = st.one_of(
    st.sampled_from(["Orders", "%RETRY%cg", LONGEST_TOPIC, LONGEST_TOPIC_MULTIBYTE, "主题-τ"]),
    st.text(st.characters(codec="utf-8", exclude_characters="@"), min_size=1, max_size=40),
)
groups = st.one_of(
    st.sampled_from(["cg", LONGEST_GROUP]), st.from_regex(r"[A-Za-z0-9_%|-]{1,30}", fullmatch=True)
)
queue_ids = st.one_of(st.integers(0, 7), st.integers(0, 2**31 - 1))
offsets = st.integers(-(2**63), 2**63 - 1)


class KeyedTableMachine(RuleBasedStateMachine):
    """A keyed offset table is a dict from (key, queue id) to a slot whose fields hold values."""

    table_class: type[KeyedOffsetTable] = QueueOffsetTable
    value_field = qo.NEXT_OFFSET
    writer = Role.PRODUCER

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[KeyedOffsetTable] = []

    @initialize(capacity=st.integers(1, 24))
    def create(self, capacity: int) -> None:
        self.owner = self.table_class.create(_segment_name("keyed"), capacity)
        self.reader = self.table_class.attach(
            self.owner.segment.name, self.writer
        )  # a second view, own caches
        self.tables = [self.owner, self.reader]
        self.model: dict[tuple[str, int], int] = {}

    def teardown(self) -> None:
        if self.tables:
            from shm.segment import SharedSegment

            name = self.owner.segment.name
            for table in self.tables:
                table.close()
            SharedSegment.unlink(name)

    def key(self, data: st.DataObject) -> str:
        return data.draw(topics)

    @rule(data=st.data(), queue_id=queue_ids, value=offsets)
    def insert_and_set(self, data: st.DataObject, queue_id: int, value: int) -> None:
        key = self.key(data)
        if (key, queue_id) not in self.model and len(self.model) == self.owner.capacity:
            with pytest.raises(OffsetTableFullError, match=self.table_class.SETTING):
                self.owner.find_or_insert(key, queue_id)
            assert self.reader.find(key, queue_id) == -1
            return
        slot = self.owner.find_or_insert(key, queue_id)
        self.owner.set(slot, self.value_field, value)
        self.model[(key, queue_id)] = value

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), value=offsets)
    def update_through_the_reader(self, data: st.DataObject, value: int) -> None:
        key, queue_id = data.draw(st.sampled_from(sorted(self.model)))
        slot = self.reader.find(key, queue_id)
        assert slot >= 0
        assert self.reader.find_or_insert(key, queue_id) == slot  # found, not inserted twice
        self.reader.set(slot, self.value_field, value)
        self.model[(key, queue_id)] = value

    @rule(data=st.data(), queue_id=queue_ids)
    def find_absent(self, data: st.DataObject, queue_id: int) -> None:
        key = self.key(data)
        if (key, queue_id) not in self.model:
            assert self.owner.find(key, queue_id) == -1
            assert self.reader.find(key, queue_id) == -1

    @invariant()
    def views_agree_with_the_model(self) -> None:
        for table in self.tables:
            assert table.used == len(self.model)
            assert sorted(table.used_slots().tolist()) == np.flatnonzero(table.column(qo.USED) == 1).tolist()
            entries = {
                (key, queue_id): table.get(slot, self.value_field) for key, queue_id, slot in table.queues()
            }
            assert entries == self.model
            for (key, queue_id), value in self.model.items():
                assert table.get(table.find(key, queue_id), self.value_field) == value
                assert (queue_id, table.find(key, queue_id)) in table.queues_of(key)


class GroupTableMachine(KeyedTableMachine):
    table_class = GroupOffsetTable
    value_field = qo.COMMITTED
    writer = Role.CONSUMER

    def key(self, data: st.DataObject) -> str:
        return f"{data.draw(topics)}@{data.draw(groups)}"


_SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
TestQueueOffsetTable = KeyedTableMachine.TestCase
TestQueueOffsetTable.settings = _SETTINGS
TestGroupOffsetTable = GroupTableMachine.TestCase
TestGroupOffsetTable.settings = _SETTINGS


# ---------------------------------------------------------------------------- a second process


def _read_table(name: str, kind: str, conn: mp.connection.Connection) -> None:
    table_class = GroupOffsetTable if kind == "group" else QueueOffsetTable
    table = table_class.attach(name, Role.CONSUMER)
    field = qo.COMMITTED if kind == "group" else qo.NEXT_OFFSET
    try:
        conn.send((table.capacity, table.used, {(k, q): table.get(s, field) for k, q, s in table.queues()}))
    finally:
        table.close()


@pytest.fixture
def group_table() -> Iterator[GroupOffsetTable]:
    table = GroupOffsetTable.create(_segment_name("groups"), 65536)
    yield table
    from shm.segment import SharedSegment

    table.close()
    SharedSegment.unlink(table.segment.name)


def test_three_groups_640_queues_read_back_exactly_in_another_process(group_table: GroupOffsetTable) -> None:
    """The issue's case: 3 groups commit for 40 topics x 16 queues. With the queue table's
    stride used on the group table, 129 of the 1,920 read back wrong and `queues()` raised
    UnicodeDecodeError past 1,024 entries."""
    model = {}
    for g in range(3):
        for t in range(40):
            for q in range(16):
                key = f"topic-{t}@group-{g}"
                slot = group_table.find_or_insert(key, q)
                group_table.set(slot, qo.COMMITTED, 1000 * g + 16 * t + q)
                model[(key, q)] = 1000 * g + 16 * t + q
    parent, child = mp.get_context("spawn").Pipe()
    reader = mp.get_context("spawn").Process(
        target=_read_table, args=(group_table.segment.name, "group", child)
    )
    reader.start()
    try:
        capacity, used, entries = parent.recv()
    finally:
        reader.join(30)
    assert (capacity, used) == (65536, 1920)
    assert entries == model


def test_the_longest_keys_fit_and_a_longer_one_is_refused_cleanly(group_table: GroupOffsetTable) -> None:
    key = f"{LONGEST_TOPIC_MULTIBYTE}@{LONGEST_GROUP}"
    assert len(key.encode()) == 127 + 1 + 255
    slot = group_table.find_or_insert(key, 3)
    assert [k for k, q, s in group_table.queues() if s == slot] == [key]
    with pytest.raises(ValueError, match="longer than"):
        group_table.find_or_insert(key + "x" * (group_table.KEY_BYTES - len(key.encode()) + 1), 3)
    assert group_table.used == 1


def test_a_full_table_names_its_setting_and_keeps_what_it_holds() -> None:
    from shm.segment import SharedSegment

    table = QueueOffsetTable.create(_segment_name("queues"), 3)
    try:
        slots = [table.find_or_insert("T", q) for q in range(3)]
        with pytest.raises(OffsetTableFullError, match=r"full \(3 entries\): raise maxConsumeQueueNum"):
            table.find_or_insert("T", 3)
        assert [table.find("T", q) for q in range(4)] == [*slots, -1]
        assert table.slots > table.capacity  # a full table still has free slots to end probes
    finally:
        table.close()
        SharedSegment.unlink(table.segment.name)


def test_a_large_table_holding_few_entries_takes_few_pages_even_when_scanned() -> None:
    """/dev/shm pages are allocated on first touch, reads included: scans go through the
    directory of used slots, so a 65,536-queue table holding 10 stays a few pages."""
    from shm.segment import SharedSegment

    table = QueueOffsetTable.create(_segment_name("pages"), 65536)
    try:
        for q in range(10):
            table.set(table.find_or_insert("T", q), qo.DISPATCHED, q)
        assert sorted(q for _k, q, _s in table.queues()) == list(range(10))
        assert [q for q, _s in table.queues_of("T")] == list(range(10))
        held = os.stat("/dev/shm" + table.segment.name).st_blocks * 512
        assert table.segment.size > 16 << 20
        assert held <= 12 * 4096, f"{held} bytes of /dev/shm for 10 entries"
    finally:
        table.close()
        SharedSegment.unlink(table.segment.name)


# ---------------------------------------------------------------------------- consumer table


class WaiterTableMachine(RuleBasedStateMachine):
    """Claims by live processes, releases, and deaths: a slot is claimable when free or dead."""

    def __init__(self) -> None:
        super().__init__()
        self.table: WaiterTable | None = None

    @initialize(capacity=st.integers(1, 12))
    def create(self, capacity: int) -> None:
        created = WaiterTable.create(_segment_name("waiters"), capacity)
        self.table = WaiterTable.attach(created.segment.name, Role.CONSUMER)  # consumers write it
        created.close()
        self.owners: dict[int, int] = {}  # slot -> pid
        self.alive: set[int] = set()
        self.waiting: set[int] = set()
        self.next_pid = 100

    def teardown(self) -> None:
        if self.table is not None:
            from shm.segment import SharedSegment

            self.table.close()
            SharedSegment.unlink(self.table.segment.name)

    def _alive(self, pid: int, _joined_ms: int) -> bool:
        return pid in self.alive

    @rule()
    def claim(self) -> None:
        assert self.table is not None
        free = [
            s for s in range(self.table.capacity) if s not in self.owners or self.owners[s] not in self.alive
        ]
        slot = next(iter(self.table.claimable_slots(self._alive)), None)
        if not free:
            assert slot is None
            return
        assert slot in free
        self.next_pid += 1
        self.table.set(slot, wt.PID, self.next_pid)
        self.owners[slot] = self.next_pid
        self.alive.add(self.next_pid)

    @precondition(lambda self: bool(self.owners))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        assert self.table is not None
        slot = data.draw(st.sampled_from(sorted(self.owners)))
        self.table.set(slot, wt.PID, 0)
        del self.owners[slot]

    @precondition(lambda self: bool(self.alive))
    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        self.alive.discard(data.draw(st.sampled_from(sorted(self.alive))))

    @rule(data=st.data(), parked=st.booleans())
    def park_or_wake(self, data: st.DataObject, parked: bool) -> None:
        """A consumer parks (WAITING 1), or reput wakes it (0), in any slot."""
        assert self.table is not None
        slot = data.draw(st.integers(0, self.table.capacity - 1))
        self.table.set(slot, wt.WAITING, int(parked))
        (self.waiting.add if parked else self.waiting.discard)(slot)

    @invariant()
    def parked_slots(self) -> None:
        """`waiting_slots` reads a view made once (`column_view`): it sees every later store,
        and the table still closes with it taken (teardown)."""
        if self.table is not None:
            assert self.table.waiting_slots() == sorted(self.waiting)

    @invariant()
    def counts_and_holders(self) -> None:
        if self.table is None:
            return
        assert self.table.live_slots() == len(self.owners)
        for slot in self.owners:
            self.table.set(slot, wt.HOLD, slot)
        holders = set(self.table.holders_below(self.table.capacity, self._alive))
        assert holders == {pid for pid in self.owners.values() if pid in self.alive}


TestWaiterTable = WaiterTableMachine.TestCase
TestWaiterTable.settings = _SETTINGS


def test_a_column_view_is_read_only_and_released_at_close() -> None:
    from shm.segment import SharedSegment

    created = WaiterTable.create(_segment_name("waiters"), 4)
    try:
        view = created.column_view(wt.WAITING)
        with pytest.raises(ValueError, match="read-only"):
            view[0] = 1
        del view
    finally:
        created.close()  # a view still cached would make the segment's release raise BufferError
        SharedSegment.unlink(created.segment.name)


# ---------------------------------------------------------------------------- layouts and settings


def test_layouts_refuse_overlapping_or_stray_fields() -> None:
    by = {"a": Writers(Role.PRODUCER), "b": Writers(Role.REPUT)}
    with pytest.raises(AssertionError, match="overlaps"):
        check_slot_layout("T", 32, {"a": 0, "b": 0}, writers=by)
    with pytest.raises(AssertionError, match="aligned word inside the slot"):
        check_slot_layout("T", 32, {"a": 28}, writers={"a": by["a"]})
    with pytest.raises(AssertionError, match="overlaps the key"):
        check_slot_layout("T", 64, {"a": 0, "b": 40}, writers=by, tail_from=40)
    with pytest.raises(AssertionError, match="writers declared for"):
        check_slot_layout("T", 32, {"a": 0, "b": 8}, writers={"a": by["a"]})
    with pytest.raises(AssertionError, match="names no writer"):
        check_slot_layout("T", 32, {"a": 0}, writers={"a": Writers()})
    layout.check_layout()  # the real pointer table passes
    indexes = [f.index for f in layout.all_fields()]
    assert len(indexes) == len(set(indexes))
    assert max(indexes) < layout.TABLE_SIZE // 8


def test_every_table_records_the_capacity_it_was_created_with() -> None:
    from shm.segment import SharedSegment

    for table_class, capacity in ((FlushRequestRing, 5), (WaiterTable, 7), (QueueOffsetTable, 9)):
        table = table_class.create(_segment_name("cap"), capacity)
        other = table_class.attach(table.segment.name, Role.CONSUMER)
        try:
            assert (table.capacity, other.capacity) == (capacity, capacity)
            assert table.segment.size == table_class.segment_bytes(capacity)
        finally:
            table.close()
            other.close()
            SharedSegment.unlink(table.segment.name)


def test_pool_size_is_bounded_by_the_pointer_tables_pool_slots() -> None:
    assert layout.POOL_SLOTS == MAX_TRANSIENT_STORE_POOL_SIZE
    MessageStoreConfig(transient_store_pool_size=32)
    with pytest.raises(ConfigError, match="transientStorePoolSize = 33: must be <= 32"):
        MessageStoreConfig(transient_store_pool_size=33)
    for key in (
        "max_consume_queue_num",
        "max_consumer_offset_num",
        "max_consumer_num",
        "max_sync_flush_request_num",
    ):
        zero: dict[str, Any] = {key: 0}  # one int field, named at run time
        with pytest.raises(ConfigError, match="must be >= 1"):
            MessageStoreConfig(**zero)
