"""config/*.json: fastjson layout, atomic durable writes, .bak fallback (RocketMQ #3401, #9328)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_mp.config_manager import FastJsonError, dumps, loads
from rmq_mp.offsets import ConsumerOffsetManager, DelayOffsetManager
from rmq_mp.topics import TopicConfig, TopicConfigManager

ROCKETMQ_SAMPLE = """{
\t"offsetTable":{
\t\t"RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:7
\t\t},
\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:248,2:251,3:250
\t\t}
\t}
}"""


def test_rocketmq_consumer_offset_file_reads_and_writes_back_identically(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(ROCKETMQ_SAMPLE, encoding="utf-8")
    manager = ConsumerOffsetManager(path)
    assert manager.load()
    assert manager.query_offset("please_rename_unique_group_name_4", "TopicTest", 3) == 250
    assert manager.query_offset("g", "TopicTest", 0) == -1
    assert manager.groups() == ["CID_RMQ_SYS_TRANS", "please_rename_unique_group_name_4"]
    manager.persist()
    assert path.read_text(encoding="utf-8") == ROCKETMQ_SAMPLE


def test_loads_keeps_strings_that_look_like_int_keys() -> None:
    assert loads('{"a":"{0:1,2:3}", 5 :6, "7":8, "n":{-1:[1,{"x":null}]}}') == {
        "a": "{0:1,2:3}",
        5: 6,
        "7": 8,
        "n": {-1: [1, {"x": None}]},
    }
    with pytest.raises(FastJsonError, match="line 1"):
        loads('{"a":')


@given(st.dictionaries(st.text(min_size=1), st.dictionaries(st.integers(0, 10_000), st.integers(-1, 2**62))))
def test_offset_tables_round_trip(table: dict[str, dict[int, int]]) -> None:
    data = {"offsetTable": table}
    assert loads(dumps(data)) == data


def test_non_ascii_is_written_raw() -> None:
    assert '"主题-τ@g"' in dumps({"offsetTable": {"主题-τ@g": {0: 1}}})


def test_the_fixture_delay_offset_file_loads(rocketmq_fixtures: Path) -> None:
    manager = DelayOffsetManager(rocketmq_fixtures / "clean-store" / "config" / "delayOffset.json")
    assert manager.load()
    assert manager.table == {}


def test_persist_keeps_the_previous_good_version_as_bak(tmp_path: Path) -> None:
    manager = ConsumerOffsetManager(tmp_path / "config" / "consumerOffset.json")
    manager.commit_offset("g", "T", 0, 1)
    manager.persist()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    assert loads(manager.bak_path.read_text())["offsetTable"]["T@g"] == {0: 1}
    assert loads(manager.path.read_text())["offsetTable"]["T@g"] == {0: 2}
    assert sorted(p.name for p in manager.path.parent.iterdir()) == [
        "consumerOffset.json",
        "consumerOffset.json.bak",
    ]
    before = manager.path.read_bytes()
    manager.persist()
    assert manager.path.read_bytes() == before, "byte-stable"


@pytest.mark.parametrize("damage", [b"", b'{"offsetTable":{"T@g":{0:', b"\x00\xff\xfe garbage"])
def test_corrupt_main_file_falls_back_to_bak_and_is_left_for_forensics(tmp_path: Path, damage: bytes) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.commit_offset("g", "T", 0, 1)
    manager.persist()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    manager.path.write_bytes(damage)
    reloaded = ConsumerOffsetManager(manager.path)
    assert reloaded.load()
    assert reloaded.query_offset("g", "T", 0) == 1
    assert manager.path.read_bytes() == damage
    reloaded.commit_offset("g", "T", 0, 3)
    reloaded.persist()  # the corrupt main file must not become the .bak
    assert ConsumerOffsetManager(manager.bak_path).load()
    assert loads(manager.bak_path.read_text())["offsetTable"]["T@g"] == {0: 1}


def test_both_files_corrupt_starts_empty_and_counts_it(tmp_path: Path) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.path.write_bytes(b"{{{")
    manager.bak_path.write_bytes(b"")
    assert not manager.load()
    assert manager.load_failures == 1
    assert manager.table == {}


def test_persist_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        calls.append(f"rename {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.commit_offset("g", "T", 0, 1)
    manager.persist()
    assert calls == ["file", "rename consumerOffset.json", "dir"]


def test_topics_json_layout_and_versioning(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path / "topics.json")
    manager.create_if_absent("TopicTest", 4)
    manager.create_if_absent("TopicTest", 8)
    assert manager.counter == 1
    manager.persist()
    text = manager.path.read_text()
    assert '\t\t"TopicTest":{\n\t\t\t"order":false,\n\t\t\t"perm":6,\n\t\t\t"readQueueNums":4,' in text
    again = TopicConfigManager(manager.path)
    assert again.load()
    assert again.get("TopicTest") == TopicConfig("TopicTest", 4, 4)
