"""Two real stores replicating over loopback: a master (haListenPort=0) and its slaves."""

from __future__ import annotations

from pathlib import Path

from rmq_mp.put.producer import Producer
from shm import layout
from tests.service import RunningService, start_service, wait_until


def start_master(tmp_path: Path, name: str = "master", **settings: str) -> RunningService:
    master = start_service(tmp_path, name, haListenPort="0", **settings)
    wait_until(lambda: master.read(layout.HA_LISTEN_PORT) > 0, 20, "the master's HA listener")
    return master


def start_slave(tmp_path: Path, port: int, name: str = "slave", **settings: str) -> RunningService:
    return start_service(tmp_path, name, brokerRole="SLAVE", haMasterAddress=f"127.0.0.1:{port}", **settings)


def put(master: RunningService, count: int, body_bytes: int = 200, topic: str = "HaTopic") -> int:
    """``count`` messages of ``body_bytes`` (message i's first 8 bytes are i); the master's end."""
    with Producer.attach(master.names.base) as producer:
        for i in range(count):
            body = i.to_bytes(8, "big") + bytes((i * 31 + j * 7) & 0xFF for j in range(body_bytes - 8))
            producer.send(topic, body, keys=f"k{i}", tags="TagA")
    return master.read(layout.WROTE_POSITION)


def wait_caught_up(slave: RunningService, end: int, timeout_s: float = 60) -> None:
    """The slave's log and dispatch reach ``end``."""
    wait_until(
        lambda: slave.read(layout.WROTE_POSITION) >= end and slave.read(layout.REPUT_FROM_OFFSET) >= end,
        timeout_s,
        f"the slave to reach {end}",
    )


def commit_log(service: RunningService) -> dict[str, bytes]:
    directory = service.root / "commitlog"
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name.isdigit()}


def assert_same_log(master: RunningService, slave: RunningService, end: int) -> None:
    """The slave's commit log is the master's, byte for byte, up to ``end`` (the files the
    allocator made ahead may differ in number: compare what was written)."""
    ours, theirs = commit_log(master), commit_log(slave)
    size = master.config.mapped_file_size_commit_log
    for offset in range(0, end, size):
        name = f"{offset:020d}"
        upto = min(size, end - offset)
        assert theirs[name][:upto] == ours[name][:upto], f"file {name} differs"
