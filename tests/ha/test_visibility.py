"""`run.py status` (text and --json) and `rmq-admin storeStatus` show replication: the role, each
connection (peer, acknowledged offset, lag in bytes and ms, last heard), the SYNC_MASTER counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rmq_mp.put.producer import Producer
from shm import layout
from tests.ha.pair import put, start_master, start_slave, wait_caught_up
from tests.service import ROOT, RunningService, wait_until


def _status(service: RunningService, *extra: str) -> str:
    return subprocess.run(
        [sys.executable, "run.py", "status", "--conf", str(service.conf), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_status_shows_master_connections_and_the_slave(tmp_path: Path) -> None:
    master = start_master(tmp_path, brokerRole="SYNC_MASTER", haSendHeartbeatInterval="1000")
    with Producer.attach(master.names.base) as producer:
        producer.send("T", b"before any slave")  # SLAVE_NOT_AVAILABLE, counted
    port = master.read(layout.HA_LISTEN_PORT)
    slave = start_slave(tmp_path, port, haSendHeartbeatInterval="1000")
    wait_until(lambda: master.read(layout.HA_CONNECTIONS) == 1, 20, "the slave to connect")
    end = put(master, 50)  # after the connection: none of these is SLAVE_NOT_AVAILABLE
    wait_caught_up(slave, end)
    wait_until(lambda: master.read(layout.HA_ACKED_OFFSET) == end, 20, "the ack")

    info = json.loads(_status(master, "--json"))
    r = info["replication"]
    assert r["role"] == "SYNC_MASTER"
    assert r["listen_port"] == port
    assert r["acked_offset"] == end
    assert r["slave_not_available"] == 1
    assert r["flush_slave_timeout"] == 0
    [conn] = r["connections"]
    assert conn["peer"].startswith("127.0.0.1:")
    assert conn["acked_offset"] == end
    assert conn["lag_bytes"] == 0
    assert conn["lag_ms"] == 0
    assert 0 <= conn["last_heard_age_ms"] < 5000
    assert "ha" in info["workers"]
    text = _status(master)
    assert f"ha port {port}" in text
    assert "SLAVE_NOT_AVAILABLE 1" in text
    assert f"acked {end}  lag 0 B / 0 ms" in text

    s = json.loads(_status(slave, "--json"))["replication"]
    assert s["role"] == "SLAVE"
    assert s["master"] == f"127.0.0.1:{port}"
    assert s["state"] == "connected"
    assert s["received_end"] == end
    assert f"SLAVE of 127.0.0.1:{port}  connected  received {end}" in _status(slave)

    admin = subprocess.run(
        [sys.executable, "-m", "rmq_mp.tools.admin", "storeStatus", "--name", master.names.base],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "replication:" in admin
    assert f"acked {end}" in admin
