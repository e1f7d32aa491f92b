"""The ha worker: RocketMQ 4.9.8's master/slave replication (`store/ha`), one process per store.

Master (ASYNC_MASTER or SYNC_MASTER with haListenPort set; RocketMQ's HAService,
AcceptSocketService and HAConnection): listens on haListenAddress:haListenPort, refuses peers
outside haAllowedSlaves and past `ha_listen.MAX_PEERS` connections (logged, closed before a byte),
and serves the rest on one poll loop. A connection sends nothing until the slave's first 8-byte
report: 0 starts it at the file holding the master's end, anything else at that offset. It then
sends frames (`rmq_mp.format.ha_frame`) of at most haTransferBatchSize committed commit-log bytes,
never crossing a file, and a heartbeat frame after haSendHeartbeatInterval without a write. Each
later report is the slave's acknowledged end: published per connection slot and as the best over
all of them (HA_ACKED_OFFSET, never decreasing), what a SYNC_MASTER put waits for. Unlike 4.9.8, a
first report beyond the master's end is not counted as an acknowledgement (a stranger could make a
SYNC_MASTER answer PUT_OK); a later report beyond the end closes the connection (#3015), and so
does haHousekeepingInterval of silence. A slave that needs bytes the cleaner has deleted is shown
(CONN_BEHIND_MIN_OFFSET) and logged, and gets heartbeats only: never a silent gap.

Slave (brokerRole=SLAVE with haMasterAddress; RocketMQ's HAClient): connects, reports its end at
once (RocketMQ waits one heartbeat interval first; the master cannot tell) and after every read
that moved it, and every haSendHeartbeatInterval; a master silent for haHousekeepingInterval (no
frame, not even a heartbeat: a stalled or half-open link) is closed and reconnected, as HAClient.
It writes each frame at exactly its own end (a non-empty slave receiving any other offset closes
and reconnects) and so is the one writer of the log on a slave: the bytes go into the files first,
HA_SLAVE_RECEIVED_END (what it reports) next, and WROTE_POSITION (what flusher and reput see) only
up to the last whole record below it, so no reader ever meets a record cut by a frame; bytes where
no record can start are refused (zeroed, the received end moved back to the last whole record, the
connection closed). It reads one frame at a time (back-pressure: nothing is buffered beyond a frame
and one read), and reconnects with backoff after a refusal, a cut or a bad frame. Restarted, it
resumes from its recovered end (the last intact record).

Both exit with the supervisor (`ServiceLoop.stopping`): a dead or fenced master stops serving.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rmq_mp.config.store_config import (
    BrokerRole,
    MessageStoreConfig,
    parse_allowed_slaves,
    parse_host_port,
)
from rmq_mp.errors import HaProtocolError, OffsetTableFullError, StoreError
from rmq_mp.format import ha_frame, native, record, record_batch, topic_marker
from rmq_mp.store import fork, ha_log
from rmq_mp.store.running_store import promoted_role, resolve_names
from shm import layout
from shm import queue_offsets as qo
from shm.layout import Role
from shm.pointer_table import PointerTable, now_ms
from shm.store_shm import read_descriptor
from workers import ha_fork, ha_listen, ha_meta, ha_start
from workers.service import ServiceLoop, main

log = logging.getLogger("rmq_mp.ha")

PASS_S = 0.1
"""Longest wait of one pass in select (RocketMQ's sender sleeps up to 100 ms when idle)."""
IDLE_SEND_POLL_S = 0.01
"""Wait while a slave is caught up: new commit-log bytes leave within this (no put wakes a select)."""
WAITING_PUT_POLL_S = 0.001
"""Wait while a SYNC_MASTER put waits: its bytes leave, and its answer comes, within this."""
SEND_PER_PASS_BYTES = 4 << 20
"""Bytes one connection may send in one pass before the others get their turn."""
FRAMES_PER_SEND = 32
"""Frames one `sendmsg` carries (a MiB at the default haTransferBatchSize)."""
READ_BYTES = 1 << 20
"""One read from the master: the slave holds at most one frame and this much more. 1 MiB
against 256 KiB: the slave's ha worker 0.50-0.57 against 0.67-0.77 s of CPU per GB replicated
(bench/NOTES.md, hasplice); 2 MiB showed no more."""
RECEIVE_READS = 4
"""Reads of one receive before the slave moves WROTE_POSITION and reports (4 MiB)."""
CONNECT_TIMEOUT_S = 1.0
BACKOFF_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
"""Delay before the n-th consecutive reconnect of a slave (RocketMQ: 5 s after a failed connect)."""
MAX_UNSENT_REPORT_BYTES = 1 << 16
"""A master that reads none of this many bytes of reports is not listening: reconnect."""
SCAN_RECORDS = 1 << 16
"""Records one `record_batch.scan_segment` of the slave's received bytes reads at most."""
SCAN_MIN_BYTES = 64 << 10
"""Received bytes from which the slave scans (below, a record at a time is quicker: a scan's
set-up costs what a few dozen one-record decodes do)."""
QUEUE_ROWS = 4096
"""Queues one compiled `queue_ends` walk reports at most (a walk meeting more stops there)."""
_MARKER_TOPIC = topic_marker.TOPIC.encode("ascii")
_RECORD_MAGICS = (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2)


def _unsent(buffers: list[bytes | memoryview], sent: int) -> bytes:
    """The bytes of ``buffers`` after the first ``sent``, copied."""
    rest = []
    for buf in buffers:
        if sent >= len(buf):
            sent -= len(buf)
            continue
        rest.append(buf[sent:])
        sent = 0
    return b"".join(rest)


def _peer_word(address: tuple[str, int] | tuple[str, int, int, int]) -> int:
    """A peer as one word for its connection slot: IPv4 << 16 | port (0 for other addresses)."""
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return 0
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return int(ip) << 16 | address[1] if isinstance(ip, ipaddress.IPv4Address) else 0


# ---------------------------------------------------------------------------------------- master


@dataclass
class _Connection:
    sock: socket.socket
    peer: str
    slot: int
    heard_at: float
    wrote_at: float
    reports: ha_frame.ReportReader = field(default_factory=ha_frame.ReportReader)
    next_offset: int = -1
    """Where the next frame starts; -1 until the first report."""
    acked: int = -1
    out: memoryview = field(default_factory=lambda: memoryview(b""))
    """Bytes of the frame being sent that the socket has not taken yet."""
    behind_logged: bool = False


class HaMaster(ServiceLoop):
    role = "ha"

    def on_start(self) -> None:
        cfg = self.store.config
        self.allowed = parse_allowed_slaves(cfg.ha_allowed_slaves)
        self.file_size = cfg.mapped_file_size_commit_log
        self.batch = cfg.ha_transfer_batch_size
        self.heartbeat_s = cfg.ha_send_heartbeat_interval / 1000
        self.housekeeping_s = cfg.ha_housekeeping_interval / 1000
        self.connections: dict[int, _Connection] = {}
        self.replicas = self.store.shm.replicas
        self.answered_through = 0
        """SYNC_MASTER: every replica-request ticket up to this one is answered."""
        self.listener = self._listen(cfg)
        self.poked = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.poked.setblocking(False)
        self.poked.bind(self.store.names.ha_wake)  # an abstract address: gone with the process
        self.table.set(layout.HA_LISTEN_PORT, self.listener.getsockname()[1])
        for slot in range(layout.HA_CONN_SLOTS):
            self._clear_slot(slot)
        log.info(
            "ha: serving slaves on %s port %d%s",
            cfg.ha_listen_address or "every interface",
            self.listener.getsockname()[1],
            f" (allowed: {cfg.ha_allowed_slaves})" if self.allowed else "",
        )
        self.meta = ha_meta.start(self.store, slave=False)  # the metadata channel (workers/ha_meta.py)

    def _listen(self, cfg: MessageStoreConfig) -> socket.socket:
        """Bound to haListenPort; with 0, to the port an earlier listener of this store got
        (HA_BOUND_PORT), so a worker the supervisor restarted is found again by its slaves (a
        fresh ephemeral port left them knocking on the old one: test_ha_kill's master_ha cases)."""
        port = cfg.ha_listen_port or self.table.get(layout.HA_BOUND_PORT)
        try:
            sock = ha_listen.listen(cfg.ha_listen_address, port, 64, "ha")
        except OSError:
            if port == cfg.ha_listen_port:
                raise
            log.warning("ha: cannot listen on port %d again; taking a new one", port)
            sock = ha_listen.listen(cfg.ha_listen_address, 0, 64, "ha")
        if not cfg.ha_listen_port:
            self.table.set(layout.HA_BOUND_PORT, sock.getsockname()[1])
        return sock

    def interval_s(self) -> float:
        return PASS_S

    def has_work(self) -> bool:
        return True  # do_work waits in select itself

    def do_work(self) -> None:
        conns = list(self.connections.values())
        waiting = [c.sock for c in conns if len(c.out)]
        caught_up = any(c.next_offset >= 0 and not len(c.out) for c in conns)
        timeout = IDLE_SEND_POLL_S if caught_up else PASS_S
        if self._requests_open():
            timeout = min(timeout, WAITING_PUT_POLL_S)
        readable, _ = ha_listen.ready([self.listener, self.poked, *(c.sock for c in conns)], waiting, timeout)
        if self.poked.fileno() in readable:
            self._drain_pokes()
        if self.listener.fileno() in readable:
            self._accept()
        now_s = time.monotonic()
        for conn in conns:
            if conn.sock.fileno() in self.connections:
                try:
                    if conn.sock.fileno() in readable:
                        self._read(conn, now_s)
                        if conn.sock.fileno() not in self.connections:
                            continue  # its slave hung up: nothing more to send (a send on the
                            # closed socket closed it twice: two lines, a drop counted)
                    self._send(conn, now_s)
                    self._housekeep(conn, now_s)
                except (OSError, HaProtocolError) as exc:
                    self._close(conn, str(exc))
        self.table.set(layout.HA_CONNECTIONS, len(self.connections))
        self._answer()

    # -- SYNC_MASTER (GroupTransferService)

    def _requests_open(self) -> bool:
        return self.replicas is not None and self.table.get(layout.HA_REQUEST_SEQ) > self.answered_through

    def _answer(self) -> None:
        """Complete the waiting puts a slave acknowledged, time out those past their deadline
        (the put's time + slaveTimeout), and wake each one answered."""
        if not self._requests_open():
            return
        assert self.replicas is not None
        self.answered_through, completed = self.replicas.answer(
            self.answered_through,
            self.table.get(layout.HA_REQUEST_SEQ),
            self.table.get(layout.HA_ACKED_OFFSET),
            now_ms(),
        )
        for slot in completed:
            self.store.shm.replica_done(slot).release()

    def _drain_pokes(self) -> None:
        """SYNC_MASTER puts' pokes (`ReplicaRequests.wake`): each only says "look now"."""
        with contextlib.suppress(BlockingIOError):
            while self.poked.recv(64):
                pass

    # -- connections

    def _accept(self) -> None:
        for sock, address, peer in ha_listen.accept_allowed(
            self.listener, self.allowed, "ha", self._refused, len(self.connections)
        ):
            slot = next((s for s in range(layout.HA_CONN_SLOTS) if s not in self._slots_used()), -1)
            now_s = time.monotonic()
            conn = _Connection(sock, peer, slot, heard_at=now_s, wrote_at=now_s)
            self.connections[sock.fileno()] = conn
            if slot >= 0:
                self._slot_set(conn, "peer", _peer_word(address))
                self._slot_set(conn, "acked", -1)
                self._slot_set(conn, "last_heard_ms", now_ms())
                self._slot_set(conn, "caught_up_ms", 0)
                self._slot_set(conn, "state", layout.CONN_WAITING_REPORT)
            log.info("ha: slave %s connected", peer)

    def _refused(self) -> None:
        self.table.add(layout.HA_REFUSED_PEERS, 1)

    def _slots_used(self) -> set[int]:
        return {c.slot for c in self.connections.values()}

    def _slot_set(self, conn: _Connection, name: str, value: int) -> None:
        if conn.slot >= 0:
            self.table.set(layout.ha_connection_field(conn.slot, name), value)

    def _clear_slot(self, slot: int) -> None:
        for name in layout.HA_CONN_FIELDS:
            self.table.set(layout.ha_connection_field(slot, name), -1 if name == "acked" else 0)

    def _close(self, conn: _Connection, why: str) -> None:
        self.connections.pop(conn.sock.fileno(), None)
        conn.sock.close()
        if conn.slot >= 0:
            self._clear_slot(conn.slot)
        self.table.set(layout.HA_CONNECTIONS, len(self.connections))  # before the drop is counted
        log.info("ha: slave %s closed%s", conn.peer, f": {why}" if why else "")
        if why:  # counted after its line: whoever sees the count finds the line
            self.table.add(layout.HA_DROPPED, 1)

    # -- reports

    def _read(self, conn: _Connection, now_s: float) -> None:
        data = conn.sock.recv(1 << 16)
        if not data:
            self._close(conn, "")
            return
        conn.heard_at = now_s
        self._slot_set(conn, "last_heard_ms", now_ms())
        # The first report says where to start; of the rest of a read only the highest counts
        # (HAConnection reads the last whole one).
        for offset in conn.reports.feed_latest(data, first=conn.next_offset < 0):
            self._report(conn, offset)

    def _report(self, conn: _Connection, offset: int) -> None:
        end = self.table.written_end()
        if conn.next_offset < 0:  # the first report: where to start
            conn.next_offset = end - end % self.file_size if offset == 0 else offset
            self._slot_set(conn, "state", layout.CONN_TRANSFERRING)
            log.info("ha: slave %s asks from %d; sending from %d", conn.peer, offset, conn.next_offset)
            if offset > end:  # 4.9.8 counts it; a stranger's claim is no acknowledgement
                log.warning(
                    "ha: slave %s reports %d beyond the end %d: not an acknowledgement",
                    conn.peer,
                    offset,
                    end,
                )
                return
        elif offset > end:
            raise HaProtocolError(f"report {offset} beyond the master's end {end}")
        conn.acked = offset
        self._slot_set(conn, "acked", offset)
        if offset >= end:
            self._slot_set(conn, "caught_up_ms", now_ms())
        if offset > self.table.get(layout.HA_ACKED_OFFSET):
            self.table.set(layout.HA_ACKED_OFFSET, offset)

    # -- frames

    def _send(self, conn: _Connection, now_s: float) -> None:
        """Up to SEND_PER_PASS_BYTES to this slave: several frames a `sendmsg`, each frame its
        header and a view of the mapped file (no copy of the log in Python). What the socket
        does not take is copied (`conn.out`), so no view of a mapped file outlives the pass
        (the cleaner may unmap it)."""
        if conn.next_offset < 0:
            return  # nothing before the first report, not even heartbeats
        sent = 0
        while sent < SEND_PER_PASS_BYTES:
            if len(conn.out):
                try:
                    n = conn.sock.send(conn.out)
                except BlockingIOError:  # full (a pass may come before select says it drained)
                    return
                conn.out = conn.out[n:]
                sent += n
                if len(conn.out):
                    return  # the socket is full: select tells when it drains
                conn.wrote_at = now_s
                continue
            buffers = self._next_frames(conn, now_s)
            if not buffers:
                if len(conn.out):
                    continue  # a heartbeat (`_heartbeat` put it in conn.out)
                return
            total = sum(len(b) for b in buffers)
            try:
                n = conn.sock.sendmsg(buffers)
            except BlockingIOError:
                n = 0
            sent += n
            if n < total:
                conn.out = memoryview(_unsent(buffers, n))
                return
            conn.wrote_at = now_s

    def _next_frames(self, conn: _Connection, now_s: float) -> list[bytes | memoryview]:
        """The next frames' buffers (header, data view, ...; at most FRAMES_PER_SEND frames) of
        committed data up to the end, `conn.next_offset` moved past them; else empty, with a
        heartbeat in `conn.out` when one is due."""
        t = self.table
        end = t.written_end()
        start = conn.next_offset
        min_offset = t.get(layout.MIN_OFFSET)
        if start < min_offset and start < end:
            if not conn.behind_logged:
                conn.behind_logged = True
                # Logged before the state is shown: whoever sees it (status, a test) finds the line.
                log.error(
                    "ha: slave %s needs the commit log from %d, but the master's oldest byte is %d "
                    "(the cleaner deleted the files between): it gets heartbeats only; rebuild it "
                    "from a copy of this store",
                    conn.peer,
                    start,
                    min_offset,
                )
                self._slot_set(conn, "state", layout.CONN_BEHIND_MIN_OFFSET)
            self._heartbeat(conn, now_s)
            return []
        if start >= end:
            self._heartbeat(conn, now_s)
            return []
        buffers: list[bytes | memoryview] = []
        try:
            self.store.sync_log(end, keep_from=start)
            while start < end and len(buffers) < 2 * FRAMES_PER_SEND:
                length = min(self.batch, end - start, self.file_size - start % self.file_size)
                mf = self.store.commit_log.file_at(start)
                position = start - mf.file_from_offset
                buffers += [
                    ha_frame.encode_header(start, length),
                    memoryview(mf.buf)[position : position + length],
                ]
                start += length
        except FileNotFoundError:  # deleted under us: MIN_OFFSET says so next pass
            if not buffers:
                self._heartbeat(conn, now_s)
                return []
        conn.next_offset = start
        return buffers

    def _heartbeat(self, conn: _Connection, now_s: float) -> bool:
        if now_s - conn.wrote_at <= self.heartbeat_s:
            return False
        conn.out = memoryview(ha_frame.encode_header(conn.next_offset, 0))
        return True

    def _housekeep(self, conn: _Connection, now_s: float) -> None:
        if conn.sock.fileno() in self.connections and now_s - conn.heard_at > self.housekeeping_s:
            self._close(conn, f"silent for {self.housekeeping_s:.0f} s (haHousekeepingInterval)")

    def on_exit(self) -> None:
        if (meta := getattr(self, "meta", None)) is not None:
            meta.stop()
        for conn in list(self.connections.values()):
            self._close(conn, "")
        if hasattr(self, "listener"):
            self.listener.close()
            self.poked.close()
            self.table.set(layout.HA_LISTEN_PORT, 0)
            self.table.set(layout.HA_CONNECTIONS, 0)


# ----------------------------------------------------------------------------------------- slave


class HaSlave(ServiceLoop):
    role = "ha"
    writable_log = True

    def on_start(self) -> None:
        cfg = self.store.config
        self.master = parse_host_port(cfg.ha_master_address)
        self.file_size = cfg.mapped_file_size_commit_log
        self.heartbeat_s = cfg.ha_send_heartbeat_interval / 1000
        self.housekeeping_s = cfg.ha_housekeeping_interval / 1000
        self.heard_at = 0.0
        self.max_frame = ha_frame.MAX_FRAME_BYTES  # what a Java slave takes in, whatever its batch size
        self.sock: socket.socket | None = None
        self.frames = ha_frame.FrameBuffer(self.max_frame, READ_BYTES)
        self.unsent = bytearray()
        self.reported_at = 0.0
        self.failures = 0
        self.retry_at = 0.0
        self.wrote = self.table.get(layout.WROTE_POSITION)
        self.received_end = self.wrote
        self.walked = self.wrote
        """`_advance_wrote` read the records up to here; WROTE_POSITION follows once a receive ends."""
        self.walked_ends: dict[tuple[str, int], int] = {}
        self.walked_starts: dict[tuple[str, int], int] = {}
        """The queues of the records in [wrote, walked): next offsets and first offsets met."""
        self.pending: list[memoryview | bytes] = []
        """Frames `_apply` took that `_write_pending` has not written yet (views of `frames`)."""
        self.pending_file = 0
        """The log offset of the file they go to."""
        self.pending_end = 0
        self.walk_rows = np.empty((4, QUEUE_ROWS), dtype=np.int64)
        """`_walk`'s output: per queue met, topic index, queue id, first offset, end."""
        self.walk_topics: list[str] = []
        self.walk_topic_ids: dict[bytes, int] = {}
        """Topic bytes -> index in `walk_topics`, kept across walks (the compiled walk adds)."""
        self.table.set(layout.HA_SLAVE_RECEIVED_END, self.received_end)
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_IDLE)
        self._fork_start()
        log.info("ha: slave of %s:%d from %d", *self.master, self.received_end)
        self.meta = ha_meta.start(self.store, slave=True)  # the metadata channel (workers/ha_meta.py)

    def interval_s(self) -> float:
        return PASS_S

    def has_work(self) -> bool:
        return not self.halted

    def do_work(self) -> None:
        if self.halted:
            return
        if self.sock is None:
            self._connect()
            return
        try:
            readable, _ = ha_listen.ready([self.sock], [self.sock] if self.unsent else [], PASS_S)
            if readable:
                self._receive()
            if time.monotonic() - self.heard_at > self.housekeeping_s:  # HAClient's housekeeping
                raise HaProtocolError(f"master silent for {self.housekeeping_s:g} s (haHousekeepingInterval)")
            if time.monotonic() - self.reported_at >= self.heartbeat_s and not self._probe_unanswered():
                self._report()
            self._flush_reports()
        except (OSError, HaProtocolError) as exc:
            self._disconnect(str(exc))
        if self.halted and self.sock is not None:  # a fork found, or a refusal: no more replication
            self.sock.close()
            self.sock = None

    def _connect(self) -> None:
        now_s = time.monotonic()
        if now_s < self.retry_at:
            time.sleep(min(PASS_S, self.retry_at - now_s))
            return
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_CONNECTING)
        try:
            sock = socket.create_connection(self.master, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            self._backoff(f"cannot connect to {self.master[0]}:{self.master[1]}: {exc}")
            return
        sock.setblocking(False)
        self.sock = sock
        self.heard_at = time.monotonic()
        self.frames = ha_frame.FrameBuffer(self.max_frame, READ_BYTES)
        self.unsent.clear()
        self.table.add(layout.HA_SLAVE_CONNECTS, 1)
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_CONNECTED)
        self.table.set(layout.HA_SLAVE_LAST_HEARD_MS, now_ms())
        self._start_check()
        log.info("ha: connected to master %s:%d, reporting %d", *self.master, self._report_offset())
        self._report()
        try:
            self._flush_reports()
        except OSError as exc:
            self._disconnect(str(exc))

    def _backoff(self, why: str) -> None:
        delay = BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)]
        self.failures += 1
        self.retry_at = time.monotonic() + delay
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_BACKOFF)
        log.warning("ha: %s; retrying in %.2f s", why, delay)

    def _disconnect(self, why: str) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._backoff(f"connection to master closed: {why}")

    def _report(self) -> None:
        self.unsent += ha_frame.encode_report(self._report_offset())
        self.reported_at = time.monotonic()
        if len(self.unsent) > MAX_UNSENT_REPORT_BYTES:
            raise HaProtocolError("the master reads none of the reports")

    def _flush_reports(self) -> None:
        assert self.sock is not None
        while self.unsent:
            try:
                n = self.sock.send(self.unsent)
            except BlockingIOError:
                return
            del self.unsent[:n]

    def _receive(self) -> None:
        """Read what the master sent (up to RECEIVE_READS reads into the frame buffer, no copy
        before the file), write each whole frame, then move WROTE_POSITION and report once."""
        assert self.sock is not None
        moved = False
        try:
            for _ in range(RECEIVE_READS):
                try:
                    n = self.sock.recv_into(self.frames.space())
                except BlockingIOError:
                    break
                if not n:
                    raise HaProtocolError("the master closed the connection")
                self.heard_at = time.monotonic()
                try:
                    for frame in self.frames.filled(n):
                        moved |= self._apply(frame)
                finally:  # before the next read reuses the buffer, and before any disconnect
                    self._write_pending()
                self._advance_wrote(publish=False)  # while the bytes just written are in the cache
        except (OSError, HaProtocolError):
            # The records an earlier read of this receive brought, readable before the connection
            # goes: a master killed -9 just after its last frame is read as that frame and the
            # close together, and they stayed walked but unpublished until another master came.
            if self.walked != self.wrote:
                self._advance_wrote()
            raise
        self.table.set(layout.HA_SLAVE_LAST_HEARD_MS, now_ms())
        if moved:  # the report first: a SYNC_MASTER put waits for it, not for this slave's reput
            self._report()
            self._flush_reports()
            self.failures = 0
            self._advance_wrote()

    def _apply(self, frame: ha_frame.Frame) -> bool:
        """Write one frame at this slave's end. True if the end moved."""
        if self.halted:
            return False
        if self.check is not None:  # comparing the master's bytes with its own first
            checked = self._check_frame(frame)
            if checked is None:
                return False
            frame = checked
        end = self.pending_end if self.pending else self.received_end
        start, data = frame
        if end != 0 and start != end:
            raise HaProtocolError(f"frame at {start}, but this slave's end is {end}")
        if not data:
            return False
        file_start = start - start % self.file_size
        if start + len(data) > file_start + self.file_size:
            raise HaProtocolError(f"frame of {len(data)} bytes at {start} crosses a file")
        if start + len(data) > ha_frame.JAVA_LONG_MAX:  # no report could say it was received
            raise HaProtocolError(f"frame of {len(data)} bytes at {start} ends past the largest offset")
        if end == 0 and start != 0 and self.wrote != start:
            ha_start.start_empty_log_at(self.store, start)  # RocketMQ's slave: the log begins there
            self.wrote = self.walked = start
        if self.pending and file_start != self.pending_file:
            self._write_pending()  # one write never spans two files
        if not self.pending:
            self.pending_file = file_start
        self.pending.append(data)
        self.pending_end = start + len(data)
        return True

    def _write_pending(self) -> None:
        """The frames `_apply` took since the last write (contiguous, in one file) into the file
        with one `pwritev`, then HA_SLAVE_RECEIVED_END past them: one write and one table store
        a read, not one a frame (a 32 KiB frame is one syscall's worth). Runs before the frame
        buffer is read into again (the pieces are views of it) and before a disconnect, so the
        end never says more than the file has."""
        if not self.pending:
            return
        pieces, self.pending = self.pending, []
        mf = self.store.commit_log.file_at(self.pending_file)
        at = self.pending_end - sum(len(piece) for piece in pieces) - mf.file_from_offset
        if mf.write_buffer is not None:  # a pool buffer to fill, not the file
            for piece in pieces:
                mf.fill(at, piece)
                at += len(piece)
        else:
            done = os.pwritev(mf.fd, pieces, at)
            for piece in pieces:  # after a short write, the rest a piece at a time
                if done < len(piece):
                    mf.fill(at + done, piece[done:])
                done = max(0, done - len(piece))
                at += len(piece)
        self.received_end = self.pending_end
        self.table.set(layout.HA_SLAVE_RECEIVED_END, self.received_end)

    def _advance_wrote(self, publish: bool = True) -> None:
        """WROTE_POSITION to the last whole record at or below the received end, each record's
        queue in the queue-offset table first (as a producer's put does on a master); with
        ``publish`` false, only the walk (`walked`): `_receive` walks after each read, while
        the bytes it just wrote are in the CPU's cache (after a whole receive, 4 MiB on, the walk's
        every record was a cache miss, perf), and publishes once. Runs of whole records are
        walked by `_walk` or read by `record_batch.scan_segment` (the compiled scan reput and
        recovery use: one record at a time in Python was 80% of the slave's time, cProfile);
        a file's tail, a record cut by the received end and a bad record one at a time.

        Bytes where no record can start (a magic no record has, a size past its file, a whole
        record's length that does not parse) are refused: what came before them is published,
        they and everything received after are dropped (`_drop_received_from`), and
        `HaProtocolError` says why (the connection closes; the next asks from the last whole
        record). Left, they stopped WROTE_POSITION for good while the received end, reported as
        acknowledged, went on over whatever the master sent, and logged a line every read."""
        pos = self.walked
        queue_ends, queue_starts = self.walked_ends, self.walked_starts
        refused = ""
        while pos < self.received_end:
            mf = self.store.commit_log.file_at(pos)
            at = pos - mf.file_from_offset
            file_end = mf.file_from_offset + self.file_size
            if self.file_size - at < record.END_FILE_MIN_BLANK_LENGTH:
                if self.received_end < file_end:
                    break
                pos = file_end  # a tail too short for a blank: RocketMQ's end of file
                continue
            if pos + 8 > self.received_end:
                break
            total, magic = record.peek_size_magic(mf.buf, at)
            if magic == record.BLANK_MAGIC_CODE:
                if self.received_end < file_end:
                    break
                pos = file_end
                continue
            if magic not in _RECORD_MAGICS or total > file_end - pos:
                refused = (
                    f"no record at {pos} of the master's bytes: TOTALSIZE {total}, "
                    f"MAGICCODE {magic & 0xFFFFFFFF:#010x}"
                )
                break
            if pos + max(total, 8) > self.received_end:
                break
            limit = min(self.received_end, file_end) - mf.file_from_offset
            if (walked := self._walk(mf.buf, at, limit, queue_ends, queue_starts)) > at:
                pos = mf.file_from_offset + walked
                continue
            scan = None
            if self.received_end - pos >= SCAN_MIN_BYTES:
                scan = record_batch.scan_segment(
                    mf.buf,
                    at,
                    min(self.received_end, file_end) - mf.file_from_offset,
                    file_from_offset=mf.file_from_offset,
                    check_crc=False,
                    max_records=SCAN_RECORDS,
                )
            if scan is not None and len(scan.batch):
                batch = scan.batch
                markers = topic_marker.rows(batch)
                if markers:  # up to the first marker: it restarts the topics it names
                    batch = batch.slice(0, markers[0] + 1)
                _queue_ends(batch, queue_ends, queue_starts)
                pos = mf.file_from_offset + scan.stop
                if markers:
                    marker_at = int(batch.phy_offset[-1]) - mf.file_from_offset
                    pos = mf.file_from_offset + marker_at + int(batch.size[-1])
                    self._restart_deleted(mf.buf, marker_at, int(batch.size[-1]), queue_ends, queue_starts)
                continue
            found = record.check_record(mf.buf, at, at + total, check_crc=False)
            if not found.success or found.size != total:
                refused = f"no whole record at {pos} of the master's bytes: {found.reason}"
                break
            key = (found.topic, found.queue_id)
            if key not in queue_ends:
                queue_starts[key] = found.queue_offset
            queue_ends[key] = max(queue_ends.get(key, 0), found.queue_offset + 1)
            if found.topic == topic_marker.TOPIC:
                self._restart_deleted(mf.buf, at, total, queue_ends, queue_starts)
            pos += total
        self.walked = pos
        if (publish or refused) and pos != self.wrote:
            self._learn_queues(queue_ends, queue_starts)
            queue_ends.clear()
            queue_starts.clear()
            self.wrote = pos
            self.table.set(layout.WROTE_POSITION, pos)
            self.store.shm.wake("flusher")
            self.store.shm.wake("reput")
        if refused:
            self._drop_received_from(pos)
            raise HaProtocolError(refused)

    def _drop_received_from(self, offset: int) -> None:
        """Zero the received bytes from ``offset`` (where no record starts) to the received end,
        and move that end back to it: the log ends at its last whole record again, as a restart's
        recovery would leave it, and no later write or reader meets the refused bytes."""
        at = offset
        while at < self.received_end:
            mf = self.store.commit_log.file_at(at)
            start = at - mf.file_from_offset
            stop = min(self.received_end - mf.file_from_offset, self.file_size)
            mf.fill(start, bytes(stop - start))
            at = mf.file_from_offset + stop
        self.received_end = offset
        self.table.set(layout.HA_SLAVE_RECEIVED_END, offset)

    def _walk(
        self,
        buf: Any,
        at: int,
        limit: int,
        queue_ends: dict[tuple[str, int], int],
        queue_starts: dict[tuple[str, int], int],
    ) -> int:
        """Where the common records from ``at`` end (``at`` when the first is not one), their
        queues entered into ``queue_ends`` / ``queue_starts``: the compiled `_scan.queue_ends`,
        which reads of each record only its size, topic, queue id and queue offset (the whole
        scan's columns, keys and tags were most of the slave's scan time, and reput reads them
        anyway). Without it (RMQ_PURE_PYTHON=1, not built) ``at``: the scan below, its reference.
        It stops before a deleteTopic marker and any record the reference must read."""
        compiled = native.scan.active
        if compiled is None:
            return at
        records, stop, queues, _why = compiled.queue_ends(
            buf, at, limit, SCAN_RECORDS, _MARKER_TOPIC, self.walk_topic_ids, self.walk_topics, self.walk_rows
        )
        if not records:
            return at
        topics = self.walk_topics
        rows = self.walk_rows[:, :queues].tolist()
        for index, queue_id, first, end in zip(*rows, strict=True):
            key = (topics[index], queue_id)
            if key not in queue_ends:
                queue_starts[key] = first
            if end > queue_ends.get(key, 0):
                queue_ends[key] = end
        return int(stop)

    def _learn_queues(
        self, queue_ends: dict[tuple[str, int], int], queue_starts: dict[tuple[str, int], int]
    ) -> None:
        """The queues' next offsets, which consumers and status read (the slave's one writer of
        them: producers are refused). A queue first met above offset 0 (the log began at a master's
        later file, workers/ha_start.py) starts there, as its ConsumeQueue does (pre-blanks
        below). A full table is logged; reput still dispatches."""
        queues = self.store.shm.queues
        for (topic, queue_id), end in queue_ends.items():
            try:
                slot = queues.find_or_insert(topic, queue_id)
            except (OffsetTableFullError, ValueError) as exc:
                log.error("ha: queue %s/%d not in the queue-offset table: %s", topic, queue_id, exc)
                continue
            first = queue_starts[(topic, queue_id)]
            if not queues.get(slot, qo.NEXT_OFFSET) and first > queues.get(slot, qo.MIN_OFFSET):
                queues.set(slot, qo.MIN_OFFSET, first)
            if end > queues.get(slot, qo.NEXT_OFFSET):
                queues.set(slot, qo.NEXT_OFFSET, end)

    def _restart_deleted(
        self,
        buf: Any,
        at: int,
        size: int,
        queue_ends: dict[tuple[str, int], int],
        queue_starts: dict[tuple[str, int], int],
    ) -> None:
        """A deleteTopic marker (rmq_mp/format/topic_marker.py) at ``at`` of ``buf``: the queues
        of the records before it are entered, then the next offsets of the topics it names go to
        0, as the master's delete set them under its put lock, so the records after it (the new
        topic's, from queue offset 0) raise them again. (Reput applies the rest of the delete.)"""
        try:
            topics = topic_marker.decode(record.decode_message(buf, at, at + size).body)
        except StoreError as exc:
            log.error("ha: deleteTopic marker at %d not applied: %s", at, exc)
            return
        self._learn_queues(queue_ends, queue_starts)
        queue_ends.clear()
        queue_starts.clear()
        queues = self.store.shm.queues
        for topic in topics:
            for _queue_id, slot in queues.queues_of(topic):
                queues.set(slot, qo.NEXT_OFFSET, 0)

    # -- a log that forks from the master's (workers/ha_fork.py)

    def _fork_start(self) -> None:
        """No probe yet; a fork found by an earlier run and not yet cut keeps this one halted."""
        self.check: ha_fork.ForkCheck | ha_fork.Locate | None = None
        self.last_record = ha_fork.LastRecord(self.store.commit_log, self.file_size)
        self.probe = 0
        """Which of `ha_fork.probe_starts` the next connection asks from."""
        self.locate = False
        """The next connection locates the master's end (`ha_fork.Locate`)."""
        self.located = False
        """This walk down the probes has located it once: it does not again."""
        cut = fork.pending_cut(self.store.paths.root)
        self.halted = cut is not None
        self.table.set(layout.HA_SLAVE_FORK_OFFSET, cut.fork_offset if cut else -1)
        if cut is not None:  # readers stop there until the supervisor's restart cuts it
            self.table.set(layout.FORK_READ_END, cut.fork_offset)
            self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_FORKED)
            log.error(
                "ha: this slave's log forks from its master's at %d (set aside in %s): the store "
                "restarts to cut it there and catch up",
                cut.fork_offset,
                cut.folder,
            )

    def _start_check(self) -> None:
        """A non-empty slave first compares its log's tail with the master's."""
        self.check = None
        if not self.received_end:
            return
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_VERIFYING)
        if self.locate:
            self.check = ha_fork.Locate()
            return
        first, starts = self._probe_starts()
        start = starts[min(self.probe, len(starts) - 1)]
        self.check = ha_fork.ForkCheck(
            self.store.commit_log, start, self.received_end, self.file_size, last=start <= first
        )

    def _probe_starts(self) -> tuple[int, list[int]]:
        """This log's first byte, and where its probes ask from (`ha_fork.probe_starts`)."""
        first = max(self.table.get(layout.MIN_OFFSET), 0)
        return first, ha_fork.probe_starts(
            self.store.commit_log, first, self.wrote, self.file_size, self.last_record
        )

    def _probe_unanswered(self) -> bool:
        """A probe the master has not answered yet: its first report is where the probe asks, and
        a master whose log ends below that closes a connection that reports it again (#3015)
        before its heartbeat says it has nothing there, so the probe would never be answered."""
        return self.check is not None and self.check.pos == self.check.start

    def _report_offset(self) -> int:
        return self.check.pos if self.check is not None else self.received_end

    def _check_frame(self, frame: ha_frame.Frame) -> ha_frame.Frame | None:
        """Feed the probe; the part of a frame left to append once the logs agree."""
        assert self.check is not None
        outcome = self.check.feed(frame)
        verdict = outcome.verdict
        if verdict is ha_fork.Verdict.PENDING:
            return None
        if verdict is ha_fork.Verdict.MATCHED:
            log.info(
                "ha: the master's log matches this slave's from %d to its end %d",
                self.check.start,
                outcome.offset,
            )
            self.check = None
            self.probe, self.located = 0, False
            self._confirmed(outcome.offset)
            self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_CONNECTED)
            return outcome.tail
        if verdict is ha_fork.Verdict.NEXT_PROBE:
            self.probe += 1
            self.failures = 0  # an answer, not a failure: the next probe connects at once
            if outcome.differs:
                self._unconfirmed_from(outcome.offset)
            if outcome.nothing and not self.located and len(self._probe_starts()[1]) - self.probe > 2:
                self.locate = True
                raise HaProtocolError(f"{outcome.why}: asking where the master's log ends next")
            raise HaProtocolError(f"{outcome.why}: comparing from an earlier record next")
        if verdict is ha_fork.Verdict.LOCATED:
            starts = self._probe_starts()[1]
            self.probe = max(self.probe, ha_fork.first_below(starts, outcome.offset, self.file_size))
            self.failures, self.locate, self.located = 0, False, True
            raise HaProtocolError(f"{outcome.why}: comparing from {starts[self.probe]} next")
        self._halt(outcome)
        return None

    def _confirmed(self, end: int) -> None:
        """The first comparison found this slave's log its master's to its ``end``: recorded
        (rmq_mp/store/ha_log.py) so the next start serves it at once, and the read window a start
        capped is lifted. A record that cannot be written only makes the next start compare first."""
        unconfirmed = self.table.get(layout.HA_UNCONFIRMED_FROM)
        if unconfirmed < 0:
            return
        master = f"{self.master[0]}:{self.master[1]}"
        try:
            ha_log.write(self.store.paths.root, ha_log.LogRecord(BrokerRole.SLAVE.value, master, None))
        except OSError as exc:
            log.error(
                "ha: %s not written (%s): the next start compares before it serves", ha_log.FILE_NAME, exc
            )
        self.table.set(layout.HA_UNCONFIRMED_FROM, -1)
        self.table.set(layout.FORK_READ_END, -1)
        log.warning(
            "ha: this slave's log is its master %s's to its end %d: served past %d again",
            master,
            end,
            unconfirmed,
        )

    def _unconfirmed_from(self, offset: int) -> None:
        """The master holds other bytes at ``offset`` (a master that changed under the same address:
        it lost its tail and wrote on, or another store answers there): whatever this slave's log
        was confirmed as, readers stop there now (and the next start too, from the record) until
        the comparison, probing further back, finds where the logs part."""
        read_end = self.table.get(layout.FORK_READ_END)
        if 0 <= read_end <= offset:
            return
        master = f"{self.master[0]}:{self.master[1]}"
        try:
            ha_log.write(self.store.paths.root, ha_log.LogRecord(BrokerRole.SLAVE.value, master, offset))
        except OSError as exc:
            log.error("ha: %s not written (%s)", ha_log.FILE_NAME, exc)
        self.table.set(layout.HA_UNCONFIRMED_FROM, offset)
        self.table.set(layout.FORK_READ_END, offset)
        log.warning(
            "ha: the master %s holds other bytes than this slave's record at %d: nothing from there is "
            "served until the comparison finds where the logs part",
            master,
            offset,
        )

    def _halt(self, outcome: ha_fork.Outcome) -> None:
        """FORKED: set the slave's own bytes aside and stop; REFUSED: stop, saying where."""
        assert isinstance(self.check, ha_fork.ForkCheck)  # a Locate's answer is LOCATED only
        end, master = self.check.end, f"{self.master[0]}:{self.master[1]}"
        self.check = None
        self.halted = True
        self.table.set(layout.HA_SLAVE_FORK_OFFSET, outcome.offset)
        # Each state is shown after its line is logged: whoever sees it (status, a test, the
        # supervisor's restart at FORKED) finds the line.
        if outcome.verdict is ha_fork.Verdict.REFUSED:
            log.error(
                "ha: refusing to replicate from %s: cannot tell where this slave's log and the "
                "master's part (%s; this slave's log begins at %d): give it a copy of the master's store",
                master,
                outcome.why,
                outcome.offset,
            )
            self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_REFUSED)
        else:
            # Before anything else: from now on no reader is served a record at or past the fork
            # (PointerTable.readable_end); the cut keeps it so, and a refusal below too. It is a
            # fork now, no longer only unconfirmed (promote refuses it even forced).
            self.table.set(layout.HA_UNCONFIRMED_FROM, -1)
            self.table.set(layout.FORK_READ_END, outcome.offset)
            try:  # a kill -9 from here on: the next start serves nothing past the fork either
                ha_log.write(
                    self.store.paths.root, ha_log.LogRecord(BrokerRole.SLAVE.value, master, outcome.offset)
                )
                folder = fork.set_aside(self.store.paths, outcome.offset, end, self.file_size, master)
            except OSError as exc:  # a full disk: nothing cut, nothing recorded; say so and refuse
                log.error(
                    "ha: refusing to replicate from %s: this slave's log forks from the master's at "
                    "%d (%s) but its bytes [%d, %d) could not be set aside: %s",
                    master,
                    outcome.offset,
                    outcome.why,
                    outcome.offset,
                    end,
                    exc,
                )
                self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_REFUSED)
                return
            log.error(
                "ha: this slave's log forks from its master's at %d (%s): its bytes [%d, %d) are not "
                "the master's; set aside in %s; the store restarts to cut it there and catch up",
                outcome.offset,
                outcome.why,
                outcome.offset,
                end,
                folder,
            )
            self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_FORKED)

    def on_exit(self) -> None:
        if (meta := getattr(self, "meta", None)) is not None:
            meta.stop()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_IDLE)


def _queue_ends(
    batch: record_batch.RecordBatch, ends: dict[tuple[str, int], int], starts: dict[tuple[str, int], int]
) -> None:
    """Each queue's next offset after ``batch`` into ``ends`` (the highest queue offset + 1), and
    its first queue offset into ``starts`` for a queue ``ends`` had not met yet."""
    keys = batch.topic_index.astype(np.int64) << 32 | batch.queue_id.astype(np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)
    top = np.full(len(unique), -1, dtype=np.int64)
    low = np.full(len(unique), np.iinfo(np.int64).max, dtype=np.int64)
    np.maximum.at(top, inverse, batch.queue_offset)
    np.minimum.at(low, inverse, batch.queue_offset)
    for key, first, offset in zip(unique.tolist(), low.tolist(), top.tolist(), strict=True):
        queue = (batch.topics[key >> 32], key & 0xFFFFFFFF)
        if queue not in ends:
            starts[queue] = first
        ends[queue] = max(ends.get(queue, 0), offset + 1)


def service_class(argv: list[str]) -> type[ServiceLoop]:
    """The side this store plays, from the role its descriptor carries."""
    names = resolve_names(argv[1])
    config = MessageStoreConfig.from_properties(read_descriptor(names)["properties"])
    table = PointerTable.attach(names.pointer_table, Role.CONSUMER)
    try:  # a promoted slave's ha worker restarts as a master (rmq-admin promote)
        config = promoted_role(config, table)
    finally:
        table.close()
    return HaSlave if config.broker_role is BrokerRole.SLAVE else HaMaster


if __name__ == "__main__":
    sys.exit(main(service_class(sys.argv)))
