"""Issue 18, items 3 and 9: hostile input against real stores.

- Property separators (``\\x01`` between a name and its value, ``\\x02`` between properties) in a
  property name or value, tags or keys would rewrite other properties when the record is read
  back (``x\\x02KEYS\\x01injected\\x02y`` sets KEYS): refused as MESSAGE_ILLEGAL naming the field
  on every put path, nothing stored, nothing indexed.
- `MessageStore`'s public calls, waits, commits, rmq-admin and broker.conf answer bad values
  with a typed error or a RocketMQ status and persist nothing of a refused call.

The expected outcomes are computed here from the rules, not from `rmq_mp.validators`.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import loads
from rmq_mp.config.store_config import PROPERTY_NAMES, MessageStoreConfig
from rmq_mp.errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError
from rmq_mp.format import message as m
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.outcomes import GetMessageResult, GetMessageStatus, PutMessageStatus
from rmq_mp.put.producer import Producer
from rmq_mp.store.message_store import MessageStore
from rmq_mp.tools.admin import main as admin_main
from shm import layout
from shm.names import ShmNames
from tests.service import (
    BASE_SETTINGS,
    ROOT,
    STARTED,
    RunningService,
    running_service,
    wait_until,
    write_conf,
)

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
EXAMPLES = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
INJECTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("name", {"properties": {"x\x02KEYS\x01injected\x02y": "v"}}, "property name"),
    ("value", {"properties": {"a": "v\x02TAGS\x01Z"}}, "value of property 'a'"),
    ("value-cut", {"properties": {"a": "v\x02w"}}, "value of property 'a'"),
    ("name-value", {"properties": {"a\x01b": "v"}}, "property name"),
    ("tags", {"tags": "A\x02TAGS\x01Z"}, "tags"),
    ("keys", {"keys": "k\x02TAGS\x01Z"}, "keys"),
    ("keys-list", {"keys": ["k", "k2\x02KEYS\x01injected"]}, "keys"),
    ("uniq", {"properties": {"UNIQ_KEY": "u\x02KEYS\x01injected"}}, "value of property 'UNIQ_KEY'"),
]
"""Issue 18's injections (and their siblings): each would set KEYS or TAGS, or cut a value."""
LEGIT = {"a": "1", "b": "x y", "KEYS_LIKE": "KEYS=1", "utf": "主题-τ"}
"""Properties that must round-trip unchanged (no separator in them)."""


def wrote(service: RunningService) -> int:
    return service.read(layout.WROTE_POSITION)


# ------------------------------------------------------------------ item 3: separators


@pytest.mark.parametrize(("case", "fields", "what"), INJECTIONS, ids=[c[0] for c in INJECTIONS])
def test_property_separators_are_refused_on_every_producer_path(
    tmp_path: Path, case: str, fields: dict[str, Any], what: str
) -> None:
    """send, send_batch items (the Spark sink's path), a MessageBatch and a `Message` item: each
    answers MESSAGE_ILLEGAL with a reason naming the field, and stores nothing."""
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        results = [producer.send("T", b"x", queue_id=0, **fields)]
        results += producer.send_batch([dict(topic="T", body=b"x", queue_id=0, **fields)])
        results += producer.send_batch([dict(topic="T", body=b"ok", queue_id=1), dict(topic="T", body=b"x", **fields)])[1:]  # fmt: skip
        batch_fields: dict[str, Any] = {k: ([val] if k == "keys" else val) for k, val in fields.items()}
        results += producer.send_batch(MessageBatch("T", [b"x"], queue_id=0, **batch_fields))
        if "properties" in fields:
            results += producer.send_batch([m.Message(topic="T", body=b"x", properties=fields["properties"])])
        for result in results:
            assert result.status is ILLEGAL, (case, result)
            assert what in result.reason, result.reason
            assert "separator" in result.reason
            assert result.commit_log_offset == -1
        assert wrote(service) > 0  # only the one good message of queue 1
        assert consumer.queues.find("T", 0) < 0, "nothing reached queue 0"
        wait_until(lambda: consumer.pull("T", 1, 0).status is GetMessageStatus.FOUND, 10, "the good one")
        assert [x.body for x in consumer.pull("T", 1, 0).messages] == [b"ok"]


def test_a_batch_with_one_injected_key_is_refused_whole(tmp_path: Path) -> None:
    with running_service(tmp_path) as service, Producer.attach(service.root) as producer:
        batch = MessageBatch("T", [b"a", b"b", b"c"], queue_id=0, keys=["k1", "k\x02TAGS\x01Z", None])
        assert [r.status for r in producer.send_batch(batch)] == [ILLEGAL] * 3
        assert wrote(service) == 0


def test_injected_keys_and_tags_are_never_indexed_or_matched(small_config: MessageStoreConfig) -> None:
    """`MessageStore.put_message`: the injection is refused, so no KEYS index entry and no tag
    filter match; legitimate properties still round-trip (and are indexed)."""
    with MessageStore.open(config=small_config) as store:
        for properties in (
            {"x\x02KEYS\x01injected\x02y": "v"},
            {"a": "v\x02TAGS\x01Z"},
            {"TAGS": "A\x02KEYS\x01injected"},
        ):
            result = store.put_message(m.Message(topic="T", body=b"x", properties=properties))
            assert result.status is ILLEGAL, result
            assert "separator" in result.reason
        assert store.max_phy_offset() == 0, "nothing stored"
        good = store.put_message(
            m.Message(topic="T", body=b"ok", properties={**LEGIT, "KEYS": "k1 k2", "TAGS": "A"})
        )
        assert good.status is PutMessageStatus.PUT_OK
        assert store.query_message("T", "injected") == []
        assert [x.body for x in store.query_message("T", "k2")] == [b"ok"]
        assert store.get_message("T", 0, 0, tags=frozenset({"Z"})).messages == []
        found = store.get_message("T", 0, 0, tags=frozenset({"A"})).messages
        assert [x.body for x in found] == [b"ok"]
        assert {k: found[0].properties[k] for k in LEGIT} == LEGIT


def test_legitimate_properties_round_trip_through_a_running_store(tmp_path: Path) -> None:
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        assert producer.send("P", b"1", queue_id=0, tags="A", keys=["k1", "k2"], properties=LEGIT).ok
        assert producer.send_batch(MessageBatch("P", [b"2", b"3"], queue_id=0, tags="A", properties=LEGIT)).ok
        wait_until(lambda: len(consumer.pull("P", 0, 0).messages) == 3, 10, "three dispatched")
        got = consumer.pull("P", 0, 0, tags=frozenset({"A"})).messages
        assert [x.body for x in got] == [b"1", b"2", b"3"]
        for msg in got:
            assert {k: msg.properties[k] for k in LEGIT} == LEGIT
        assert got[0].keys == "k1 k2"


# ------------------------------------------------------------------ item 9: MessageStore calls

ODD = st.one_of(
    st.none(), st.booleans(), st.floats(), st.text(max_size=2), st.binary(max_size=2), st.just(object())
)
INTS = st.one_of(
    st.integers(-3, 3), st.sampled_from([INT_MAX, INT_MAX + 1, -(2**31) - 1, LONG_MAX, LONG_MAX + 1, -(2**63) - 1])
)  # fmt: skip
TOPICS = st.one_of(st.sampled_from(["T", "a\udc80", "", "a/b", "t" * 128, "主题-τ"]), ODD)
BODIES = st.one_of(st.binary(max_size=8), st.none(), st.text(max_size=2), st.integers())
PROPS = st.one_of(
    st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["v", "w"]), max_size=2),
    st.dictionaries(st.sampled_from(["a", "x\x02KEYS\x01injected\x02y"]), st.sampled_from(["v", "v\x02TAGS\x01Z"]), min_size=1, max_size=2),
    st.sampled_from([[("a", "b")], "a=b"]),
)  # fmt: skip


def message_outcome(fields: dict[str, Any]) -> str:
    """'type', 'illegal' or 'ok' for a `Message` with these fields, by RocketMQ's rules."""
    topic, body, props = fields["topic"], fields["body"], fields["properties"]
    ints = [fields[k] for k in ("queue_id", "flag", "sys_flag")]
    if not isinstance(topic, str) or not isinstance(body, bytes) or not isinstance(props, dict):
        return "type"
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ints):
        return "type"
    try:
        topic_bytes = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return "illegal"
    queue_id, flag, sys_flag = ints
    if not topic or "/" in topic or topic_bytes > 127 or not 0 <= queue_id <= INT_MAX:
        return "illegal"
    if not -(2**31) <= flag <= INT_MAX or not -(2**31) <= sys_flag <= INT_MAX:
        return "illegal"
    if any("\x01" in t or "\x02" in t for t in [*props, *props.values()]):
        return "illegal"
    return "ok"


def test_hostile_message_store_calls(small_config: MessageStoreConfig) -> None:
    """put_message, get_message, query_message, look_message_by_offset, view_message_by_id and
    get_offset_in_queue_by_time: a status or a typed error; a refused put stores nothing."""
    with MessageStore.open(config=small_config) as store:
        first = store.put_message(m.Message(topic="T", body=b"first", properties={"KEYS": "k"}))
        assert first.status is PutMessageStatus.PUT_OK

        @EXAMPLES
        @given(fields=st.fixed_dictionaries({"topic": TOPICS, "body": BODIES, "properties": PROPS,
                                             "queue_id": st.one_of(INTS, ODD), "flag": st.one_of(INTS, ODD),
                                             "sys_flag": st.one_of(st.just(0), INTS)}))  # fmt: skip
        def put(fields: dict[str, Any]) -> None:
            before = store.max_phy_offset()
            expected = message_outcome(fields)
            try:
                result = store.put_message(m.Message(**fields))
            except InvalidArgumentTypeError:
                assert expected == "type", fields
                assert store.max_phy_offset() == before
                return
            assert expected != "type", (fields, result)
            if expected == "illegal":
                assert result.status is ILLEGAL, (fields, result)
                assert result.reason
                assert store.max_phy_offset() == before
            else:
                assert result.status is PutMessageStatus.PUT_OK, (fields, result)

        put()

        @EXAMPLES
        @given(topic=TOPICS, queue_id=st.one_of(INTS, ODD), offset=st.one_of(INTS, ODD),
               max_msgs=st.one_of(INTS, ODD), tags=st.one_of(st.none(), st.just(frozenset({"A"})), ODD))  # fmt: skip
        def get(topic: Any, queue_id: Any, offset: Any, max_msgs: Any, tags: Any) -> None:
            type_wrong = not isinstance(topic, str) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in (queue_id, offset, max_msgs)
            ) or not (tags is None or isinstance(tags, frozenset))  # fmt: skip
            try:
                result: Any = store.get_message(topic, queue_id, offset, max_msgs, tags=tags)
            except InvalidArgumentError as exc:
                result = exc
            if isinstance(result, InvalidArgumentError):
                if not type_wrong:
                    assert not isinstance(result, TypeError), result
                    assert (
                        topic in ("a\udc80", "", "a/b", "t" * 128)
                        or not 0 <= queue_id <= INT_MAX
                        or not -(2**63) <= offset <= LONG_MAX
                        or max_msgs < 1
                    ), result
                return
            assert not type_wrong
            assert isinstance(result.status, GetMessageStatus)

        get()

        @EXAMPLES
        @given(topic=TOPICS, key=st.one_of(st.just("k"), ODD), max_num=st.one_of(st.none(), INTS, ODD),
               begin=st.one_of(st.just(0), INTS, ODD), end=st.one_of(st.just(LONG_MAX), INTS, ODD))  # fmt: skip
        def query(topic: Any, key: Any, max_num: Any, begin: Any, end: Any) -> None:
            try:
                found = store.query_message(topic, key, max_num, begin, end)
            except InvalidArgumentError:
                return
            assert isinstance(topic, str)
            assert isinstance(key, str)
            assert max_num is None or max_num >= 1
            assert all(msg.topic == topic for msg in found)

        query()
        for call in (  # wrong types on purpose (ignored for mypy): each raises, typed
            lambda: store.look_message_by_offset("0"),  # type: ignore[arg-type]
            lambda: store.look_message_by_offset(2**70),
            lambda: store.view_message_by_id(None),  # type: ignore[arg-type]
            lambda: store.get_offset_in_queue_by_time("T", -1, 0),
            lambda: store.get_offset_in_queue_by_time("T", 0, "now"),  # type: ignore[arg-type]
            lambda: store.put_message("not a message"),  # type: ignore[arg-type]
        ):
            with pytest.raises(InvalidArgumentError):
                call()


@pytest.mark.parametrize(
    ("store_dir", "error"),
    [
        (5, InvalidArgumentTypeError),
        (b"store", InvalidArgumentTypeError),
        ("a\0b", ConfigError),
        ("", ConfigError),
    ],
)
def test_message_store_open_refuses_hostile_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_dir: Any, error: type[Exception]
) -> None:
    """Never a directory named ``5`` or ``b'store'`` in the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error):
        MessageStore.open(store_dir)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InvalidArgumentTypeError):
        MessageStore.open(tmp_path / "s", config="storePathRootDir=x")  # type: ignore[arg-type]


# ------------------------------------------------------------------ item 9: waits and commits


def test_hostile_waits_are_refused_and_long_ones_still_wake(tmp_path: Path) -> None:
    """NaN, infinite, negative or beyond Long.MAX_VALUE ms: `InvalidArgumentError` (posix_ipc
    once raised ExistentialError for NaN). A long finite wait still returns on the first message."""
    with (
        running_service(tmp_path) as service,
        Producer.attach(service.root) as producer,
        Consumer.attach(service.root, "g") as consumer,
    ):
        consumer.subscribe("W")
        for timeout in (math.nan, math.inf, -math.inf, -1, -0.001, 2**70, 1e300):
            with pytest.raises(InvalidArgumentError, match="finite number of seconds"):
                consumer.pull("W", 0, 0, timeout_s=timeout)
            with pytest.raises(InvalidArgumentError, match="finite number of seconds"):
                consumer.poll(timeout)
        for not_a_number in (None, "1", True):
            with pytest.raises(InvalidArgumentTypeError):
                consumer.pull("W", 0, 0, timeout_s=not_a_number)  # type: ignore[arg-type]
        pulled: list[GetMessageResult] = []
        puller = threading.Thread(  # a wait beyond what one semaphore wait holds
            target=lambda: pulled.append(consumer.pull("W", 0, 0, timeout_s=1e12)), daemon=True
        )
        puller.start()
        try:
            wait_until(lambda: consumer.waiters.waiting_slots() != [], 10, "the pull to park")
            assert producer.send("W", b"late", queue_id=0).ok
        finally:
            puller.join(30)
        assert not puller.is_alive(), "the message did not end the wait"
        assert [x.body for x in pulled[0].messages] == [b"late"]
        consumer.close()
        consumer.close()  # a second close (the `with` block's) is harmless


def test_refused_commits_persist_nothing(tmp_path: Path) -> None:
    """Issue 18: an offset of 2^63 once left a phantom offset 0 committed, and negative offsets
    and queue -1 reached consumerOffset.json. Refused commits record nothing, in shared memory
    and in the file the supervisor writes at stop."""
    with running_service(tmp_path) as service, Consumer.attach(service.root, "g") as consumer:
        for bad in (
            {("C", 0): 2**63},
            {("C", 0): -1},
            {("C", -1): 1},
            {("C", 2**31): 1},
            {("C", 1): 5, ("C", 2): -5},
            {("C", 1): 5, ("C@x", 2): 5},
            {("C", 1): 5, ("C", 2): "6"},
        ):
            with pytest.raises(InvalidArgumentError):
                consumer.commit(bad)  # type: ignore[arg-type]
        assert consumer.committed == {}
        assert [consumer.committed_offset("C", q) for q in range(3)] == [-1, -1, -1]
        consumer.commit({("C", 3): 7})
    table = loads((service.root / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert table == {"C@g": {3: 7}}


# ------------------------------------------------------------------ item 9: rmq-admin


def test_rmq_admin_answers_hostile_arguments_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_service(tmp_path) as service:
        name = str(service.root)
        assert admin_main(["sendMessage", "--name", name, "-t", "T", "-p", "x"]) == 0
        capsys.readouterr()
        for argv, code in (
            (["sendMessage", "--name", name, "-t", "T", "-p", "x", "-c", "A\x02TAGS\x01Z"], 1),
            (["sendMessage", "--name", name, "-t", "T", "-p", "\udc80\ud800"], 2),
            (["sendMessage", "--name", name, "-t", "a\udc80", "-p", "x"], 1),
            (["updateTopic", "--name", name, "-t", "a/b", "-r", "1"], 2),
            (["updateTopic", "--name", name, "-t", "t" * 128, "-r", "1"], 2),
            (["resetOffsetByTime", "--name", name, "-g", "a@b", "-t", "T", "-s", "now"], 2),
            (["resetOffsetByTime", "--name", name, "-g", "g", "-t", "T@x", "-s", "now"], 2),
            (["resetOffsetByTime", "--name", name, "-g", "g", "-t", "T", "-s", "²"], 2),
            (["resetOffsetByTime", "--name", name, "-g", "g", "-t", "T", "-s", "9" * 30], 2),
            (["consumeMessage", "--name", name, "-g", "g", "-t", "T@x"], 2),  # a group: its offsets key
            (["queryMsgByOffset", "--store", name, "--topic", "T", "--queue", "-1", "--offset", "0"], 2),
            (
                ["queryMsgByOffset", "--store", name, "--topic", "T", "--queue", "0", "--offset", str(2**63)],
                2,
            ),
            (["queryMsgByKey", "--store", name, "--topic", "a\udc80", "--key", "k"], 2),
        ):
            assert admin_main(argv) == code, argv
            out, err = capsys.readouterr()
            assert "Traceback" not in out + err
            if code == 2:
                assert err.startswith("rmq-admin: error: "), err
                assert err.count("\n") == 1, err
            else:
                assert "MESSAGE_ILLEGAL" in out
        for argv in (
            ["consumeMessage", "--name", name, "-t", "T", "--timeout", "nan"],
            ["consumeMessage", "--name", name, "-t", "T", "--timeout", "-1"],
            ["consumeMessage", "--name", name, "-t", "T", "--count", "0"],
        ):
            with pytest.raises(SystemExit):
                admin_main(argv)
            assert "error: argument" in capsys.readouterr().err
        topics = service.root / "config" / "topics.json"
        assert not topics.exists() or "a/b" not in topics.read_text()
    offsets = service.root / "config" / "consumerOffset.json"
    assert not offsets.exists() or "a@b" not in offsets.read_text()


# ------------------------------------------------------------------ item 9: broker.conf


def test_an_empty_broker_conf_says_where_the_store_goes(tmp_path: Path) -> None:
    """No storePathRootDir: RocketMQ's default ${user.home}/store (here HOME is the test's
    directory), said on stdout and in the supervisor's log."""
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in BASE_SETTINGS.items()), encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    root = home / "store"
    config = MessageStoreConfig.from_file(conf).replace(store_path_root_dir=str(root))
    names = ShmNames.for_store(str(root), config.shm_name)
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), "start", "--conf", str(conf)],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "HOME": str(home)},
        )  # fmt: skip
    STARTED.append(RunningService(conf, config, names, process, out))
    service = STARTED[-1]

    def running() -> bool:
        assert process.poll() is None, out.read_text()
        return (
            "running as" in (root / "logs" / "supervisor.log").read_text()
            if (root / "logs" / "supervisor.log").exists()
            else False
        )

    wait_until(running, 60, "the store to start in $HOME/store")
    assert service.stop() == 0
    STARTED.remove(service)
    note = (
        f"{conf} does not set storePathRootDir: the store is RocketMQ's default ${{user.home}}/store = {root}"
    )
    printed = out.read_text()
    assert f"starting store {root} as shm" in printed
    assert note in printed
    log = (root / "logs" / "supervisor.log").read_text()
    assert f"store root {root}" in log
    assert note in log
    assert names.leftovers() == []


def test_a_conf_that_sets_the_root_says_nothing_more(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "b.conf", tmp_path / "s")
    assert MessageStoreConfig.from_file(conf).root_dir_note == ""
    empty = tmp_path / "empty.conf"
    empty.write_text("", encoding="utf-8")
    defaulted = MessageStoreConfig.from_file(empty)
    assert defaulted.store_path_root_dir == os.path.expanduser("~/store")
    assert "does not set storePathRootDir" in defaulted.root_dir_note
    assert defaulted.replace(flush_interval_commit_log=100).root_dir_note == defaulted.root_dir_note
    assert defaulted.replace(store_path_root_dir=str(tmp_path)).root_dir_note == ""


# ------------------------------------------------------------------ item 9: queue file size


def queue_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted((root / "consumequeue").rglob("0000*"))}


def write_queues(config: MessageStoreConfig, per_queue: int) -> None:
    with MessageStore.open(config=config) as store:
        for i in range(per_queue * 2):
            result = store.put_message(m.Message(topic="Q", body=b"%d" % i, queue_id=i % 2))
            assert result.status is PutMessageStatus.PUT_OK


@pytest.mark.parametrize("configured", [1000, 4000, 20000])
def test_queue_files_of_another_size_are_refused_not_rewritten(
    small_config: MessageStoreConfig, configured: int
) -> None:
    """Written with 2000-byte queue files (100 entries), several per queue; opened with another
    size: one `ConfigError` naming mappedFileSizeConsumeQueue and the size the files have, and
    no queue file touched (it used to discard and rebuild every queue)."""
    write_queues(small_config, 250)  # three files per queue
    root = Path(small_config.store_path_root_dir)
    before = queue_files(root)
    assert len(before) == 6
    other = small_config.replace(mapped_file_size_consume_queue=configured)
    for read_only in (False, True):
        expected = f"mappedFileSizeConsumeQueue is {configured}: start this store with mappedFileSizeConsumeQueue=2000"
        with pytest.raises(ConfigError, match=expected):
            MessageStore.open(config=other, read_only=read_only)
        assert queue_files(root) == before
    with MessageStore.open(config=small_config) as store:
        assert store.find_consume_queue("Q", 1).max_offset_in_queue() == 250


def test_a_lone_queue_file_longer_than_configured_is_refused(small_config: MessageStoreConfig) -> None:
    """One file per queue: a file never grows past its size, so one longer than configured was
    written with a larger size. (A shorter one is a torn file or a larger size: extended, as a
    short last commit-log file is.)"""
    write_queues(small_config, 10)
    root = Path(small_config.store_path_root_dir)
    before = queue_files(root)
    with pytest.raises(ConfigError, match="ConsumeQueue files of 2000 bytes"):
        MessageStore.open(config=small_config.replace(mapped_file_size_consume_queue=1000))
    assert queue_files(root) == before


def test_a_damaged_queue_is_still_rebuilt(small_config: MessageStoreConfig) -> None:
    """Damage is not a size change: a truncated first file of a queue is discarded and rebuilt."""
    write_queues(small_config, 250)
    root = Path(small_config.store_path_root_dir)
    first = sorted((root / "consumequeue" / "Q" / "0").iterdir())[0]
    os.truncate(first, 333)
    with MessageStore.open(config=small_config) as store:
        assert store.reporter.count("cq-file-discarded") == 3
        assert store.find_consume_queue("Q", 0).max_offset_in_queue() == 250


def test_the_supervisor_refuses_a_queue_size_change_with_one_line(tmp_path: Path) -> None:
    with running_service(tmp_path, mappedFileSizeConsumeQueue="200") as service:
        with Producer.attach(service.root) as producer:
            for i in range(25):
                assert producer.send("Q", b"%d" % i, queue_id=0).ok
        with Consumer.attach(service.root, "g") as consumer:
            wait_until(lambda: consumer.pull("Q", 0, 0).max_offset == 25, 10, "25 dispatched")
    before = queue_files(service.root)
    assert len(before) == 3  # 10 entries of 20 bytes a file
    conf = write_conf(tmp_path / "other.conf", service.root, mappedFileSizeConsumeQueue="400")
    started = subprocess.run(
        [sys.executable, "run.py", "start", "--conf", str(conf)], cwd=ROOT, capture_output=True, text=True, timeout=90
    )  # fmt: skip
    assert started.returncode == 2
    errors = started.stderr.strip().splitlines()
    assert errors[-1].startswith("run.py: error: "), started.stderr
    assert "mappedFileSizeConsumeQueue=200" in errors[-1], started.stderr
    assert "Traceback" not in started.stderr
    assert queue_files(service.root) == before
    assert ShmNames.for_store(str(service.root), service.config.shm_name).leftovers() == []


HOSTILE_VALUES = st.one_of(
    st.sampled_from(["", " ", "-1", "0", "1", "19", "4095", str(2**31), str(2**63), "nan", "inf", "1e3",
                     "true", "TRUE", "yes", "\0", "a\0b", "\udc80", "~", "/", "a,b", "SYNC_FLUSH", "04;05"]),
    st.integers(-(2**64), 2**64).map(str),
    st.text(max_size=8),
)  # fmt: skip


@settings(max_examples=300, deadline=None, database=None)
@given(values=st.dictionaries(st.sampled_from(PROPERTY_NAMES), HOSTILE_VALUES, min_size=1, max_size=4))
def test_hostile_broker_conf_values_are_config_errors(values: dict[str, str]) -> None:
    """Any broker.conf value: a config, or one `ConfigError` naming the key, never another error."""
    try:
        config = MessageStoreConfig.from_properties({"storePathRootDir": "/tmp/x", **values}, source="<h>")
    except ConfigError as exc:
        refused = str(exc)
    else:
        refused = ""
    if refused:
        assert any(key in refused for key in values), (values, refused)
        return
    assert config.mapped_file_size_commit_log >= 4096
    assert config.mapped_file_size_consume_queue >= 20
    assert config.mapped_file_size_consume_queue % 20 == 0
    assert "\0" not in config.store_path_root_dir + config.store_path_commit_log


def test_a_bool_flag_or_queue_id_is_a_type_error_for_put_message(tmp_path: Path) -> None:
    """A bool is an int to the encoder: `put_message` stored ``flag=False`` until hypothesis
    found it (the send paths already refused it); numpy integers stay accepted."""
    with MessageStore.open(tmp_path / "store") as store:
        for fields in ({"flag": False}, {"queue_id": True}):
            with pytest.raises(InvalidArgumentTypeError, match="not bool"):
                store.put_message(m.Message(topic="T", body=b"x", **fields))  # type: ignore[arg-type]
        assert store.max_phy_offset() == 0
        assert store.put_message(m.Message(topic="T", body=b"x", flag=np.int32(3))).ok  # type: ignore[arg-type]
