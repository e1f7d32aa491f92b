"""rmq-mp reads, recovers and indexes stores written by the real RocketMQ 4.9.8 engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format.message import TRANSACTION_ROLLBACK_TYPE, split_keys
from rmq_mp.store.message_store import MessageStore
from rmq_mp.tools.audit import digest_report


def _expected(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _tree_digest(root: Path, sub: str) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


def test_clean_store_digests_match_rocketmq(
    rocketmq_fixtures: Path, fixture_config: MessageStoreConfig
) -> None:
    with MessageStore.open(rocketmq_fixtures / "clean-store", fixture_config, read_only=True) as store:
        assert digest_report(store) == _expected(rocketmq_fixtures / "clean-store.queues.txt")
        assert store.reporter.findings == []


def test_clean_store_normal_recovery_changes_no_data_file(
    clean_store_copy: Path, fixture_config: MessageStoreConfig
) -> None:
    before = {sub: _tree_digest(clean_store_copy, sub) for sub in ("commitlog", "consumequeue", "index")}
    with MessageStore.open(clean_store_copy, fixture_config) as store:
        assert store.recovery is not None
        assert not store.recovery.abnormal
        assert store.recovery.recovered_end_offset == 8_356_744
        assert store.recovery.records_dispatched == 0
        assert (clean_store_copy / "abort").exists()
    assert not (clean_store_copy / "abort").exists()
    after = {sub: _tree_digest(clean_store_copy, sub) for sub in ("commitlog", "consumequeue", "index")}
    assert after == before


def test_crashed_store_abnormal_recovery_matches_rocketmq(
    rocketmq_fixtures: Path, crashed_store_copy: Path, fixture_config: MessageStoreConfig
) -> None:
    with MessageStore.open(crashed_store_copy, fixture_config) as store:
        report = store.recovery
        assert report is not None
        assert report.abnormal
        assert report.recovered_end_offset == 4_887_764
        assert report.commit_log_bytes_dropped == 0
        assert digest_report(store) == _expected(rocketmq_fixtures / "crashed-store.queues.txt")
    # The pre-allocated all-zero file above the data is removed, as RocketMQ does.
    assert sorted(p.name for p in (crashed_store_copy / "commitlog").iterdir())[-1] == "00000000000004194304"
    # A second open is a normal recovery with nothing left to do.
    with MessageStore.open(crashed_store_copy, fixture_config) as store:
        assert store.recovery is not None
        assert not store.recovery.abnormal
        assert store.recovery.records_dispatched == 0
        assert digest_report(store) == _expected(rocketmq_fixtures / "crashed-store.queues.txt")


def test_crashed_store_index_has_every_key_once(
    crashed_store_copy: Path, fixture_config: MessageStoreConfig
) -> None:
    """RocketMQ's rebuild leaves 9,748 entries for 9,746 keys; rmq-mp adds none twice."""
    with MessageStore.open(crashed_store_copy, fixture_config) as store:
        assert store.index_service is not None
        entries = [e for f in store.index_service.files for e in f.entries()]
        assert len(entries) == 9_746
        assert len({(h, phy) for h, phy, _t, _p in entries}) <= 9_746


def _fixture_messages(rocketmq_fixtures: Path) -> list[dict]:
    with (rocketmq_fixtures / "clean-store.messages.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_every_key_of_clean_store_is_found_through_the_index(
    rocketmq_fixtures: Path, fixture_config: MessageStoreConfig
) -> None:
    messages = _fixture_messages(rocketmq_fixtures)
    checked = 0
    with MessageStore.open(rocketmq_fixtures / "clean-store", fixture_config, read_only=True) as store:
        for msg in messages:
            if msg["sysFlag"] & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE:
                continue
            keys = split_keys(msg["keys"])
            uniq = msg["properties"].get("UNIQ_KEY")
            for key in [*keys, *([uniq] if uniq else [])]:
                ts = msg["storeTimestamp"]
                found = store.query_message(msg["topic"], key, 64, ts - 1000, ts + 1000)
                assert msg["commitLogOffset"] in {m.commit_log_offset for m in found}, (msg["topic"], key)
                assert all(m.topic == msg["topic"] for m in found)
                assert all(key == m.uniq_key or key in split_keys(m.keys) for m in found)
                checked += 1
    assert checked == 6_006 + 10_838 - sum(
        len(split_keys(m["keys"])) + ("UNIQ_KEY" in m["properties"])
        for m in messages
        if m["sysFlag"] & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE
    )


def test_clean_store_records_decode_as_rocketmq_decoded_them(
    rocketmq_fixtures: Path, fixture_config: MessageStoreConfig
) -> None:
    messages = _fixture_messages(rocketmq_fixtures)
    with MessageStore.open(rocketmq_fixtures / "clean-store", fixture_config, read_only=True) as store:
        decoded = list(store.iter_messages())
    assert len(decoded) == len(messages) == 12_000
    for ours, ref in zip(decoded, messages, strict=True):
        assert ours.commit_log_offset == ref["commitLogOffset"] == ours.file_position
        assert (ours.topic, ours.queue_id, ours.queue_offset) == (
            ref["topic"],
            ref["queueId"],
            ref["queueOffset"],
        )
        assert ours.body.hex() == ref["body"]
        assert ours.properties == ref["properties"]
        assert ours.msg_id == ref["msgId"]
        assert (ours.flag, ours.sys_flag, ours.store_size) == (ref["flag"], ref["sysFlag"], ref["storeSize"])
