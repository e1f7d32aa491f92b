"""Replication through the fault relay (tests/ha/relay.py): a real TCP proxy between a slave and
its master that cuts, stalls, slows and half-opens the link. After every fault is lifted and the
slave has caught up, the two commit logs are byte-identical; a stalled or half-open link is
dropped after haHousekeepingInterval and the slave connects again; a SYNC_MASTER whose slave is
stalled answers FLUSH_SLAVE_TIMEOUT, never PUT_OK, and PUT_OK again once the link is back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import assert_same_log, commit_log, put, start_master, start_slave, wait_caught_up
from tests.ha.relay import Relay
from tests.ha.sync_load import SyncLoad
from tests.service import RunningService, wait_until

LINK = {"haSendHeartbeatInterval": "200", "haHousekeepingInterval": "1500"}
"""Heartbeats every 200 ms; a link silent for 1.5 s is dropped (RocketMQ: 5 s and 20 s)."""


def _more(service: RunningService, field: layout.Field, than: int, what: str, timeout_s: float = 30) -> None:
    wait_until(lambda: service.read(field) > than, timeout_s, what)


def _in_force(master: RunningService, slave: RunningService, fault: str, dropped: int, connects: int) -> None:
    """What each fault must visibly do to the two stores while it lasts (``dropped`` and
    ``connects``: the counts before it)."""
    if fault in ("stall", "half_open_up", "vanish_slave"):  # the master hears nothing: it drops the link
        _more(master, layout.HA_DROPPED, dropped, "the master to drop the silent slave")
    if fault in ("stall", "half_open_down", "half_open_up", "vanish_master", "cut_rst", "cut_fin"):
        _more(slave, layout.HA_SLAVE_CONNECTS, connects, "the slave to connect again")
    if fault == "vanish_slave":  # its new connection flows: caught up during the fault
        wait_caught_up(slave, master.read(layout.WROTE_POSITION))


FAULTS = [
    "cut_rst",
    "cut_fin",
    "stall",
    "slow",
    "half_open_down",
    "half_open_up",
    "vanish_slave",
    "vanish_master",
]


def _apply(relay: Relay, fault: str) -> None:
    if fault.startswith("cut_"):
        relay.cut(fault.removeprefix("cut_"))
    elif fault == "stall":
        relay.stall()
    elif fault == "slow":
        relay.slow(256 << 10)
    elif fault.startswith("half_open_"):
        relay.half_open(fault.removeprefix("half_open_"))
    else:
        relay.vanish(fault.removeprefix("vanish_"))


@pytest.mark.parametrize("fault", FAULTS)
def test_logs_identical_after_each_fault(tmp_path: Path, fault: str) -> None:
    master = start_master(tmp_path, **LINK)
    with Relay(master.read(layout.HA_LISTEN_PORT)) as relay:
        slave = start_slave(tmp_path, relay.port, **LINK)
        end = put(master, 500)
        wait_caught_up(slave, end)
        dropped, connects = master.read(layout.HA_DROPPED), slave.read(layout.HA_SLAVE_CONNECTS)
        _apply(relay, fault)
        end = put(master, 3000, body_bytes=400)  # 1.3 MiB while the fault lasts: a file roll
        _in_force(master, slave, fault, dropped, connects)
        if fault == "slow":  # still follows, at the relay's pace
            wait_caught_up(slave, end, 60)
            assert relay.forwarded["down"] >= end - (1 << 20)
        relay.heal()
        end = put(master, 300)
        wait_caught_up(slave, end)
        wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 30, "the master to see the ack")
        assert_same_log(master, slave, end)
        assert slave.stop() == 0
        assert master.stop() == 0
    assert_same_log(master, slave, end)


def test_a_stalled_sync_masters_puts_time_out_then_put_ok_again(tmp_path: Path) -> None:
    sync = {"brokerRole": "SYNC_MASTER", "slaveTimeout": "300", **LINK}
    master = start_master(tmp_path, **sync)
    with Relay(master.read(layout.HA_LISTEN_PORT)) as relay:
        slave = start_slave(tmp_path, relay.port, **LINK)
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
        ok: list[tuple[int, bytes]] = []
        with Producer.attach(master.names.base) as producer:

            def send(i: int) -> PutMessageStatus:
                body = b"stall-%06d" % i
                result = producer.send("T", body)
                if result.status is PutMessageStatus.PUT_OK:
                    ok.append((result.commit_log_offset, body))
                return result.status

            assert [send(i) for i in range(20)] == [PutMessageStatus.PUT_OK] * 20
            relay.stall()
            dropped = master.read(layout.HA_DROPPED)
            connects = slave.read(layout.HA_SLAVE_CONNECTS)
            during: list[PutMessageStatus] = []

            def dropped_and_back() -> bool:  # puts go on until the link was dropped and remade
                during.append(send(100 + len(during)))
                return (
                    master.read(layout.HA_DROPPED) > dropped
                    and slave.read(layout.HA_SLAVE_CONNECTS) > connects
                )

            wait_until(dropped_and_back, 60, "the stalled link to be dropped and the slave to reconnect")
            assert PutMessageStatus.PUT_OK not in during, during
            assert during[0] is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
            assert set(during) <= {PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE}
            assert master.read(layout.HA_FLUSH_SLAVE_TIMEOUT) >= 1
            relay.heal()
            end = master.read(layout.WROTE_POSITION)
            wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) >= end, 30, "the slave to catch up")
            assert [send(1000 + i) for i in range(20)] == [PutMessageStatus.PUT_OK] * 20
        end = master.read(layout.WROTE_POSITION)
        wait_caught_up(slave, end)
        assert_same_log(master, slave, end)
        log = b"".join(commit_log(slave).values())
        assert all(body in log for _, body in ok)
        print(
            f"{len(during)} puts during the stall: {sorted({s.name for s in during})}; {len(ok)} PUT_OK on the slave"
        )


@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_two_slaves_under_load_one_cut_the_other_keeps_put_ok(tmp_path: Path, fault: str) -> None:
    """``stall``: the stalled slave's socket fills on the master, which must go on serving the
    other (one select loop for all) until housekeeping drops the stalled one."""
    sync = {"brokerRole": "SYNC_MASTER", "slaveTimeout": "1000", **LINK}
    master = start_master(tmp_path, **sync)
    port = master.read(layout.HA_LISTEN_PORT)
    with Relay(port) as relay_one, Relay(port) as relay_two:
        one = start_slave(tmp_path, relay_one.port, "one", **LINK)
        two = start_slave(tmp_path, relay_two.port, "two", **LINK)
        wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 2, 20, "two slave connections")
        load = SyncLoad(master, threads=2)
        try:
            load.wait_put_ok(200)
            if fault == "cut":
                relay_one.cut("rst", hold=True)  # one is cut off and kept off
            else:
                relay_one.stall()
            cut_at = len(load.answers)
            wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the master to lose one")
            load.wait_put_ok(len(load.put_ok()) + 500)
            during = [status for status, _ in load.answers[cut_at:]]
            assert set(during) == {PutMessageStatus.PUT_OK}, Counter(during)
            assert relay_one.accepted > 1, "the slave cut off kept trying"
            relay_one.heal()
            wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 2, 30, "the cut slave back")
            load.wait_put_ok(len(load.put_ok()) + 200)
        finally:
            load.stop()
        end = master.read(layout.WROTE_POSITION)
        for slave in (one, two):
            wait_caught_up(slave, end)
            assert_same_log(master, slave, end)
        for slave in (one, two):
            assert not load.missing_on(b"".join(commit_log(slave).values()))
        print(
            f"{len(during)} puts while one slave was {fault}: all PUT_OK; {len(load.put_ok())} PUT_OK in all"
        )


def test_a_cut_in_the_middle_of_big_records(tmp_path: Path) -> None:
    """A slowed link cut while 2 MiB records are half across: the slave never shows a partial
    record (WROTE_POSITION stays on a record boundary below what it received), reports its
    received end mid record, and the master resumes there."""
    settings = {**LINK, "mappedFileSizeCommitLog": str(16 << 20)}
    master = start_master(tmp_path, **settings)
    with Relay(master.read(layout.HA_LISTEN_PORT)) as relay:
        slave = start_slave(tmp_path, relay.port, **settings)
        start = put(master, 10)
        wait_caught_up(slave, start)
        relay.slow(1 << 20)
        with Producer.attach(master.names.base) as producer:
            results = [producer.send("Big", bytes([i + 1]) * (2 << 20)) for i in range(3)]
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        end = master.read(layout.WROTE_POSITION)
        boundaries = {start, *(r.commit_log_offset for r in results), end}
        received = slave.read(layout.HA_SLAVE_RECEIVED_END)
        wait_until(
            lambda: slave.read(layout.HA_SLAVE_RECEIVED_END) > start + (512 << 10), 30, "half a record across"
        )
        for _ in range(3):  # cut at three points inside the big records
            received = slave.read(layout.HA_SLAVE_RECEIVED_END)
            wrote = slave.read(layout.WROTE_POSITION)
            assert wrote in boundaries, (wrote, sorted(boundaries))
            assert wrote <= received
            connects = slave.read(layout.HA_SLAVE_CONNECTS)
            relay.cut("rst")
            wait_until(lambda: slave.read(layout.HA_SLAVE_CONNECTS) > connects, 30, "the slave back")  # noqa: B023
            wait_until(
                lambda: slave.read(layout.HA_SLAVE_RECEIVED_END) > received + (256 << 10),  # noqa: B023
                30,
                "the slave to go on from where it was",
            )
        relay.heal()
        wait_caught_up(slave, end)
        assert_same_log(master, slave, end)
