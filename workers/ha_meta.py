"""The metadata channel: consumer offsets, topic configs and delay-level progress follow the master.

RocketMQ's broker copies consumerOffset.json, topics.json, delayOffset.json and
subscriptionGroup.json to a slave every 10 s (SlaveSynchronize); rmq-mp has no broker, so the ha
worker carries them itself, over a port of its own beside the HA port (haMetaListenPort on a
master, haMasterMetaAddress on a SLAVE; bytes: `rmq_mp.format.ha_meta`). It runs as one thread
of the ha worker process (started and stopped by `HaMaster`/`HaSlave`), so it starts, stops and
is restarted with replication, and exits with the supervisor.

Master (`MetaServer`): refuses peers outside haAllowedSlaves before a byte (as the HA port), waits
for a slave's HELLO (bounded; nothing else is read from a slave), then sends a SNAPSHOT at once,
whenever what it holds changes (looked at every `SNAPSHOT_POLL_S`), and every `HEARTBEAT_S`
besides, so an idle slave has the master's state within `SNAPSHOT_POLL_S` + a round trip and the
master's end within `HEARTBEAT_S`. A snapshot holds every committed group offset of the
group-offset table, every delay level's offset and topics.json's configs.

Slave (`MetaFollower`): connects with backoff, sends HELLO, and applies each SNAPSHOT whole (every
field checked first, `ha_meta.decode_snapshot`): into the shared group-offset and schedule tables
(under the flags lock), which its supervisor persists to consumerOffset.json and delayOffset.json
with the same atomic, checksummed writes as a master's, and topics.json through
`TopicConfigManager.persist` (under the flags lock, as `rmq-admin updateTopic` does live). A group
offset or delay offset only ever rises (#1094: a master restarted after losing its last persist
interval, or a stale one, cannot move a group back); the one exception is a deliberate move on
the master (rmq-admin's offset commands stamp HA_META_RESET_MS): for each new stamp the slave
copies the master's group offsets exactly once (and deletes groups the master deleted). A
malformed or oversized message is logged with the peer and the reason, counted, and its
connection closed: nothing of it is applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rmq_mp.config.deleted_topics import DeletedTopics
from rmq_mp.config.store_config import parse_allowed_slaves, parse_host_port
from rmq_mp.config.topics import TopicConfig, TopicConfigManager
from rmq_mp.errors import OffsetTableFullError, ShmAttachError
from rmq_mp.format import ha_meta
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm import queue_offsets as qo
from shm import schedule_offsets as so
from shm.pointer_table import now_ms
from workers import ha_listen

log = logging.getLogger("rmq_mp.ha_meta")

SNAPSHOT_POLL_S = 0.1
"""How often a master looks whether its metadata changed (and a slave gets it, at idle, within this)."""
HEARTBEAT_S = 1.0
"""A master sends its snapshot at least this often: the master's end a slave last heard is never older."""
HELLO_TIMEOUT_S = 10.0
"""A peer that has not said HELLO within this is closed."""
READ_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 1.0
BACKOFF_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
MAX_UNSENT_BYTES = 2 * ha_meta.MAX_SNAPSHOT_BYTES
"""A slave that takes none of this much is not reading: closed."""


class MetaChannel:
    """One thread of the ha worker; `stop` ends it (and closes its sockets) within a pass."""

    name = "rmq-ha-meta"

    def __init__(self, store: RunningStore) -> None:
        self.store = store
        self.table = store.shm.table
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> MetaChannel:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.step()
            except Exception:  # a bug here must not take replication down: logged, retried
                log.exception("ha-meta: unexpected error; going on in 1 s")
                self.stopping.wait(1.0)
        self.close()

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def malformed(self, peer: str, exc: Exception) -> None:
        self.table.add(layout.HA_META_MALFORMED, 1)
        log.error("ha-meta: malformed message from %s, connection closed, nothing applied: %s", peer, exc)


def without_deleted(snapshot: ha_meta.Snapshot, tombstones: dict[str, int]) -> ha_meta.Snapshot:
    """``snapshot`` less the group offsets and config of each topic deleted (``tombstones``:
    topic -> its delete's marker offset) at or above the master's end when it read them
    (`Snapshot.built_end`): the old topic's, read before the delete."""
    old = {topic for topic, bound in tombstones.items() if snapshot.built_end <= bound}
    if not old:
        return snapshot
    return dataclasses.replace(
        snapshot,
        offsets={k: q for k, q in snapshot.offsets.items() if k.partition("@")[0] not in old},
        topics={t: c for t, c in snapshot.topics.items() if t not in old},
    )


def start(store: RunningStore, slave: bool) -> MetaChannel | None:
    """The channel this store's settings ask for (None: none): a SLAVE follows
    haMasterMetaAddress, a master serves haMetaListenPort."""
    cfg = store.config
    if slave:
        return MetaFollower(store).start() if cfg.ha_master_meta_address else None
    return MetaServer(store).start() if cfg.ha_meta_listen_port >= 0 else None


# ---------------------------------------------------------------------------------------- master


@dataclass
class _Peer:
    sock: socket.socket
    name: str
    since: float
    reader: ha_meta.MessageReader = field(default_factory=lambda: ha_meta.MessageReader(ha_meta.HELLO))
    hello: str = ""
    out: bytearray = field(default_factory=bytearray)
    sent: Any = None
    sent_at: float = 0.0
    seq: int = 0


class MetaServer(MetaChannel):
    def __init__(self, store: RunningStore) -> None:
        super().__init__(store)
        cfg = store.config
        self.allowed = parse_allowed_slaves(cfg.ha_allowed_slaves)
        self.listener = sock = ha_listen.listen(cfg.ha_listen_address, cfg.ha_meta_listen_port, 16, "ha-meta")
        self.peers: dict[int, _Peer] = {}
        self.topics = TopicConfigManager(store.paths.topics)
        self.topics_mtime_ns = -1
        self.topics_json: dict[str, dict[str, Any]] = {}
        self.build_at = 0.0
        self.content: dict[str, Any] = {}
        self.end_before = self.delay_from = 0
        self.table.set(layout.HA_META_LISTEN_PORT, sock.getsockname()[1])
        log.info("ha-meta: serving metadata on port %d", sock.getsockname()[1])

    def step(self) -> None:
        socks = [p.sock for p in self.peers.values()]
        writing = [p.sock for p in self.peers.values() if p.out]
        readable, _writable = ha_listen.ready([self.listener, *socks], writing, SNAPSHOT_POLL_S / 2)
        if self.listener.fileno() in readable:
            self._accept()
        now_s = time.monotonic()
        if now_s >= self.build_at and any(p.hello for p in self.peers.values()):
            self.content = self._build()
            # A large table takes long to look at, and the ha worker's sending shares this
            # process: at most a tenth of its time goes here (the idle bound stretches with it).
            self.build_at = time.monotonic() + max(SNAPSHOT_POLL_S, 10 * (time.monotonic() - now_s))
        for peer in list(self.peers.values()):
            try:
                if peer.sock.fileno() in readable:
                    self._read(peer)
                if peer.hello and self.content and not peer.out:
                    self._send_due(peer, now_s)
                if peer.out:
                    with contextlib.suppress(BlockingIOError):
                        del peer.out[: peer.sock.send(peer.out)]
                if not peer.hello and now_s - peer.since > HELLO_TIMEOUT_S:
                    raise ha_meta.HaMetaError(f"no HELLO within {HELLO_TIMEOUT_S:.0f} s")
            except ha_meta.HaMetaError as exc:
                self.malformed(peer.name, exc)
                self._close(peer)
            except OSError as exc:
                log.info("ha-meta: slave %s closed: %s", peer.name, exc)
                self._close(peer)
        self.table.set(layout.HA_META_CONNECTIONS, len(self.peers))

    def _send_due(self, peer: _Peer, now_s: float) -> None:
        """A full snapshot when the state changed since this peer's last, else a heartbeat (the
        master's end, the reset stamp) once HEARTBEAT_S passed."""
        full = peer.sent != self.content
        if not full and now_s - peer.sent_at < HEARTBEAT_S:
            return
        peer.seq += 1
        head = {
            "seq": peer.seq,
            "masterEnd": self.table.written_end(),
            "delayFrom": self.delay_from,
            "full": full,
        }
        payload = {**head, **self.content} if full else {**head, "resetMs": self.content["resetMs"]}
        peer.out += ha_meta.encode(ha_meta.SNAPSHOT, payload)
        peer.sent, peer.sent_at = self.content, now_s
        self.table.add(layout.HA_META_SENT, 1)

    def _accept(self) -> None:
        for sock, _address, name in ha_listen.accept_allowed(
            self.listener, self.allowed, "ha-meta", self._refused, len(self.peers)
        ):
            self.peers[sock.fileno()] = _Peer(sock, name, time.monotonic())
            log.info("ha-meta: slave %s connected", name)

    def _refused(self) -> None:
        self.table.add(layout.HA_META_REFUSED, 1)

    def _read(self, peer: _Peer) -> None:
        data = peer.sock.recv(
            min(ha_meta.HEADER_BYTES + ha_meta.MAX_HELLO_BYTES, max(peer.reader.needed(), 1))
        )
        if not data:
            raise OSError("the slave closed the connection")
        if peer.hello:
            raise ha_meta.HaMetaError("bytes after HELLO (a slave sends nothing else)")
        for payload in peer.reader.feed(data):
            peer.hello = ha_meta.decode_hello(payload)
            log.info("ha-meta: slave %s is %s", peer.name, peer.hello)

    def _close(self, peer: _Peer) -> None:
        self.peers.pop(peer.sock.fileno(), None)
        peer.sock.close()

    def _build(self) -> dict[str, Any]:
        """The master's metadata now, as a SNAPSHOT's fields (all but seq, masterEnd, full). Not
        while a deleteTopic is under way (the last one kept): ``builtEnd`` past a delete's
        marker must mean a state without the topic's old offsets and config, which a slave
        that deleted the topic takes as the new topic's."""
        done = self.table.get(layout.TOPIC_DELETES_DONE)
        if self.table.get(layout.TOPIC_DELETE_REQUESTS) != done:
            return self.content
        built = self._read_state()
        if self.table.get(layout.TOPIC_DELETES_DONE) != done:
            return self.content
        if {**built, "builtEnd": 0} == {**self.content, "builtEnd": 0}:
            return (
                self.content
            )  # unchanged: no full snapshot for a moved end alone (the older end stays true)
        return built

    def _read_state(self) -> dict[str, Any]:
        shm = self.store.shm
        # A delivery's put ends before the scheduler publishes its offset, at once after: one
        # below the end a pass ago is in the offsets read now (`Snapshot.delay_from`).
        self.delay_from, self.end_before = self.end_before, self.table.written_end()
        offsets: dict[str, dict[str, int]] = {}
        for key, queue_id, slot in shm.groups.queues():
            committed = shm.groups.get(slot, qo.COMMITTED)
            if committed >= 0:  # -1 held, never committed; -2 deleted
                offsets.setdefault(key, {})[str(queue_id)] = committed
        delay = {
            str(level + 1): offset
            for level in range(shm.schedule.levels)
            if (offset := shm.schedule.get(level, so.OFFSET)) > 0
        }
        with contextlib.suppress(FileNotFoundError):
            mtime = self.topics.path.stat().st_mtime_ns
            if mtime != self.topics_mtime_ns and self.topics.load():
                self.topics_mtime_ns = mtime
                self.topics_json = {t: c.to_json() for t, c in self.topics.table.items()}
        return {  # the master's end goes with each message (`_send_due`): no change of state
            "builtEnd": self.end_before,
            "resetMs": self.table.get(layout.HA_META_RESET_MS),
            "offsets": offsets,
            "delay": delay,
            "topics": self.topics_json,
        }

    def close(self) -> None:
        for peer in list(self.peers.values()):
            self._close(peer)
        self.listener.close()
        self.table.set(layout.HA_META_LISTEN_PORT, 0)
        self.table.set(layout.HA_META_CONNECTIONS, 0)


# ----------------------------------------------------------------------------------------- slave


class MetaFollower(MetaChannel):
    def __init__(self, store: RunningStore) -> None:
        super().__init__(store)
        self.master = parse_host_port(store.config.ha_master_meta_address)
        self.peer = f"{self.master[0]}:{self.master[1]}"
        self.sock: socket.socket | None = None
        self.reader = ha_meta.MessageReader(ha_meta.SNAPSHOT)
        self.failures = 0
        self.retry_at = 0.0
        self.topics_applied: dict[str, dict[str, Any]] | None = None
        self.full_logged = False
        self.offsets_applied: dict[str, dict[int, int]] = {}
        """The last full snapshot's offsets, all applied: the next applies what differs."""
        self.tombstones: dict[str, int] = {}
        self.tombstones_mtime_ns = -1
        self.markers_finished = self.table.get(layout.TOPIC_DELETE_MARKERS_FINISHED)
        """Deletes met in the log this slave has finished (workers/topic_delete.py): when it
        moves, a full snapshot is applied whole again (what the delete dropped of a new topic)."""

    def step(self) -> None:
        finished = self.table.get(layout.TOPIC_DELETE_MARKERS_FINISHED)
        if finished != self.markers_finished:
            self.markers_finished = finished
            self._refollow()
        if self.sock is None:
            self._connect()
            return
        try:
            readable, _ = ha_listen.ready([self.sock], [], SNAPSHOT_POLL_S)
            if not readable:
                return
            data = self.sock.recv(min(READ_BYTES, max(self.reader.needed(), 1)))
            if not data:
                raise OSError("the master closed the connection")
            for payload in self.reader.feed(data):
                self.apply(ha_meta.decode_snapshot(payload))
                self.failures = 0
        except ha_meta.HaMetaError as exc:
            self.malformed(self.peer, exc)
            self._disconnect(str(exc))
        except OSError as exc:
            self._disconnect(str(exc))

    def _connect(self) -> None:
        now_s = time.monotonic()
        if now_s < self.retry_at:
            self.stopping.wait(min(SNAPSHOT_POLL_S, self.retry_at - now_s))
            return
        try:
            sock = socket.create_connection(self.master, timeout=CONNECT_TIMEOUT_S)
            sock.sendall(ha_meta.encode_hello(self.store.config.broker_name))
        except OSError as exc:
            self._disconnect(f"cannot connect: {exc}")
            return
        sock.setblocking(False)
        self.sock = sock
        self.reader = ha_meta.MessageReader(ha_meta.SNAPSHOT)
        log.info("ha-meta: following the master's metadata at %s", self.peer)

    def _refollow(self) -> None:
        """Connect again at once: the master's first snapshot on a connection is full, and is
        applied whole (a topic deleted here from the log dropped group offsets and a config the
        master may hold for the topic made again since)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.offsets_applied = {}
        self.topics_applied = None
        self.retry_at = 0.0
        log.info("ha-meta: a topic was deleted from the log: following the master's metadata afresh")

    def _disconnect(self, why: str) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.offsets_applied = {}  # the next connection's first snapshot is applied whole
        delay = BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)]
        self.failures += 1
        self.retry_at = time.monotonic() + delay
        if self.failures <= 2 or self.failures % 50 == 0:
            log.warning("ha-meta: master %s: %s; retrying in %.2f s", self.peer, why, delay)

    def apply(self, snapshot: ha_meta.Snapshot) -> None:
        """One checked snapshot into this slave's shared tables and topics.json."""
        shm, table = self.store.shm, self.table
        if snapshot.full:
            try:
                with shm.flags_lock("apply the master's consumer offsets"):
                    snapshot = self._without_deleted(snapshot)
                    self._apply_offsets(snapshot)
                    self._apply_topics(snapshot)
            except ShmAttachError as exc:
                log.warning("ha-meta: %s; reconnecting for a full snapshot", exc)
                raise OSError("a snapshot could not be applied") from exc
        elif snapshot.reset_ms > table.get(layout.HA_META_APPLIED_RESET_MS):
            raise OSError("a reset the last full snapshot did not carry: reconnecting for one")
        for level, offset in snapshot.delay.items():
            if level <= shm.schedule.levels and offset > shm.schedule.get(level - 1, so.OFFSET):
                shm.schedule.set(level - 1, so.OFFSET, offset)
        if snapshot.delay_from > table.get(layout.HA_META_DELAY_FROM):
            table.set(layout.HA_META_DELAY_FROM, snapshot.delay_from)
        table.set(layout.HA_META_MASTER_END, snapshot.master_end)
        table.set(layout.HA_META_APPLIED_MS, now_ms())
        if snapshot.full:
            table.add(layout.HA_META_APPLIED_FULL, 1)
        table.add(layout.HA_META_APPLIED, 1)

    def _without_deleted(self, snapshot: ha_meta.Snapshot) -> ha_meta.Snapshot:
        """``snapshot`` less what it holds of a topic this slave deleted from the log at or above
        the master's end when the master read it (`Snapshot.built_end`): that is the old topic's
        state, read before the delete (flags lock held: the tombstone and the supervisor's drop
        of the topic's offsets are written under it too)."""
        path = self.store.paths.deleted_topics
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return snapshot
        if mtime != self.tombstones_mtime_ns:
            tombstones = DeletedTopics(path)
            tombstones.load()
            self.tombstones, self.tombstones_mtime_ns = tombstones.bounds(), mtime
        return without_deleted(snapshot, self.tombstones)

    def _apply_offsets(self, snapshot: ha_meta.Snapshot) -> None:
        groups, table = self.store.shm.groups, self.table
        reset = snapshot.reset_ms > table.get(layout.HA_META_APPLIED_RESET_MS)
        before = {} if reset else self.offsets_applied
        for key, queues in snapshot.offsets.items():
            known = before.get(key, {})
            for queue_id, offset in queues.items():
                if known.get(queue_id) == offset:
                    continue  # as the last snapshot applied: nothing to look at (a slave's table moves only here)
                try:
                    slot = groups.find_or_insert(key, queue_id)
                except (OffsetTableFullError, ValueError) as exc:
                    if not self.full_logged:
                        self.full_logged = True
                        log.error("ha-meta: %s/%d not followed: %s", key, queue_id, exc)
                    continue
                if reset or offset > groups.get(slot, qo.COMMITTED):
                    groups.set(slot, qo.COMMITTED, offset)
        self.offsets_applied = snapshot.offsets
        if reset:
            for key, queue_id, slot in list(groups.queues()):
                if queue_id not in snapshot.offsets.get(key, {}) and groups.get(slot, qo.COMMITTED) >= 0:
                    groups.set(slot, qo.COMMITTED, qo.DELETED)
            table.set(layout.HA_META_APPLIED_RESET_MS, snapshot.reset_ms)
            log.info(
                "ha-meta: the master moved group offsets (reset at %d ms): copied them exactly",
                snapshot.reset_ms,
            )

    def _apply_topics(self, snapshot: ha_meta.Snapshot) -> None:
        if snapshot.topics == self.topics_applied:
            return
        manager = TopicConfigManager(self.store.paths.topics)
        manager.load()
        before = manager.counter
        for name, data in snapshot.topics.items():
            config = TopicConfig.from_json(data, name=name)
            if manager.get(name) != config:
                manager.put(config)
        if manager.counter != before:
            manager.persist()
        self.topics_applied = snapshot.topics

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
