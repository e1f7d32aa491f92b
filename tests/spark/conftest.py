"""One local Spark session per test process, shared by every Spark test (start-up is 8-10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SKIP_REASON = "pyspark is not installed: install the [spark] extra (pip install -e '.[test,spark]')"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark", reason=SKIP_REASON)
    from rmq_mp.spark.session import local_session

    session = local_session(
        "rmq-mp tests",
        master="local[2]",
        work_dir=tmp_path_factory.mktemp("spark"),
        fast_start=True,
        extra={"spark.driver.memory": "1g"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def clean_store(rocketmq_fixtures: Path) -> Path:
    """The RocketMQ 4.9.8 clean store (read only)."""
    return rocketmq_fixtures / "clean-store"
