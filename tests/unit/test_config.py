"""rmq_mp.config.store_config: Java properties syntax, RocketMQ 4.9.8 defaults, validation, adjustments."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_mp.config.store_config import (
    IGNORED_PROPERTIES,
    PROPERTY_NAMES,
    BrokerRole,
    FlushDiskType,
    MessageStoreConfig,
    camel_to_snake,
    parse_properties,
    snake_to_camel,
)
from rmq_mp.errors import ConfigError

SHIPPED_CONF = Path(__file__).resolve().parents[2] / "conf" / "broker.conf"
LOGGER = "rmq_mp.config.store_config"


def load(text: str) -> MessageStoreConfig:
    return MessageStoreConfig.from_properties(parse_properties(text), source="<test>")


# ----------------------------------------------------------------------------- defaults


def test_defaults_are_rocketmq_4_9_8_values():
    """Spot checks against docs/format.md §13."""
    c = MessageStoreConfig()
    assert c.store_path_root_dir == os.path.expanduser("~/store")
    assert c.commit_log_dir == Path(os.path.expanduser("~/store")) / "commitlog"
    assert c.mapped_file_size_commit_log == 1073741824
    assert c.mapped_file_size_consume_queue == 6000000
    assert c.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert c.broker_role is BrokerRole.ASYNC_MASTER
    assert c.flush_interval_commit_log == 500
    assert c.flush_commit_log_least_pages == 4
    assert c.flush_commit_log_thorough_interval == 10000
    assert c.commit_interval_commit_log == 200
    assert c.sync_flush_timeout == 5000
    assert c.flush_consume_queue_thorough_interval == 60000
    assert c.delete_when == "04"
    assert c.file_reserved_time == 72
    assert c.disk_max_used_space_ratio == 75
    assert c.max_message_size == 4194304
    assert c.max_hash_slot_num == 5000000
    assert c.max_index_num == 20000000
    assert c.transient_store_pool_size == 5
    assert c.transient_store_pool_enable is False
    assert c.flush_least_pages_when_warm_maped_file == 4096
    assert c.use_reentrant_lock_when_put_message is True
    assert c.flush_commit_log_timed is True
    assert c.check_crc_on_recover is True
    assert c.message_delay_level == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert c.max_transfer_bytes_on_message_in_memory == 262144
    assert c.max_transfer_count_on_message_in_memory == 32
    assert c.max_transfer_bytes_on_message_in_disk == 65536
    assert c.max_transfer_count_on_message_in_disk == 8
    assert (c.broker_cluster_name, c.broker_name, c.listen_port) == ("DefaultCluster", "broker-a", 10911)
    assert (c.disk_space_warning_level_ratio, c.disk_space_clean_forcibly_ratio) == (90, 85)
    assert c.adjustments == ()


def test_derived_paths_and_values(tmp_path):
    c = MessageStoreConfig(store_path_root_dir=str(tmp_path))
    assert c.commit_log_dirs == (tmp_path / "commitlog",)
    assert c.consume_queue_dir == tmp_path / "consumequeue"
    assert c.index_dir == tmp_path / "index"
    assert c.checkpoint_path == tmp_path / "checkpoint"
    assert c.abort_path == tmp_path / "abort"
    assert c.lock_path == tmp_path / "lock"
    assert c.config_dir == tmp_path / "config"
    assert c.read_only_commit_log_dirs == ()
    assert c.delete_when_hours == frozenset({4})
    assert len(c.delay_levels_ms) == 18
    assert c.delay_levels_ms[0] == 1000
    assert c.delay_levels_ms[-1] == 7_200_000
    assert c.index_file_size_bytes == 40 + 5000000 * 4 + 20000000 * 20

    multi = c.replace(store_path_commit_log=f"{tmp_path}/a,{tmp_path}/b")
    assert multi.commit_log_dirs == (tmp_path / "a", tmp_path / "b")
    assert multi.commit_log_dir == tmp_path / "a"


def test_relative_paths_resolve_against_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = load("storePathRootDir=./store\nstorePathCommitLog=cl1,cl2\n")
    assert c.store_path_root_dir == str(tmp_path / "store")
    assert c.commit_log_dirs == (tmp_path / "cl1", tmp_path / "cl2")


# ----------------------------------------------------------------------------- names


def test_camel_snake_mapping_is_mechanical_both_ways():
    assert camel_to_snake("mappedFileSizeCommitLog") == "mapped_file_size_commit_log"
    assert camel_to_snake("checkCRCOnRecover") == "check_crc_on_recover"
    assert camel_to_snake("brokerIP1") == "broker_ip1"
    assert snake_to_camel("check_crc_on_recover") == "checkCRCOnRecover"
    assert snake_to_camel("broker_ip1") == "brokerIP1"
    fields = {f.name for f in dataclasses.fields(MessageStoreConfig)}
    for key in PROPERTY_NAMES:
        assert snake_to_camel(camel_to_snake(key)) == key
        assert camel_to_snake(key) in fields


# ----------------------------------------------------------------------------- shipped conf


def test_shipped_broker_conf_loads_and_lists_every_property():
    keys = parse_properties(SHIPPED_CONF.read_text(encoding="utf-8"))
    assert set(keys) == set(PROPERTY_NAMES)
    c = MessageStoreConfig.from_file(SHIPPED_CONF)
    assert c.adjustments == ()
    assert c.ignored_properties == ()
    # The deliberate differences from RocketMQ's defaults; everything else is RocketMQ's.
    assert c.mapped_file_size_commit_log == 104857600
    assert (c.max_hash_slot_num, c.max_index_num) == (500000, 2000000)
    assert c.store_path_root_dir == os.path.abspath("store")
    differing = {
        spec
        for spec, value in c.to_properties().items()
        if value != MessageStoreConfig().to_properties()[spec]
    }
    assert differing == {"mappedFileSizeCommitLog", "maxHashSlotNum", "maxIndexNum", "storePathRootDir"}


def test_rocketmq_distribution_broker_conf_loads():
    """distribution/conf/broker.conf (docs/format.md §14.2) plus common broker keys."""
    text = (
        "brokerClusterName = DefaultCluster\n"
        "brokerName = broker-a\n"
        "brokerId = 0\n"
        "deleteWhen = 04\n"
        "fileReservedTime = 48\n"
        "brokerRole = ASYNC_MASTER \n"  # trailing space: RocketMQ silently ignores this line
        "flushDiskType = ASYNC_FLUSH\n"
        "namesrvAddr = 127.0.0.1:9876\n"
        "autoCreateTopicEnable=true\n"
    )
    c = load(text)
    assert c.file_reserved_time == 48
    assert c.broker_role is BrokerRole.ASYNC_MASTER
    assert c.ignored_properties == ("brokerId=0", "namesrvAddr=127.0.0.1:9876", "autoCreateTopicEnable=true")
    assert set(IGNORED_PROPERTIES) >= {"brokerId", "namesrvAddr", "sendMessageThreadPoolNums"}


# ----------------------------------------------------------------------------- Java properties syntax


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=b", {"a": "b"}),
        ("a:b", {"a": "b"}),
        ("a b", {"a": "b"}),
        ("a\tb", {"a": "b"}),
        ("  a  =  b", {"a": "b"}),
        ("a  :  b", {"a": "b"}),
        ("a = = b", {"a": "= b"}),  # only one separator is skipped
        ("a b=c", {"a": "b=c"}),
        ("a", {"a": ""}),
        ("a=", {"a": ""}),
        ("a=b  \t", {"a": "b"}),  # rmq-mp: trailing whitespace stripped
        ("a=b\\ ", {"a": "b "}),  # ... unless escaped
        ("a=b\\\\ ", {"a": "b\\"}),
        ("# c=d\n! e=f\n   # g=h\na=b", {"a": "b"}),
        ("\n\n   \na=b\n\n", {"a": "b"}),
        ("a=1\na=2", {"a": "2"}),
        ("a\\=b=c", {"a=b": "c"}),
        ("a\\:b:c", {"a:b": "c"}),
        ("a\\ b c", {"a b": "c"}),
        ("a=\\t\\n\\r\\f", {"a": "\t\n\r\f"}),
        ("a=\\q\\=\\:", {"a": "q=:"}),
        ("caf\\u00e9=\\u00E9t\\u00e9", {"café": "été"}),
        ("a=\\ud83d\\ude00", {"a": "\U0001f600"}),
        ("a=caf\u00e9", {"a": "café"}),
        ("a=b\\\n   c", {"a": "bc"}),
        ("a=b\\\r\n\t c\\\r   d", {"a": "bcd"}),
        ("a=b\\\n# not a comment", {"a": "b# not a comment"}),
        ("# comment \\\na=b", {"a": "b"}),  # a comment line never continues
        ("a=b\\\\\nc=d", {"a": "b\\", "c": "d"}),  # even backslashes: no continuation
        ("a=b\\\n\nc=d", {"a": "b", "c": "d"}),  # blank line ends a continuation
        ("a=b\\", {"a": "b"}),  # continuation at end of input
        ("a\\\n  b=c", {"ab": "c"}),
    ],
)
def test_java_properties_syntax(text, expected):
    assert parse_properties(text) == expected


@pytest.mark.parametrize("text", ["a=\\u00g1", "a=\\u12", "\\uzzzz=b"])
def test_malformed_unicode_escape_is_an_error(text):
    with pytest.raises(ConfigError, match="malformed"):
        parse_properties(text)


def _java_escape(text: str, *, is_key: bool) -> str:
    """`Properties.saveConvert`, enough to write any key or value back."""
    out = []
    for i, char in enumerate(text):
        if char == "\\":
            out.append("\\\\")
        elif char in "=:#!":
            out.append("\\" + char)
        elif char == " " and (is_key or i == 0 or i == len(text) - 1):
            out.append("\\ ")
        elif char in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[char])
        elif ord(char) < 0x20 or ord(char) > 0x7E:
            out.append("".join(f"\\u{unit:04x}" for unit in _utf16_units(char)))
        else:
            out.append(char)
    return "".join(out)


def _utf16_units(char: str) -> list[int]:
    data = char.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


@given(st.dictionaries(st.text(min_size=1), st.text()))
def test_escaped_properties_round_trip(mapping):
    lines = [f"{_java_escape(k, is_key=True)}={_java_escape(v, is_key=False)}" for k, v in mapping.items()]
    text = "\n".join(lines)
    assert parse_properties(text) == mapping


# ----------------------------------------------------------------------------- errors


def test_unknown_key_names_key_and_suggestion():
    with pytest.raises(ConfigError) as excinfo:
        load("mapedFileSizeCommitLog=1024")
    message = str(excinfo.value)
    assert "'mapedFileSizeCommitLog'" in message
    assert "did you mean 'mappedFileSizeCommitLog'" in message
    assert "<test>" in message


def test_unknown_key_suggestion_is_case_insensitive():
    with pytest.raises(ConfigError, match="did you mean 'flushDiskType'"):
        load("FLUSHDISKTYPE=SYNC_FLUSH")


def test_unknown_key_without_close_match():
    with pytest.raises(ConfigError, match="unknown property 'zzz'"):
        load("zzz=1")


def test_key_that_does_nothing_in_rocketmq_either():
    with pytest.raises(ConfigError, match=r"storePathConsumeQueue.*nothing in RocketMQ 4\.9\.8"):
        load("storePathConsumeQueue=/data/cq")


def test_unsupported_feature_accepted_only_at_default():
    assert load("enableDLegerCommitLog=false").ignored_properties == ("enableDLegerCommitLog=false",)
    with pytest.raises(ConfigError, match="DLedger"):
        load("enableDLegerCommitLog=true")
    assert load("duplicationEnable=false").ignored_properties == ("duplicationEnable=false",)
    with pytest.raises(ConfigError, match="replication"):
        load("duplicationEnable=true")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("checkCRCOnRecover=yes", "expected boolean"),
        ("checkCRCOnRecover=ture", "expected boolean"),
        ("checkCRCOnRecover=", "expected boolean"),
        ("mappedFileSizeCommitLog=1g", "expected int"),
        ("mappedFileSizeCommitLog=1_000", "expected int"),
        ("mappedFileSizeCommitLog=1.5", "expected int"),
        ("mappedFileSizeCommitLog=3000000000", "Java int range"),
        ("flushDiskType=sync_flush", "expected one of ASYNC_FLUSH, SYNC_FLUSH"),
        ("brokerRole=MASTER", "expected one of ASYNC_MASTER, SYNC_MASTER, SLAVE"),
    ],
)
def test_bad_values_name_property_value_and_type(line, expected):
    key, _, value = line.partition("=")
    with pytest.raises(ConfigError, match=expected) as excinfo:
        load(line)
    assert key in str(excinfo.value)
    assert value in str(excinfo.value)


def test_boolean_is_case_insensitive():
    assert load("checkCRCOnRecover=FALSE").check_crc_on_recover is False
    assert load("checkCRCOnRecover=True").check_crc_on_recover is True


def test_long_fields_accept_long_values():
    assert load("osPageCacheBusyTimeOutMills=3000000000").os_page_cache_busy_time_out_mills == 3000000000


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("mappedFileSizeCommitLog=0", "mappedFileSizeCommitLog = 0: must be >= 4096"),
        ("mappedFileSizeCommitLog=-1", "must be >= 4096"),
        ("mappedFileSizeCommitLog=1", "mappedFileSizeCommitLog = 1: must be >= 4096"),
        ("mappedFileSizeCommitLog=4095", "mappedFileSizeCommitLog = 4095: must be >= 4096"),
        ("mappedFileSizeConsumeQueue=0", "mappedFileSizeConsumeQueue = 0: must be >= 20"),
        ("mappedFileSizeConsumeQueue=19", "mappedFileSizeConsumeQueue = 19: must be >= 20"),
        ("storePathRootDir=a\\u0000b", "storePathRootDir = .*: a path cannot hold a NUL character"),
        ("storePathCommitLog=/x\\u0000", "storePathCommitLog"),
        ("flushIntervalCommitLog=-1", "flushIntervalCommitLog = -1: must be >= 0"),
        ("cleanResourceInterval=-5", "cleanResourceInterval = -5: must be >= 0"),
        ("transientStorePoolEnable=true\ntransientStorePoolSize=0", "transientStorePoolSize > 0"),
        ("maxHashSlotNum=0", "maxHashSlotNum = 0: must be >= 1"),
        ("maxIndexNum=0", "maxIndexNum = 0: must be >= 1"),
        ("maxIndexNum=200000000", "index file must be < 2 GiB"),
        ("deleteWhen=24", "deleteWhen = '24': must be hours 0..23"),
        ("deleteWhen=04;x", "deleteWhen"),
        ("deleteWhen=", "deleteWhen"),
        ("diskMaxUsedSpaceRatio=101", "diskMaxUsedSpaceRatio = 101: must be <= 100"),
        ("diskSpaceWarningLevelRatio=-1", "must be >= 0"),
        ("messageDelayLevel=1s 5x", "messageDelayLevel"),
        ("brokerIP1=localhost", "brokerIP1"),
        ("listenPort=70000", "listenPort = 70000: must be <= 65535"),
    ],
)
def test_values_the_store_cannot_run_with_are_rejected(text, rule):
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(")):
        load(text)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as excinfo:
        load("mapedFileSizeCommitLog=1\nflushDiskType=SYNC\ncheckCRCOnRecover=1")
    message = str(excinfo.value)
    assert "mapedFileSizeCommitLog" in message
    assert "flushDiskType" in message
    assert "checkCRCOnRecover" in message


def test_commit_log_size_need_not_be_page_aligned():
    assert load("mappedFileSizeCommitLog=10000").mapped_file_size_commit_log == 10000


def test_the_smallest_file_sizes():
    """A page of commit log (a size of 1 used to be accepted, and then every put refused); one
    ConsumeQueue entry, a size that is no multiple of 20 rounded up as RocketMQ's getter does."""
    assert load("mappedFileSizeCommitLog=4096").mapped_file_size_commit_log == 4096
    assert load("mappedFileSizeConsumeQueue=20").mapped_file_size_consume_queue == 20
    assert load("mappedFileSizeConsumeQueue=21").mapped_file_size_consume_queue == 40


def test_from_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        MessageStoreConfig.from_file(tmp_path / "missing.conf")
    latin1 = tmp_path / "latin1.conf"
    latin1.write_bytes(b"brokerName=caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        MessageStoreConfig.from_file(latin1)


# ----------------------------------------------------------------------------- adjustments


@pytest.mark.parametrize(("written", "effective"), [(128, 140), (21, 40), (20, 20), (6000000, 6000000)])
def test_consume_queue_size_rounded_up_to_multiple_of_20(written, effective, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    c = load(f"mappedFileSizeConsumeQueue={written}")
    assert c.mapped_file_size_consume_queue == effective
    note = f"mappedFileSizeConsumeQueue: {written} -> {effective}"
    if written == effective:
        assert c.adjustments == ()
    else:
        assert len(c.adjustments) == 1
        assert c.adjustments[0].startswith(note)
        assert note in caplog.text


@pytest.mark.parametrize(
    "text",
    ["flushDiskType=SYNC_FLUSH", "brokerRole=SLAVE"],
)
def test_transient_store_pool_off_under_sync_flush_or_slave(text, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    c = load(f"transientStorePoolEnable=true\n{text}")
    assert c.transient_store_pool_enable is False
    assert len(c.adjustments) == 1
    assert c.adjustments[0].startswith("transientStorePoolEnable: true -> false")
    assert "transientStorePoolEnable: true -> false" in caplog.text


def test_transient_store_pool_kept_on_async_master():
    c = load("transientStorePoolEnable=true\nbrokerRole=SYNC_MASTER")
    assert c.transient_store_pool_enable is True
    assert c.adjustments == ()


@pytest.mark.parametrize(
    ("key", "written", "effective"),
    [
        ("diskMaxUsedSpaceRatio", 5, 10),
        ("diskMaxUsedSpaceRatio", 99, 95),
        ("diskSpaceWarningLevelRatio", 95, 90),
        ("diskSpaceWarningLevelRatio", 20, 35),
        ("diskSpaceCleanForciblyRatio", 90, 85),
        ("diskSpaceCleanForciblyRatio", 10, 30),
    ],
)
def test_disk_ratios_clamped(key, written, effective):
    c = load(f"{key}={written}")
    assert getattr(c, camel_to_snake(key)) == effective
    assert c.adjustments[0].startswith(f"{key}: {written} -> {effective} (clamped")


def test_all_adjustments_logged_in_one_record(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    c = load(
        "mappedFileSizeConsumeQueue=128\ntransientStorePoolEnable=true\nflushDiskType=SYNC_FLUSH\n"
        "diskMaxUsedSpaceRatio=99\ndiskSpaceWarningLevelRatio=99\ndiskSpaceCleanForciblyRatio=99\n"
    )
    assert len(c.adjustments) == 5
    records = [r for r in caplog.records if "adjustment(s):" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    for note in c.adjustments:
        assert note in records[0].getMessage()
    loaded = [r for r in caplog.records if "loaded from <test>" in r.getMessage()]
    assert len(loaded) == 1


def test_direct_construction_is_adjusted_too():
    c = MessageStoreConfig(mapped_file_size_consume_queue=128)
    assert c.mapped_file_size_consume_queue == 140
    assert c.adjustments


# ----------------------------------------------------------------------------- replace, round trip


def test_replace_overrides_and_validates(tmp_path):
    base = MessageStoreConfig(store_path_root_dir=str(tmp_path))
    c = base.replace(mapped_file_size_commit_log=4096, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    assert c.mapped_file_size_commit_log == 4096
    assert c.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert base.mapped_file_size_commit_log == 1073741824
    with pytest.raises(ConfigError, match="mappedFileSizeCommitLog = 0"):
        base.replace(mapped_file_size_commit_log=0)
    with pytest.raises(ConfigError, match="did you mean 'mapped_file_size_commit_log'"):
        base.replace(maped_file_size_commit_log=4096)
    with pytest.raises(ConfigError, match="expected int"):
        base.replace(mapped_file_size_commit_log="4096")
    with pytest.raises(ConfigError, match="expected int"):
        base.replace(mapped_file_size_commit_log=True)
    with pytest.raises(ConfigError, match="expected boolean"):
        base.replace(check_crc_on_recover=1)
    with pytest.raises(ConfigError, match="one of ASYNC_FLUSH"):
        base.replace(flush_disk_type="SYNC_FLUSH")


def test_replace_reruns_adjustments_from_written_values():
    sync = MessageStoreConfig().replace(
        transient_store_pool_enable=True,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        mapped_file_size_consume_queue=128,
    )
    assert sync.transient_store_pool_enable is False
    assert len(sync.adjustments) == 2
    back = sync.replace(flush_disk_type=FlushDiskType.ASYNC_FLUSH)
    assert back.transient_store_pool_enable is True  # as written, now effective
    assert back.adjustments == (sync.adjustments[0],)  # the CQ rounding still applies
    resized = back.replace(mapped_file_size_consume_queue=200)
    assert resized.adjustments == ()


def test_to_properties_round_trips(tmp_path):
    c = load(
        f"storePathRootDir={tmp_path}\nflushDiskType=SYNC_FLUSH\nmappedFileSizeConsumeQueue=128\n"
        "checkCRCOnRecover=false\nbrokerIP1=::1\nmessageDelayLevel=1s 2m\nshmName=demo\n"
    )
    properties = c.to_properties()
    assert set(properties) == set(PROPERTY_NAMES)
    assert properties["flushDiskType"] == "SYNC_FLUSH"
    assert properties["checkCRCOnRecover"] == "false"
    assert properties["mappedFileSizeConsumeQueue"] == "140"
    assert MessageStoreConfig.from_properties(properties) == c
    conf = tmp_path / "round.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in properties.items()), encoding="utf-8")
    assert MessageStoreConfig.from_file(conf) == c


def test_config_pickles():
    c = load("mappedFileSizeConsumeQueue=128\nbrokerId=1")
    clone = pickle.loads(pickle.dumps(c))
    assert clone == c
    assert clone.adjustments == c.adjustments
    assert clone.ignored_properties == c.ignored_properties


def test_config_is_frozen():
    c = MessageStoreConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.mapped_file_size_commit_log = 1
