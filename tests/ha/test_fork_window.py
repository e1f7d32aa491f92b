"""Issue 32: a slave serves nothing it has not confirmed as its current master's, also before its
first comparison with that master (rmq_mp/store/ha_log.py). On real processes, with the master
held out of reach (a stalled relay) while the test reads the slave every way a reader can: a
consumer pulling every queue from 0, `max_offset`, a Spark read's plan, and rmq-admin on the
running store and on the stopped one. Then the master is let through: the fork is found, cut
and the slave converges. A slave confirmed as its master's keeps serving with its master down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rmq_mp.client.consumer import Consumer
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.spark.store_files import queue_ranges, resolve_store
from rmq_mp.store import fork, ha_log
from shm import layout
from tests.ha.pair import assert_same_log, put, start_master, start_slave, wait_caught_up
from tests.ha.relay import Relay
from tests.ha.test_fork import HB, _admin, _bodies, _read, _served
from tests.service import ROOT, RunningService, kill_tree, wait_until

TOPICS = ("HaTopic", "OnlyB", "OnlyA")


def _written_apart(tmp_path: Path) -> tuple[RunningService, int, int]:
    """A master A, and B stopped: A's slave up to ``shared``, then run as a master that wrote its
    own HaTopic records and a topic only it has (OnlyB). Returns A, ``shared`` and A's end."""
    a = start_master(tmp_path, "a", **HB)
    b = start_slave(tmp_path, a.read(layout.HA_LISTEN_PORT), "b", **HB)
    shared = put(a, 800, body_bytes=300)
    wait_caught_up(b, shared)
    assert b.stop() == 0
    a_end = put(a, 600, body_bytes=250)
    b = start_master(tmp_path, "b", **HB)
    put(b, 500, body_bytes=111)
    put(b, 200, body_bytes=90, topic="OnlyB")
    group = _admin(
        "resetOffsetByTime", "--name", b.names.base, "-g", "G", "-t", "HaTopic", "-s", "0", "--create-group"
    )
    assert group.returncode == 0, group.stderr  # group G at queue offset 0 of each HaTopic queue
    assert b.stop() == 0
    return a, shared, a_end


def _lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _find(document: object, key: str) -> list[dict[str, object]]:
    """The list under ``key`` anywhere in a JSON document."""
    if isinstance(document, dict):
        if key in document:
            return list(document[key])
        return [row for value in document.values() for row in _find(value, key)]
    return []


def _assert_window(
    service: RunningService, read_end: int, theirs: dict[tuple[str, int, int], bytes], *, group: bool = False
) -> None:
    """Every reader of the running ``service`` stops at ``read_end``: what a consumer pulling each
    queue from 0 gets is exactly the master's records below it (``theirs``: topic, queue id,
    queue offset -> body), `max_offset`, the Spark plan and rmq-admin's topicStatus end each queue
    where those pulls did, and rmq-admin's file readers show nothing at or past it."""
    served: dict[tuple[str, int, int], bytes] = {}
    ends: dict[tuple[str, int], int] = {}
    with Consumer.attach(service.names.base, "window") as consumer:
        for topic in TOPICS:
            for queue_id in range(8):
                offset = 0
                while True:
                    got = consumer.pull(topic, queue_id, offset, 32)
                    assert all(m.commit_log_offset < read_end for m in got.messages), (
                        topic,
                        queue_id,
                        offset,
                    )
                    served.update({(topic, queue_id, m.queue_offset): m.body for m in got.messages})
                    if got.status is not GetMessageStatus.FOUND:
                        break
                    offset = got.next_begin_offset
                assert got.status in (
                    GetMessageStatus.OFFSET_OVERFLOW_ONE,
                    GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                )
                assert consumer.max_offset(topic, queue_id) == offset, (topic, queue_id)
                ends[(topic, queue_id)] = offset
    assert all(theirs.get(key) == body for key, body in served.items()), "below the window: the master's"
    planned = {(q.topic, q.queue_id): q.max_offset for q in queue_ranges(resolve_store(service.names.base))}
    assert {key: end for key, end in planned.items() if key[0] in TOPICS} == {
        key: end for key, end in ends.items() if key in planned
    }, "a Spark read planned now ends each queue where the pulls did"
    status = _lines(_admin("topicStatus", "--name", service.names.base, "--json"))
    assert {(r["topic"], r["queueId"]): r["maxOffset"] for r in status if r["topic"] in TOPICS} == {
        key: end for key, end in ends.items() if key in planned
    }, "topicStatus counts no entry past the window"
    printed = _admin("printMsg", "--name", service.names.base, "--json")
    rows = _lines(printed)
    assert all(int(str(r["commitLogOffset"])) < read_end for r in rows)
    assert len([r for r in rows if r["topic"] in TOPICS]) == len(served)
    assert f"[{read_end}," in printed.stderr
    assert "not printed" in printed.stderr
    found = _lines(_admin("queryMsgByKey", "--name", service.names.base, "-t", "OnlyB", "-k", "k1", "--json"))
    assert found == [], "queryMsgByKey: nothing past the window"
    if group:  # consumerProgress' broker offsets and status' lag: to the window's end too
        progress = _lines(_admin("consumerProgress", "--name", service.names.base, "-g", "G", "--json"))
        assert {(r["topic"], r["queueId"]): r["brokerOffset"] for r in progress} == {
            key: end for key, end in ends.items() if key[0] == "HaTopic" and key in planned
        }
        shown = subprocess.run(
            [sys.executable, "run.py", "status", "--conf", str(service.conf), "--json"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
        [row] = [r for r in _find(json.loads(shown.stdout), "consumer_groups") if r["group"] == "G"]
        assert row["lag"] == sum(end for key, end in ends.items() if key[0] == "HaTopic")
        text = subprocess.run(
            [sys.executable, "run.py", "status", "--conf", str(service.conf)],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert f"serves nothing from {read_end} (not yet confirmed as its master's)" in text


def _assert_stopped_window(root: Path, read_end: int) -> None:
    """rmq-admin on the stopped store (its record says where its window ends) shows nothing past it."""
    rows = _lines(_admin("printMsg", "--store", str(root), "--json"))
    assert rows
    assert all(int(str(r["commitLogOffset"])) < read_end for r in rows)
    assert not [r for r in rows if r["topic"] == "OnlyB"]
    status = _lines(_admin("topicStatus", "--store", str(root), "-t", "OnlyB", "--json"))
    assert status
    assert all(r["maxOffset"] == r["minOffset"] for r in status)


def _theirs(a: RunningService) -> dict[tuple[str, int, int], bytes]:
    return {("HaTopic", q, o): body for (q, o), body in _bodies(a, "HaTopic").items()}


def _converged(a: RunningService, b: RunningService, a_end: int) -> None:
    wait_until(lambda: _read(b, layout.FORK_RESTARTS) == 1, 60, "B to find the fork and restart itself")
    wait_caught_up(b, a_end)
    assert_same_log(a, b, a_end)
    assert _bodies(b, "HaTopic") == _bodies(a, "HaTopic")
    assert _bodies(b, "OnlyB") == {}
    assert b.read(layout.FORK_READ_END) == b.read(layout.HA_UNCONFIRMED_FROM) == -1
    assert ha_log.load(b.root) == ha_log.LogRecord("SLAVE", f"127.0.0.1:{_port(b)}", None)


def _port(service: RunningService) -> int:
    return int(service.config.ha_master_address.rpartition(":")[2])


def test_a_returning_old_master_serves_nothing_before_its_first_comparison(tmp_path: Path) -> None:
    """B ran as a master: started as A's slave with A out of reach, its log is confirmed as A's
    nowhere, so nothing is served (its first byte is the window's end); promote refuses unless
    forced. A let through: the fork found, cut, converged, and served again."""
    a, shared, a_end = _written_apart(tmp_path)
    theirs = _theirs(a)
    with Relay(a.read(layout.HA_LISTEN_PORT)) as relay:
        relay.cut(hold=True)  # A out of reach: every connection refused until healed
        b = start_slave(tmp_path, relay.port, "b", **HB)
        _assert_window(b, 0, theirs, group=True)
        assert b.read(layout.FORK_READ_END) == b.read(layout.HA_UNCONFIRMED_FROM) == 0
        assert "is not confirmed as" in (b.root / "logs" / "supervisor.log").read_text()
        assert ha_log.load(b.root) == ha_log.LogRecord("SLAVE", f"127.0.0.1:{relay.port}", 0)
        refused = _admin("promote", "--name", b.names.base)
        assert refused.returncode == 2
        assert "is confirmed as its master" in refused.stderr
        assert "only below 0" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        relay.heal()
        _converged(a, b, a_end)
    assert shared < a_end


def test_a_kill_before_the_cut_was_recorded_keeps_the_window_at_the_fork(tmp_path: Path) -> None:
    """The fork found at C and its record durable, but no forkCut.json (its bytes could not be
    set aside: a file where the folder goes), then kill -9 of the whole store: a stopped store's
    rmq-admin and its next start, with the master out of reach, serve the master's records below
    C and nothing at or past it; the master let through, it finds the fork again, cuts, converges."""
    a, shared, a_end = _written_apart(tmp_path)
    theirs = _theirs(a)
    with Relay(a.read(layout.HA_LISTEN_PORT)) as relay:
        (tmp_path / "b" / fork.DIVERGED_DIR).write_text("in the way")
        b = start_slave(tmp_path, relay.port, "b", **HB)
        wait_until(lambda: b.read(layout.HA_SLAVE_STATE) == layout.SLAVE_REFUSED, 60, "B to find the fork")
        assert b.read(layout.FORK_READ_END) == shared
        assert not (b.root / fork.PENDING_CUT).exists()
        kill_tree(b)
        (b.root / fork.DIVERGED_DIR).unlink()
        assert ha_log.stopped_read_end(b.root) == shared
        _assert_stopped_window(b.root, shared)
        relay.cut(hold=True)
        b = start_slave(tmp_path, relay.port, "b", **HB)
        _assert_window(b, shared, theirs, group=True)
        assert b.read(layout.FORK_READ_END) == b.read(layout.HA_UNCONFIRMED_FROM) == shared
        assert len(_bodies(b, "HaTopic")) == 800, "what is below the fork is served"
        assert b.stop() == 0  # stopped cleanly (no shared memory left): rmq-spark reads its files
        counted = subprocess.run(
            [sys.executable, "-m", "rmq_mp.spark.jobs", "stats", "--store", str(b.root), "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert counted.returncode == 0, counted.stderr[-2000:]
        queues = json.loads(counted.stdout)["queues"]
        assert sum(q["count"] for q in queues if q["topic"] == "HaTopic") == 800, "rmq-spark: below the fork"
        assert not [q for q in queues if q["topic"] == "OnlyB"]
        assert f"records from commit-log offset {shared} are left out" in counted.stderr
        _assert_stopped_window(b.root, shared)
        b = start_slave(tmp_path, relay.port, "b", **HB)
        assert b.read(layout.FORK_READ_END) == shared
        relay.heal()
        _converged(a, b, a_end)


def test_a_confirmed_slave_keeps_serving_with_its_master_down(tmp_path: Path) -> None:
    """A slave that has followed its master (its record: all of its log is that master's) serves
    everything with the master gone, also after its own restart, and promote is not refused for it."""
    a = start_master(tmp_path, "a", **HB)
    port = a.read(layout.HA_LISTEN_PORT)
    b = start_slave(tmp_path, port, "b", **HB)
    end = put(a, 700, body_bytes=300)
    wait_caught_up(b, end)
    theirs = _bodies(a, "HaTopic")
    kill_tree(a)
    assert b.read(layout.FORK_READ_END) == -1
    assert _bodies(b, "HaTopic") == theirs
    assert b.stop() == 0
    assert ha_log.load(b.root) == ha_log.LogRecord("SLAVE", f"127.0.0.1:{port}", None)
    assert ha_log.stopped_read_end(b.root) == -1
    b = start_slave(tmp_path, port, "b", **HB)  # its master still down
    assert _bodies(b, "HaTopic") == theirs
    assert b.read(layout.FORK_READ_END) == b.read(layout.HA_UNCONFIRMED_FROM) == -1
    with Consumer.attach(b.names.base, "ends") as consumer:
        assert sum(consumer.max_offset("HaTopic", q) for q in range(8)) == len(theirs)
    promoted = _admin("promote", "--name", b.names.base, "--role", "ASYNC_MASTER")
    assert promoted.returncode == 0, promoted.stderr
    assert ha_log.load(b.root) == ha_log.LogRecord("ASYNC_MASTER")


def test_a_slave_ahead_re_pointed_at_a_promoted_slave_serves_nothing_before_comparing(tmp_path: Path) -> None:
    """Two slaves: S2 ahead of S1 (S1's link held while A wrote OnlyA), A gone, S1 promoted and
    written to. S2 re-pointed at S1 with S1 out of reach: its log is not confirmed as S1's, and
    its tail past S1's end (OnlyA) is served to nobody; S1 let through: the fork found at S1's
    end, cut, and S2 converges on S1's log."""
    a = start_master(tmp_path, "a", **HB)
    a_port = a.read(layout.HA_LISTEN_PORT)
    with Relay(a_port) as to_a:
        s1 = start_slave(tmp_path, to_a.port, "s1", haListenPort="0", **HB)
        s2 = start_slave(tmp_path, a_port, "s2", **HB)
        shared = put(a, 600, body_bytes=300)
        wait_caught_up(s1, shared)
        to_a.stall()
        a_end = put(a, 300, body_bytes=200, topic="OnlyA")
        wait_caught_up(s2, a_end)
        a.stop()
        promoted = _admin("promote", "--name", s1.names.base, "--role", "ASYNC_MASTER", "--force")
        assert promoted.returncode == 0, promoted.stderr
    wait_until(lambda: s1.read(layout.HA_LISTEN_PORT) > 0, 30, "S1 to serve slaves")
    s1_end = put(s1, 200, body_bytes=150, topic="AfterPromotion")
    assert s2.stop() == 0
    theirs = _theirs(s1)
    with Relay(s1.read(layout.HA_LISTEN_PORT)) as to_s1:
        to_s1.cut(hold=True)
        s2 = start_slave(tmp_path, to_s1.port, "s2", **HB)
        _assert_window(s2, 0, theirs)
        assert s2.read(layout.FORK_READ_END) == s2.read(layout.HA_UNCONFIRMED_FROM) == 0
        with Consumer.attach(s2.names.base, "only-a") as consumer:
            assert all(consumer.max_offset("OnlyA", q) == 0 for q in range(8))
        to_s1.heal()
        _converged(s1, s2, s1_end)
        assert _bodies(s2, "OnlyA") == {}
        assert _bodies(s2, "AfterPromotion") == _bodies(s1, "AfterPromotion")
        assert f"forks from its master's at {shared}" in (s2.root / "logs" / "ha.log").read_text()


def _last_record(service: RunningService, topic: str) -> int:
    """The commit-log offset of the last record of ``topic`` the store serves."""
    with Consumer.attach(service.names.base, "last") as consumer:
        return max(
            m.commit_log_offset
            for q in range(8)
            for m in consumer.pull(topic, q, max(consumer.max_offset(topic, q) - 1, 0), 1).messages
        )


def test_a_confirmed_slave_stops_where_a_master_replaced_under_its_address_differs(tmp_path: Path) -> None:
    """B follows A (its record: all of its log is A's). A is replaced at the address B follows by
    A2, a copy of A's log up to ``shared`` that wrote on (a master that lost its tail): B's first
    probe finds other bytes at its last record X, and from then on nothing from X is served (after
    a restart too), until its comparison, let through again, finds the fork and converges on A2."""
    a = start_master(tmp_path, "a", **HB)
    with Relay(a.read(layout.HA_LISTEN_PORT)) as relay:
        b = start_slave(tmp_path, relay.port, "b", **HB)
        shared = put(a, 600, body_bytes=300)
        wait_caught_up(b, shared)
        copied = _admin("copyLog", "--name", a.names.base, "--to", str(tmp_path / "a2"))
        assert copied.returncode == 0, copied.stderr
        a_end = put(a, 200, body_bytes=250)
        wait_caught_up(b, a_end)
        last = _last_record(a, "HaTopic")
        assert len(_bodies(b, "HaTopic")) == 800
        relay.cut(hold=True)
        assert a.stop() == 0
        a2 = start_master(tmp_path, "a2", **HB)
        a2_end = put(a2, 400, body_bytes=200, topic="AfterLoss")
        assert a2_end > a_end
        relay.retarget(a2.read(layout.HA_LISTEN_PORT))
        relay.hold_after(1)  # one probe gets through, the next is refused
        wait_until(lambda: b.read(layout.FORK_READ_END) == last, 60, "B to stop at its last record")
        assert b.read(layout.HA_UNCONFIRMED_FROM) == last
        assert len(_served(b, "HaTopic")) == 799, "everything below its last record, nothing from it"
        with Consumer.attach(b.names.base, "ends") as consumer:
            assert sum(consumer.max_offset("HaTopic", q) for q in range(8)) == 799
        assert ha_log.load(b.root) == ha_log.LogRecord("SLAVE", f"127.0.0.1:{relay.port}", last)
        assert b.stop() == 0
        b = start_slave(tmp_path, relay.port, "b", **HB)  # the record keeps the window there
        assert len(_served(b, "HaTopic")) == 799
        assert b.read(layout.FORK_READ_END) == last
        relay.heal()
        _converged(a2, b, a2_end)
        assert f"forks from its master's at {shared}" in (b.root / "logs" / "ha.log").read_text()
