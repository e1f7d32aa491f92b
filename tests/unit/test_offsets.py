"""config/consumerOffset.json and config/delayOffset.json: RocketMQ's files read, queried and
written back as RocketMQ writes them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_mp.config.config_manager import loads
from rmq_mp.config.offsets import TOPIC_GROUP_SEPARATOR, ConsumerOffsetManager, DelayOffsetManager

# A 4.9 broker's file after a transaction check and a quickstart consumer (the layout quoted in
# RocketMQ-fork source comments and blog pastes: see rmq_mp/config/config_manager.py).
ROCKETMQ_CONSUMER_OFFSET = (
    "{\n"
    '\t"offsetTable":{\n'
    '\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0\n'
    "\t\t},\n"
    '\t\t"RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:7\n'
    "\t\t},\n"
    '\t\t"TopicTest@please_rename_unique_group_name_4":{0:533,1:533,2:533,3:532,4:60,5:60,6:60,7:62,'
    "8:62,9:61,10:21,11:25,12:23,13:23,14:21,15:20\n"
    "\t\t}\n"
    "\t}\n"
    "}"
)
GROUP = "please_rename_unique_group_name_4"


def test_a_rocketmq_consumer_offset_file_is_read_and_written_back_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(ROCKETMQ_CONSUMER_OFFSET, encoding="utf-8")
    manager = ConsumerOffsetManager(path)
    assert manager.load()
    assert manager.query_offset(GROUP, "TopicTest", 3) == 532
    assert manager.query_offset(GROUP, "TopicTest", 15) == 20
    assert manager.query_offset("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0) == 7
    assert manager.offsets_of(GROUP, f"%RETRY%{GROUP}") == {0: 0}
    assert manager.groups() == ["CID_RMQ_SYS_TRANS", GROUP]
    assert manager.topics_of_group(GROUP) == [f"%RETRY%{GROUP}", "TopicTest"]
    assert manager.encode() == ROCKETMQ_CONSUMER_OFFSET
    manager.commit_offset(GROUP, "TopicTest", 3, 533)
    manager.persist()
    assert path.read_text(encoding="utf-8") == ROCKETMQ_CONSUMER_OFFSET.replace("3:532", "3:533")
    assert path.with_name("consumerOffset.json.bak").read_text(encoding="utf-8") == ROCKETMQ_CONSUMER_OFFSET


def test_an_unknown_offset_is_minus_one_as_in_rocketmq(tmp_path: Path) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    assert manager.query_offset("g", "T", 0) == -1
    manager.commit_offset("g", "T", 0, 5)
    assert manager.query_offset("g", "T", 1) == -1
    assert manager.query_offset("other", "T", 0) == -1
    assert manager.offsets_of("g", "missing") == {}


def test_commit_query_and_the_table(tmp_path: Path) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.commit_offset("g1", "T", 1, 10)
    manager.commit_offset("g1", "T", 0, 7)
    manager.commit_offset("g1", "T", 0, 8)
    manager.commit_offset("g2", "T", 0, 3)
    manager.commit_offset("g1", "U", 2, 4)
    assert manager.query_offset("g1", "T", 0) == 8
    assert manager.offsets_of("g1", "T") == {0: 8, 1: 10}
    assert manager.table == {"T@g1": {1: 10, 0: 8}, "T@g2": {0: 3}, "U@g1": {2: 4}}
    assert manager.key("g1", "T") == f"T{TOPIC_GROUP_SEPARATOR}g1" == "T@g1"
    copy = manager.offsets_of("g1", "T")
    copy[0] = 99
    assert manager.query_offset("g1", "T", 0) == 8, "offsets_of returns a copy"
    assert manager.groups() == ["g1", "g2"]
    assert manager.topics_of_group("g1") == ["T", "U"]
    assert manager.topics_of_group("g") == []


def test_remove_group_forgets_all_its_topics(tmp_path: Path) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.commit_offset("g1", "T", 0, 1)
    manager.commit_offset("g1", "U", 0, 2)
    manager.commit_offset("g2", "T", 0, 3)
    assert manager.remove_group("g1") == ["T", "U"]
    assert manager.table == {"T@g2": {0: 3}}
    assert manager.remove_group("g1") == []


@pytest.mark.parametrize(
    ("group", "topic", "queue_id"),
    [("g@x", "T", 0), ("g", "T@x", 0), ("", "T", 0), ("g", "", 0), ("g", "T", -1)],
)
def test_commit_offset_rejects_what_the_file_cannot_key(group: str, topic: str, queue_id: int) -> None:
    manager = ConsumerOffsetManager(Path("unused.json"))
    with pytest.raises(ValueError, match=r"group|topic|queue_id"):
        manager.commit_offset(group, topic, queue_id, 1)
    assert manager.table == {}


def test_quoted_queue_ids_from_other_writers_are_read_as_ints(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text('{\n  "offsetTable": {\n    "T@g": {"0": 5, "1": "6"}\n  }\n}', encoding="utf-8")
    manager = ConsumerOffsetManager(path)
    assert manager.load()
    assert manager.table == {"T@g": {0: 5, 1: 6}}


@pytest.mark.parametrize(
    "text",
    ["{}", '{"offsetTable":{}}', '{"offsetTable":{},"dataVersion":{"counter":1,"timestamp":2}}'],
)
def test_an_empty_or_absent_table_loads_empty(tmp_path: Path, text: str) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(text, encoding="utf-8")
    manager = ConsumerOffsetManager(path)
    assert manager.load()
    assert manager.table == {}


@pytest.mark.parametrize(
    "text",
    [
        '{"offsetTable":[]}',
        '{"offsetTable":{"T@g":[1]}}',
        '{"offsetTable":{"T@g":{0:true}}}',
        '{"offsetTable":{"T@g":{0:1.5}}}',
        '{"offsetTable":{"T@g":{"x":1}}}',
        '{"offsetTable":{"T@g":null}}',
        '{"offsetTable":{5:{0:1}}}',
    ],
)
def test_a_table_of_the_wrong_shape_is_unusable_not_half_loaded(tmp_path: Path, text: str) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(text, encoding="utf-8")
    manager = ConsumerOffsetManager(path)
    manager.commit_offset("g", "Old", 0, 1)
    assert not manager.load()
    assert manager.table == {}
    assert manager.load_failures == 1


_offset_tables = st.dictionaries(
    st.tuples(
        st.text(alphabet=st.characters(blacklist_characters="@"), min_size=1, max_size=12),
        st.text(alphabet=st.characters(blacklist_characters="@"), min_size=1, max_size=12),
    ),
    st.dictionaries(st.integers(0, 1023), st.integers(-1, 2**63 - 1), max_size=8),
    max_size=6,
)


@given(_offset_tables)
def test_offset_tables_survive_persist_and_load(table: dict[tuple[str, str], dict[int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config" / "consumerOffset.json"
        manager = ConsumerOffsetManager(path)
        for (group, topic), queues in table.items():
            for queue_id, offset in queues.items():
                manager.commit_offset(group, topic, queue_id, offset)
        manager.persist()
        written = path.read_bytes()
        reloaded = ConsumerOffsetManager(path)
        assert reloaded.load()
        assert reloaded.table == manager.table
        for (group, topic), queues in table.items():
            assert reloaded.offsets_of(group, topic) == queues
        reloaded.persist()
        assert path.read_bytes() == written, "byte-stable"
        assert not list(Path(tmp, "config").glob("*.tmp"))


# ------------------------------------------------------------------------------ delayOffset.json


def test_the_fixture_stores_delay_offset_file_loads(rocketmq_fixtures: Path, tmp_path: Path) -> None:
    """Written by the fixture build's gson stand-in (2-space indent, a space after colons)."""
    source = rocketmq_fixtures / "clean-store" / "config" / "delayOffset.json"
    manager = DelayOffsetManager(source)
    assert manager.load()
    assert manager.loaded_from == source
    assert manager.table == {}
    assert manager.offset_of(1) == -1
    copy = shutil.copy(source, tmp_path / "delayOffset.json")
    rewritten = DelayOffsetManager(Path(copy))
    assert rewritten.load()
    rewritten.persist()
    assert rewritten.path.read_text(encoding="utf-8") == '{\n\t"offsetTable":{}\n}'


def test_delay_levels_are_bare_integer_keys(tmp_path: Path) -> None:
    path = tmp_path / "delayOffset.json"
    path.write_text('{\n\t"offsetTable":{1:12,2:0,18:3\n\t}\n}', encoding="utf-8")
    manager = DelayOffsetManager(path)
    assert manager.load()
    assert manager.table == {1: 12, 2: 0, 18: 3}
    assert manager.offset_of(1) == 12
    assert manager.offset_of(3) == -1
    assert loads(manager.encode()) == {"offsetTable": {1: 12, 2: 0, 18: 3}}
    assert manager.encode() == path.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ damage


def _two_groups(tmp_path: Path) -> ConsumerOffsetManager:
    """A store's consumerOffset.json persisted twice: .bak holds the older offsets."""
    manager = ConsumerOffsetManager(tmp_path / "store" / "config" / "consumerOffset.json")
    for group, offset in (("ga", 10), ("gb", 20)):
        manager.commit_offset(group, "T", 0, offset)
        manager.commit_offset(group, "T", 1, offset + 1)
    manager.persist()
    for group, offset in (("ga", 15), ("gb", 25)):
        manager.commit_offset(group, "T", 0, offset)
        manager.commit_offset(group, "T", 1, offset + 1)
    manager.persist()
    return manager


def test_a_flipped_byte_that_still_parses_is_caught_by_the_checksum_record(tmp_path: Path) -> None:
    """ "T@ga" -> "T@gc": valid JSON, another group's key; RocketMQ would load it silently."""
    manager = _two_groups(tmp_path)
    raw = manager.path.read_bytes()
    manager.path.write_bytes(raw.replace(b'"T@ga"', b'"T@gc"'))
    reloaded = ConsumerOffsetManager(manager.path)
    assert not reloaded.load()
    result = reloaded.last_load
    assert result.lost
    assert result.damaged == (manager.path,)
    assert "configChecksum.json" in result.describe()
    # Salvage: every entry of the damaged file plus the older .bak, the lower offset where both
    # have one; "gc" keeps what the flipped key carried, "ga" falls back to the .bak.
    assert reloaded.offsets_of("gb", "T") == {0: 20, 1: 21}
    assert reloaded.offsets_of("ga", "T") == {0: 10, 1: 11}
    assert reloaded.offsets_of("gc", "T") == {0: 15, 1: 16}
    assert "3 group(s)" in result.salvaged
    assert manager.path.read_bytes() != raw, "load changes no file"


def test_a_flip_that_makes_two_keys_equal_is_unparseable_even_without_a_record(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text('{"offsetTable":{"T@ga":{0:15},"T@gb":{0:25}}}', encoding="utf-8")
    path.write_text(path.read_text().replace("T@gb", "T@ga"), encoding="utf-8")
    manager = ConsumerOffsetManager(path)
    assert not manager.load()
    assert "Duplicate key" in manager.last_load.describe()
    assert manager.table == {"T@ga": {0: 15}}, "the lower of the two offsets: seen again, never skipped"


def test_salvage_keeps_whole_maps_only(tmp_path: Path) -> None:
    """A cut in the middle of "1:248" must not become offset 24."""
    path = tmp_path / "consumerOffset.json"
    path.write_text(
        '{\n\t"offsetTable":{\n\t\t"T@a":{0:5,1:7\n\t\t},\n\t\t"T@b":{0:250,1:24', encoding="utf-8"
    )
    manager = ConsumerOffsetManager(path)
    assert not manager.load()
    assert manager.table == {"T@a": {0: 5, 1: 7}}
    assert manager.last_load.salvaged.startswith("2 offset(s) of 1 group(s) (a)")


def test_salvage_drops_entries_that_are_not_two_integers(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(b'{"offsetTable":{"T@a":{0:5,1:\xff7,2:"9"},"T@":{0:1},"x":{0:1}}')
    manager = ConsumerOffsetManager(path)
    assert not manager.load()
    assert manager.table == {"T@a": {0: 5, 2: 9}}
    assert "1 unreadable entry(ies) dropped" in manager.last_load.salvaged


def test_set_aside_keeps_every_damaged_copy(tmp_path: Path) -> None:
    manager = _two_groups(tmp_path)
    kept = []
    for damage in (b"{", b"{{"):
        manager.path.write_bytes(damage)
        reloaded = ConsumerOffsetManager(manager.path)
        reloaded.load()  # the second time the .bak has the newest content: no loss, still damage
        assert reloaded.last_load.damaged == (manager.path,)
        (moved,) = reloaded.set_aside()
        kept.append(moved)
        assert not manager.path.exists()
        reloaded.persist()
    assert [p.read_bytes() for p in kept] == [b"{", b"{{"], "a second damage never overwrites the first"
    assert len(set(kept)) == 2


def test_a_persist_cut_short_anywhere_loads_without_a_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the checksum record: stop the persist at each rename (a crash there) and reload."""
    import os

    real_replace = os.replace
    for step in range(3):  # record, .bak, the file itself
        manager = _two_groups(tmp_path / str(step))
        manager.commit_offset("ga", "T", 0, 99)
        calls: list[str | os.PathLike[str]] = []

        def crash(
            src: str | os.PathLike[str],
            dst: str | os.PathLike[str],
            *,
            at: int = step,
            calls: list[str | os.PathLike[str]] = calls,
        ) -> None:
            calls.append(dst)
            if len(calls) > at:
                raise OSError("simulated crash")
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="simulated crash"):
            manager.persist()
        monkeypatch.setattr(os, "replace", real_replace)
        reloaded = ConsumerOffsetManager(manager.path)
        assert reloaded.load(), f"crash before rename {step}: {reloaded.last_load.describe()}"
        assert reloaded.query_offset("ga", "T", 0) == 15
