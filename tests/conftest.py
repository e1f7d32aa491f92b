"""Shared fixtures: the vendored RocketMQ 4.9.8 stores, per-test store dirs and configs.

Every test gets its own directories under pytest's tmp_path, so tests are safe under
``pytest -n auto``.
"""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig

FIXTURE_TARBALL = Path(__file__).parent / "fixtures" / "rocketmq-4.9.8.tar.xz"
HA_FIXTURE_TARBALL = Path(__file__).parent / "fixtures" / "rocketmq-4.9.8-ha.tar.xz"

# Settings the fixture stores were written with (their README).
FIXTURE_SETTINGS = {
    "mapped_file_size_commit_log": 1048576,
    "mapped_file_size_consume_queue": 20000,
    "max_hash_slot_num": 1000,
    "max_index_num": 4000,
}


PUT_PATH_TESTS = (
    "tests/unit/test_native_core.py",
    "tests/integration/test_put_path.py",
    "tests/integration/test_put_properties.py",
    "tests/integration/test_service.py",
    "tests/integration/test_arguments.py",
    "tests/integration/test_hostile_input.py",
    "tests/integration/test_capacities.py",
    "tests/integration/test_native_send.py",
    "tests/integration/test_producer_threads.py",
    "tests/crash/test_kill_matrix.py",
    "tests/crash/test_fence.py",
    "tests/crash/test_power_loss.py",
    "tests/crash/test_fsync_failure.py",
    "tests/crash/test_slow_flush.py",
)
"""Marked ``put_path``: the README's test command runs them again with RMQ_PURE_PYTHON=1, so the
Python reference put path (and the semaphore put lock) stays tested beside the compiled core."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath)
    for item in items:
        where = item.path.relative_to(root).as_posix()
        if where.startswith(PUT_PATH_TESTS):
            item.add_marker(pytest.mark.put_path)


@pytest.fixture(autouse=True)
def _no_store_left_behind() -> Iterator[None]:
    """Whatever happens in a test, no store process, segment or semaphore outlives it."""
    yield
    from tests.service import cleanup_started

    cleanup_started()


@pytest.fixture(scope="session")
def rocketmq_fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture folder (stores, messages.jsonl, queues.txt), extracted once per worker.
    Tests must not modify it: use `clean_store_copy` / `crashed_store_copy` to write."""
    target = tmp_path_factory.mktemp("rocketmq-fixtures")
    with tarfile.open(FIXTURE_TARBALL) as tar:
        tar.extractall(target, filter="data")
    return target / "rocketmq-4.9.8"


@pytest.fixture(scope="session")
def ha_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded RocketMQ 4.9.8 replication exchange (transcript.jsonl, master-store,
    slave-store; its README), extracted once per worker. Read only."""
    target = tmp_path_factory.mktemp("rocketmq-ha-fixture")
    with tarfile.open(HA_FIXTURE_TARBALL) as tar:
        tar.extractall(target, filter="data")
    return target / "rocketmq-4.9.8-ha"


@pytest.fixture
def fixture_config() -> MessageStoreConfig:
    return MessageStoreConfig().replace(**FIXTURE_SETTINGS)


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dst


@pytest.fixture
def clean_store_copy(rocketmq_fixtures: Path, tmp_path: Path) -> Path:
    return _writable_copy(rocketmq_fixtures / "clean-store", tmp_path / "clean-store")


@pytest.fixture
def crashed_store_copy(rocketmq_fixtures: Path, tmp_path: Path) -> Path:
    return _writable_copy(rocketmq_fixtures / "crashed-store", tmp_path / "crashed-store")


@pytest.fixture
def small_config(tmp_path: Path) -> MessageStoreConfig:
    """A store with small files so tests roll commit-log, queue and index files quickly."""
    return MessageStoreConfig().replace(
        store_path_root_dir=str(tmp_path / "store"),
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 100,
        max_hash_slot_num=64,
        max_index_num=200,
    )
