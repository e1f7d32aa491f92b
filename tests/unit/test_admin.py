"""rmq-admin against the RocketMQ 4.9.8 fixture store and a running rmq-mp store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.tools.admin import main
from tests.service import ROOT

FIXTURE_SETTINGS = [
    "--set",
    "mappedFileSizeCommitLog=1048576",
    "--set",
    "mappedFileSizeConsumeQueue=20000",
    "--set",
    "maxHashSlotNum=1000",
    "--set",
    "maxIndexNum=4000",
]


def admin(*args: str, io_encoding: str | None = None) -> subprocess.CompletedProcess[str]:
    """The console script in a child process; its output decoded as UTF-8, newlines untouched."""
    env = {**os.environ, "PYTHONIOENCODING": io_encoding} if io_encoding else None
    result = subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", *args],
        cwd=ROOT,
        capture_output=True,
        env=env,
        timeout=120,
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode("utf-8"), result.stderr.decode("utf-8")
    )


def test_print_msg_json_reproduces_rocketmqs_decoding_byte_for_byte(rocketmq_fixtures: Path) -> None:
    result = admin("printMsg", "--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS, "--json")
    assert result.returncode == 0, result.stderr
    expected = (rocketmq_fixtures / "clean-store.messages.jsonl").read_text(encoding="utf-8")
    got_lines, want_lines = result.stdout.split("\n"), expected.split("\n")
    assert got_lines.pop() == want_lines.pop() == ""
    assert len(got_lines) == len(want_lines) == 12_000
    for number, (got, want) in enumerate(zip(got_lines, want_lines, strict=True), 1):
        # field for field, in the fixture's order, before comparing bytes
        assert list(json.loads(got).items()) == list(json.loads(want).items()), f"line {number}"
    assert result.stdout == expected
    # the control characters of the `note` property are escaped as the fixture escapes them
    assert "\\n" in expected
    assert "\\t" in expected


def test_print_msg_human_and_filters(rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(rocketmq_fixtures / "clean-store")
    assert main(["printMsg", "--store", store, *FIXTURE_SETTINGS, "--topic", "Payments"]) == 0
    out = capsys.readouterr().out
    assert "3044 message(s)" in out
    assert "msgId" in out.splitlines()[0]
    with (rocketmq_fixtures / "clean-store.messages.jsonl").open(encoding="utf-8") as f:
        first = json.loads(f.readline())
    ts = first["storeTimestamp"]
    assert (
        main(
            ["printMsg", "--store", store, *FIXTURE_SETTINGS, "--json", "--begin", str(ts), "--end", str(ts)]
        )
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines
    assert all(m["storeTimestamp"] == ts for m in lines)


def test_query_commands_both_forms(rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS]
    text = (rocketmq_fixtures / "clean-store.messages.jsonl").read_text(encoding="utf-8")
    messages = [json.loads(line) for line in text.splitlines()]
    keyed = next(m for m in messages if m["keys"] and m["sysFlag"] & 0xC != 0xC)
    key = keyed["keys"].split(" ")[0]
    assert main(["queryMsgByKey", *store, "--topic", keyed["topic"], "--key", key, "--json"]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert keyed["msgId"] in {m["msgId"] for m in found}
    assert all(key in (m["keys"] or "").split(" ") for m in found)
    assert main(["queryMsgById", *store, "--id", keyed["msgId"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == keyed
    assert main(["queryMsgById", *store, "--id", keyed["msgId"]]) == 0
    human = capsys.readouterr().out
    assert "msgId:" in human
    assert keyed["msgId"] in human
    assert "storeTimestamp:" in human
    assert (
        main(
            [
                "queryMsgByOffset",
                *store,
                "--topic",
                keyed["topic"],
                "--queue",
                str(keyed["queueId"]),
                "--offset",
                str(keyed["queueOffset"]),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["msgId"] == keyed["msgId"]
    assert (
        main(
            [
                "queryMsgByOffset",
                *store,
                "--topic",
                keyed["topic"],
                "--queue",
                str(keyed["queueId"]),
                "--offset",
                str(keyed["queueOffset"]),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert keyed["msgId"] in out
    assert out.splitlines()[0].split() == ["status:", "FOUND"]
    assert f"({keyed['bodyLen']} bytes)" in out


def test_query_by_key_also_finds_uniq_key_and_honours_max(
    rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS]
    text = (rocketmq_fixtures / "clean-store.messages.jsonl").read_text(encoding="utf-8")
    messages = [json.loads(line) for line in text.splitlines()]
    uniq = next(m for m in messages if "UNIQ_KEY" in m["properties"] and m["sysFlag"] & 0xC != 0xC)
    uniq_key = uniq["properties"]["UNIQ_KEY"]
    assert main(["queryMsgByKey", *store, "--topic", uniq["topic"], "--key", uniq_key]) == 0
    out = capsys.readouterr().out
    assert uniq["msgId"] in out
    assert "1 message(s)" in out
    # ORD<n> keys repeat across messages: --max caps the hits
    ord_keys = [k for m in messages if m["keys"] for k in m["keys"].split(" ") if k.startswith("ORD")]
    common = max(set(ord_keys), key=ord_keys.count)
    topic = next(m["topic"] for m in messages if m["keys"] and common in m["keys"].split(" "))
    assert main(["queryMsgByKey", *store, "--topic", topic, "--key", common, "--max", "1", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_conf_file_merges_with_set(
    rocketmq_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "storePathRootDir=/nowhere\nmappedFileSizeCommitLog=999999\nmappedFileSizeConsumeQueue=20000\n"
        "maxHashSlotNum=1000\nmaxIndexNum=4000\n",
        encoding="utf-8",
    )
    store = str(rocketmq_fixtures / "clean-store")
    # --set wins over the file, --store over its storePathRootDir
    args = ["topicStatus", "--store", store, "--conf", str(conf), "--set", "mappedFileSizeCommitLog=1048576"]
    assert main([*args, "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 15
    assert main(["topicStatus", "--store", store, "--conf", str(conf)]) == 2
    assert "does not match the configured file size" in capsys.readouterr().err


def test_binary_body_is_shown_as_hex(rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS]
    with (rocketmq_fixtures / "clean-store.messages.jsonl").open(encoding="utf-8") as f:
        binary = next(
            m for m in map(json.loads, f) if m["bodyLen"] > 4 and b"\xff" in bytes.fromhex(m["body"])
        )
    assert main(["queryMsgById", *store, "--id", binary["msgId"]]) == 0
    body_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("body:"))
    assert body_line.split()[1].startswith("0x" + binary["body"][:16])


def test_json_is_utf8_whatever_the_locale(rocketmq_fixtures: Path) -> None:
    store = ["--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS]
    machine = admin("topicStatus", *store, "--topic", "主题-τ", "--json", io_encoding="latin-1")
    assert machine.returncode == 0, machine.stderr
    assert json.loads(machine.stdout.split("\n")[0])["topic"] == "主题-τ"
    human = admin("topicStatus", *store, "--topic", "主题-τ", io_encoding="latin-1")
    assert human.returncode == 0, human.stderr
    assert "\\u4e3b\\u9898-\\u03c4" in human.stdout


def test_topic_status_both_forms(rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS]
    assert main(["topicStatus", *store, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 15
    assert {k: v for k, v in rows[0].items() if k != "lastUpdateTimestamp"} == {
        "topic": "OrderTopic",
        "queueId": 0,
        "minOffset": 0,
        "maxOffset": 2857,
    }
    assert main(["topicStatus", *store, "--topic", "主题-τ"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["Topic", "QueueId", "MinOffset"]
    assert "1404" in out
    assert "1399" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["queryMsgById", "--store", "{missing}", "--id", "00"], "no such store directory"),
        (["queryMsgById", "--store", "{clean}", "--id", "XYZ"], "32 or 56 hex"),
        (["queryMsgById", "--store", "{clean}", "--id", "0A000005 00002A9F00000000000000 "], "32 or 56 hex"),
        (["queryMsgById", "--store", "{clean}", "--id", "0A00000500002A9F0000000FFFFFFFF5"], "outside"),
        (["topicStatus", "--store", "{tmp}"], "not a store directory"),
        (["topicStatus", "--store", "{clean}", "--conf", "{missing}"], "cannot read config file"),
        (["topicStatus", "--store", "{clean}", "--set", "novalue"], "key=value"),
        (
            ["topicStatus", "--store", "{clean}", "--set", "mapedFileSizeCommitLog=1"],
            "mappedFileSizeCommitLog",
        ),
        (["topicStatus", "--store", "{clean}", "--topic", "Nope"], "no queue"),
        (
            [
                "queryMsgByOffset",
                "--store",
                "{clean}",
                "--topic",
                "Payments",
                "--queue",
                "0",
                "--offset",
                "99999",
            ],
            "OFFSET_OVERFLOW_BADLY",
        ),
        (["topicStatus", "--name", "rmq_not_running"], "is the store running"),
    ],
)
def test_errors_are_one_clear_line_and_exit_2(
    rocketmq_fixtures: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    clean = str(rocketmq_fixtures / "clean-store")
    args = [
        a.replace("{missing}", str(tmp_path / "nope"))
        .replace("{clean}", clean)
        .replace("{tmp}", str(tmp_path))
        for a in args
    ]
    result = admin(*args, *FIXTURE_SETTINGS)
    assert result.returncode == 2
    assert result.stderr.startswith("rmq-admin: error: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["printMsg"],
        ["queryMsgByKey", "--store", "x", "--topic", "T", "--key", "k", "--max", "0"],
        ["printMsg", "--store", "x", "--begin", "yesterday"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_against_a_running_store_by_shm_name(tmp_path: Path) -> None:
    from rmq_mp.put.producer import Producer
    from shm import layout
    from tests.service import running_service, wait_until

    with running_service(tmp_path) as service:
        with Producer.attach(service.root) as producer:
            sent = producer.send("Live", b"hello", keys=["k1"], queue_id=2)
        wait_until(
            lambda: service.read(layout.REPUT_FROM_OFFSET) >= service.read(layout.WROTE_POSITION), 10, "reput"
        )
        status = admin("topicStatus", "--name", service.names.base, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["maxOffset"] == 1
        by_key = admin(
            "queryMsgByKey", "--name", service.names.base, "--topic", "Live", "--key", "k1", "--json"
        )
        assert json.loads(by_key.stdout)["msgId"] == sent.msg_id


def test_store_alone_reads_the_file_sizes_from_the_files(
    rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fixture's non-default sizes (1 MiB commit-log files, 20000-byte queue files, 84040-byte
    index files) come from the file lengths: --store works without --conf or --set."""
    store = str(rocketmq_fixtures / "clean-store")
    assert main(["printMsg", "--store", store, "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 12_000
    topic = (
        "t_%RETRY%x_long-topic-name_abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789a"
    )
    with_settings = main(
        ["queryMsgByKey", "--store", store, *FIXTURE_SETTINGS, "-t", topic, "-k", "oscar-65", "--json"]
    )
    expected = capsys.readouterr().out
    assert with_settings == 0
    assert expected.count("\n") >= 1
    assert main(["queryMsgByKey", "--store", store, "-t", topic, "-k", "oscar-65", "--json"]) == 0
    assert capsys.readouterr().out == expected
    # one size given, the index length tells the other
    assert (
        main(
            [
                "queryMsgByKey",
                "--store",
                store,
                "--set",
                "maxHashSlotNum=1000",
                "-t",
                topic,
                "-k",
                "oscar-65",
                "--json",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == expected
    # a size given that the files contradict is still refused, naming the mismatch
    assert main(["printMsg", "--store", store, "--set", "mappedFileSizeCommitLog=2097152"]) == 2
    assert "does not match the configured file size" in capsys.readouterr().err


def test_store_alone_reads_a_crashed_store_as_with_its_settings(
    rocketmq_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(rocketmq_fixtures / "crashed-store")
    assert main(["printMsg", "--store", store, *FIXTURE_SETTINGS, "--json"]) == 0
    expected = capsys.readouterr().out
    assert main(["printMsg", "--store", store, "--json"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["topicStatus", "--store", store, "--json"]) == 0
    alone = capsys.readouterr().out
    assert main(["topicStatus", "--store", store, *FIXTURE_SETTINGS, "--json"]) == 0
    assert capsys.readouterr().out == alone
