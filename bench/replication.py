"""Replication (docs/replication.md) beside same-run baselines, on real stores over loopback.

    python -m bench.replication [--mib N] [--puts N] [--rounds N]

- throughput: an empty slave copies N MiB of a master's commit log (its ha worker's frames,
  appends, reports), against two copies of the same bytes over loopback, each round beside its
  own baselines: a plain TCP copy (the floor: no framing, no file, nothing dispatched; the
  issue's 0.8x goal) and the same copy written into a fresh file (what any replica pays at
  least: the page cache). Both send and read in the slices the ha workers use (a master's
  `sendmsg` of FRAMES_PER_SEND frames, a slave's READ_BYTES reads). Ratio = baseline time /
  replication time, per round, and the median over rounds. The CPU time the two stores' processes
  used during the copy (by process) beside the copies' own says what bounds the ratio on a
  small machine: wall time is at least CPU time / cores (the kernel counts in 10 ms ticks:
  rounds are summed, per GB);
- SYNC_MASTER against ASYNC_MASTER, each with a slave on this machine: put throughput and p99
  of one producer's sends of 1 KiB; and SYNC_MASTER's p50 against the same round trip without
  a store (`sync_floor_us`: four wake-ups across three processes, the floor of its design);
- slave lag at maximum put load: the master's end minus the best acknowledged offset, sampled
  while one producer sends batches as fast as it can.
Prints a table and writes bench/results/replication.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing import Queue
from pathlib import Path

import psutil

from bench.service import RunningService, start_service, wait_until
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.put.producer import Producer
from shm import layout
from workers import ha

DEFAULT_BATCH = MessageStoreConfig().ha_transfer_batch_size
"""A master's frames carry this much each (haTransferBatchSize's default)."""

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


def plain_tcp_copy_s(data: memoryview, into: Path | None = None) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) to send ``data`` over loopback in the master's
    send size and receive it all in the slave's read size, written into the fresh file ``into``
    when given (`os.pwrite` of each read into a fresh file, as the slave's frames go)."""
    server = socket.create_server(("127.0.0.1", 0))
    got = [0]
    send_bytes = ha.FRAMES_PER_SEND * DEFAULT_BATCH

    def receive() -> None:
        buf = bytearray(ha.READ_BYTES)
        view = memoryview(buf)
        fd = os.open(into, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) if into is not None else -1
        try:
            with socket.create_connection(server.getsockname()) as sock:
                while got[0] < len(data):
                    n = sock.recv_into(buf)
                    if not n:
                        return
                    if fd >= 0:
                        os.pwrite(fd, view[:n], got[0])
                    got[0] += n
        finally:
            if fd >= 0:
                os.close(fd)

    thread = threading.Thread(target=receive)
    cpu = _cpu_s([psutil.Process()])
    started = time.perf_counter()
    thread.start()
    conn, _ = server.accept()
    with conn:
        for at in range(0, len(data), send_bytes):
            conn.sendall(data[at : at + send_bytes])
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = _cpu_s([psutil.Process()]) - cpu
    server.close()
    if into is not None:
        into.unlink()
    assert got[0] == len(data)
    return elapsed, cpu


def _cpu_s(procs: list[psutil.Process]) -> float:
    return sum(_cpu_by_process({str(i): p for i, p in enumerate(procs)}).values())


def _cpu_by_process(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for label, proc in procs.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            out[label] = times.user + times.system
    return out


def _tree(service: RunningService, side: str) -> dict[str, psutil.Process]:
    """The store's processes by role: ``side`` and the worker's module (or supervisor)."""
    root = psutil.Process(service.process.pid)
    out = {f"{side} supervisor": root}
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            cmd = child.cmdline()
            module = cmd[cmd.index("-m") + 1] if "-m" in cmd else str(child.pid)
            out[f"{side} {module.removeprefix('workers.')}"] = child
    return out


def replication_s(tmp: Path, master: RunningService, end: int, name: str) -> tuple[float, dict[str, float]]:
    """(seconds, CPU seconds of each of both stores' processes) from the slave's connection to
    its last byte (its start excluded), timed by looking at its pointer table every millisecond."""
    slave = _slave(tmp, master, name)
    table = slave.table()
    try:
        while not table.get(layout.HA_SLAVE_CONNECTS):
            time.sleep(0.001)
        procs = _tree(master, "master") | _tree(slave, "slave")
        before = _cpu_by_process(procs)
        started = time.perf_counter()
        deadline = started + 600
        while table.get(layout.HA_SLAVE_RECEIVED_END) < end:
            assert time.perf_counter() < deadline, "the slave did not copy the log in 600 s"
            time.sleep(0.001)
        elapsed = time.perf_counter() - started
        after = _cpu_by_process(procs)
    finally:
        table.close()
    slave.stop()
    return elapsed, {k: after[k] - before[k] for k in after.keys() & before.keys()}


def throughput(tmp: Path, master: RunningService, end: int, rounds: int) -> dict[str, object]:
    """Each round: the plain copy, the copy into a file, the replication, in turn."""
    log = tmp / "m1" / "commitlog" / f"{0:020d}"
    with log.open("rb") as f:
        data = memoryview(f.read(end))
    rows: list[dict[str, float]] = []
    cpu_by_process: dict[str, float] = {}
    for i in range(rounds):
        plain, plain_cpu = plain_tcp_copy_s(data)
        to_file, to_file_cpu = plain_tcp_copy_s(data, tmp / "plain-copy")
        replicated, by_process = replication_s(tmp, master, end, f"s{i}")
        for label, seconds in by_process.items():
            cpu_by_process[label] = cpu_by_process.get(label, 0.0) + seconds
        replicated_cpu = sum(by_process.values())
        rows.append(
            {
                "plain_s": plain,
                "to_file_s": to_file,
                "replication_s": replicated,
                "plain_cpu_s": plain_cpu,
                "to_file_cpu_s": to_file_cpu,
                "replication_cpu_s": replicated_cpu,
                "ratio": plain / replicated,
                "ratio_to_file": to_file / replicated,
            }
        )

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "bytes": end,
        "rounds": rows,
        "plain_mb_s": end / median("plain_s") / 1e6,
        "to_file_mb_s": end / median("to_file_s") / 1e6,
        "replication_mb_s": end / median("replication_s") / 1e6,
        "ratio": median("ratio"),
        "ratio_to_file": median("ratio_to_file"),
        "cpu_s_per_gb": {
            k: sum(r[f"{k}_cpu_s"] for r in rows) / (rounds * end / 1e9)
            for k in ("plain", "to_file", "replication")
        },
        "replication_cpu_s_per_gb_by_process": {
            k: v / (rounds * end / 1e9) for k, v in sorted(cpu_by_process.items(), key=lambda kv: -kv[1]) if v
        },
        "cores": os.cpu_count(),
    }


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


def _floor_master(wake_address: bytes, port: Queue[int], answer_fd: int) -> None:
    """`sync_floor_us`'s ha worker: each datagram sends a record-sized frame to its slave and,
    once the 8-byte report is back, answers the producer's pipe."""
    wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    wake.bind(wake_address)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port.put(server.getsockname()[1])
        conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frame = bytes(FLOOR_FRAME_BYTES)
    while wake.recv(8) == b"p":
        conn.sendall(frame)
        _read_exactly(conn, 8)
        os.write(answer_fd, b"k")


def _floor_slave(port: Queue[int]) -> None:
    with socket.create_connection(("127.0.0.1", port.get())) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while _read_exactly(sock, FLOOR_FRAME_BYTES):
            sock.sendall(bytes(8))


def _read_exactly(sock: socket.socket, nbytes: int) -> bool:
    got = 0
    while got < nbytes:
        chunk = sock.recv(nbytes - got)
        if not chunk:
            return False
        got += len(chunk)
    return True


FLOOR_FRAME_BYTES = 12 + 1024 + 200
"""A frame of one 1 KiB put: header, body and the record's other fields."""


def sync_floor_us(trips: int) -> list[float]:
    """A SYNC_MASTER put's round trip without a store, in microseconds per trip: the producer's
    datagram wakes a process, which sends a frame over loopback TCP to a third and waits for its
    8 bytes back, then writes the producer's pipe. Four wake-ups across three Python processes,
    as the put's poke, frame, report and answer; what the store adds is the rest."""
    ctx = multiprocessing.get_context("fork")  # the pipe is inherited
    port: Queue[int] = ctx.Queue()
    answer_r, answer_w = os.pipe()
    address = f"\0rmq-bench-sync-floor-{os.getpid()}".encode()
    master = ctx.Process(target=_floor_master, args=(address, port, answer_w), daemon=True)
    slave = ctx.Process(target=_floor_slave, args=(port,), daemon=True)
    master.start()
    slave.start()
    out = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as poke:
            for _ in range(trips):
                started = time.perf_counter_ns()
                while True:
                    try:
                        poke.sendto(b"p", address)
                        break
                    except (FileNotFoundError, ConnectionRefusedError):  # not bound yet
                        time.sleep(0.01)
                os.read(answer_r, 1)
                out.append((time.perf_counter_ns() - started) / 1000)
            poke.sendto(b"q", address)
        master.join(10)
        slave.join(10)
    finally:
        for proc in (master, slave):
            if proc.is_alive():
                proc.kill()
                proc.join()
        os.close(answer_r)
        os.close(answer_w)
    return out[len(out) // 10 :]  # the first tenth: the processes' start


def _connected(master: RunningService) -> Callable[[], bool]:
    return lambda: master.read(layout.HA_CONNECTIONS) == 1


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (median reported)")
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        master = _master(tmp, "m1")
        end = _fill(master, args.mib)
        results["throughput"] = throughput(tmp, master, end, args.rounds)
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
    floor = sync_floor_us(args.puts)
    results["sync_floor"] = {"p50_us": statistics.median(floor), "p99_us": p99(floor)}
    results["sync_vs_async"] = {
        "throughput_ratio": results["SYNC_MASTER"]["puts_per_s"] / results["ASYNC_MASTER"]["puts_per_s"],  # type: ignore[index]
        "p99_ratio": results["SYNC_MASTER"]["p99_us"] / results["ASYNC_MASTER"]["p99_us"],  # type: ignore[index]
        "p50_to_floor": results["SYNC_MASTER"]["p50_us"] / results["sync_floor"]["p50_us"],  # type: ignore[index]
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
