"""The chaos soak (issue 29 point 6): every feature at once on one store while seeded faults hit
random processes at random times, then one clean stop and the promises checked on the files.

At work: two `tests.load` batch producers (properties, every queue of three topics), a
`tests.chaos_clients` producer (tags, keys as a list, user properties, a delay level, batches of
dicts) feeding a consumer-group member (`tests.group_member`, riding restarts) and a push
consumer that fails every fifth message until it is dead-lettered (`tests.chaos_clients
pusher`, one retry). Faults, one every 0.3-1.5 s: kill -9 of a worker (the supervisor restarts
it), SIGSTOP of a worker or a client for up to a second, kill -9 of the supervisor followed by
`run.py stop` and `run.py start` or by a start alone, kill -9 of the group member (a new one
takes its queues). Time passes for the cleaner: every few seconds the commit-log files wholly
written at least EXPIRE_AGE_S ago are aged two hours (their mtime), so the real cleaner
(fileReservedTime 1 h, every hour a deletion hour) deletes them while everything else runs.

Checked after the clean stop, from the files by an independent decoder: every PUT_OK at its
commit-log and queue offset with its bytes; no queue offset holding two records; every message
a consumer read is the one stored at its queue offset; each committed group offset within its
queue and at most one past what the group read there; every delayed message delivered on its
real topic, not before its delay; every message the push consumer failed dead-lettered, every
other PushT message it saw consumed. A message stored below what the soak expired may be gone
(the cleaner deleted it, as RocketMQ's would): it is checked if still there, else skipped; a
group's committed offset may then be its queue's first remaining offset (it skipped the deleted).

``RMQ_CHAOS_SEED`` replays a seed (the failure message names it), ``RMQ_CHAOS_SECONDS`` sets the
faults' duration (CI: 20 s), ``RMQ_CHAOS_SEEDS`` runs that many seeds from the given one.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.config_manager import loads
from rmq_mp.outcomes import GetMessageStatus
from shm import layout
from shm.roles import ROLES
from tests.chaos_clients import FAIL_EVERY, body_of
from tests.crash.test_fence import (
    MODES,
    armed_run_py,
    check_acknowledged,
    kill_supervisor,
    stored_records,
)
from tests.integration.test_round_trip import independent_records
from tests.service import ROOT, acknowledged, json_lines, start_producers, start_service, wait_until

SECONDS = float(os.environ.get("RMQ_CHAOS_SECONDS", "20"))
RUNS = int(os.environ.get("RMQ_CHAOS_SEEDS", "1"))
"""Seeds to run: one drawn per test run by default (about 70 s of one worker); 0 skips the soak."""


def first_seed() -> int:
    """``RMQ_CHAOS_SEED``, else one drawn for this test run: the same in every xdist worker
    (they must collect the same tests), another in the next run."""
    given = os.environ.get("RMQ_CHAOS_SEED")
    if given:
        return int(given)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(random.SystemRandom().random())
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big") >> 2


ENDLESS = 10**9
SETTINGS = {
    "messageDelayLevel": " ".join(["1s"] * 18),  # retries (level 3 + times) and delays come in 1 s
    "flushConsumerOffsetInterval": "200",
    # The cleaner: files the soak ages are deleted within a pass; a file a reader holds waits 2 s.
    "deleteWhen": ";".join(str(h) for h in range(24)),
    "fileReservedTime": "1",
    "cleanResourceInterval": "200",
    "deleteCommitLogFilesInterval": "0",
    "deleteConsumeQueueFilesInterval": "0",
    "destroyMapedFileIntervalForcibly": "2000",
}
EXPIRE_AGE_S = 8.0
"""Files wholly written at least this long ago may be aged: delays and retries come in 1 s
levels, so most have run their course before their files go (those that have not are lost to
expiry, as in RocketMQ, and skipped by the check)."""
EXPIRE_EVERY_S = 4.0
WORKER_ROLES = [r for r in ROLES if r != "ha"]  # no replication in this store


def _numbers(consumer: Consumer, topic: str) -> set[int]:
    """The message numbers (``<topic>-<n>`` bodies) in every queue of ``topic``."""
    found: set[int] = set()
    for queue_topic, queue_id, _slot in list(consumer.queues.queues()):
        if queue_topic != topic:
            continue
        offset = 0
        while True:
            result = consumer.pull(topic, queue_id, offset, 32)
            if result.status is GetMessageStatus.FOUND:
                found.update(int(m.body.decode().rsplit("-", 1)[1]) for m in result.messages)
            elif result.next_begin_offset <= offset:
                break  # the queue's end (a pull past deleted files moves up to its minimum)
            offset = result.next_begin_offset
    return found


class Soak:
    """The store and its clients, restarted as faults take them down."""

    def __init__(self, tmp_path: Path, seed: int, mode: str) -> None:
        self.tmp_path, self.rnd, self.mode = tmp_path, random.Random(seed), mode
        self.settings = {**MODES[mode], **SETTINGS}
        self.service = start_service(tmp_path, **self.settings)
        self.stop_file = tmp_path / "stop"
        self.chaos_out, self.push_out = tmp_path / "chaos.jsonl", tmp_path / "push.jsonl"
        self.group_outs: list[Path] = []
        self.loaders, self.load_outs = start_producers(
            self.service, tmp_path, [ENDLESS, ENDLESS], batch=[1, 8]
        )
        base = self.service.names.base
        self.chaos = self._spawn(
            "-m", "tests.chaos_clients", "producer", base, str(seed), str(self.chaos_out)
        )
        self.pusher = self._spawn("-m", "tests.chaos_clients", "pusher", base, str(self.push_out))
        self.member = self._new_member()
        self.log: list[str] = []
        self.positions: list[tuple[float, int]] = []  # (monotonic s, WROTE_POSITION) samples
        self.expired_below = 0
        self.missing = ""
        """Every commit-log file below this offset has been aged past fileReservedTime."""

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT)

    def _new_member(self) -> subprocess.Popen[bytes]:
        out = self.tmp_path / f"group{len(self.group_outs)}.jsonl"
        self.group_outs.append(out)
        return self._spawn(
            "-m", "tests.group_member", self.service.names.base, "members", f"m{len(self.group_outs)}",
            str(out), str(self.stop_file), "--topic", "GroupT", "--interval-ms", "200", "--across-restarts",
        )  # fmt: skip

    def clients(self) -> list[subprocess.Popen[bytes]]:
        return [*self.loaders, self.chaos, self.pusher, self.member]

    def fault(self) -> None:
        kind = self.rnd.choices(["kill-worker", "stop-cont", "supervisor", "member"], [4, 4, 1, 1])[0]
        if kind == "kill-worker":
            role = self.rnd.choice(WORKER_ROLES)
            pid = self.service.worker_pid(role)
            if pid:
                self.log.append(f"kill -9 {role}")
                os.kill(pid, signal.SIGKILL)
        elif kind == "stop-cont":
            roles = [r for r in WORKER_ROLES if self.service.worker_pid(r)]
            pids = [self.service.worker_pid(r) for r in roles] + [p.pid for p in self.clients()]
            pid, pause_s = self.rnd.choice(pids), self.rnd.uniform(0.05, 1.0)
            self.log.append(f"SIGSTOP {pid} for {pause_s:.2f} s")
            os.kill(pid, signal.SIGSTOP)
            time.sleep(pause_s)
            os.kill(pid, signal.SIGCONT)
        elif kind == "supervisor":
            with_stop = self.rnd.random() < 0.5
            self.log.append(f"kill -9 supervisor, then {'stop and start' if with_stop else 'start'}")
            stop = armed_run_py(self.service, "stop") if with_stop else None
            kill_supervisor(self.service)
            if stop is not None:
                out_text, err_text = stop.communicate("go\n", timeout=120)
                assert stop.returncode in (1, 2), out_text + err_text  # 2: a live producer mid-put
            self.service = start_service(self.tmp_path, **self.settings)
        else:
            self.log.append("kill -9 the group member; a new one joins")
            self.member.kill()
            self.member.wait(30)
            self.member = self._new_member()

    def expire(self) -> None:
        """Age the files wholly written EXPIRE_AGE_S ago, so the cleaner deletes them."""
        now = time.monotonic()
        old = [pos for at, pos in self.positions if now - at >= EXPIRE_AGE_S]
        size = self.service.config.mapped_file_size_commit_log
        below = old[-1] - old[-1] % size if old else 0
        if below <= self.expired_below:
            return
        aged_s = time.time() - 2 * 3600
        for path in (self.service.root / "commitlog").iterdir():
            if path.name.isdigit() and int(path.name) + size <= below:  # not the allocator's .tmp
                os.utime(path, (aged_s, aged_s))
        self.log.append(f"age the commit log below {below}")
        self.expired_below = below

    def run(self, seconds: float) -> None:
        wait_until(lambda: len(json_lines(self.chaos_out)) > 20, 90, "the chaos producer at work")
        start = time.monotonic()
        deadline, expire_at = start + seconds, start + EXPIRE_EVERY_S
        while time.monotonic() < deadline:
            time.sleep(self.rnd.uniform(0.3, 1.5))
            self.positions.append((time.monotonic(), self.service.read(layout.WROTE_POSITION)))
            if time.monotonic() >= expire_at:
                self.expire()
                expire_at = time.monotonic() + EXPIRE_EVERY_S
            self.fault()

    def settle(self) -> None:
        """Producers stopped; the consumers given time to read what is left (delays, retries)."""
        for proc in (*self.loaders, self.chaos):
            proc.kill()
            proc.wait(30)
        chaos = self.kept(json_lines(self.chaos_out))
        failing = {a["n"] for a in chaos if a["t"] == "PushT" and a["n"] % FAIL_EVERY == 0}
        pushed_ok = {a["n"] for a in chaos if a["t"] == "PushT"} - failing

        def pushed_all() -> bool:
            seen = {int(p["b"].rsplit("-", 1)[1]) for p in json_lines(self.push_out)}
            return pushed_ok <= seen

        wait_until(pushed_all, 120, "the push consumer through every PushT message")
        # Dead letters and delayed messages arrive after their delay levels, and a retried message
        # reaches %DLQ% only once the push consumer has failed it again: wait for every one
        # (bounded) before the consumers stop.
        wait_until(
            lambda: self._dead_and_delayed_done(chaos, failing), 90, "retries dead-lettered, delays delivered"
        )
        wait_until(
            lambda: self.service.read(layout.MIN_OFFSET) >= self.expired_below, 60, "the aged files deleted"
        )
        self.stop_file.touch()
        for proc in (self.member, self.pusher):
            proc.send_signal(signal.SIGTERM)
        for proc in (self.member, self.pusher):
            proc.wait(60)

    def kept(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chaos producer's PUT_OK results stored at or above what was expired: their whole
        story (retries, dead letters, delays delivered) comes after them in the log, so is kept too."""
        return [a for a in results if a["s"] == "PUT_OK" and a["phy"] >= self.expired_below]

    def _dead_and_delayed_done(self, chaos: list[dict[str, Any]], failing: set[int]) -> bool:
        want_delayed = {a["n"] for a in chaos if a["t"] == "DelayT"}
        with Consumer.attach(self.service.names.base, "soak-check") as c:
            dlq = _numbers(c, "%DLQ%pushers")
            delayed = _numbers(c, "DelayT")
        self.missing = f"not dead-lettered: {sorted(failing - dlq)[:20]}; not delivered: {sorted(want_delayed - delayed)[:20]}"
        return failing <= dlq and want_delayed <= delayed

    def close(self) -> None:
        self.stop_file.touch()
        for proc in self.clients():
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        if self.service.process.poll() is None:
            self.service.stop()


def _check(soak: Soak) -> None:
    service = soak.service
    for i, out in enumerate(soak.load_outs):
        check_acknowledged(service, acknowledged(out), producer=i, expired_below=soak.expired_below)
    stored_records(service)  # no (topic, queue, queue offset) held by two records
    records = independent_records(service.root / "commitlog", service.config.mapped_file_size_commit_log)
    by_slot = {(r["topic"], r["queue_id"], r["queue_offset"]): r for r in records}
    by_body: dict[bytes, list[dict[str, Any]]] = {}
    for r in records:
        by_body.setdefault(r["body"], []).append(r)
    scheduled = {r["body"]: r for r in records if r["topic"] == "SCHEDULE_TOPIC_XXXX"}
    kept = {(a["t"], a["n"]) for a in soak.kept(json_lines(soak.chaos_out))}
    for a in json_lines(soak.chaos_out):
        if a["s"] != "PUT_OK":
            continue
        expired = (a["t"], a["n"]) not in kept  # checked only if still there
        body = body_of(a["t"], a["n"])
        if a["kind"] == "delay":
            if expired:
                continue
            sched = scheduled.get(body)
            assert sched is not None, f"acknowledged delayed {a} lost"
            assert sched["phy"] == a["phy"], f"delayed {a} is not where its result said: {sched}"
            delivered = [r for r in by_body.get(body, []) if r["topic"] == "DelayT"]
            assert delivered, f"delayed {a} never delivered on DelayT"
            for r in delivered:
                assert r["store_ts"] >= sched["store_ts"] + 1000, f"delayed {a} delivered early: {r}"
            continue
        rec = by_slot.get((a["t"], a["q"], a["o"]))
        if rec is None and expired:
            continue
        assert rec is not None, f"acknowledged {a} lost"
        assert (rec["body"], rec["phy"]) == (body, a["phy"]), f"{a} at its offsets holds {rec}"
    first_kept: dict[int, int] = {}  # GroupT queue -> its first queue offset still stored
    for r in records:
        if r["topic"] == "GroupT":
            first_kept[r["queue_id"]] = min(
                first_kept.get(r["queue_id"], r["queue_offset"]), r["queue_offset"]
            )
    read: dict[int, int] = {}
    for out in soak.group_outs:
        for e in json_lines(out):
            if e["e"] == "read":
                rec = by_slot.get(("GroupT", e["q"], e["o"]))
                if rec is None and e["o"] < first_kept.get(e["q"], 0):
                    continue  # expired with its file
                assert rec is not None, f"read {e}, not stored"
                assert rec["body"].decode() == e["b"], f"read {e}, stored {rec}"
                read[e["q"]] = max(read.get(e["q"], -1), e["o"])
    offsets = loads((service.root / "config" / "consumerOffset.json").read_text())["offsetTable"]
    ends: dict[int, int] = {}
    for r in records:
        if r["topic"] == "GroupT":
            ends[r["queue_id"]] = max(ends.get(r["queue_id"], 0), r["queue_offset"] + 1)
    for q, committed in offsets.get("GroupT@members", {}).items():
        assert committed <= ends.get(int(q), 0), f"GroupT queue {q}: committed {committed} past its end"
        read_end = max(read.get(int(q), -1) + 1, first_kept.get(int(q), 0))
        assert committed <= read_end, f"GroupT queue {q}: committed {committed}, read {read}"
    chaos_phy = {body_of(a["t"], a["n"]): a["phy"] for a in json_lines(soak.chaos_out) if a["s"] == "PUT_OK"}
    for b in (p["b"].encode() for p in json_lines(soak.push_out)):
        assert b in by_body or chaos_phy.get(b, 0) < soak.expired_below, f"the push consumer consumed {b!r}"


@pytest.mark.skipif(RUNS == 0, reason="RMQ_CHAOS_SEEDS=0 skips the chaos soak")
@pytest.mark.parametrize("run", range(max(RUNS, 1)))
def test_chaos_soak(tmp_path: Path, run: int) -> None:
    seed = first_seed() + run
    mode = sorted(MODES)[seed % len(MODES)]
    print(f"chaos soak seed {seed} ({mode}, {SECONDS:.0f} s): replay with RMQ_CHAOS_SEED={seed}")
    soak = Soak(tmp_path, seed, mode)
    try:
        try:
            soak.run(SECONDS)
            soak.settle()
        except BaseException as exc:
            raise AssertionError(f"seed {seed} ({mode}): {exc} {soak.missing}; faults: {soak.log}") from exc
        assert soak.service.stop() == 0, soak.service.log.read_text()[-4000:]
        print(f"faults: {soak.log}")
        try:
            _check(soak)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed} ({mode}): {exc}; faults: {soak.log}") from exc
    finally:
        soak.close()
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if soak.service.names.base in (p.info["cmdline"] or [])
    ]
