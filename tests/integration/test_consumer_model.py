"""Consumer groups, a broadcasting member and a push consumer on a running store against a simple
model (hypothesis stateful), while members join, leave cleanly or are killed -9 and the store is
restarted cleanly or killed -9 with every client attached.

The model is what was sent: (queue, offset) -> body on ``GroupT``, and each ``PushT`` message's
plan for its listener. Clustering members are processes (tests/group_member.py, riding restarts,
committing after every batch or every third) logging each read and commit with the machine's
monotonic time, each batch taking 50 ms; every join, leave, kill and restart comes with new
messages being read meanwhile. The broadcasting member is a process run to its end or killed;
the push consumer runs in this process (max_reconsume_times 2, retries one second apart, a 3 s
consume timeout) and is restarted cleanly. Checked at the end of each example, from the logs
and the files:

- no message lost: every sent (queue, offset) read by the group with its body, and by the
  broadcasting member; every push message consumed at exactly its planned reconsume count, or
  (planned to always fail) in ``%DLQ%GP`` with RETRY_TOPIC, reconsume count 3 (more only where a
  send-back was refused while the store was down: retried locally, +1) and its first copy's
  msgId as ORIGIN_MESSAGE_ID, and never consumed; a held message timed out;
- a read repeated only where a kill -9 or a store restart lies between the two reads, or where the
  first reader commits lazily and had given the queue up: so across a clean join or leave of
  members that commit each batch, exactly once; never a read of an offset the group had committed
  past (a queue held by two live members at once, or a commit lost, reads one twice);
- a commit never below what the group committed before; consumerOffset.json never moves back,
  and a clean stop persists every commit made before it (a kill -9 keeps what was persisted; a
  commit made between the kill and the next start's running may be lost with the dead start);
- the broadcasting member resumes from its own progress: it repeats only the uncommitted reads
  of a run killed -9.

Bounded as tests/crash/test_service_model.py: few examples (5, 20 steps: about 40-50 s on 2
cores), no shrinking (each step starts processes); ``RMQ_CONSUMER_MODEL_EXAMPLES`` raises the
example count; ``--hypothesis-show-statistics`` says how often each step ran."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rmq_mp.client.consumer import Consumer
from rmq_mp.client.push_consumer import ConsumeConcurrentlyContext, PushConsumer, ServiceState
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.format import message as m
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import ConsumeConcurrentlyStatus, GetMessageStatus
from rmq_mp.put.producer import Producer
from shm.layout import Role
from shm.pointer_table import pid_alive_since
from shm.store_shm import StoreShm
from tests.service import (
    ROOT,
    RunningService,
    cleanup_started,
    json_lines,
    kill_tree,
    start_service,
    wait_until,
)

TOPIC, GROUP, QUEUES = "GroupT", "G", 4
BROADCAST_GROUP, BROADCASTER = "GB", "b1"
PUSH_TOPIC, PUSH_GROUP, MAX_RECONSUME = "PushT", "GP", 2
SETTINGS = {
    "defaultTopicQueueNums": str(QUEUES),
    "messageDelayLevel": "1s 1s 1s",  # every retry a second later
    "flushConsumerOffsetInterval": "5000",  # (the default) a clean stop persists what came since
}
PLANS = ["0", "1", "2", "x", "h"]
"""A push message's plan: fail (RECONSUME_LATER, or raise) until its reconsume count reaches the
digit; ``x`` always fail (dead letter); ``h`` hold it past the consume timeout once (its
late answer counts where the consumer could not send it back, the store being down)."""
CONSUME_TIMEOUT_MIN = 0.05
"""3 s: a held message is sent back after it; a listener that answers at once is never near it."""
WAIT_S = 90
MAX_MEMBERS = 3
BACKLOG = st.integers(8, 64)
"""New messages sent just before a join, a leave, a kill or a restart: read while it happens."""
EXAMPLES = int(os.environ.get("RMQ_CONSUMER_MODEL_EXAMPLES", "5"))


F = TypeVar("F", bound=Callable[..., Any])


def _step(fn: F) -> F:
    """A step of the machine: one that raises marks the example failed, so that teardown does
    not run the final checks over it (their failure would hide the step's)."""

    @functools.wraps(fn)
    def run(self: ConsumerModel, *args: Any, **kwargs: Any) -> Any:
        event(fn.__name__)  # --hypothesis-show-statistics: how often each step ran
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return run  # type: ignore[return-value]


def _persisted(root: Path, group: str) -> dict[int, int]:
    """The group's offsets of ``GroupT`` in config/consumerOffset.json (the store stopped)."""
    manager = ConsumerOffsetManager(root / "config" / "consumerOffset.json")
    manager.load()
    return dict(manager.table.get(ConsumerOffsetManager.key(group, TOPIC), {}))


@dataclass
class Member:
    client_id: str
    out: Path
    proc: subprocess.Popen[bytes]
    commit_every: int
    gone_s: float | None = None
    """When it was dead after a kill -9 (monotonic s); None while it runs or after a clean leave."""
    running: bool = True
    """Until the test stopped it (the rules' choices never depend on a process's own fate)."""


@dataclass
class Down:
    """The store stopped (``killed``: SIGKILL of its tree) at ``start_s`` and ran again (the next
    start) at ``end_s``; the group's offsets in consumerOffset.json in between. A commit made in
    between may be lost: for SUPERVISOR_STALE_MS a killed store still looks alive, and what is
    committed into it then is gone with it (as a broker's offsets since its last persist)."""

    start_s: float
    end_s: float
    killed: bool
    persisted: dict[int, int] = field(default_factory=dict)


class PushModel:
    """The push consumer's listener and what it was handed (consume threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: dict[str, list[int]] = defaultdict(list)
        self.successes: dict[str, list[int]] = defaultdict(list)
        self.errors: list[str] = []
        self.full_holds = 0
        """Holds that ran their whole time (not cut short by a shutdown, whose answer counts)."""
        self.timed_out = 0
        """Messages timed out by the push consumers shut down so far."""
        self.consumer: PushConsumer | None = None

    def listener(self, msgs: list[MessageExt], _c: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        (msg,) = msgs
        body = msg.body.decode()
        plan = body.split(":")[1]
        with self.lock:
            self.attempts[body].append(msg.reconsume_times)
            if msg.topic != PUSH_TOPIC:
                self.errors.append(f"{body} handed over as {msg.topic}")
        if plan == "x" or (plan.isdigit() and msg.reconsume_times < int(plan)):
            if msg.reconsume_times % 2:
                raise RuntimeError("the listener fails")  # counts as RECONSUME_LATER
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        if plan == "h" and msg.reconsume_times == 0:
            # held past the consume timeout: the consumer sends it back (r 1) and drops this late
            # answer, unless the send-back was refused (the store down) and it is still in flight
            consumer = self.consumer
            assert consumer is not None
            deadline = time.monotonic() + CONSUME_TIMEOUT_MIN * 60 + 1.5
            while time.monotonic() < deadline and consumer.state is ServiceState.RUNNING:
                time.sleep(0.05)
            if consumer.state is ServiceState.RUNNING:
                with self.lock:
                    self.full_holds += 1
        with self.lock:
            self.successes[body].append(msg.reconsume_times)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


class ConsumerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rmq-cmodel-"))
        self.failed = False
        self.service: RunningService | None = None
        self.producer: Producer | None = None
        self.sent: dict[tuple[int, int], str] = {}
        self.sequence = 0
        self.members: list[Member] = []
        self.downs: list[Down] = []
        self.last_persisted: dict[int, int] = {}
        self.broadcast_runs: list[tuple[Path, bool]] = []
        """Each run of the broadcasting member: its log, and whether it was killed -9."""
        self.push = PushModel()
        self.push_consumer: PushConsumer | None = None
        self.push_sent: dict[str, str] = {}
        """body -> the msgId of its first copy."""

    # ------------------------------------------------------------------ setup

    @initialize(commit_every=st.sampled_from([1, 3]), backlog=BACKLOG)
    @_step
    def start(self, commit_every: int, backlog: int) -> None:
        """The store, the push consumer and a first member, with messages to read."""
        self.service = start_service(self.tmp, **SETTINGS)
        self.producer = Producer.attach(self.service.root)
        self._start_push()
        self.join(commit_every, backlog)

    def _start_push(self) -> None:
        consumer = PushConsumer(
            str(self.running.root), PUSH_GROUP, max_reconsume_times=MAX_RECONSUME,
            consume_timeout_min=CONSUME_TIMEOUT_MIN, persist_consumer_offset_interval_ms=200,
        )  # fmt: skip
        consumer.subscribe(PUSH_TOPIC, "*")
        consumer.register_message_listener(self.push.listener)
        self.push.consumer = consumer
        consumer.start()
        self.push_consumer = consumer

    @property
    def running(self) -> RunningService:
        assert self.service is not None
        return self.service

    def teardown(self) -> None:
        try:
            if not self.failed and self.service is not None:
                self._check_everything()
        finally:
            for member in self.members:
                if member.proc.poll() is None:
                    member.proc.kill()
                member.proc.wait(30)
            with contextlib.suppress(Exception):
                if self.push_consumer is not None:
                    self.push_consumer.shutdown()
            with contextlib.suppress(Exception):
                if self.producer is not None:
                    self.producer.close()
            if self.service is not None:
                self.service.stop()
            cleanup_started()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ rules

    def _live(self) -> list[Member]:
        return [mb for mb in self.members if mb.running]

    @rule(
        count=st.integers(0, 80),
        queues=st.lists(st.integers(0, QUEUES - 1), min_size=1, max_size=QUEUES),
        plans=st.lists(st.sampled_from(PLANS), max_size=4),
    )
    @_step
    def produce(self, count: int, queues: list[int], plans: list[str]) -> None:
        """``count`` messages to the group's queues (round-robin over ``queues``), and one to
        the push consumer per plan."""
        self._send(count, queues)
        self._send_push(plans)

    def _send(self, count: int, queues: list[int]) -> None:
        assert self.producer is not None
        for i in range(count):
            queue = queues[i % len(queues)]
            body = f"g{self.sequence}"
            self.sequence += 1
            result = self.producer.send(TOPIC, body.encode(), queue_id=queue)
            assert result.ok, result
            assert (queue, result.queue_offset) not in self.sent, "a queue offset given twice"
            self.sent[(queue, result.queue_offset)] = body

    def _send_push(self, plans: list[str]) -> None:
        assert self.producer is not None
        for plan in plans:
            body = f"p{self.sequence}:{plan}"
            self.sequence += 1
            result = self.producer.send(PUSH_TOPIC, body.encode(), queue_id=self.sequence % 2)
            assert result.ok, result
            self.push_sent[body] = result.msg_id

    @rule()
    @_step
    def restart_push(self) -> None:
        """The push consumer shuts down cleanly (it commits the lowest offset in flight; queued
        work and local retries are dropped, to be read again) and a new one starts."""
        assert self.push_consumer is not None
        self.push_consumer.shutdown()
        self.push.timed_out += self.push_consumer.stats["timed_out"]
        self._start_push()

    @precondition(lambda self: len(self._live()) < MAX_MEMBERS)
    @rule(commit_every=st.sampled_from([1, 1, 3]), backlog=BACKLOG)
    @_step
    def join(self, commit_every: int, backlog: int = 0) -> None:
        """A member process joins, while ``backlog`` new messages are read by the members there
        (a queue handed over mid-batch)."""
        client_id = f"m{len(self.members)}"
        out = self.tmp / f"{client_id}.jsonl"
        args = [
            self.running.names.base, GROUP, client_id, str(out), str(self.tmp / "stop"), "--topic", TOPIC,
            "--poll-s", "0.2", "--interval-ms", "300", "--max", "8", "--across-restarts",
            "--commit-every", str(commit_every), "--work-s", "0.05",
        ]  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "tests.group_member", *args], cwd=ROOT)
        self.members.append(Member(client_id, out, proc, commit_every))
        self._send(backlog, list(range(QUEUES)))
        # joined once it polled: its first assign event (an empty one is not written) or a read
        wait_until(lambda: proc.poll() is not None or self._joined(proc.pid), WAIT_S, f"{client_id} to join")
        assert proc.poll() is None, f"{client_id} exited {proc.returncode}"

    def _joined(self, pid: int, group: str = GROUP) -> bool:
        shm = StoreShm.attach(self.running.names, Role.CONSUMER)
        try:
            return any(mb.pid == pid for mb in shm.members.members(pid_alive_since, group))
        finally:
            shm.close()

    @precondition(lambda self: self._live())
    @rule()
    @_step
    def catch_up(self) -> None:
        """The live members read everything sent so far (the next kill or restart then lands
        after reads and commits, not before them)."""
        wait_until(self._group_read_all, WAIT_S, "the group to read every message")

    @precondition(lambda self: self._live())
    @rule(data=st.data(), killed=st.booleans(), backlog=BACKLOG)
    @_step
    def member_goes(self, data: st.DataObject, killed: bool, backlog: int) -> None:
        """A member leaves cleanly (SIGTERM: it commits what it read, then closes) or is killed
        -9, while ``backlog`` new messages are being read."""
        self._send(backlog, list(range(QUEUES)))
        member = data.draw(st.sampled_from(self._live()))
        member.running = False
        if not killed:
            member.proc.send_signal(signal.SIGTERM)
            assert member.proc.wait(WAIT_S) == 0, f"{member.client_id} left with {member.proc.returncode}"
            return
        member.proc.kill()
        member.proc.wait(30)
        member.gone_s = time.monotonic()  # after its last event

    @rule(killed=st.booleans())
    @_step
    def broadcast_run(self, killed: bool) -> None:
        """The broadcasting member reads what is new to it and exits, or is killed -9 once it
        polled (and read something, when there was something to read)."""
        out = self.tmp / f"{BROADCASTER}-run{len(self.broadcast_runs)}.jsonl"
        stop = self.tmp / ("never" if killed else "bstop")
        (self.tmp / "bstop").touch()  # a run not killed exits at its first poll that finds nothing
        args = [
            self.running.names.base, BROADCAST_GROUP, BROADCASTER, str(out), str(stop), "--topic", TOPIC,
            "--broadcasting", "--poll-s", "0.05", "--max", "4",
        ]  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "tests.group_member", *args], cwd=ROOT)
        self.broadcast_runs.append((out, killed))
        try:
            if killed:  # once it read something, or polled when nothing is new to it
                seen = {
                    (e["q"], e["o"])
                    for run, _k in self.broadcast_runs
                    for e in json_lines(run)
                    if e["e"] == "read"
                }
                wait_until(
                    lambda: (
                        proc.poll() is not None
                        or any(e["e"] == "read" for e in json_lines(out))
                        or (seen >= set(self.sent) and self._joined(proc.pid, BROADCAST_GROUP))
                    ),
                    WAIT_S,
                    "the broadcasting member to poll",
                )
                proc.kill()
                proc.wait(30)
            else:
                assert proc.wait(WAIT_S) == 0, f"the broadcasting member exited {proc.returncode}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)

    @rule(killed=st.booleans(), backlog=BACKLOG)
    @_step
    def restart(self, killed: bool, backlog: int) -> None:
        """A clean stop, or SIGKILL of the supervisor and every worker at once, while ``backlog``
        new messages are being read; then a start. Every client stays attached and rides it
        (the members retry, the push consumer reattaches)."""
        self._send(backlog, list(range(QUEUES)))
        start_s = time.monotonic()
        if killed:
            self._kill_store()
        else:
            assert self.running.stop() == 0, self.running.supervisor_log()
        self._restart(start_s, killed)

    def _kill_store(self) -> None:
        kill_tree(self.running)

    def _restart(self, start_s: float, killed: bool) -> None:
        """Start the store again, its group offsets checked against the last start's."""
        down = Down(start_s, start_s, killed, _persisted(self.running.root, GROUP))
        for queue, offset in self.last_persisted.items():
            assert down.persisted.get(queue, -1) >= offset, (
                f"consumerOffset.json moved back: queue {queue} {offset} -> {down.persisted.get(queue)}"
            )
        self.last_persisted = down.persisted
        self.downs.append(down)
        self.service = start_service(self.tmp, **SETTINGS)
        down.end_s = time.monotonic()  # a supervisor killed looks alive to clients for a while

    @invariant()
    @_step
    def clients_alive(self) -> None:
        for member in self.members:
            code = member.proc.poll()
            assert code is None if member.running else code in (0, -signal.SIGKILL), (
                f"{member.client_id} exited {code}"
            )
        if self.push_consumer is not None:
            assert self.push_consumer.failure is None, self.push_consumer.failure

    # ------------------------------------------------------------------ the end

    def _check_everything(self) -> None:
        if not self._live():
            self.join(1)
        wait_until(self._group_read_all, WAIT_S, "the group to read every message")
        self._check_push()
        self.broadcast_run(killed=False)
        for member in self._live():  # a clean leave commits what it read
            member.running = False
            member.proc.send_signal(signal.SIGTERM)
            assert member.proc.wait(WAIT_S) == 0, member.client_id
        start_s = time.monotonic()
        assert self.running.stop() == 0, self.running.supervisor_log()
        down = Down(start_s, time.monotonic(), killed=False, persisted=_persisted(self.running.root, GROUP))
        self.downs.append(down)
        ends: dict[int, int] = defaultdict(int)
        for queue, offset in self.sent:
            ends[queue] = max(ends[queue], offset + 1)
        assert {q: o for q, o in down.persisted.items() if o > 0} == dict(ends), (
            "the group's offsets at the end are not every queue's end"
        )
        self._check_group()
        self._check_broadcasting()

    def _group_read_all(self) -> bool:
        read = {(e["q"], e["o"]) for mb in self.members for e in json_lines(mb.out) if e["e"] == "read"}
        return read >= set(self.sent)

    def _check_group(self) -> None:
        """Replay every member's reads and commits with the restarts, in time order."""
        timeline: list[tuple[float, int, str, Any]] = []
        for mb in self.members:
            for e in json_lines(mb.out):
                if e["e"] in ("read", "commit", "assign"):
                    timeline.append((e["t"], 1, mb.client_id, e))
        for down in self.downs:
            timeline.append((down.start_s, 0, "", down))
        timeline.sort(key=lambda item: (item[0], item[1]))
        by_id = {mb.client_id: mb for mb in self.members}
        committed: dict[int, int] = defaultdict(int)
        reads: dict[tuple[int, int], tuple[float, str]] = {}
        released: dict[str, list[tuple[float, set[int]]]] = defaultdict(list)
        for mb in self.members:
            for e in json_lines(mb.out):
                if e["e"] == "assign":
                    released[mb.client_id].append((e["t"], set(e["queues"])))
        for t, _order, client, e in timeline:
            if isinstance(e, Down):
                if e.killed:
                    committed = defaultdict(int, e.persisted)
                else:
                    for queue, offset in committed.items():
                        assert e.persisted.get(queue, 0) >= offset, (
                            f"a clean stop lost queue {queue}'s commit {offset}: {e.persisted}"
                        )
                    committed = defaultdict(int, e.persisted)
                continue
            if e["e"] == "commit":
                if any(d.start_s <= t and e["t0"] <= d.end_s for d in self.downs):
                    continue  # landed in a store being stopped or killed: maybe not kept
                for queue, offset in e["offs"].items():
                    assert offset >= committed[int(queue)], (
                        f"{client} committed queue {queue} at {offset}, below the group's {committed[int(queue)]}"
                    )
                    committed[int(queue)] = offset
            elif e["e"] == "read":
                key = (e["q"], e["o"])
                assert self.sent.get(key) == e["b"], (
                    f"{client} read {key} as {e['b']}, sent {self.sent.get(key)}"
                )
                if key in reads:
                    first_s, first = reads[key]
                    assert e["o"] >= committed[e["q"]], (
                        f"{client} read {key} again, committed past by the group ({committed[e['q']]})\n"
                        + self._story(timeline, e["q"], first_s, t)
                    )
                    assert self._repeat_explained(by_id[first], first_s, t, e["q"], released[first]), (
                        f"{client} read {key} again at {t:.3f}, first read by {first} at {first_s:.3f}, "
                        "with no kill, restart or lazy commit between\n"
                        + self._story(timeline, e["q"], first_s, t)
                    )
                reads[key] = (t, client)

    def _story(
        self, timeline: list[tuple[float, int, str, Any]], queue: int, from_s: float, to_s: float
    ) -> str:
        """The events of ``queue`` (and every restart and kill) from ``from_s`` to ``to_s``, for a
        failure's message."""
        lines = []
        for t, _order, client, e in timeline:
            if not from_s - 1 <= t <= to_s + 0.01:
                continue
            if isinstance(e, Down):
                lines.append(f"{t:.3f} store {'killed' if e.killed else 'stopped'} until {e.end_s:.3f}")
            elif e["e"] == "read" and e["q"] == queue:
                lines.append(f"{t:.3f} {client} read {e['o']}")
            elif e["e"] == "commit" and str(queue) in e["offs"]:
                lines.append(f"{t:.3f} {client} committed {e['offs'][str(queue)]} (from {e['t0']:.3f})")
            elif e["e"] == "assign":
                lines.append(f"{t:.3f} {client} holds {e['queues']}")
        lines += [f"{mb.gone_s:.3f} {mb.client_id} killed" for mb in self.members if mb.gone_s]
        return "\n".join(lines[-60:])

    def _repeat_explained(
        self, first: Member, first_s: float, again_s: float, queue: int, assigns: list[tuple[float, set[int]]]
    ) -> bool:
        """A second read of a message: its first reader died, the store went down between the two
        reads, or the first reader commits lazily and gave the queue up after its read."""
        if first.gone_s is not None and first_s <= first.gone_s <= again_s:
            return True
        if any(first_s <= d.end_s and d.start_s <= again_s for d in self.downs):
            return True
        return first.commit_every > 1 and any(t >= first_s and queue not in qs for t, qs in assigns)

    def _check_broadcasting(self) -> None:
        committed: dict[int, int] = defaultdict(int)
        seen: set[tuple[int, int]] = set()
        uncommitted: set[tuple[int, int]] = set()
        """Read by a run killed -9 after its last commit: may be read again."""
        for out, killed in self.broadcast_runs:
            run_reads: list[tuple[int, int]] = []
            for e in json_lines(out):
                if e["e"] == "read":
                    key = (e["q"], e["o"])
                    assert self.sent.get(key) == e["b"], (key, e["b"])
                    if key in seen:
                        assert key in uncommitted, f"the broadcasting member read {key} twice ({out.name})"
                        assert e["o"] >= committed[e["q"]], f"{key} read again below its own progress"
                        uncommitted.discard(key)
                    seen.add(key)
                    run_reads.append(key)
                elif e["e"] == "commit":
                    for queue, offset in e["offs"].items():
                        assert offset >= committed[int(queue)], "a broadcasting commit went back"
                        committed[int(queue)] = offset
                    run_reads.clear()
            if killed:
                uncommitted.update(run_reads)
        assert seen >= set(self.sent), "the broadcasting member missed messages"

    def _check_push(self) -> None:
        push = self.push

        dead = {b for b in self.push_sent if b.endswith(":x")}

        def done() -> bool:
            with push.lock:
                finished = {b for b, rs in push.successes.items() if rs}
            return finished | dead >= set(self.push_sent) and self._dead_letters_of(dead)

        try:
            wait_until(done, WAIT_S, "every push message consumed or dead-lettered")
        except AssertionError as exc:
            with push.lock:
                missing = {
                    b: (push.attempts.get(b), push.successes.get(b))
                    for b in self.push_sent
                    if b not in dead and not push.successes.get(b)
                }
            raise AssertionError(f"{exc}: (attempts, successes) of those not consumed: {missing}") from exc
        assert not push.errors, push.errors
        for body, successes in push.successes.items():
            plan = body.split(":")[1]
            want = {0, 1} if plan == "h" else {int(plan)}  # h: its late answer, or its retry's
            assert plan != "x", f"{body} consumed though its listener always fails"
            assert set(successes) <= want, f"{body} consumed at reconsume counts {successes}, want {want}"
        if (
            push.full_holds and not self.downs
        ):  # (a send-back refused, the store down: the late answer counts)
            assert self.push_consumer is not None
            assert push.timed_out + self.push_consumer.stats["timed_out"] >= 1, "no held message timed out"
        for body, attempts in push.attempts.items():
            if body.endswith(":x"):  # (a send-back refused while the store was down: retried locally, +1)
                assert set(attempts) >= set(range(MAX_RECONSUME + 1)), (body, attempts)
                assert self.downs or set(attempts) == set(range(MAX_RECONSUME + 1)), (body, attempts)

    def _dead_letters_of(self, bodies: set[str]) -> bool:
        """Whether every body of ``bodies`` is in the dead-letter topic (checking each copy)."""
        dlq = m.dlq_topic(PUSH_GROUP)
        found: set[str] = set()
        with Consumer.attach(self.running.names.base, "model-reader") as reader:
            offset = 0
            while (r := reader.pull(dlq, 0, offset, 32)).status is GetMessageStatus.FOUND:
                for msg in r.messages:
                    body = msg.body.decode()
                    assert body.endswith(":x"), f"{body} dead-lettered, though its listener succeeds"
                    assert msg.reconsume_times == MAX_RECONSUME + 1 or (
                        self.downs and msg.reconsume_times > MAX_RECONSUME
                    ), (body, msg.reconsume_times)
                    assert msg.properties[m.PROPERTY_RETRY_TOPIC] == PUSH_TOPIC, msg.properties
                    assert msg.properties[m.PROPERTY_ORIGIN_MESSAGE_ID] == self.push_sent[body], (
                        body, msg.properties, self.push_sent[body],
                    )  # fmt: skip
                    found.add(body)
                offset = r.next_begin_offset
        return found >= bodies


ConsumerModel.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each step starts processes
)
test_consumers_follow_their_model = ConsumerModel.TestCase
