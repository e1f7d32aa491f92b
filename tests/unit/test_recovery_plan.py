"""Recovery's first step is a value (`RecoveryPlan`): which files the pass checks and where
dispatch must replay from, decided before anything is cut. Built here on real stores, after a
clean close, after a crash, and with a damaged queue file (issue 30: `recover` as named steps)."""

from __future__ import annotations

from pathlib import Path

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format.queue_entry import CQ_ENTRY, CQ_STORE_UNIT_SIZE
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.recovery import RecoveryPlan, plan_recovery
from tests.store_content import make_messages


def write(config: MessageStoreConfig, count: int, *, crash: bool) -> None:
    store = MessageStore.open(config=config)
    for msg in make_messages(count, 7):
        store.put_message(msg)
    store.flush()
    if crash:
        store._release()  # `abort` stays, as after a kill -9
    else:
        store.close()


def plan_of(config: MessageStoreConfig) -> tuple[RecoveryPlan, MessageStore]:
    """The plan `MessageStore.open` would make (a writable store: damage is checked for only
    where it can be rebuilt). The caller releases the store."""
    store = MessageStore(config, read_only=False)
    last_exit_ok = not store.paths.abort.exists()
    store._take_lock()
    store.commit_log.load()
    store.cq_table.load()
    assert store.index_service is not None
    store.index_service.load()
    return plan_recovery(store, last_exit_ok=last_exit_ok), store


def test_a_clean_close_checks_the_last_three_files_and_replays_nothing_dispatched(
    small_config: MessageStoreConfig,
) -> None:
    write(small_config, 2000, crash=False)
    plan, store = plan_of(small_config)
    try:
        files = store.commit_log.mfq.files
        assert len(files) > 3
        assert plan.last_exit_ok
        assert plan.start_file_index == len(files) - 3
        assert plan.scan_from_offset == files[-3].file_from_offset
        assert plan.repair_from_offset is None
        assert plan.replay_from_offset == plan.max_queue_end > plan.scan_from_offset
    finally:
        store._release()


def test_a_crash_replays_from_the_file_the_checkpoint_chooses(small_config: MessageStoreConfig) -> None:
    write(small_config, 2000, crash=True)
    plan, store = plan_of(small_config)
    try:
        assert not plan.last_exit_ok
        assert plan.replay_from_offset == plan.scan_from_offset
        assert plan.scan_from_offset == store.commit_log.mfq.files[plan.start_file_index].file_from_offset
    finally:
        store._release()


def test_a_damaged_queue_file_moves_the_replay_back_to_its_first_lost_record(
    small_config: MessageStoreConfig,
) -> None:
    write(small_config, 2000, crash=False)
    queue_dir = Path(small_config.store_path_root_dir) / "consumequeue"
    first = sorted(p for p in queue_dir.rglob("*") if p.is_file())[0]
    data = bytearray(first.read_bytes())
    phy, size, _tags = CQ_ENTRY.unpack_from(data, 4 * CQ_STORE_UNIT_SIZE)
    data[5 * CQ_STORE_UNIT_SIZE : 6 * CQ_STORE_UNIT_SIZE] = b"\xff" * CQ_STORE_UNIT_SIZE  # entry 5
    first.write_bytes(bytes(data))
    plan, store = plan_of(small_config)
    try:
        assert plan.last_exit_ok
        assert plan.repair_from_offset == phy + size  # the end of the last entry kept (entry 4)
        assert plan.repair_from_offset is not None
        assert plan.replay_from_offset == plan.repair_from_offset < plan.scan_from_offset
    finally:
        store._release()
