"""A slave whose log forks from its master's (issue 32 point 3, RocketMQ #3388), on real processes:
two stores written apart after a common prefix, then one started as the slave of the other. It
finds the last offset both share, sets aside what only it had (a dated folder, named in its log
and status), cuts there at its next start and catches up byte for byte; a slave that cannot
tell where the logs part refuses with one line and stays refusing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

from rmq_mp.client.consumer import Consumer
from rmq_mp.errors import ShmAttachError
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.spark.store_files import queue_ranges, resolve_store
from rmq_mp.store import fork
from shm import layout
from tests.ha.pair import assert_same_log, commit_log, put, start_master, start_slave, wait_caught_up
from tests.ha.relay import Relay
from tests.service import ROOT, RunningService, wait_until, worker_passes

HB = {"haSendHeartbeatInterval": "1000"}
SIZE = 1 << 20


def _bodies(service: RunningService, topic: str) -> dict[tuple[int, int], bytes]:
    """(queue id, queue offset) -> body of every message of ``topic`` the store serves."""
    out: dict[tuple[int, int], bytes] = {}
    with Consumer.attach(service.names.base, "reader") as consumer:
        for queue_id in range(8):
            offset, high = consumer.min_offset(topic, queue_id), consumer.max_offset(topic, queue_id)
            while offset < high:
                result = consumer.pull(topic, queue_id, offset, 32)
                assert result.status is GetMessageStatus.FOUND, (topic, queue_id, offset, result.status)
                out.update({(queue_id, m.queue_offset): m.body for m in result.messages})
                offset = result.next_begin_offset
    return out


def _served(service: RunningService, topic: str) -> dict[tuple[int, int], bytes]:
    """What a consumer is served of ``topic`` now, each queue from its first offset to where
    a pull finds nothing more (on a forked slave: the fork, below its queues' max offsets)."""
    out: dict[tuple[int, int], bytes] = {}
    with Consumer.attach(service.names.base, "reader") as consumer:
        for queue_id in range(8):
            offset = consumer.min_offset(topic, queue_id)
            while (result := consumer.pull(topic, queue_id, offset, 32)).status is GetMessageStatus.FOUND:
                out.update({(queue_id, m.queue_offset): m.body for m in result.messages})
                offset = result.next_begin_offset
    return out


def _ha_log(service: RunningService) -> str:
    return (service.root / "logs" / "ha.log").read_text()


def _read(service: RunningService, field: layout.Field) -> int:
    """A field of the store's current start; -1 while it restarts (no table to attach to)."""
    try:
        return service.read(field)
    except ShmAttachError:
        return -1


@contextlib.contextmanager
def _held_until_forked(tmp_path: Path, relay: Relay, name: str) -> Iterator[RunningService]:
    """Start ``name`` as the slave of the relay's master with the link stalled, stop its
    supervisor (SIGSTOP: as slow as an adversary likes), let the link flow and wait until its ha
    worker has found the fork and recorded the cut: the window before the supervisor's own
    restart, held open for the block (the supervisor goes on at its end)."""
    relay.stall()
    service = start_slave(tmp_path, relay.port, name, **HB)
    wait_until(
        lambda: service.read(layout.HA_SLAVE_STATE) == layout.SLAVE_VERIFYING, 60, f"{name} to compare logs"
    )
    os.kill(service.process.pid, signal.SIGSTOP)
    try:
        relay.heal()
        wait_until(
            lambda: service.read(layout.HA_SLAVE_STATE) == layout.SLAVE_FORKED, 60, f"{name} to find the fork"
        )
        yield service
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(service.process.pid, signal.SIGCONT)


class _Reader(threading.Thread):
    """A consumer reading every queue of some topics from their first offsets, again and again,
    through the fork, the store's own restart and after. It notes what breaks the rule: a pull
    begun once the store's read window ended at a fork (FORK_READ_END, read before the pull)
    that served a record at or past it, and (``check``) a message a later start served that
    differs from the master's at its queue offset."""

    def __init__(self, name: str, topics: tuple[str, ...]) -> None:
        super().__init__(name="fork-reader", daemon=True)
        self.store_name, self.topics = name, topics
        self.done = threading.Event()
        self.violations: list[str] = []
        self.capped_pulls = 0
        """Pulls begun while FORK_READ_END was set."""
        self.later: dict[tuple[str, int, int], bytes] = {}
        """What a start after the first one served: (topic, queue id, queue offset) -> body."""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Consumer.attach(self.store_name, "fork-reader") as consumer:
                first = consumer.store.instance.generation
                while not self.done.is_set():
                    with contextlib.suppress(ShmAttachError):  # the store restarting: read again
                        self._pass(consumer, first)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _pass(self, consumer: Consumer, first: int) -> None:
        for topic in self.topics:
            for queue_id in range(8):
                offset = 0
                while not self.done.is_set():
                    fork_end = consumer.store.table.get(layout.FORK_READ_END)
                    generation = consumer.store.instance.generation
                    result = consumer.pull(topic, queue_id, offset, 32)
                    if result.status is not GetMessageStatus.FOUND:
                        break
                    if consumer.store.instance.generation != generation:
                        continue  # attached to the next start during the pull: read again
                    if fork_end >= 0:
                        self.capped_pulls += 1
                        self.violations += [
                            f"{topic}/{queue_id}@{m.queue_offset} at {m.commit_log_offset} past the fork {fork_end}"
                            for m in result.messages
                            if m.commit_log_offset + m.store_size > fork_end
                        ]
                    if generation != first:
                        self.later.update(
                            {(topic, queue_id, m.queue_offset): m.body for m in result.messages}
                        )
                    offset = result.next_begin_offset


def test_a_returning_old_master_sets_aside_what_only_it_has_and_converges(tmp_path: Path) -> None:
    a = start_master(tmp_path, "a", **HB)
    port_a = a.read(layout.HA_LISTEN_PORT)
    b = start_slave(tmp_path, port_a, "b", **HB)
    shared = put(a, 2500, body_bytes=300)  # the common prefix, over a file roll
    wait_caught_up(b, shared)
    assert b.stop() == 0
    a_end = put(a, 1500, body_bytes=250)  # written apart: A as the master ...
    b = start_master(tmp_path, "b", **HB)  # ... and B, promoted while A was away
    put(b, 400, body_bytes=111)
    b_end = put(b, 300, body_bytes=90, topic="OnlyB")
    assert b.stop() == 0
    before = commit_log(b)

    b = start_slave(tmp_path, port_a, "b", **HB)  # B returns as A's slave
    wait_until(lambda: _read(b, layout.FORK_RESTARTS) == 1, 60, "B to find the fork and restart itself")
    assert f"forks from its master's at {shared}" in _ha_log(b)
    [folder] = (b.root / fork.DIVERGED_DIR).iterdir()
    manifest = json.loads((folder / "fork.json").read_text())
    assert (manifest["fork_offset"], manifest["end"]) == (shared, b_end)
    assert str(folder.relative_to(b.root)) in _ha_log(b)
    for name in manifest["files"]:  # B's own bytes, whole segments, byte for byte
        assert (folder / "commitlog" / name).read_bytes() == before[name]
    assert shared - shared % SIZE == int(manifest["files"][0])
    wait_caught_up(b, a_end)  # its own restart cut at the fork, and it caught up
    assert not (b.root / fork.PENDING_CUT).exists()
    assert b.read(layout.HA_SLAVE_STATE) == layout.SLAVE_CONNECTED
    assert_same_log(a, b, a_end)
    ours = commit_log(b)
    for offset in range(a_end - a_end % SIZE + SIZE, b_end, SIZE):  # nothing of B's past A's end
        assert not ours.get(f"{offset:020d}", b"").strip(b"\0")
    assert _bodies(b, "HaTopic") == _bodies(a, "HaTopic")
    assert _bodies(b, "OnlyB") == {}, "records set aside are never served after the cut"
    assert "cutting the log at" in (b.root / "logs" / "supervisor.log").read_text()
    end = put(a, 200)  # and it follows on
    wait_caught_up(b, end)
    assert_same_log(a, b, end)
    assert (folder / "fork.json").exists(), "the set-aside folder stays"


def test_a_consumer_reading_while_the_fork_is_found_gets_nothing_past_it(tmp_path: Path) -> None:
    """Issue 32: from the moment a slave finds that its log forks from its master's, no reader is
    served a record at or past the fork (its read window ends there at once), and the store
    restarts itself to cut there and catch up: no operator. The supervisor is held (SIGSTOP)
    between the finding and its restart, so the window is as long as the test likes."""
    a = start_master(tmp_path, "a", **HB)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    shared = put(a, 800, body_bytes=300)
    wait_caught_up(b, shared)
    assert b.stop() == 0
    a_end = put(a, 600, body_bytes=250)
    b = start_master(tmp_path, "b", **HB)
    put(b, 500, body_bytes=111)  # HaTopic past `shared`: other bodies at A's queue offsets
    b_end = put(b, 200, body_bytes=90, topic="OnlyB")
    assert b.stop() == 0
    theirs = {(t, q, o): body for t in ("HaTopic",) for (q, o), body in _bodies(a, t).items()}

    with Relay(a.read(layout.HA_LISTEN_PORT)) as relay, contextlib.ExitStack() as cleanup:
        reader: _Reader | None = None

        def stop_reader() -> None:  # also when the test fails: no thread left attached
            if reader is not None:
                reader.done.set()
                reader.join(30)

        cleanup.callback(stop_reader)
        with _held_until_forked(tmp_path, relay, "b") as b:
            assert b.read(layout.FORK_READ_END) == shared
            assert b.read(layout.HA_SLAVE_FORK_OFFSET) == shared
            reader = _Reader(b.names.base, ("HaTopic", "OnlyB"))
            reader.start()
            with Consumer.attach(b.names.base, "direct") as consumer:
                for queue_id in range(8):  # only B wrote OnlyB, all past the fork: none served
                    got = consumer.pull("OnlyB", queue_id, 0, 32)
                    assert got.status is GetMessageStatus.OFFSET_OVERFLOW_ONE, got.status
                    assert not got.messages
            assert _served(b, "OnlyB") == {}
            below = {("HaTopic", q, o): body for (q, o), body in _served(b, "HaTopic").items()}
            assert len(below) >= 800, "what is below the fork is still served"
            assert all(theirs[key] == body for key, body in below.items()), "below the fork: A's"
            ref = resolve_store(b.names.base)  # a Spark read planned now ends at the fork too
            planned = {(q.topic, q.queue_id): (q.min_offset, q.max_offset) for q in queue_ranges(ref)}
            assert sum(high - low for (t, _q), (low, high) in planned.items() if t == "HaTopic") == len(below)
            assert all(low == high for (t, _q), (low, high) in planned.items() if t == "OnlyB")
            promote = _admin("promote", "--name", str(b.root), "--force")  # not before the cut, even forced
            assert promote.returncode == 2, promote
            assert f"forks from its master's at {shared}" in promote.stderr
            wait_until(
                lambda: reader.capped_pulls >= 20 or reader.error is not None, 60, "pulls in the window"
            )
            assert b.read(layout.FORK_RESTARTS) == 0, "the supervisor is held"
        # The supervisor goes on: it restarts the store, which cuts at the fork and catches up.
        wait_until(lambda: _read(b, layout.FORK_RESTARTS) == 1, 60, "B to restart itself")
        wait_caught_up(b, a_end)
        assert_same_log(a, b, a_end)
        assert _bodies(b, "HaTopic") == _bodies(a, "HaTopic")
        assert _bodies(b, "OnlyB") == {}
        wait_until(lambda: len(reader.later) >= len(theirs) or reader.error is not None, 60, "the reader")
        reader.done.set()
        reader.join(30)
        assert reader.error is None, reader.error
        assert not reader.violations, reader.violations[:5]
        assert all(theirs[key] == body for key, body in reader.later.items()), "after the cut: A's"
        assert b.read(layout.FORK_READ_END) == -1
        assert "restarting the store to cut it there" in (b.root / "logs" / "supervisor.log").read_text()
        end = put(a, 100)  # and it follows on, byte for byte
        wait_caught_up(b, end)
        assert_same_log(a, b, end)
        [folder] = (b.root / fork.DIVERGED_DIR).iterdir()
        assert json.loads((folder / "fork.json").read_text())["end"] == b_end


def test_a_slave_ahead_of_its_restarted_master_finds_the_masters_end(tmp_path: Path) -> None:
    """A master that lost its tail (its slave has more): the slave's extra records are set aside
    at the master's end, and what the master writes next replaces them; the slave killed -9
    while forked cuts at its next start all the same."""
    a = start_master(tmp_path, "a", **HB)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    shared = put(a, 300)
    wait_caught_up(b, shared)
    assert b.stop() == 0
    b = start_master(tmp_path, "b", **HB)
    b_end = put(b, 100, body_bytes=77)
    assert b.stop() == 0
    with Relay(a.read(layout.HA_LISTEN_PORT)) as relay, _held_until_forked(tmp_path, relay, "b") as b:
        assert b.read(layout.HA_SLAVE_FORK_OFFSET) == shared
        assert (b.root / fork.PENDING_CUT).exists()
        assert f"its bytes [{shared}, {b_end}) are not the master's" in _ha_log(b)
        tree = psutil.Process(b.process.pid)  # kill -9 of the whole slave before its own restart
        for proc in [tree, *tree.children(recursive=True)]:
            proc.kill()
        b.process.wait(10)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    end = put(a, 150, body_bytes=55)
    wait_caught_up(b, end)
    assert_same_log(a, b, end)
    assert _bodies(b, "HaTopic") == _bodies(a, "HaTopic")


def test_a_slave_whose_master_has_nothing_where_its_log_begins_refuses(tmp_path: Path) -> None:
    """The slave's log begins at a master's last file (4 MiB); its new master is empty: nothing at
    any offset it can ask from, so it refuses with one line naming where, and stays refusing."""
    a = start_master(tmp_path, "a", **HB)
    end = put(a, 9000, body_bytes=300)
    start = end - end % SIZE
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    wait_caught_up(b, end)
    assert b.stop() == 0
    assert a.stop() == 0
    empty = start_master(tmp_path, "empty", **HB)
    before = commit_log(b)
    b = start_slave(tmp_path, empty.read(layout.HA_LISTEN_PORT), "b", **HB)
    wait_until(lambda: b.read(layout.HA_SLAVE_STATE) == layout.SLAVE_REFUSED, 60, "B to refuse")
    assert b.read(layout.HA_SLAVE_FORK_OFFSET) == start
    lines = [line for line in _ha_log(b).splitlines() if "refusing to replicate" in line]
    [line] = lines
    assert f"nothing at {start}" in line
    connects = b.read(layout.HA_SLAVE_CONNECTS)
    worker_passes(b, "ha", 3)
    assert b.read(layout.HA_SLAVE_CONNECTS) == connects, "it stays refusing"
    assert not (b.root / fork.DIVERGED_DIR).exists()
    assert b.stop() == 0
    assert commit_log(b) == before, "a refusal changes nothing"


def test_an_empty_store_refilled_by_copy_log_follows_from_offset_0(tmp_path: Path) -> None:
    """An empty store refilled from a running one with `rmq-admin copyLog` (its whole log: the
    HA wire gives an empty slave only the last file), then its slave: byte for byte from 0."""
    a = start_master(tmp_path, "a", **HB)
    end = put(a, 9000, body_bytes=300)  # five files
    copied = _admin("copyLog", "--name", a.names.base, "--to", str(tmp_path / "c"))
    assert copied.returncode == 0, copied.stderr
    c = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "c", **HB)
    end = put(a, 500, body_bytes=300)
    wait_caught_up(c, end)
    assert c.read(layout.MIN_OFFSET) == 0
    assert_same_log(a, c, end)
    assert _bodies(c, "HaTopic") == _bodies(a, "HaTopic")
    assert "matches this slave's" in _ha_log(c)
    assert c.stop() == 0
    again = _admin("copyLog", "--store", str(a.root), "--to", str(c.root))
    assert again.returncode == 2
    assert "already holds commit-log data" in again.stderr
    assert_same_log(a, c, end)


def _admin(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", *argv], cwd=ROOT, capture_output=True, text=True
    )


def test_a_fork_that_cannot_be_set_aside_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Its folder cannot be made (a file in its place, as a full disk would fail it): nothing is
    cut or recorded, the slave refuses with one line naming the fork and why."""
    a = start_master(tmp_path, "a", **HB)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    shared = put(a, 200)
    wait_caught_up(b, shared)
    assert b.stop() == 0
    b = start_master(tmp_path, "b", **HB)
    put(b, 50, body_bytes=77)
    assert b.stop() == 0
    (b.root / fork.DIVERGED_DIR).write_text("in the way")
    before = commit_log(b)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    wait_until(lambda: b.read(layout.HA_SLAVE_STATE) == layout.SLAVE_REFUSED, 60, "B to refuse")
    [line] = [line for line in _ha_log(b).splitlines() if "refusing to replicate" in line]
    assert f"forks from the master's at {shared}" in line
    assert "could not be set aside" in line
    assert not (b.root / fork.PENDING_CUT).exists()
    assert b.stop() == 0
    assert commit_log(b) == before
