"""Every reader that checks a body CRC checks the whole-record CRC too (issue 35): a record whose
FLAG, STORETIMESTAMP or a property byte was damaged (fields the body CRC does not cover) is
skipped and reported as a body-CRC failure by a pull, rmq-admin, the Spark source and the Spark
audit, and everything else is served as before. No store processes: the library store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_mp.format import record
from rmq_mp.store.message_store import MessageStore
from rmq_mp.tools.admin import main as admin_main
from tests.integration.test_read_damage import (
    ADMIN_SETTINGS,
    COUNT,
    QUEUES,
    TOPIC,
    Written,
    drain,
    expected,
    log_file,
    served,
    store_config,
    write_store,
)


def damage(written: list[Written], config_root: Path) -> dict[tuple[int, int], Written]:
    """FLAG of (0, 7), STORETIMESTAMP of (1, 12), the TAGS value of (0, 33): one byte each."""
    config = store_config(config_root)
    by_offset = {(w.queue_id, w.queue_offset): w for w in written}
    victims = {(0, 7): 16, (1, 12): record.store_timestamp_position(0) + 7, (0, 33): None}
    for key, at in victims.items():
        w = by_offset[key]
        path = log_file(config, w.phy_offset)
        start = w.phy_offset - int(path.name)
        data = path.read_bytes()
        if at is None:
            at = data.index(b"TAGS\x01TagA", start, start + w.size) + 6 - start  # "TagA" -> "TbgA"
        with path.open("r+b") as f:
            f.seek(start + at)
            f.write(bytes([data[start + at] ^ 0x03]))
    return {key: by_offset[key] for key in victims}


def test_a_pull_and_rmq_admin_skip_a_record_damaged_outside_its_body(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = store_config(tmp_path / "store")
    written = write_store(config)
    assert all(w.size > 0 for w in written)
    with MessageStore.open(config=config) as store:  # damaged while open: recovery would cut there
        victims = damage(written, tmp_path / "store")
        for queue_id in range(QUEUES):
            bad = {offset for (q, offset) in victims if q == queue_id}
            assert served(drain(store.get_message, queue_id, max_msgs=16)) == expected(
                written, queue_id, without=bad
            )
        findings = sorted((d for d in store.reporter.findings), key=lambda d: d.start)
        assert [(d.kind, d.start, d.end) for d in findings] == sorted(
            ("record-crc-failed", w.phy_offset, w.phy_offset + w.size) for w in victims.values()
        )
        assert all("__CRC32#" in d.reason for d in findings)
    # rmq-admin, after a clean stop (recovery scans the last 3 files: the first is not among them)
    store_args = ["--store", config.store_path_root_dir, *ADMIN_SETTINGS]
    assert admin_main(["queryMsgById", *store_args, "--id", victims[(0, 7)].msg_id]) == 2
    assert "__CRC32#" in capsys.readouterr().err
    by_offset = ["queryMsgByOffset", *store_args, "--topic", TOPIC, "--queue", "1", "--offset", "12"]
    assert admin_main(by_offset) == 2
    assert "__CRC32#" in capsys.readouterr().err


def test_the_spark_source_and_audit_skip_and_report_it(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    from rmq_mp.spark.segments import audit_segment, list_segments
    from rmq_mp.spark.source import REPORTER, QueueSlice, read_slice
    from rmq_mp.spark.store_files import resolve_store

    config = store_config(tmp_path / "store")
    written = write_store(config)
    victims = damage(written, tmp_path / "store")
    ref = resolve_store(config.store_path_root_dir)
    for queue_id in range(QUEUES):
        part = QueueSlice(ref, TOPIC, queue_id, 0, COUNT // QUEUES)
        rows = [
            row
            for batch in read_slice(part, include_properties=True)
            for row in batch.select(["queue_id", "queue_offset", "body", "properties"]).to_pylist()
        ]
        bad = {offset for (q, offset) in victims if q == queue_id}
        assert [(r["queue_id"], r["queue_offset"], r["body"]) for r in rows] == expected(
            written, queue_id, without=bad
        )
        assert all("__CRC32#" not in dict(r["properties"]) for r in rows), "checked, not served"
    mine = sorted((d for d in REPORTER.findings if d.path.startswith(str(tmp_path))), key=lambda d: d.start)
    assert [(d.kind, d.start) for d in mine] == sorted(
        ("record-crc-failed", w.phy_offset) for w in victims.values()
    )
    errors = [phy for seg in list_segments(config.commit_log_dir) for phy, _why in audit_segment(seg).errors]
    assert errors == sorted(w.phy_offset for w in victims.values())
