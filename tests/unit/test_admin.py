"""rmq-admin against the RocketMQ 4.9.8 fixture store and a running rmq-mp store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.admin import main
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


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmq_mp.admin", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_print_msg_json_reproduces_rocketmqs_decoding_byte_for_byte(rocketmq_fixtures: Path) -> None:
    result = admin("printMsg", "--store", str(rocketmq_fixtures / "clean-store"), *FIXTURE_SETTINGS, "--json")
    assert result.returncode == 0, result.stderr
    expected = (rocketmq_fixtures / "clean-store.messages.jsonl").read_text(encoding="utf-8")
    assert result.stdout.count("\n") == 12_000
    assert result.stdout == expected


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
    assert keyed["msgId"] in capsys.readouterr().out


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
    args = [a.replace("{missing}", str(tmp_path / "nope")).replace("{clean}", clean) for a in args]
    result = admin(*args, *FIXTURE_SETTINGS)
    assert result.returncode == 2
    assert result.stderr.startswith("rmq-admin: error: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_against_a_running_store_by_shm_name(tmp_path: Path) -> None:
    from rmq_mp.producer import Producer
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
