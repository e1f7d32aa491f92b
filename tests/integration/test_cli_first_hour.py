"""A user's first hour with the command lines (issue 19): every subcommand of rmq-admin and
run.py answers a missing store, a wrong path, an empty or invalid name and a closed pipe with
one line and no traceback; mqadmin's short options; the output a first user needs (the store
looked for, a refusal's reason, bodies, the terminal's width)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp.tools.admin import build_parser, main
from shm import layout
from shm.names import ShmNames
from tests.integration.test_ops import fill
from tests.service import ROOT, RunningService, running_service, wait_until

# Valid arguments for each rmq-admin subcommand against a store `fill` wrote (topic Orders,
# keys order-<i>, group g1). A subcommand missing here fails test_every_admin_subcommand_is_listed.
ADMIN_ARGS: dict[str, list[str]] = {
    "printMsg": [],
    "queryMsgByKey": ["-t", "Orders", "-k", "order-1"],
    "queryMsgById": ["-i", "0" * 32],
    "queryMsgByOffset": ["-t", "Orders", "-i", "0", "-o", "0"],
    "topicStatus": ["-t", "Orders"],
    "topicList": [],
    "updateTopic": ["-t", "Orders"],
    "consumerProgress": ["-g", "g1"],
    "consumerConnection": ["-g", "g1"],
    "resetOffsetByTime": ["-g", "g1", "-t", "Orders", "-s", "0"],
    "storeStatus": [],
    "scheduleStatus": ["-l", "1"],
    "sendMessage": ["-t", "Orders", "-p", "x"],
    "consumeMessage": ["-t", "Orders", "-g", "g1", "-c", "1", "--timeout", "0"],
    "deleteExpiredCommitLog": ["--wait", "5"],
    "printMsgByQueue": ["-t", "Orders", "-i", "0"],
    "queryMsgByUniqueKey": ["-t", "Orders", "-i", "0" * 32],
    "getBrokerConfig": [],
    "brokerStatus": [],
    "statsAll": [],
    "skipAccumulatedMessage": ["-g", "g2", "-t", "Orders"],
    "cloneGroupOffset": ["-s", "g1", "-d", "g3", "-t", "Orders"],
    "deleteSubGroup": ["-g", "g1"],  # after every command that needs g1
    "deleteTopic": ["-t", "Orders", "--force"],  # after every command that needs Orders
    "copyLog": ["--to", "copied-store"],  # a tmp_path directory where it runs
    "promote": ["--broker-name", "broker-a"],  # refused on a master: tests/ha/test_promote.py promotes
    "demote": [],  # a stopped store only: tests/ha/test_promote.py demotes
}
RUN_PY = ("start", "stop", "status", "demo")


def admin_subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def with_option(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value replaced by ``value`` (added when absent)."""
    if flag in args:
        i = args.index(flag)
        return [*args[: i + 1], value, *args[i + 2 :]]
    return [*args, flag, value]


def one_error_line(code: int, err: str, prefix: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), err
    return lines[0]


def test_every_admin_subcommand_is_listed() -> None:
    assert set(admin_subcommands()) == set(ADMIN_ARGS)


def bad_inputs(tmp_path: Path) -> list[tuple[str, list[str], str]]:
    """(subcommand, argv, what the line must name) for every subcommand and every kind of bad input."""
    not_a_store = tmp_path / "empty"
    not_a_store.mkdir()
    cases = []
    for command, parser in admin_subcommands().items():
        args = ADMIN_ARGS[command]
        cases += [
            (command, [command, "--store", str(tmp_path / "missing"), *args], "missing"),
            (command, [command, "-n", "./stor", *args], "./stor"),
            (command, [command, "--store", str(not_a_store), *args], str(not_a_store)),
        ]
        options = parser._option_string_actions
        for flag, bad in (("-t", ""), ("-t", "a/b"), ("-g", ""), ("-g", "a b"), ("-g", "a/b")):
            if flag in options and not (command == "sendMessage" and flag == "-t"):  # the store's answer
                argv = [command, "--store", str(not_a_store), *with_option(args, flag, bad)]
                cases.append((command, argv, "topic" if flag == "-t" else "group"))
    return cases


def test_every_admin_subcommand_refuses_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = set()
    for command, argv, named in bad_inputs(tmp_path):
        code = main(argv)
        captured = capsys.readouterr()
        line = one_error_line(code, captured.err, "rmq-admin: error: ")
        assert named in line, (argv, line)
        assert captured.out == "", argv
        seen.add(command)
    assert seen == set(ADMIN_ARGS)


def run_py(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_every_run_py_subcommand_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for command in RUN_PY:
        result = run_py(command, "--conf", str(tmp_path / "missing.conf"))
        assert "missing.conf" in one_error_line(result.returncode, result.stderr, "run.py: error: ")
        result = run_py(command, "--conf", str(a_file), "--store", str(a_file / "store"))
        assert "a-file" in one_error_line(result.returncode, result.stderr, "run.py: error: ")
    try:
        for command in RUN_PY:
            # an empty --store is not the current directory: start and demo made it a store
            daemon = ["--daemon"] if command == "start" else []
            result = run_py(command, *daemon, "--store", "", cwd=tmp_path)
            assert "--store is empty" in one_error_line(result.returncode, result.stderr, "run.py: error: ")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    finally:
        run_py("stop", "--store", str(tmp_path))  # what a start in tmp_path would have left
    for count in ("0", "-5"):  # was an IndexError's traceback after starting and stopping a store
        result = run_py("demo", "--messages", count, "--store", str(tmp_path / "demo"))
        line = one_error_line(result.returncode, result.stderr, "run.py: error: ")
        assert f"--messages must be at least 1, got {count}" in line
    assert not (tmp_path / "demo").exists()
    for command in ("stop", "status"):
        # run from another directory: the line names the store and the conf file it looked at
        result = run_py(command, "--store", "rel-store", cwd=tmp_path)
        line = one_error_line(result.returncode, result.stderr, "run.py: error: ")
        assert f"no store running at {tmp_path / 'rel-store'}" in line
        assert str(ROOT / "conf" / "broker.conf") in line


def closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """``argv`` writing into a pipe whose reader has gone (``| head -0``), its stdout block
    buffered as a user's is (no PYTHONUNBUFFERED): the failing write is the final flush."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            argv, stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT, timeout=120,
            env={**env, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    finally:
        os.close(write_end)


@pytest.fixture
def filled(tmp_path: Path) -> RunningService:  # type: ignore[misc]
    with running_service(tmp_path) as service:
        fill(service, 20)
        yield service


def test_every_subcommand_stops_quietly_on_a_closed_pipe(filled: RunningService, tmp_path: Path) -> None:
    name = filled.names.base
    for command, args in ADMIN_ARGS.items():
        if command == "copyLog":
            args = ["--to", str(tmp_path / "copied-store")]
        if command in (
            "promote",
            "demote",
        ):  # a running master refuses both (exit 2): tests/ha/test_promote.py
            continue
        if command == "queryMsgById":
            args = ["-i", msg_id_of(name, 0)]
        if command == "queryMsgByUniqueKey":
            args = ["-t", "Orders", "-i", uniq_key_of(name, 0)]
        result = closed_pipe([sys.executable, "-m", "rmq_mp.tools.admin", command, "-n", name, *args])
        assert result.returncode == 0, (command, result.stderr)
        assert result.stderr == b"", (command, result.stderr)
    for args in (["status"], ["status", "--json"]):
        result = closed_pipe([sys.executable, str(ROOT / "run.py"), *args, "--conf", str(filled.conf)])
        assert result.returncode == 0, (args, result.stderr)
        assert result.stderr == b"", (args, result.stderr)
    # stop's report goes nowhere, the stop itself is done
    result = closed_pipe([sys.executable, str(ROOT / "run.py"), "stop", "--conf", str(filled.conf)])
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    assert filled.process.wait(60) == 0


def test_demo_into_a_closed_pipe_still_runs_the_store(tmp_path: Path) -> None:
    """`run.py demo | head -0`: the supervisor demo starts shares its stdout; its first line
    failed, so it exited 0 without starting and the demo said only 'the store did not start'."""
    from rmq_mp.config.config_manager import loads
    from tests.service import write_conf

    conf = write_conf(tmp_path / "demo.conf", tmp_path / "demo")
    result = closed_pipe(
        [sys.executable, str(ROOT / "run.py"), "demo", "--messages", "20", "--conf", str(conf)]
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    offsets = loads((tmp_path / "demo" / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert sum(offsets["DemoOrders@demo-group"].values()) == 20
    assert ShmNames.for_store(str(tmp_path / "demo")).leftovers() == []


def msg_id_of(name: str, queue_offset: int) -> str:
    result = admin_json("queryMsgByOffset", "-n", name, "-t", "Orders", "-i", "0", "-o", str(queue_offset))
    return str(result[0]["msgId"])


def uniq_key_of(name: str, queue_offset: int) -> str:
    result = admin_json("queryMsgByOffset", "-n", name, "-t", "Orders", "-i", "0", "-o", str(queue_offset))
    return str(result[0]["properties"]["UNIQ_KEY"])


def admin_json(*args: str) -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", *args, "--json"], cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_mqadmin_short_options(filled: RunningService, capsys: pytest.CaptureFixture[str]) -> None:
    name = filled.names.base
    assert main(["topicStatus", "-n", name, "-t", "Orders", "--json"]) == 0
    queues = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(q["maxOffset"] for q in queues) == 20
    assert main(["queryMsgByKey", "-n", name, "-t", "Orders", "-k", "order-3", "--json"]) == 0
    (found,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert bytes.fromhex(found["body"]) == b"order 3"
    assert main(["queryMsgById", "-n", name, "-i", found["msgId"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == "order-3"
    assert main(["queryMsgByOffset", "-n", name, "-b", "broker-a", "-t", "Orders",
                 "-i", str(found["queueId"]), "-o", str(found["queueOffset"]), "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["msgId"] == found["msgId"]
    stored = found["storeTimestamp"]
    assert main(["printMsg", "-n", name, "-t", "Orders", "-b", str(stored), "-e", str(stored), "--json"]) == 0
    assert found["msgId"] in capsys.readouterr().out
    assert main(["consumerProgress", "-n", name, "-g", "g1", "--json"]) == 0
    assert (
        sum(max(r["consumerOffset"], 0) for r in map(json.loads, capsys.readouterr().out.splitlines())) == 10
    )
    help_text = subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", "queryMsgByOffset", "--help"], cwd=ROOT, capture_output=True,
        text=True, timeout=60,
    ).stdout  # fmt: skip
    for flag in ("-n", "-t", "-i", "-o", "-b"):
        assert re.search(rf"(^|\s){flag}[ ,]", help_text), flag
    top_help = build_parser().format_help()
    for letter in ("-n", "-t", "-g", "-k", "-i", "-o", "-s", "-r/-w", "-p", "-b/-e", "-c"):
        assert f"  {letter}  " in top_help, letter
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Operating a store: `rmq-admin`") :]
    for letter in ("`-t`", "`-g`", "`-k`", "`-i`", "`-o`", "`-s`", "`-r`/`-w`", "`-b`/`-e`", "`-n`"):
        assert letter in section, letter


def test_reset_offset_by_time_refuses_an_unknown_group(
    filled: RunningService, capsys: pytest.CaptureFixture[str]
) -> None:
    name = filled.names.base
    code = main(["resetOffsetByTime", "-n", name, "-g", "g2", "-t", "Orders", "-s", "0"])
    line = one_error_line(code, capsys.readouterr().err, "rmq-admin: error: ")
    assert "'g2' has no offsets" in line
    assert "--create-group" in line
    assert main(["consumerProgress", "-n", name, "-g", "g2"]) == 2  # nothing was created
    capsys.readouterr()
    assert (
        main(["resetOffsetByTime", "-n", name, "-g", "g2", "-t", "Orders", "-s", "0", "--create-group"]) == 0
    )
    assert main(["resetOffsetByTime", "-n", name, "-g", "g1", "-t", "Orders", "-s", "0", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()[-8:]]
    assert all(r["group"] == "g1" and r["newOffset"] == 0 for r in rows)


def test_send_message_shows_the_reason_and_reads_a_body_file(
    filled: RunningService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = filled.names.base
    assert main(["sendMessage", "-n", name, "-t", "Orders", "-p", "x", "-c", "bad\x01tag"]) == 1
    out = capsys.readouterr().out
    assert "MESSAGE_ILLEGAL" in out
    assert "tags contains '\\x01'" in out
    # a topic no queue can hold: the store's MESSAGE_ILLEGAL, with its reason
    assert main(["sendMessage", "-n", name, "-t", "a/b", "-p", "x"]) == 1
    out = capsys.readouterr().out
    assert "MESSAGE_ILLEGAL" in out
    assert "cannot name a consume-queue directory" in out
    body = bytes(range(256))
    (tmp_path / "body.bin").write_bytes(body)
    assert (
        main(
            ["sendMessage", "-n", name, "-t", "Raw", "--body-file", str(tmp_path / "body.bin"), "-k", "raw-1"]
        )
        == 0
    )
    assert "PUT_OK" in capsys.readouterr().out
    assert main(["sendMessage", "-n", name, "-t", "Raw", "-p", "héllo wörld", "-k", "text-1"]) == 0
    capsys.readouterr()
    wait_until(
        lambda: filled.read(layout.REPUT_FROM_OFFSET) >= filled.read(layout.WROTE_POSITION), 30, "dispatch"
    )
    assert (
        main(["consumeMessage", "-n", name, "-t", "Raw", "-g", "reader", "-c", "2", "--timeout", "10"]) == 0
    )
    out = capsys.readouterr().out
    assert "'héllo wörld'" in out  # text as text
    assert "0x000102030405" in out  # anything else as hex
    assert "2 message(s)" in out


def test_status_watch_never_cuts_offsets_at_a_narrow_terminal(filled: RunningService) -> None:
    status = json.loads(run_py("status", "--conf", str(filled.conf), "--json").stdout)
    result = run_py("status", "--conf", str(filled.conf), "--watch", "--count", "1", env={"COLUMNS": "60"})
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 60
    for key in ("wrote", "committed", "flushed", "reput"):
        assert re.search(rf"{key}\s+│\s+{status['offsets'][key]:,}\s", result.stdout), (key, result.stdout)


def test_attach_to_a_relative_path_that_is_not_a_store_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``./stor`` (a slash, nothing there) was posix_ipc's ``ValueError: Invalid parameter(s)``."""
    from rmq_mp.client.consumer import Consumer
    from rmq_mp.errors import InvalidArgumentError, StoreNotRunningError
    from rmq_mp.put.producer import Producer

    monkeypatch.chdir(tmp_path)
    for name in ("./stor", "stor/", "a/b", "../stor"):
        for attach in (Producer.attach, lambda n: Consumer.attach(n, "g")):
            with pytest.raises(StoreNotRunningError, match="not running"):
                attach(name)
    with pytest.raises(InvalidArgumentError, match="blank"):
        Consumer.attach("./stor", "")  # the group is checked first
