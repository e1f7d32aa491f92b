"""Replication (docs/replication.md) beside same-run baselines, on real stores over loopback.

    python -m bench.replication [--mib N] [--puts N]

- throughput: an empty slave copies N MiB of a master's commit log (its ha worker's frames,
  appends, reports), against a plain TCP copy of the same bytes over loopback in 32 KiB sends
  (the floor: no framing, no file writes). Ratio = plain time / replication time (goal >= 0.8);
- SYNC_MASTER against ASYNC_MASTER, each with a slave on this machine: put throughput and p99
  of one producer's sends of 1 KiB;
- slave lag at maximum put load: the master's end minus the best acknowledged offset, sampled
  while one producer sends batches as fast as it can.
Prints a table and writes bench/results/replication.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.service import RunningService, start_service, wait_until
from rmq_mp.put.producer import Producer
from shm import layout

RESULTS = Path(__file__).resolve().parent / "results"
FILE = {"mappedFileSizeCommitLog": str(1 << 30)}


def _master(tmp: Path, name: str, **settings: str) -> RunningService:
    master = start_service(tmp, name, haListenPort="0", **FILE, **settings)
    wait_until(lambda: master.read(layout.HA_LISTEN_PORT) > 0, 20, "the HA listener")
    return master


def _slave(tmp: Path, master: RunningService, name: str) -> RunningService:
    port = master.read(layout.HA_LISTEN_PORT)
    return start_service(tmp, name, brokerRole="SLAVE", haMasterAddress=f"127.0.0.1:{port}", **FILE)


def _fill(master: RunningService, mib: int) -> int:
    body = bytes(1000)
    with Producer.attach(master.names.base) as producer:
        while master.read(layout.WROTE_POSITION) < mib << 20:
            producer.send_batch([{"topic": "Bench", "body": body}] * 256)
    return master.read(layout.WROTE_POSITION)


def plain_tcp_copy_s(data: memoryview) -> float:
    """Seconds to send ``data`` over loopback in 32 KiB sends and receive it all."""
    server = socket.create_server(("127.0.0.1", 0))
    got = [0]

    def receive() -> None:
        with socket.create_connection(server.getsockname()) as sock:
            while got[0] < len(data):
                n = len(sock.recv(1 << 20))
                if not n:
                    return
                got[0] += n

    thread = threading.Thread(target=receive)
    started = time.perf_counter()
    thread.start()
    conn, _ = server.accept()
    with conn:
        for at in range(0, len(data), 32768):
            conn.sendall(data[at : at + 32768])
        thread.join()
    server.close()
    assert got[0] == len(data)
    return time.perf_counter() - started


def replication_s(tmp: Path, master: RunningService, end: int, name: str) -> float:
    """Seconds from the slave's connection to its last byte (its start excluded), timed by
    looking at its pointer table every millisecond."""
    slave = _slave(tmp, master, name)
    table = slave.table()
    try:
        while not table.get(layout.HA_SLAVE_CONNECTS):
            time.sleep(0.001)
        started = time.perf_counter()
        deadline = started + 600
        while table.get(layout.HA_SLAVE_RECEIVED_END) < end:
            assert time.perf_counter() < deadline, "the slave did not copy the log in 600 s"
            time.sleep(0.001)
        elapsed = time.perf_counter() - started
    finally:
        table.close()
    slave.stop()
    return elapsed


def put_latencies_us(master: RunningService, puts: int) -> tuple[float, list[float]]:
    body = bytes(1024)
    out = []
    with Producer.attach(master.names.base) as producer:
        started = time.perf_counter()
        for _ in range(puts):
            t = time.perf_counter_ns()
            result = producer.send("Lat", body)
            out.append((time.perf_counter_ns() - t) / 1000)
            assert result.status.name == "PUT_OK", result
        return time.perf_counter() - started, out


def _connected(master: RunningService) -> Callable[[], bool]:
    return lambda: master.read(layout.HA_CONNECTIONS) == 1


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--puts", type=int, default=2000)
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        master = _master(tmp, "m1")
        end = _fill(master, args.mib)
        log = tmp / "m1" / "commitlog" / f"{0:020d}"
        with log.open("rb") as f:
            data = memoryview(f.read(end))
        plain = [plain_tcp_copy_s(data) for _ in range(2)]
        replicated = [replication_s(tmp, master, end, f"s{i}") for i in range(2)]
        results["throughput"] = {
            "bytes": end,
            "plain_tcp_s": plain,
            "replication_s": replicated,
            "plain_mb_s": end / min(plain) / 1e6,
            "replication_mb_s": end / min(replicated) / 1e6,
            "ratio": min(plain) / min(replicated),
        }
        master.stop()
        for role in ("ASYNC_MASTER", "SYNC_MASTER"):
            master = _master(tmp, role, brokerRole=role)
            slave = _slave(tmp, master, f"{role}-slave")
            wait_until(_connected(master), 20, "the slave")
            seconds, lat = put_latencies_us(master, args.puts)
            results[role] = {
                "puts_per_s": args.puts / seconds,
                "p50_us": statistics.median(lat),
                "p99_us": p99(lat),
            }
            if role == "ASYNC_MASTER":
                results["lag_at_max_load"] = lag_at_max_load(master)
            slave.stop()
            master.stop()
    results["sync_vs_async"] = {
        "throughput_ratio": results["SYNC_MASTER"]["puts_per_s"] / results["ASYNC_MASTER"]["puts_per_s"],  # type: ignore[index]
        "p99_ratio": results["SYNC_MASTER"]["p99_us"] / results["ASYNC_MASTER"]["p99_us"],  # type: ignore[index]
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replication.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


def lag_at_max_load(master: RunningService, seconds: float = 3.0) -> dict[str, float]:
    """The master's end minus the best acknowledged offset, every 10 ms while one producer sends
    batches of 100 x 1 KiB as fast as it can."""
    stop = threading.Event()
    samples: list[int] = []

    def produce() -> None:
        with Producer.attach(master.names.base) as producer:
            while not stop.is_set():
                producer.send_batch([{"topic": "Load", "body": bytes(1024)}] * 100)

    thread = threading.Thread(target=produce)
    thread.start()
    table = master.table()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            samples.append(table.written_end() - table.get(layout.HA_ACKED_OFFSET))
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
        table.close()
    return {
        "max_bytes": max(samples),
        "p99_bytes": p99([float(s) for s in samples]),
        "median_bytes": statistics.median(samples),
    }


if __name__ == "__main__":
    raise SystemExit(main())
