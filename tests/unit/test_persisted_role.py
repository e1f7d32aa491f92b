"""What a promoted slave's start makes of its promotion record (workers/promotion.py
`persisted_role`): the promoted role while broker.conf still names the same master and that
master is silent; broker.conf's SLAVE when the record is unreadable or names another master;
a refused start while the old master answers (two masters would fork the log)."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from rmq_mp.errors import StoreError
from workers.promotion import persisted_role, promotion_path


@pytest.fixture
def silent_address() -> str:
    """host:port where nothing listens (a port just bound and closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def answering_address() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def slave_config(root: Path, master: str, role: str = "SLAVE") -> MessageStoreConfig:
    return MessageStoreConfig.from_properties(
        {"storePathRootDir": str(root), "brokerRole": role, "haMasterAddress": master}, source="test"
    )


def record(config: MessageStoreConfig, text: str) -> None:
    path = promotion_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def promoted(master: str, role: str = "SYNC_MASTER") -> str:
    return json.dumps({"brokerRole": role, "haMasterAddress": master, "promotedAtMs": 1, "wrotePosition": 0})


def test_without_a_record_or_as_a_master_broker_conf_decides(tmp_path: Path, silent_address: str) -> None:
    config = slave_config(tmp_path, silent_address)
    assert persisted_role(config) is config
    master = slave_config(tmp_path, silent_address, role="ASYNC_MASTER")
    record(master, promoted(silent_address))
    assert persisted_role(master) is master, "only a SLAVE's start reads the record"


def test_a_record_of_the_same_silent_master_makes_it_the_promoted_role(
    tmp_path: Path, silent_address: str
) -> None:
    config = slave_config(tmp_path, silent_address)
    record(config, promoted(silent_address, "ASYNC_MASTER"))
    assert persisted_role(config).broker_role is BrokerRole.ASYNC_MASTER


@pytest.mark.parametrize(
    "text", ["{not json", json.dumps({"brokerRole": "CAPTAIN", "haMasterAddress": "x:1"}), json.dumps([1])]
)
def test_an_unreadable_record_starts_it_as_broker_conf_says_and_says_so(
    tmp_path: Path, silent_address: str, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = slave_config(tmp_path, silent_address)
    record(config, text)
    with caplog.at_level(logging.ERROR, logger="rmq_mp.supervisor"):
        assert persisted_role(config).broker_role is BrokerRole.SLAVE
    assert "is unreadable" in caplog.text


def test_a_record_of_another_master_is_ignored_with_a_warning(
    tmp_path: Path, silent_address: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = slave_config(tmp_path, silent_address)
    record(config, promoted("127.0.0.1:1"))
    with caplog.at_level(logging.WARNING, logger="rmq_mp.supervisor"):
        assert persisted_role(config).broker_role is BrokerRole.SLAVE
    assert f"broker.conf now names {silent_address}: starting as a SLAVE" in caplog.text


def test_the_start_is_refused_while_the_old_master_answers(tmp_path: Path, answering_address: str) -> None:
    config = slave_config(tmp_path, answering_address)
    record(config, promoted(answering_address))
    with pytest.raises(StoreError, match="rmq-admin demote"):
        persisted_role(config)
