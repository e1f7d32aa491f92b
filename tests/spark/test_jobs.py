"""`rmq-spark` jobs (issue 7): one task per CommitLog segment; audit, rebuild-index, export, stats."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format.message import TRANSACTION_ROLLBACK_TYPE, is_dispatchable, split_keys, transaction_type

from .conftest import SKIP_REASON

pytest.importorskip("pyspark", reason=SKIP_REASON)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ["mappedFileSizeCommitLog=1048576", "mappedFileSizeConsumeQueue=20000", "maxHashSlotNum=1000",
            "maxIndexNum=4000"]  # fmt: skip


def _fast_jvm_env() -> dict[str, str]:
    """The environment for a job run as its own process: its JVM with the C1 compiler only and
    the serial collector, as the tests' session (`local_session(fast_start=True)`), a few seconds
    less start-up on 2 cores; the JVM notes the option on stderr ("Picked up JAVA_TOOL_OPTIONS")."""
    import os

    return {**os.environ, "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def _messages(rocketmq_fixtures: Path) -> list[dict]:
    with (rocketmq_fixtures / "clean-store.messages.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _config(store: Path) -> MessageStoreConfig:
    from rmq_mp.spark.jobs import store_config

    return store_config(str(store), None, SETTINGS)


def test_rebuild_index_reproduces_the_consume_queues_byte_for_byte_and_finds_every_key(
    spark, clean_store: Path, rocketmq_fixtures: Path, tmp_path: Path
) -> None:
    from rmq_mp.spark.jobs import rebuild_index

    report = rebuild_index(spark, _config(clean_store), tmp_path / "rebuilt")
    assert report["segments"] == 8
    assert report["errors"] == []
    assert report["cq_entries"] == 11_518
    assert report["cq_files"] == report["cq_identical"] == 19
    assert (report["cq_differ"], report["cq_missing"], report["cq_extra"]) == ([], [], [])
    keys = sum(
        len(split_keys(m["keys"])) + ("UNIQ_KEY" in m["properties"])
        for m in _messages(rocketmq_fixtures)
        if transaction_type(m["sysFlag"]) != TRANSACTION_ROLLBACK_TYPE
    )
    assert report["keys_total"] == keys == 16_674
    assert report["keys_missing"] == []
    assert report["index_files"] == report["index_rebuilt_files"] == report["index_identical"]


def test_audit_of_a_clean_store_finds_nothing(spark, clean_store: Path) -> None:
    from rmq_mp.spark.jobs import audit

    reports = audit(spark, _config(clean_store))
    assert [r.errors for r in reports] == [[]] * 8
    assert sum(r.records for r in reports) == 12_000
    assert all(r.blank_at is not None for r in reports[:-1])
    assert reports[-1].blank_at is None


def test_audit_names_the_segment_and_offset_of_a_flipped_byte(
    clean_store_copy: Path, rocketmq_fixtures: Path
) -> None:
    """The console script end to end (its own Spark session), progress lines included."""
    victim = next(
        m for m in _messages(rocketmq_fixtures) if m["commitLogOffset"] > 3 * 2**20 and m["bodyLen"] > 20
    )
    segment = clean_store_copy / "commitlog" / f"{3 * 2**20:020d}"
    data = bytearray(segment.read_bytes())
    body_at = data.find(bytes.fromhex(victim["body"]), victim["commitLogOffset"] - 3 * 2**20)
    data[body_at + 7] ^= 0x20
    segment.write_bytes(data)
    result = subprocess.run(
        [sys.executable, "-m", "rmq_mp.spark.jobs", "audit", "--store", str(clean_store_copy), "--master", "local[2]"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=_fast_jvm_env(),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert (
        f"00000000000003145728 offset {victim['commitLogOffset']} "
        f"(position {victim['commitLogOffset'] - 3 * 2**20}): body CRC mismatch"
    ) in result.stdout
    assert "8 segment(s), 12000 record(s), 1 problem(s)" in result.stdout
    assert "audit: 8/8 tasks" in result.stderr


def test_export_writes_parquet_by_topic_and_queue_that_spark_reads_back(
    spark, clean_store: Path, tmp_path: Path
) -> None:
    from rmq_mp.spark.jobs import export

    topics = frozenset(
        {
            "Payments",
            "主题-τ",
            "t_%RETRY%x_long-topic-name_abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789a",
        }
    )
    report = export(spark, _config(clean_store), tmp_path / "export", topics)
    source = (
        spark.read.format("rmq").option("store", str(clean_store)).option("topics", ",".join(topics)).load()
    )
    expected = {(r.topic, r.queue_id, r.queue_offset): bytes(r.body) for r in source.collect()}
    assert report["rows"] == len(expected)
    assert report["errors"] == []
    exported = spark.read.parquet(str(tmp_path / "export"))
    got = {(r.topic, r.queue_id, r.queue_offset): bytes(r.body) for r in exported.collect()}
    assert got == expected
    assert report["mb_per_s"] > 0


def test_stats_counts_bytes_time_range_and_top_keys_per_queue(
    spark, clean_store: Path, rocketmq_fixtures: Path
) -> None:
    from rmq_mp.spark.jobs import stats

    report = stats(spark, _config(clean_store), None, 5)
    messages = [m for m in _messages(rocketmq_fixtures) if is_dispatchable(m["sysFlag"])]
    by_queue: dict[tuple[str, int], list[dict]] = {}
    for m in messages:
        by_queue.setdefault((m["topic"], m["queueId"]), []).append(m)
    assert len(report["queues"]) == len(by_queue)
    for q in report["queues"]:
        ms = by_queue[(q["topic"], q["queue_id"])]
        assert q["count"] == len(ms)
        assert q["record_bytes"] == sum(m["storeSize"] for m in ms)
        assert q["body_bytes"] == sum(m["bodyLen"] for m in ms)
        assert (q["first_store_ms"], q["last_store_ms"]) == (
            min(m["storeTimestamp"] for m in ms), max(m["storeTimestamp"] for m in ms),
        )  # fmt: skip
    keys = Counter((m["topic"], k) for m in messages for k in split_keys(m["keys"]))
    top = [(k["topic"], k["key"], k["count"]) for k in report["top_keys"]]
    assert [c for _t, _k, c in top] == [c for _key, c in keys.most_common(5)]
    assert all(keys[(t, k)] == c for t, k, c in top)


def test_audit_and_rebuild_index_of_a_healthy_running_store_find_nothing_wrong(spark, tmp_path: Path) -> None:
    """Issue 19: they stop at the running store's readable end; the zeros after it in the file
    being written and the files allocated ahead are not damage."""
    from rmq_mp.put.producer import Producer
    from rmq_mp.spark.jobs import rebuild_index, rebuild_ok, running_readable_end, store_config
    from rmq_mp.spark.store_files import queue_ranges, resolve_store
    from tests.service import running_service, wait_until

    with running_service(tmp_path) as service:
        with Producer.attach(service.root) as producer:
            for i in range(600):
                sent = producer.send("Orders", f"order {i} ".encode() * 300, tags="TagA", keys=[f"k{i}"])
                assert sent.ok, sent
        store = resolve_store(str(service.root))
        wait_until(lambda: sum(q.max_offset for q in queue_ranges(store)) == 600, 30, "600 dispatched")
        log_dir = service.root / "commitlog"
        end = running_readable_end(str(service.root))
        assert end is not None
        assert end % 2**20 > 0  # inside a file: zeros follow it
        wait_until(lambda: any(int(p.name) > end for p in log_dir.iterdir()), 30, "a file allocated ahead")
        # `rmq-spark audit --store <the running store's directory>` in this session's JVM (main()
        # between its session's start and stop; the console script end to end: the tests above)
        code, out, err = _in_session(spark, "audit", "--store", str(service.root))
        assert code == 0, out + err
        assert ", 0 problem(s)" in out
        assert f"running store: read up to its readable end, offset {end}" in err
        report = rebuild_index(
            spark, store_config(service.names.base, None, []), tmp_path / "rebuilt", readable_end=end
        )
        assert report["errors"] == []
        assert report["cq_entries"] == 600
        assert rebuild_ok(report), report


def _in_session(spark, *argv: str) -> tuple[int, str, str]:
    """An rmq-spark subcommand run as main() runs it, in the tests' shared Spark session rather
    than a JVM of its own (10-20 s each on 2 cores): exit status, stdout, stderr."""
    from rmq_mp.spark.jobs import _run, build_parser, check_arguments, store_config

    args = build_parser().parse_args(argv)
    check_arguments(args)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out):
        code = _run(spark, args, store_config(args.store, args.conf, args.set), err)
    return code, out.getvalue(), err.getvalue()


FLUSH_MODES = {
    "async": {"flushDiskType": "ASYNC_FLUSH"},
    "sync": {"flushDiskType": "SYNC_FLUSH"},
    "async-pool": {"flushDiskType": "ASYNC_FLUSH", "transientStorePoolEnable": "true"},
}


@pytest.mark.parametrize("mode", sorted(FLUSH_MODES))
def test_audit_is_quiet_on_a_healthy_store_in_every_flush_mode_while_files_roll(
    spark, tmp_path: Path, mode: str
) -> None:
    """Issue 34: audits while a producer rolls 1 MiB files, knowing the readable end and not
    knowing it (a store attached by a directory whose shm name is another), then offline: no
    problem each time; the files ahead of the write position are not damage."""
    import threading

    from rmq_mp.put.producer import Producer
    from rmq_mp.spark.jobs import audit, running_readable_end, store_config
    from tests.service import running_service

    stop = threading.Event()
    sent: list[int] = []

    def produce(root: Path) -> None:
        with Producer.attach(root) as producer:
            while not stop.is_set():
                result = producer.send("Orders", f"order {len(sent)} ".encode() * 40, tags="TagA")
                assert result.ok, result
                sent.append(1)

    with running_service(tmp_path, **FLUSH_MODES[mode]) as service:
        log_dir = service.root / "commitlog"
        config = store_config(service.names.base, None, [])
        thread = threading.Thread(target=produce, args=(service.root,))
        thread.start()
        try:
            for files in (1, 2):  # each audit once another file has rolled, the producer still sending
                _wait_end_past(service.names.base, files * 2**20)
                end = running_readable_end(service.names.base)
                assert end is not None
                reports = audit(spark, config, readable_end=end)
                assert [e for r in reports for e in r.errors] == [], (mode, files)
                assert sum(r.records for r in reports) > 0
        finally:
            stop.set()
            thread.join(60)
        assert not thread.is_alive()
        # The producer has stopped: what the files hold is whole records, read with no readable
        # end (a directory whose store runs under another shm name is read this way).
        reports = audit(spark, config)
        assert [e for r in reports for e in r.errors] == []
        assert sum(r.records for r in reports) == len(sent)
    reports = audit(spark, config)  # stopped: the last file and those allocated ahead are zeros
    assert [e for r in reports for e in r.errors] == []
    assert sum(r.records for r in reports) == len(sent)
    # Still loud on damage: a zeroed record inside the written range, and a file's zeroed tail
    # with records after it in the next file.
    segments = sorted(p for p in log_dir.iterdir() if p.name.isdigit())
    _zero_from_record(segments[0], 2048, 4096)
    _zero_from_record(segments[1], 2**20 - 64 * 1024, 2**20)
    errors = {(r.file_offset, problem) for r in audit(spark, config) for _phy, problem in r.errors}
    zeros = "zero bytes where a record or the end-of-file blank should be"
    assert errors == {(0, zeros), (2**20, zeros)}, errors


def _wait_end_past(store: str, offset: int) -> None:
    from rmq_mp.spark.jobs import running_readable_end
    from tests.service import wait_until

    wait_until(lambda: (running_readable_end(store) or 0) > offset, 60, f"the readable end past {offset}")


def _zero_from_record(segment: Path, after: int, length: int) -> None:
    """Zero ``length`` bytes of a CommitLog file from its first record boundary at or after
    ``after`` (following TOTALSIZE from the file's start)."""
    data = bytearray(segment.read_bytes())
    pos = 0
    while pos < after:
        pos += int.from_bytes(data[pos : pos + 4], "big")
    data[pos : pos + length] = bytes(min(length, len(data) - pos))
    segment.write_bytes(data)


def test_a_store_that_does_not_exist_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rmq_mp.spark.jobs", "audit", "--store", str(tmp_path / "stor")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"rmq-spark: error: {tmp_path / 'stor'}: no such store directory, and no running store has that shm name"
    ]


def _job_args(target: Path) -> dict[str, list[str]]:
    """Valid arguments beside --store for each rmq-spark subcommand (the fixture's settings)."""
    sets = [arg for setting in SETTINGS for arg in ("--set", setting)]
    return {
        "audit": [*sets],
        "rebuild-index": [*sets, "--target", str(target / "rebuilt")],
        "export": [*sets, "--target", str(target / "exported"), "--topic", "Payments"],
        "stats": [*sets, "--topic", "Payments", "--top", "3"],
    }


def _subcommands() -> set[str]:
    import argparse

    from rmq_mp.spark.jobs import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_subcommand_refuses_bad_input_with_one_line_before_spark_starts(
    clean_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19: a missing store, a wrong path, an empty or invalid name, a --target that cannot
    be one: one line, exit 2, and no Spark session (its JVM prints lines of its own). An empty
    or invalid --topic exported or counted nothing and exited 0; a --target that is a file or
    cannot be made was a traceback after Spark had started."""
    from rmq_mp.spark.jobs import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "not-empty").mkdir()
    (tmp_path / "not-empty" / "x").write_text("")
    jobs = _job_args(tmp_path)
    assert set(jobs) == _subcommands()
    seen = set()
    for command, args in jobs.items():
        cases = [
            (["--store", str(tmp_path / "missing")], "no such store directory"),
            (["--store", "./stor"], "./stor: no such store directory"),
            (["--store", str(tmp_path)], "not a store directory"),
            (["--store", ""], "--store is empty"),
        ]
        store = ["--store", str(clean_store)]
        if "--topic" in args:
            cases += [
                (["--topic", ""], "topic '' cannot name"),
                (["--topic", "a/b"], "topic 'a/b' cannot name"),
            ]
        if "--target" in args:
            cases += [
                ([*store, "--target", str(tmp_path / "a-file")], "a-file is not an empty directory"),
                ([*store, "--target", str(tmp_path / "not-empty")], "not-empty is not an empty directory"),
                ([*store, "--target", str(tmp_path / "a-file" / "t")], "a-file/t: Not a directory"),
            ]
        for extra, named in cases:
            argv = [command, *args, *(extra if "--store" in extra else [*store, *extra])]
            assert main(argv) == 2, argv
            captured = capsys.readouterr()
            assert captured.out == "", argv
            lines = captured.err.splitlines()
            assert len(lines) == 1, (argv, captured.err)
            assert lines[0].startswith("rmq-spark: error: "), argv
            assert named in lines[0], (argv, lines[0])
            seen.add(command)
    assert seen == _subcommands()
    assert not (tmp_path / "rebuilt").exists()
    assert not (tmp_path / "exported").exists()


def test_every_subcommand_ends_quietly_on_a_closed_pipe_with_its_exit_status(
    clean_store: Path, tmp_path: Path
) -> None:
    """Issue 19: `rmq-spark ... | head -0` was 'Exception ignored ... BrokenPipeError' and exit
    120. The job's report is lost, its exit status is not (here every job finds nothing wrong)."""
    import os

    env = {k: v for k, v in _fast_jvm_env().items() if k != "PYTHONUNBUFFERED"}  # block-buffered, as a user's
    jobs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for command, args in _job_args(tmp_path).items():  # all at once: each waits on its own JVM
            read_end, write_end = os.pipe()
            os.close(read_end)
            try:
                jobs[command] = subprocess.Popen(
                    [sys.executable, "-m", "rmq_mp.spark.jobs", command, "--store", str(clean_store), *args,
                     "--master", "local[1]", "--quiet"],
                    stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                )  # fmt: skip
            finally:
                os.close(write_end)
        for command, job in jobs.items():
            _, err = job.communicate(timeout=300)
            stderr = err.decode(errors="replace")
            assert job.returncode == 0, (command, stderr)
            assert "Traceback" not in stderr, (command, stderr)
            assert "BrokenPipeError" not in stderr, (command, stderr)
            assert "rmq-spark" not in stderr, (command, stderr)
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
                job.wait()
