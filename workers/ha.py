"""The ha worker: RocketMQ 4.9.8's master/slave replication (`store/ha`), one process per store.

Master (ASYNC_MASTER or SYNC_MASTER with haListenPort set; RocketMQ's HAService, AcceptSocketService
and HAConnection): listens on haListenAddress:haListenPort, refuses peers outside haAllowedSlaves
(logged, closed before a byte), and serves any number of slaves on one select loop. A connection
sends nothing until the slave's first 8-byte report: 0 starts it at the file holding the master's
end, anything else at that offset. It then sends frames (`rmq_mp.format.ha_frame`) of at most
haTransferBatchSize committed commit-log bytes, never crossing a file, and a heartbeat frame after
haSendHeartbeatInterval without a write. Each later report is the slave's acknowledged end:
published per connection slot and as the best over all of them (HA_ACKED_OFFSET, never
decreasing), what a SYNC_MASTER put waits for. Unlike 4.9.8, a first report beyond the master's
end is not counted as an acknowledgement (a stranger could make a SYNC_MASTER answer PUT_OK);
a later report beyond the end closes the connection (#3015), and so does haHousekeepingInterval
of silence. A slave that needs bytes the cleaner has deleted is shown (CONN_BEHIND_MIN_OFFSET) and
logged, and gets heartbeats only: never a silent gap.

Slave (brokerRole=SLAVE with haMasterAddress; RocketMQ's HAClient): connects, reports its end at
once (RocketMQ waits one heartbeat interval first; the master cannot tell) and after every frame
that moved it, and every haSendHeartbeatInterval. It writes each frame at exactly its own end (a
non-empty slave receiving any other offset closes and reconnects) and so is the one writer of
the log on a slave: the bytes go into the files first, HA_SLAVE_RECEIVED_END (what it reports)
next, and WROTE_POSITION (what flusher and reput see) only up to the last whole record below it,
so no reader ever meets a record cut by a frame. It reads one frame at a time (back-pressure:
nothing is buffered beyond a frame and one read), and reconnects with backoff after a refusal, a
cut or a bad frame. Restarted, it resumes from its recovered end (the last intact record).

Both exit with the supervisor (`ServiceLoop.stopping`): a dead or fenced master stops serving.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import select
import socket
import sys
import time
from dataclasses import dataclass, field

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig, parse_allowed_slaves, parse_host_port
from rmq_mp.errors import HaProtocolError, OffsetTableFullError
from rmq_mp.format import ha_frame, record
from rmq_mp.store.running_store import promoted_role, resolve_names
from shm import layout
from shm import queue_offsets as qo
from shm.layout import Role
from shm.pointer_table import PointerTable, now_ms
from shm.store_shm import read_descriptor
from workers import ha_meta
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
READ_BYTES = 256 << 10
"""One read from the master: the slave holds at most one frame and this much more."""
CONNECT_TIMEOUT_S = 1.0
BACKOFF_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
"""Delay before the n-th consecutive reconnect of a slave (RocketMQ: 5 s after a failed connect)."""
MAX_UNSENT_REPORT_BYTES = 1 << 16
"""A master that reads none of this many bytes of reports is not listening: reconnect."""


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
        address = cfg.ha_listen_address
        family = socket.AF_INET6 if ":" in address or (not address and socket.has_ipv6) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and not address:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address or ("::" if family == socket.AF_INET6 else "0.0.0.0"), cfg.ha_listen_port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            log.error("ha: cannot listen on %s:%d: %s", address or "*", cfg.ha_listen_port, exc)
            raise
        sock.setblocking(False)
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
        readable, _, _ = select.select(
            [self.listener, self.poked, *(c.sock for c in conns)], waiting, [], timeout
        )
        if self.poked in readable:
            self._drain_pokes()
        if self.listener in readable:
            self._accept()
        now = time.monotonic()
        for conn in conns:
            if conn.sock.fileno() in self.connections:
                try:
                    if conn.sock in readable:
                        self._read(conn, now)
                    self._send(conn, now)
                    self._housekeep(conn, now)
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
        for _ in range(16):
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                return
            host = address[0].removeprefix("::ffff:")
            peer = f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
            if not self._allowed(address[0]):
                self.table.add(layout.HA_REFUSED_PEERS, 1)
                log.warning("ha: refused %s: not in haAllowedSlaves", peer)
                sock.close()
                continue
            slot = next((s for s in range(layout.HA_CONN_SLOTS) if s not in self._slots_used()), -1)
            sock.setblocking(False)
            now = time.monotonic()
            conn = _Connection(sock, peer, slot, heard_at=now, wrote_at=now)
            self.connections[sock.fileno()] = conn
            if slot >= 0:
                self._slot_set(conn, "peer", _peer_word(address))
                self._slot_set(conn, "acked", -1)
                self._slot_set(conn, "last_heard_ms", now_ms())
                self._slot_set(conn, "caught_up_ms", 0)
                self._slot_set(conn, "state", layout.CONN_WAITING_REPORT)
            log.info("ha: slave %s connected", peer)

    def _allowed(self, host: str) -> bool:
        if not self.allowed:
            return True
        ip = ipaddress.ip_address(host.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.allowed)

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
        if why:
            self.table.add(layout.HA_DROPPED, 1)
        log.info("ha: slave %s closed%s", conn.peer, f": {why}" if why else "")

    # -- reports

    def _read(self, conn: _Connection, now: float) -> None:
        data = conn.sock.recv(1 << 16)
        if not data:
            self._close(conn, "")
            return
        conn.heard_at = now
        self._slot_set(conn, "last_heard_ms", now_ms())
        for offset in conn.reports.feed(data):
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

    def _send(self, conn: _Connection, now: float) -> None:
        if conn.next_offset < 0:
            return  # nothing before the first report, not even heartbeats
        sent = 0
        while sent < SEND_PER_PASS_BYTES:
            if not len(conn.out) and not self._next_frame(conn, now):
                return
            n = conn.sock.send(conn.out)
            conn.out = conn.out[n:]
            sent += n
            if len(conn.out):
                return  # the socket is full: select tells when it drains
            conn.wrote_at = now

    def _next_frame(self, conn: _Connection, now: float) -> bool:
        """Put the next frame in `conn.out`: data up to the committed end, else a heartbeat when
        one is due. False when there is nothing to send."""
        t = self.table
        end = t.written_end()
        start = conn.next_offset
        min_offset = t.get(layout.MIN_OFFSET)
        if start < min_offset and start < end:
            if not conn.behind_logged:
                conn.behind_logged = True
                self._slot_set(conn, "state", layout.CONN_BEHIND_MIN_OFFSET)
                log.error(
                    "ha: slave %s needs the commit log from %d, but the master's oldest byte is %d "
                    "(the cleaner deleted the files between): it gets heartbeats only; rebuild it "
                    "from a copy of this store",
                    conn.peer,
                    start,
                    min_offset,
                )
            return self._heartbeat(conn, now)
        if start < end:
            length = min(self.batch, end - start, self.file_size - start % self.file_size)
            try:
                data = self._read_log(start, length)
            except FileNotFoundError:
                return self._heartbeat(conn, now)  # deleted under us: MIN_OFFSET says so next pass
            conn.out = memoryview(ha_frame.encode_header(start, length) + data)
            conn.next_offset = start + length
            return True
        return self._heartbeat(conn, now)

    def _heartbeat(self, conn: _Connection, now: float) -> bool:
        if now - conn.wrote_at <= self.heartbeat_s:
            return False
        conn.out = memoryview(ha_frame.encode_header(conn.next_offset, 0))
        return True

    def _read_log(self, start: int, length: int) -> bytes:
        self.store.sync_log(start + length, keep_from=start)
        mf = self.store.commit_log.file_at(start)
        position = start - mf.file_from_offset
        return bytes(mf.buf[position : position + length])

    def _housekeep(self, conn: _Connection, now: float) -> None:
        if conn.sock.fileno() in self.connections and now - conn.heard_at > self.housekeeping_s:
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
        self.max_frame = ha_frame.MAX_FRAME_BYTES  # what a Java slave takes in, whatever its batch size
        self.sock: socket.socket | None = None
        self.frames = ha_frame.FrameReader(self.max_frame)
        self.unsent = bytearray()
        self.reported_at = 0.0
        self.failures = 0
        self.retry_at = 0.0
        self.wrote = self.table.get(layout.WROTE_POSITION)
        self.received_end = self.wrote
        self.table.set(layout.HA_SLAVE_RECEIVED_END, self.received_end)
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_IDLE)
        log.info("ha: slave of %s:%d from %d", *self.master, self.received_end)
        self.meta = ha_meta.start(self.store, slave=True)  # the metadata channel (workers/ha_meta.py)

    def interval_s(self) -> float:
        return PASS_S

    def has_work(self) -> bool:
        return True

    def do_work(self) -> None:
        if self.sock is None:
            self._connect()
            return
        try:
            readable, _, _ = select.select([self.sock], [self.sock] if self.unsent else [], [], PASS_S)
            if readable:
                self._receive()
            if time.monotonic() - self.reported_at >= self.heartbeat_s:
                self._report()
            self._flush_reports()
        except (OSError, HaProtocolError) as exc:
            self._disconnect(str(exc))

    def _connect(self) -> None:
        now = time.monotonic()
        if now < self.retry_at:
            time.sleep(min(PASS_S, self.retry_at - now))
            return
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_CONNECTING)
        try:
            sock = socket.create_connection(self.master, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            self._backoff(f"cannot connect to {self.master[0]}:{self.master[1]}: {exc}")
            return
        sock.setblocking(False)
        self.sock = sock
        self.frames = ha_frame.FrameReader(self.max_frame)
        self.unsent.clear()
        self.table.add(layout.HA_SLAVE_CONNECTS, 1)
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_CONNECTED)
        self.table.set(layout.HA_SLAVE_LAST_HEARD_MS, now_ms())
        log.info("ha: connected to master %s:%d, reporting %d", *self.master, self.received_end)
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
        self.unsent += ha_frame.encode_report(self.received_end)
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
        assert self.sock is not None
        data = self.sock.recv(min(READ_BYTES, max(self.frames.needed(), 1 << 16)))
        if not data:
            raise HaProtocolError("the master closed the connection")
        self.table.set(layout.HA_SLAVE_LAST_HEARD_MS, now_ms())
        moved = False
        for frame in self.frames.feed(data):
            moved |= self._apply(frame)
        if moved:
            self._report()
            self.failures = 0

    def _apply(self, frame: ha_frame.Frame) -> bool:
        """Write one frame at this slave's end. True if the end moved."""
        if self.received_end != 0 and frame.phy_offset != self.received_end:
            raise HaProtocolError(f"frame at {frame.phy_offset}, but this slave's end is {self.received_end}")
        if not frame.data:
            return False
        start = frame.phy_offset
        if start // self.file_size != (start + len(frame.data) - 1) // self.file_size:
            raise HaProtocolError(f"frame of {len(frame.data)} bytes at {start} crosses a file")
        if self.received_end == 0 and start != 0:
            if start % self.file_size:
                raise HaProtocolError(f"an empty slave's first frame at {start} is not at a file start")
            raise HaProtocolError(
                f"the master starts this empty slave at {start} (it has more than one file); rmq-mp's "
                f"slave starts only from the master's first byte: give it a copy of the master's store"
            )
        mf = self.store.commit_log.file_at(start)
        mf.fill(start - mf.file_from_offset, frame.data)
        self.received_end = start + len(frame.data)
        self.table.set(layout.HA_SLAVE_RECEIVED_END, self.received_end)
        self._advance_wrote()
        return True

    def _advance_wrote(self) -> None:
        """WROTE_POSITION to the last whole record at or below the received end, each record's
        queue in the queue-offset table first (as a producer's put does on a master)."""
        pos = self.wrote
        queue_ends: dict[tuple[str, int], int] = {}
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
            if pos + max(total, 8) > self.received_end:
                break
            found = record.check_record(mf.buf, at, at + total, check_crc=False)
            if not found.success or found.size != total:
                log.error("ha: no whole record at %d of the master's bytes: %s", pos, found.reason)
                break
            key = (found.topic, found.queue_id)
            queue_ends[key] = max(queue_ends.get(key, 0), found.queue_offset + 1)
            pos += total
        if pos != self.wrote:
            self._learn_queues(queue_ends)
            self.wrote = pos
            self.table.set(layout.WROTE_POSITION, pos)
            self.store.shm.wake("flusher")
            self.store.shm.wake("reput")

    def _learn_queues(self, queue_ends: dict[tuple[str, int], int]) -> None:
        """The queues' next offsets, which consumers and status read (the slave's one writer of
        them: producers are refused). A full table is logged; reput still dispatches."""
        queues = self.store.shm.queues
        for (topic, queue_id), end in queue_ends.items():
            try:
                slot = queues.find_or_insert(topic, queue_id)
            except (OffsetTableFullError, ValueError) as exc:
                log.error("ha: queue %s/%d not in the queue-offset table: %s", topic, queue_id, exc)
                continue
            if end > queues.get(slot, qo.NEXT_OFFSET):
                queues.set(slot, qo.NEXT_OFFSET, end)

    def on_exit(self) -> None:
        if (meta := getattr(self, "meta", None)) is not None:
            meta.stop()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.table.set(layout.HA_SLAVE_STATE, layout.SLAVE_IDLE)


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
