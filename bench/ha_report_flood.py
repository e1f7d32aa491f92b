"""`python -m bench.ha_report_flood`: SYNC_MASTER puts while peers stream reports at the HA port.

Per run, a fresh SYNC_MASTER and one slave (bench.service's settings); ``--puts`` SYNC sends of
200 bytes timed quiet, then again while ``--peers`` connections from one other process stream
8-byte reports of 0 as fast as the socket takes them (after a first report far beyond the end:
no acknowledgement, heartbeats only), then quiet again. Prints each phase's seconds and the
flood / quiet ratio of the same run: what a peer costs the master's loop per read of reports.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.service import RunningService, cleanup_started, start_service, wait_until
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.put.producer import Producer
from shm import layout

REPORTS_PER_SEND = 8192


def flood(port: int, peers: int) -> None:
    """The flooding process: ``peers`` connections, each sent 64 KiB of reports whenever it has room."""
    import selectors

    selector = selectors.DefaultSelector()
    for _ in range(peers):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(struct.pack(">q", 1 << 40))
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_WRITE)
    payload = struct.pack(">q", 0) * REPORTS_PER_SEND
    try:
        while True:
            for key, _events in selector.select(1):
                with contextlib.suppress(BlockingIOError):
                    key.fileobj.send(payload)  # type: ignore[union-attr]
    except (OSError, KeyboardInterrupt):
        pass


def sync_puts_s(master: RunningService, puts: int) -> float:
    start = time.monotonic()
    with Producer.attach(master.names.base) as producer:
        for _ in range(puts):
            result = producer.send("HaTopic", b"x" * 200)
            assert result.status is PutMessageStatus.PUT_OK, result
    return time.monotonic() - start


def run_once(peers: int, puts: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory(prefix="ha_flood") as tmp:
        master = start_service(Path(tmp), "master", brokerRole="SYNC_MASTER", haListenPort="0")
        wait_until(lambda: master.read(layout.HA_LISTEN_PORT) > 0, 20, "the master's HA listener")
        port = master.read(layout.HA_LISTEN_PORT)
        slave = start_service(Path(tmp), "slave", brokerRole="SLAVE", haMasterAddress=f"127.0.0.1:{port}")
        try:
            quiet = sync_puts_s(master, puts)
            flooder = subprocess.Popen(
                [sys.executable, "-m", "bench.ha_report_flood", "--flood", str(port), str(peers)]
            )
            try:
                time.sleep(1)  # the peers connected and streaming
                flooded = sync_puts_s(master, puts)
            finally:
                flooder.kill()
                flooder.wait()
            after = sync_puts_s(master, puts)
        finally:
            slave.stop()
            master.stop()
            cleanup_started()
    return quiet, flooded, after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--puts", type=int, default=300)
    parser.add_argument("--flood", nargs=2, type=int, metavar=("PORT", "PEERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood:
        flood(*args.flood)
        return 0
    for run in range(1, args.runs + 1):
        quiet, flooded, after = run_once(args.peers, args.puts)
        print(
            f"run {run}: {args.puts} SYNC puts quiet {quiet:.2f} s, under {args.peers} flooding peers "
            f"{flooded:.2f} s ({flooded / quiet:.1f}x), quiet again {after:.2f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
