"""Consumer offsets are never lost silently (issue 18, item 5).

A real store, written by the real service: messages in the commit log and the offsets of three
groups persisted twice (so ``consumerOffset.json.bak`` holds the older ones). Each test damages a
copy the way a disk, a crash or an operator would, and checks that `run.py start` refuses with one
line (exit 2, nothing changed, nothing left in /dev/shm), that `MessageStore.open` raises the typed
error, and that with ``acceptConsumerOffsetLoss=true`` the store starts with every offset that
could be salvaged and keeps the damaged file aside. RocketMQ's own stores, which have no checksum
record, still start.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import CHECKSUMS_NAME, dumps, loads
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ConsumerOffsetLossError
from rmq_mp.put.producer import Producer
from rmq_mp.store.message_store import MessageStore
from shm.names import ShmNames
from tests.service import ROOT, running_service, write_conf

TOPIC = "Orders"
OLD = {"ga": {0: 5, 1: 6}, "gb": {0: 10, 1: 11}, "gz": {0: 1, 1: 2}}
"""What the first run committed: after the second, only consumerOffset.json.bak has it."""
NEW = {"ga": {0: 15, 1: 16}, "gb": {0: 18, 1: 19}, "gz": {0: 20, 1: 20}}
"""What the second run committed: consumerOffset.json."""


def commit(root: Path, table: dict[str, dict[int, int]]) -> None:
    for group, offsets in table.items():
        with Consumer.attach(root, group) as consumer:
            consumer.commit({(TOPIC, q): o for q, o in offsets.items()})


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with 40 messages and three groups' offsets, persisted by two runs."""
    base = tmp_path_factory.mktemp("golden")
    with running_service(base) as service:
        with Producer.attach(service.root) as producer:
            assert all(producer.send(TOPIC, b"m%d" % i, queue_id=i % 2).ok for i in range(40))
        commit(service.root, OLD)
    with running_service(base) as service:
        commit(service.root, NEW)
    path = base / "store" / "config" / "consumerOffset.json"
    assert loads(path.read_text())["offsetTable"] == {f"{TOPIC}@{g}": q for g, q in NEW.items()}
    assert loads(path.with_name(path.name + ".bak").read_text())["offsetTable"] == {
        f"{TOPIC}@{g}": q for g, q in OLD.items()
    }
    return base / "store"


def store_copy(golden: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(golden, root, ignore=shutil.ignore_patterns("lock"))
    return root


def start(tmp_path: Path, *extra: str, **settings: str) -> subprocess.CompletedProcess[str]:
    conf = write_conf(tmp_path / "store.conf", tmp_path / "store", **settings)
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def offsets_of(root: Path, groups: list[str]) -> dict[str, dict[int, int]]:
    table = {}
    for group in groups:
        with Consumer.attach(root, group) as consumer:
            queues = {q: consumer.committed_offset(TOPIC, q) for q in (0, 1)}
        table[group] = {q: o for q, o in queues.items() if o >= 0}
    return {g: q for g, q in table.items() if q}


def _truncate(config: Path) -> None:
    path = config / "consumerOffset.json"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _random_bytes(config: Path) -> None:
    path = config / "consumerOffset.json"
    path.write_bytes(random.Random(18).randbytes(len(path.read_bytes())))


def _flip_key(config: Path) -> None:
    """One byte: "Orders@ga" becomes "Orders@gc", still valid JSON (RocketMQ would load it)."""
    path = config / "consumerOffset.json"
    raw = bytearray(path.read_bytes())
    at = raw.index(b"@ga") + 2
    raw[at] ^= ord("a") ^ ord("c")
    path.write_bytes(bytes(raw))


def _delete(config: Path) -> None:
    (config / "consumerOffset.json").unlink()
    (config / "consumerOffset.json.bak").unlink()


def _bak_only(config: Path) -> None:
    (config / "consumerOffset.json").unlink()


def _delete_config_dir(config: Path) -> None:
    shutil.rmtree(config)


CASES: dict[str, tuple[Callable[[Path], None], dict[str, dict[int, int]], str]] = {
    # damage, the offsets that survive, what the refusal says about them
    "truncated": (_truncate, OLD, "salvaged 6 offset(s) of 3 group(s)"),
    "random bytes": (_random_bytes, OLD, "salvaged 6 offset(s) of 3 group(s)"),
    "one byte flipped in a key": (_flip_key, {**OLD, "gc": NEW["ga"]}, "salvaged 8 offset(s) of 4 group(s)"),
    "file and .bak deleted": (_delete, {}, "nothing could be salvaged"),
    "config dir deleted": (_delete_config_dir, {}, "nothing could be salvaged"),
    ".bak only": (_bak_only, OLD, "consumerOffset.json.bak holds an older copy"),
}


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_lost_offsets_refuse_the_start_until_the_loss_is_accepted(
    golden: Path, tmp_path: Path, case: str
) -> None:
    damage, survivors, salvage_words = CASES[case]
    root = store_copy(golden, tmp_path)
    config_dir = root / "config"
    damage(config_dir)
    before = {p.name: p.read_bytes() for p in config_dir.glob("*")} if config_dir.exists() else {}
    path = config_dir / "consumerOffset.json"

    # The library: a typed error, nothing changed.
    config = MessageStoreConfig.from_file(write_conf(tmp_path / "store.conf", root))
    with pytest.raises(ConsumerOffsetLossError, match=re.escape(salvage_words)) as raised:
        MessageStore.open(config=config)
    assert str(path) in str(raised.value)
    assert "acceptConsumerOffsetLoss=true" in str(raised.value)

    # The service: one line, exit 2, nothing changed, nothing left behind.
    refused = start(tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("run.py: error: ")
    assert salvage_words in refused.stderr
    assert str(path) in refused.stderr
    assert "acceptConsumerOffsetLoss=true" in refused.stderr
    after = {p.name: p.read_bytes() for p in config_dir.glob("*")} if config_dir.exists() else {}
    assert after == before, "a refusal changes nothing"
    assert ShmNames.for_store(str(root), "").leftovers() == []
    assert "consumer offsets lost" in (root / "logs" / "supervisor.log").read_text(), "logged under logs/"

    # Accepting the loss: every salvaged offset served, the damaged file kept aside.
    with running_service(tmp_path, acceptConsumerOffsetLoss="true") as service:
        assert offsets_of(service.root, ["ga", "gb", "gz", "gc"]) == survivors
    kept = sorted(config_dir.glob("consumerOffset.json.damaged-*"))
    if "consumerOffset.json" in before and case != ".bak only":
        assert [p.read_bytes() for p in kept] == [before["consumerOffset.json"]]
    else:
        assert kept == []
    assert loads(path.read_text())["offsetTable"] == {f"{TOPIC}@{g}": q for g, q in survivors.items()}


def test_after_an_accepted_loss_the_next_start_is_clean(golden: Path, tmp_path: Path) -> None:
    root = store_copy(golden, tmp_path)
    _flip_key(root / "config")
    with running_service(tmp_path, acceptConsumerOffsetLoss="true"):
        pass
    with running_service(tmp_path) as service:  # no setting: the repaired file is good
        assert offsets_of(service.root, ["ga", "gb", "gz", "gc"]) == {**OLD, "gc": NEW["ga"]}


def test_a_fresh_store_without_offsets_starts_silently(tmp_path: Path) -> None:
    with running_service(tmp_path) as service:
        assert not (service.root / "config" / "consumerOffset.json.damaged").exists()
    log = (tmp_path / "store" / "logs" / "supervisor.log").read_text()
    assert "consumer offsets" not in log
    assert "WARNING" not in log
    assert "ERROR" not in log


def test_an_empty_commit_log_accepts_damaged_offsets_with_an_error_logged(tmp_path: Path) -> None:
    """Nothing to re-deliver or skip: the damage is reported and kept aside, the store starts."""
    root = tmp_path / "store"
    (root / "config").mkdir(parents=True)
    (root / "config" / "consumerOffset.json").write_bytes(b'{"offsetTable":{"Orders@ga":{0:3},')
    with running_service(tmp_path) as service:
        assert offsets_of(service.root, ["ga"]) == {"ga": {0: 3}}
    assert list((root / "config").glob("consumerOffset.json.damaged-*"))
    assert "consumer-offsets-lost" in (root / "logs" / "supervisor.log").read_text()


def test_healthy_offsets_round_trip_in_rocketmqs_format(golden: Path, tmp_path: Path) -> None:
    root = store_copy(golden, tmp_path)
    path = root / "config" / "consumerOffset.json"
    with running_service(tmp_path) as service:
        assert offsets_of(service.root, ["ga", "gb", "gz"]) == NEW
    text = path.read_text(encoding="utf-8")
    assert text == dumps({"offsetTable": {f"{TOPIC}@{g}": q for g, q in NEW.items()}}), "fastjson's layout"
    assert '\t\t"Orders@ga":{0:15,1:16\n\t\t},' in text
    record = loads((root / CHECKSUMS_NAME).read_text())
    assert set(record) >= {"consumerOffset.json", "topics.json"}


def test_rocketmq_stores_without_a_checksum_record_still_start(
    clean_store_copy: Path, tmp_path: Path
) -> None:
    """The fixture store holds messages and no consumerOffset.json (RocketMQ's store writes none):
    not a loss. A RocketMQ-written file without the record loads as it parses."""
    root = tmp_path / "store"
    shutil.move(clean_store_copy, root)
    (root / "config" / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"Payments@rocketmq_group":{0:7,3:2\n\t\t}\n\t}\n}', encoding="utf-8"
    )
    with running_service(tmp_path) as service, Consumer.attach(service.root, "rocketmq_group") as consumer:
        assert (consumer.committed_offset("Payments", 0), consumer.committed_offset("Payments", 3)) == (7, 2)
    assert not (root / "config" / "consumerOffset.json.bak").exists() or loads(
        (root / "config" / "consumerOffset.json.bak").read_text()
    )["offsetTable"] == {"Payments@rocketmq_group": {0: 7, 3: 2}}


def test_a_daemon_start_repeats_the_refusal(golden: Path, tmp_path: Path) -> None:
    root = store_copy(golden, tmp_path)
    _flip_key(root / "config")
    refused = start(tmp_path, "--daemon")
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("run.py: error: ")
    assert "acceptConsumerOffsetLoss=true" in refused.stderr
    assert ShmNames.for_store(str(root), "").leftovers() == []


def test_an_offline_reset_does_not_make_a_loss_final(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """rmq-admin resetOffsetByTime --store would persist the salvage over the evidence."""
    from rmq_mp.tools.admin import main

    root = store_copy(golden, tmp_path)
    _flip_key(root / "config")
    before = (root / "config" / "consumerOffset.json").read_bytes()
    conf = write_conf(tmp_path / "store.conf", root)
    code = main(
        ["resetOffsetByTime", "--store", str(root), "--conf", str(conf), "-g", "ga", "-t", TOPIC, "-s", "0"]
    )
    assert code == 2
    assert "acceptConsumerOffsetLoss" in capsys.readouterr().err
    assert (root / "config" / "consumerOffset.json").read_bytes() == before
