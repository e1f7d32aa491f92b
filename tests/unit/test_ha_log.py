"""config/haLog.json (rmq_mp/store/ha_log.py): what a start decides from it, and hostile files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from rmq_mp.store import fork, ha_log
from rmq_mp.store.ha_log import LogRecord

MASTER = "127.0.0.1:7001"


def _slave(root: Path, master: str = MASTER) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=str(root), broker_role=BrokerRole.SLAVE, ha_master_address=master
    )


def test_a_slave_confirmed_for_its_master_is_not_capped(tmp_path: Path) -> None:
    ha_log.write(tmp_path, LogRecord("SLAVE", MASTER, None))
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 0, 5000) == -1
    assert ha_log.start_window(_slave(tmp_path, f" {MASTER}"), tmp_path, 0, 5000) == -1  # same address
    assert ha_log.stopped_read_end(tmp_path) == -1


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (None, "no readable"),
        (LogRecord("ASYNC_MASTER"), "last run was a ASYNC_MASTER"),
        (LogRecord("SLAVE", "127.0.0.1:7002", None), "it followed 127.0.0.1:7002"),
    ],
)
def test_a_log_not_confirmed_for_this_master_is_capped_at_its_first_byte(
    tmp_path: Path, record: LogRecord | None, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    if record is not None:
        ha_log.write(tmp_path, record)
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 1024, 5000) == 1024
    assert why in caplog.text
    assert ha_log.load(tmp_path) == LogRecord("SLAVE", MASTER, 1024)
    assert ha_log.stopped_read_end(tmp_path) == 1024


def test_a_confirmed_offset_caps_there_and_one_at_the_end_confirms_all(tmp_path: Path) -> None:
    ha_log.write(tmp_path, LogRecord("SLAVE", MASTER, 3000))
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 0, 5000) == 3000
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 0, 3000) == -1  # cut at the fork: all compared
    assert ha_log.load(tmp_path) == LogRecord("SLAVE", MASTER, None)


def test_an_empty_log_is_confirmed_and_a_master_start_retires_a_slave_record(tmp_path: Path) -> None:
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 0, 0) == -1
    assert ha_log.load(tmp_path) == LogRecord("SLAVE", MASTER, None)
    master = MessageStoreConfig(store_path_root_dir=str(tmp_path), broker_role=BrokerRole.SYNC_MASTER)
    assert ha_log.start_window(master, tmp_path, 0, 100) == -1
    assert ha_log.load(tmp_path) == LogRecord("SYNC_MASTER")
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 0, 100) == 0


def test_a_slave_without_a_master_address_is_not_capped(tmp_path: Path) -> None:
    config = MessageStoreConfig(store_path_root_dir=str(tmp_path), broker_role=BrokerRole.SLAVE)
    assert ha_log.start_window(config, tmp_path, 0, 100) == -1


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"[]",
        b'{"brokerRole": "SLAVE", "haMasterAddress": "127.0.0.1:7001", "confirmed": -5}',
        b'{"brokerRole": "SLAVE", "haMasterAddress": "127.0.0.1:7001", "confirmed": true}',
        b'{"brokerRole": "SLAVE", "haMasterAddress": 7, "confirmed": "all"}',
        b'{"brokerRole": "KING"}',
        b"\xff\xfe{",
    ],
)
def test_a_damaged_record_confirms_nothing(tmp_path: Path, content: bytes) -> None:
    path = ha_log.path_of(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert ha_log.load(tmp_path) is None
    assert ha_log.start_window(_slave(tmp_path), tmp_path, 0, 100) == 0


def test_a_changed_byte_is_caught_by_the_checksum(tmp_path: Path) -> None:
    ha_log.write(tmp_path, LogRecord("SLAVE", MASTER, 3000))
    path = ha_log.path_of(tmp_path)
    path.write_text(path.read_text().replace("3000", "4000"))
    path.with_name(path.name + ".bak").unlink()
    assert ha_log.load(tmp_path) is None


def test_a_stopped_store_stops_at_a_pending_cut(tmp_path: Path) -> None:
    ha_log.write(tmp_path, LogRecord("SLAVE", MASTER, 3000))
    (tmp_path / fork.PENDING_CUT).write_text(json.dumps({"fork_offset": 2000, "end": 5000, "folder": "x"}))
    assert ha_log.stopped_read_end(tmp_path) == 2000
    (tmp_path / fork.PENDING_CUT).write_text("{")
    assert ha_log.stopped_read_end(tmp_path) == 3000
