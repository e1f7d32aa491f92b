"""config/*.json: fastjson's dialect and layout, atomic durable writes, `.bak` fallback.

RocketMQ writes these files without fsync and users find them empty or garbled after a power loss
(apache/rocketmq#3401, #9328); these tests pin the layout to what RocketMQ writes and the
recovery rules rmq-mp adds.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_mp.config.config_manager import (
    CHECKSUMS_NAME,
    ConfigManager,
    FastJsonError,
    dumps,
    loads,
    sha256_hex,
)
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.config.topics import TopicConfig, TopicConfigManager

LOGGER = "rmq_mp.config.config_manager"

# `cat consumerOffset.json` of a RocketMQ 4.x broker, as pasted in a source walk-through
# (see rmq_mp/config/config_manager.py): tabs, bare queue ids, a newline before each inner `}`.
ROCKETMQ_CONSUMER_OFFSET = (
    "{\n"
    '\t"offsetTable":{\n'
    '\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0\n'
    "\t\t},\n"
    '\t\t"TopicRead3@please_rename_unique_group_name_4":{1:5\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)

# topics.json as a 4.9 broker writes it (TopicConfigSerializeWrapper, fields alphabetical).
ROCKETMQ_TOPICS = (
    "{\n"
    '\t"dataVersion":{\n'
    '\t\t"counter":1,\n'
    '\t\t"timestamp":1636355958169\n'
    "\t},\n"
    '\t"topicConfigTable":{\n'
    '\t\t"TopicTest":{\n'
    '\t\t\t"order":false,\n'
    '\t\t\t"perm":6,\n'
    '\t\t\t"readQueueNums":4,\n'
    '\t\t\t"topicFilterType":"SINGLE_TAG",\n'
    '\t\t\t"topicName":"TopicTest",\n'
    '\t\t\t"topicSysFlag":0,\n'
    '\t\t\t"writeQueueNums":4\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)


# ------------------------------------------------------------------------------ loads


def test_bare_integer_keys_come_back_as_int_and_quoted_keys_as_str() -> None:
    assert loads('{"t@g":{0:250,1:248,-1:7},"7":8}') == {"t@g": {0: 250, 1: 248, -1: 7}, "7": 8}


def test_text_that_looks_like_int_keys_inside_strings_is_untouched() -> None:
    text = r'{"a":"{0:1,2:3}","b":"x\",5:6","c\\":"\\{0:","d":["{1:2}",{"e":{3:"{4:5}"}}]}'
    assert loads(text) == {
        "a": "{0:1,2:3}",
        "b": 'x",5:6',
        "c\\": "\\{0:",
        "d": ["{1:2}", {"e": {3: "{4:5}"}}],
    }


def test_escapes_and_control_characters_in_strings() -> None:
    assert loads(r'{"s":"q\"b\\s\/n\nt\tu\u0001\u00e9\uD83D\uDE00"}') == {"s": 'q"b\\s/n\nt\tu\x01é😀'}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{0:0\n\t\t}", {0: 0}),
        ("{\r\n\t0 : 0 ,\n 1\n:\n1\r\n}", {0: 0, 1: 1}),
        (' \n{ "a" : [ 1 , 2 ] , 3 : { } }\n\n', {"a": [1, 2], 3: {}}),
        ('{\n  "offsetTable": {}\n}', {"offsetTable": {}}),  # gson's layout (the fixture's delayOffset.json)
    ],
)
def test_whitespace_is_allowed_anywhere_between_tokens(text: str, expected: Any) -> None:
    assert loads(text) == expected


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("", 1, 1),
        ("   ", 1, 4),
        ('{"offsetTable":{"T@g":{0:', 1, 26),  # truncated, as after a crash
        ('{\n\t"offsetTable":{\n\t\t"T@g":{0:1,\n', 4, 1),
        ('{"a":1,}', 1, 8),  # trailing comma
        ("[1,]", 1, 4),
        ("{01:1}", 1, 3),  # leading zero
        ("{1.5:1}", 1, 3),  # float key
        ("{a:1}", 1, 2),  # unquoted non-numeric key
        ("{'a':1}", 1, 2),
        ('{"a" 1}', 1, 6),
        ('{"a":1} {}', 1, 9),  # extra data
        ('{"a":tru}', 1, 6),
        ('{"a":NaN}', 1, 6),
        ('{"a":"unterminated}', 1, 6),
        ('{"a":"raw\ncontrol"}', 1, 10),
        ("\x00\xff\xfe garbage", 1, 1),
        ("[" * 300, 1, 257),  # nesting limit, not a RecursionError
    ],
)
def test_malformed_text_raises_a_value_error_with_its_position(text: str, line: int, column: int) -> None:
    with pytest.raises(FastJsonError) as info:
        loads(text)
    assert isinstance(info.value, ValueError)
    assert (info.value.lineno, info.value.colno) == (line, column), info.value


def test_fast_json_error_pickles() -> None:
    with pytest.raises(FastJsonError) as info:
        loads('{"a":')
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is FastJsonError
    assert (again.msg, again.pos, again.lineno) == (info.value.msg, 5, 1)


def test_loads_takes_text_only() -> None:
    with pytest.raises(TypeError):
        loads(b"{}")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ dumps


def test_consumer_offset_layout_is_rocketmqs_byte_for_byte() -> None:
    assert dumps(loads(ROCKETMQ_CONSUMER_OFFSET)) == ROCKETMQ_CONSUMER_OFFSET
    assert dumps({"offsetTable": {"TopicTest@group_a": {3: 250, 0: 250, 2: 251, 1: 248}}}) == (
        '{\n\t"offsetTable":{\n\t\t"TopicTest@group_a":{0:250,1:248,2:251,3:250\n\t\t}\n\t}\n}'
    )


def test_an_empty_table_is_the_21_bytes_rocketmq_writes() -> None:
    assert dumps({"offsetTable": {}}) == '{\n\t"offsetTable":{}\n}'
    assert len(dumps({"offsetTable": {}}).encode()) == 21


def test_beans_one_field_per_line_in_alphabetical_order() -> None:
    bean = {
        "topicName": "TopicTest",
        "writeQueueNums": 4,
        "readQueueNums": 4,
        "perm": 6,
        "topicSysFlag": 0,
        "topicFilterType": "SINGLE_TAG",
        "order": False,
    }
    wrapper = {
        "topicConfigTable": {"TopicTest": bean},
        "dataVersion": {"timestamp": 1636355958169, "counter": 1},
    }
    assert dumps(wrapper) == ROCKETMQ_TOPICS


def test_non_ascii_is_written_raw_and_specials_escaped_as_fastjson_does() -> None:
    text = dumps({"主题-τ@g": 'é"\\\b\t\n\f\r\x00\x0b\x1f\x7f\xa0\xa1\u2028\u2029😀'})
    assert (
        text
        == '{\n\t"主题-τ@g":"é\\"\\\\\\b\\t\\n\\f\\r\\u0000\\u000B\\u001F\\u007F\\u00A0¡\\u2028\\u2029😀"\n}'
    )
    assert dumps("/") == '"/"', "no WriteSlashAsSpecial"
    assert loads(dumps("/")) == "/"


def test_null_values_are_left_out_like_fastjson() -> None:
    assert dumps({"a": None, "b": 1}) == '{\n\t"b":1\n}'
    assert dumps([None, 1]) == "[null,1]"
    assert dumps({}) == "{}"


def test_mixed_keys_int_inline_first_then_strings_on_their_own_lines() -> None:
    assert dumps({"x": {"b": 2, 1: 1, "a": 3}}) == '{\n\t"x":{1:1,\n\t\t"a":3,\n\t\t"b":2\n\t}\n}'


def test_key_order_does_not_change_the_bytes() -> None:
    a = {"offsetTable": {"B@g": {1: 1, 0: 0}, "A@g": {0: 5}}}
    b = {"offsetTable": {"A@g": {0: 5}, "B@g": {0: 0, 1: 1}}}
    assert dumps(a) == dumps(b)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({True: 1}, TypeError),
        ({1.5: 1}, TypeError),
        ({"a": float("nan")}, ValueError),
        ({"a": float("inf")}, ValueError),
        ({"a": {1, 2}}, TypeError),
        ({"a": b"bytes"}, TypeError),
    ],
)
def test_dumps_rejects_what_has_no_fastjson_form(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        dumps(value)


def _has_int_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return any(isinstance(k, int) or _has_int_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_int_keys(v) for v in value)
    return False


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=10) | st.integers(-5, 10**6),
            children.filter(lambda v: v is not None),
            max_size=4,
        )
    ),
    max_leaves=25,
)


@given(_json)
def test_dumps_then_loads_round_trips(value: Any) -> None:
    text = dumps(value)
    assert loads(text) == value
    assert dumps(loads(text)) == text, "byte-stable"
    if not _has_int_keys(value):
        assert json.loads(text) == value, "standard JSON when no map has integer keys"


@given(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))
def test_a_lone_surrogate_is_escaped_so_the_file_stays_utf8(surrogate: str) -> None:
    written = dumps({"k": f"a{surrogate}b"})
    assert f"\\u{ord(surrogate):04X}" in written
    written.encode("utf-8")
    assert loads(written) == {"k": f"a{surrogate}b"}


# ------------------------------------------------------------------ ConfigManager: persist


def _offsets(path: Path, **offsets: int) -> ConsumerOffsetManager:
    manager = ConsumerOffsetManager(path)
    for queue, offset in offsets.items():
        manager.commit_offset("g", "T", int(queue.lstrip("q")), offset)
    return manager


def test_first_persist_creates_the_directory_and_a_bak(tmp_path: Path) -> None:
    """RocketMQ leaves no .bak until a second persist: a first file damaged early had no fallback."""
    manager = _offsets(tmp_path / "store" / "config" / "consumerOffset.json", q0=1)
    manager.persist()
    assert sorted(p.name for p in manager.path.parent.iterdir()) == [
        "consumerOffset.json",
        "consumerOffset.json.bak",
    ]
    assert manager.path.read_text(encoding="utf-8") == '{\n\t"offsetTable":{\n\t\t"T@g":{0:1\n\t\t}\n\t}\n}'
    assert manager.bak_path.read_bytes() == manager.path.read_bytes()
    record = loads((tmp_path / "store" / CHECKSUMS_NAME).read_text())
    assert record["consumerOffset.json"]["sha256"] == [sha256_hex(manager.path.read_bytes())]


def test_persist_keeps_the_previous_good_version_as_bak(tmp_path: Path) -> None:
    manager = _offsets(tmp_path / "consumerOffset.json", q0=1)
    manager.persist()
    first = manager.path.read_bytes()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    assert manager.bak_path.read_bytes() == first
    assert loads(manager.path.read_text())["offsetTable"]["T@g"] == {0: 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["consumerOffset.json", "consumerOffset.json.bak"]


def test_persisting_the_same_content_is_byte_stable_and_keeps_the_older_bak(tmp_path: Path) -> None:
    manager = _offsets(tmp_path / "consumerOffset.json", q0=1)
    manager.persist()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    main, bak = manager.path.read_bytes(), manager.bak_path.read_bytes()
    same = ConsumerOffsetManager(manager.path)
    same.table = {"T@g": {0: 2}}  # equal content, built another way
    same.persist()
    manager.persist()
    assert (manager.path.read_bytes(), manager.bak_path.read_bytes()) == (main, bak)
    assert manager.statistics().persists == 2
    assert manager.statistics().persists_unchanged == 1


def test_persist_fsyncs_the_data_before_each_rename_and_then_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Observe the order only: the real os.fsync and os.replace still run."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(f"rename {Path(src).name} -> {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    manager = _offsets(tmp_path / "consumerOffset.json", q0=1)
    manager.persist()
    assert events == [
        "fsync consumerOffset.json.tmp",
        "fsync consumerOffset.json.bak.tmp",
        "rename consumerOffset.json.bak.tmp -> consumerOffset.json.bak",
        "rename consumerOffset.json.tmp -> consumerOffset.json",
        f"fsync {tmp_path.name}",
    ]
    events.clear()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    assert events == [
        "fsync consumerOffset.json.tmp",
        "fsync consumerOffset.json.bak.tmp",
        "rename consumerOffset.json.bak.tmp -> consumerOffset.json.bak",
        "rename consumerOffset.json.tmp -> consumerOffset.json",
        f"fsync {tmp_path.name}",
    ]
    assert not list(tmp_path.glob("*.tmp"))

    # In a store, the checksum record follows a first file and precedes any later rename.
    events.clear()
    in_store = _offsets(tmp_path / "store" / "config" / "consumerOffset.json", q0=1)
    in_store.persist()
    in_store.commit_offset("g", "T", 0, 2)
    in_store.persist()
    record = [
        "fsync configChecksum.json.tmp",
        "rename configChecksum.json.tmp -> configChecksum.json",
        "fsync store",
    ]
    data = [
        "fsync consumerOffset.json.tmp",
        "fsync consumerOffset.json.bak.tmp",
        "rename consumerOffset.json.bak.tmp -> consumerOffset.json.bak",
    ]
    publish = ["rename consumerOffset.json.tmp -> consumerOffset.json", "fsync config"]
    assert events == [*data, *publish, *record, data[0], *record, *data[1:], *publish]


def test_a_persist_interrupted_before_its_rename_leaves_the_old_file_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _offsets(tmp_path / "consumerOffset.json", q0=1)
    manager.persist()
    manager.commit_offset("g", "T", 0, 2)
    real_replace = os.replace

    def crash_on_main_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst) == manager.path:
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_main_rename)
    with pytest.raises(OSError, match="simulated crash"):
        manager.persist()
    monkeypatch.setattr(os, "replace", real_replace)
    assert manager.tmp_path.exists()
    reloaded = ConsumerOffsetManager(manager.path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert reloaded.load()
    assert reloaded.query_offset("g", "T", 0) == 1
    assert "interrupted persist" in caplog.text
    reloaded.commit_offset("g", "T", 0, 3)
    reloaded.persist()
    assert not reloaded.tmp_path.exists()
    assert loads(reloaded.path.read_text())["offsetTable"]["T@g"] == {0: 3}


# --------------------------------------------------------------------- ConfigManager: load

DAMAGE = {
    "truncated": b'{\n\t"offsetTable":{\n\t\t"T@g":{0:',
    "empty": b"",
    "blank": b" \n\t\n",
    "binary garbage": b"\x00\xff\xfe\x9c garbage \x00",
    "zeros (a lost page)": b"\x00" * 4096,
    "not an object": b"[1,2,3]",
    "wrong shape": b'{"offsetTable":{"T@g":{0:"many"}}}',
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_corrupt_file_falls_back_to_bak_and_is_left_as_it_was(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _offsets(tmp_path / "consumerOffset.json", q0=1)
    manager.persist()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    good_bak = manager.bak_path.read_bytes()
    manager.path.write_bytes(damage)
    before = manager.path.stat()

    reloaded = ConsumerOffsetManager(manager.path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not reloaded.load(), "the .bak is one persist older: something may be lost"
    assert reloaded.query_offset("g", "T", 0) == 1
    assert reloaded.last_load.lost
    assert reloaded.last_load.damaged == (manager.path,)
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert str(manager.path) in caplog.text
    assert "consumerOffset.json.bak" in caplog.text or reloaded.last_load.salvaged
    assert manager.path.read_bytes() == damage, "kept for forensics"
    assert manager.path.stat().st_mtime_ns == before.st_mtime_ns

    reloaded.commit_offset("g", "T", 0, 3)
    reloaded.persist()
    assert manager.bak_path.read_bytes() == good_bak, "a corrupt file never replaces the good .bak"
    assert loads(manager.path.read_text())["offsetTable"]["T@g"] == {0: 3}
    (kept,) = tmp_path.glob("consumerOffset.json.damaged-*")
    assert kept.read_bytes() == damage, "persist keeps the damaged file aside, never overwrites it"


def test_a_missing_file_with_a_bak_loads_the_bak_as_a_possible_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _offsets(tmp_path / "consumerOffset.json", q0=1)
    manager.persist()
    manager.commit_offset("g", "T", 0, 2)
    manager.persist()
    manager.path.unlink()  # e.g. RocketMQ's delete-then-rename interrupted
    reloaded = ConsumerOffsetManager(manager.path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not reloaded.load()
    assert reloaded.loaded_from == manager.bak_path
    assert reloaded.statistics().loads_from_bak == 1
    assert reloaded.query_offset("g", "T", 0) == 1
    assert "missing" in caplog.text


def test_a_bak_with_the_newest_content_is_no_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After a first persist the .bak equals the file, and the record says so."""
    manager = _offsets(tmp_path / "config" / "consumerOffset.json", q0=7)
    manager.persist()
    manager.path.write_bytes(b"\x00" * 64)
    reloaded = ConsumerOffsetManager(manager.path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert reloaded.load()
    assert reloaded.loaded_from == manager.bak_path
    assert reloaded.query_offset("g", "T", 0) == 7
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_both_files_unusable_start_empty_and_are_counted_without_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.path.write_bytes(b"{{{")
    manager.bak_path.write_bytes(b"")
    manager.commit_offset("g", "T", 0, 9)  # content from before the load is dropped too
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not manager.load()
    assert manager.table == {}
    assert manager.load_failures == 1
    assert manager.statistics().load_failures == 1
    assert manager.loaded_from is None
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert (manager.path.read_bytes(), manager.bak_path.read_bytes()) == (b"{{{", b"")


def test_a_corrupt_file_without_a_bak_is_a_load_failure(tmp_path: Path) -> None:
    manager = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    manager.path.write_bytes(b"\x00" * 16)
    assert not manager.load()
    assert manager.load_failures == 1
    assert manager.path.read_bytes() == b"\x00" * 16


def test_no_files_is_a_new_store_not_a_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = ConsumerOffsetManager(tmp_path / "config" / "consumerOffset.json")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert manager.load()
    assert manager.table == {}
    assert manager.load_failures == 0
    assert not caplog.records
    assert not manager.path.parent.exists(), "load creates nothing"


def test_the_base_class_asks_subclasses_for_the_content(tmp_path: Path) -> None:
    manager = ConfigManager(tmp_path / "x.json")
    with pytest.raises(NotImplementedError):
        manager.persist()


# ------------------------------------------------------------------------------ topics.json


def test_topics_json_is_written_as_rocketmq_writes_it(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path / "topics.json", clock_ms=lambda: 1636355958169)
    assert manager.create_if_absent("TopicTest", 4) == TopicConfig("TopicTest", 4, 4)
    manager.persist()
    assert manager.path.read_text(encoding="utf-8") == ROCKETMQ_TOPICS


def test_rocketmq_topics_json_reads_back_identically(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text(ROCKETMQ_TOPICS, encoding="utf-8")
    manager = TopicConfigManager(path)
    assert manager.load()
    assert manager.get("TopicTest") == TopicConfig(
        topic_name="TopicTest",
        read_queue_nums=4,
        write_queue_nums=4,
        perm=6,
        topic_filter_type="SINGLE_TAG",
        topic_sys_flag=0,
        order=False,
    )
    assert (manager.counter, manager.timestamp_ms) == (1, 1636355958169)
    assert manager.encode() == ROCKETMQ_TOPICS


def test_every_change_and_only_a_change_bumps_the_data_version(tmp_path: Path) -> None:
    ticks = iter(range(1000, 2000))
    manager = TopicConfigManager(tmp_path / "topics.json", clock_ms=lambda: next(ticks))
    manager.create_if_absent("A", 4)
    assert manager.create_if_absent("A", 8) == TopicConfig("A", 4, 4), "absent only"
    assert not manager.put(TopicConfig("A", 4, 4))
    assert (manager.counter, manager.timestamp_ms) == (1, 1000)
    assert manager.put(TopicConfig("A", 8, 8, order=True))
    manager.create_if_absent("B", 1)
    assert (manager.counter, manager.timestamp_ms) == (3, 1002)
    assert manager.topics() == ["A", "B"]
    assert manager.get("C") is None


def test_a_5x_topics_json_loads_ignoring_fields_49_does_not_have(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text(
        '{"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1670616895921},"topicConfigTable":'
        '{"TBW102":{"attributes":{},"order":false,"perm":7,"readQueueNums":8,"topicFilterType":"SINGLE_TAG",'
        '"topicName":"TBW102","topicSysFlag":0,"writeQueueNums":8}}}',
        encoding="utf-8",
    )
    manager = TopicConfigManager(path)
    assert manager.load()
    assert manager.get("TBW102") == TopicConfig("TBW102", 8, 8, perm=7)
    assert manager.counter == 3


@pytest.mark.parametrize(
    "bean",
    [
        '{"topicName":"Other","readQueueNums":1,"writeQueueNums":1}',
        '{"topicName":"T","readQueueNums":-1,"writeQueueNums":1}',
        '{"topicName":"T","readQueueNums":"4","writeQueueNums":1}',
        '{"topicName":"T","readQueueNums":1,"writeQueueNums":1,"order":"yes"}',
        "[]",
    ],
)
def test_a_topics_json_with_a_bad_bean_is_unusable(tmp_path: Path, bean: str) -> None:
    path = tmp_path / "topics.json"
    path.write_text('{"topicConfigTable":{"T":' + bean + "}}", encoding="utf-8")
    manager = TopicConfigManager(path)
    assert not manager.load()
    assert manager.table == {}


@pytest.mark.parametrize(
    "kwargs",
    [{"topic_name": ""}, {"read_queue_nums": -1}, {"perm": True}, {"order": 1}, {"topic_filter_type": None}],
)
def test_topic_config_rejects_values_rocketmq_could_not_hold(kwargs: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"topic_name": "T", "read_queue_nums": 1, "write_queue_nums": 1} | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        TopicConfig(**fields)


def test_a_repeated_key_is_malformed() -> None:
    with pytest.raises(FastJsonError, match="Duplicate key 'a'"):
        loads('{"a":1,"b":2,"a":3}')
    with pytest.raises(FastJsonError, match="Duplicate key 0"):
        loads("{0:1,0:2}")
    assert loads('{0:1,"0":2}') == {0: 1, "0": 2}, "an int key and a str key are different keys"


def test_damaged_topics_json_salvages_every_whole_bean(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    good = ROCKETMQ_TOPICS.replace(
        '"topicConfigTable":{',
        '"topicConfigTable":{\n\t\t"A":{"topicName":"A","readQueueNums":2,"writeQueueNums":2},',
    )
    path.write_text(good[: good.index('"topicName":"TopicTest"')], encoding="utf-8")
    manager = TopicConfigManager(path, clock_ms=lambda: 5)
    assert not manager.load()
    assert manager.topics() == ["A"]
    assert manager.counter == 2, "past the salvaged data version"
    assert manager.last_load.salvaged == "1 topic config(s) (A)"
