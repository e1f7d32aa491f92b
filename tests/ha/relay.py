"""A fault relay: a real TCP proxy on 127.0.0.1 (port 0) between a slave and its master, in its
own thread, that on command cuts, stalls, slows or half-opens the connections it carries.

The slave is given ``127.0.0.1:relay.port`` as its haMasterAddress; every connection it makes is
accepted here and joined to a fresh connection to the master. Faults, all applied by the relay's
thread before the command returns (so a test knows the fault is in force, not hopes it is):

- ``cut("rst")`` / ``cut("fin")``: end every carried connection at once, both sides, with a reset
  (SO_LINGER 0) or an orderly close; with ``hold=True`` later connections are reset on accept
  until ``heal()`` (a master that refuses).
- ``stall()``: nothing is read or forwarded either way, the sockets stay open (the senders'
  buffers fill, as on a link that lost every packet); later connections are joined but stalled.
- ``slow(bytes_per_s)``: each direction of each connection forwards at most that rate.
- ``half_open("down" | "up")``: one direction (down: master to slave) stops, silently and with
  no FIN; the other flows.
- ``vanish("slave" | "master")``: that peer is gone without a FIN. For ``"slave"`` the relay's
  socket to the master is kept open and never read or written again (the master sees a peer
  that went silent) and the slave's side is reset (the slave, as if rebooted, connects again);
  for ``"master"`` the other way round (the slave sees a master that went silent).
- ``heal()``: everything flows again at full rate; sockets kept silent by ``vanish`` are reset.

Bytes are never altered or dropped inside a stream (a real link delays or loses a whole
connection, it does not splice one), so whatever reaches a peer is a prefix of what was sent.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

READ_BYTES = 1 << 16
TICK_S = 0.02
"""Longest wait of one pass (a slowed direction refills its allowance this often)."""


def _reset(sock: socket.socket) -> None:
    """Close with a RST rather than a FIN (SO_LINGER on, 0 s)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@dataclass
class _Direction:
    src: socket.socket
    dst: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    eof: bool = False
    """The source sent its FIN: once ``buf`` is forwarded the destination gets one too."""
    shut: bool = False
    allowance: float = 0.0


@dataclass
class _Pair:
    slave_side: socket.socket
    master_side: socket.socket
    up: _Direction  # slave -> master
    down: _Direction  # master -> slave
    zombie: socket.socket | None = None
    """A side kept open and silent by ``vanish``: nothing carried any more."""


class Relay:
    """The proxy; a context manager that stops its thread and closes every socket on exit."""

    def __init__(self, master_port: int, master_host: str = "127.0.0.1") -> None:
        self.master = (master_host, master_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.pairs: list[_Pair] = []
        self.zombies: list[socket.socket] = []
        self.up_mode = self.down_mode = "flow"
        self.rate: float | None = None
        self.hold = False
        self.let_through: int | None = None
        """`hold_after`: the count of accepted connections past which new ones are refused."""
        self.accepted = 0
        """Connections accepted so far (a reconnect shows here)."""
        self.forwarded = {"up": 0, "down": 0}
        self._commands: queue.Queue[tuple[Callable[[], None], threading.Event]] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"relay:{self.port}", daemon=True)
        self._thread.start()

    # -- commands (any thread)

    def _do(self, action: Callable[[], None]) -> None:
        if self._error is not None:
            raise AssertionError(f"the relay failed: {self._error!r}") from self._error
        done = threading.Event()
        self._commands.put((action, done))
        self._wake_w.send(b"\0")
        if not done.wait(10):
            raise AssertionError(f"the relay did not apply a command: {self._error!r}")

    def sync(self) -> None:
        """Return once the relay's thread has begun a fresh pass (what it had, it has handled)."""
        self._do(lambda: None)

    def cut(self, how: str = "rst", hold: bool = False) -> None:
        assert how in ("rst", "fin")

        def action() -> None:
            for pair in list(self.pairs):
                self._end(pair, reset=how == "rst")
            self.hold = hold

        self._do(action)

    def hold_after(self, connections: int) -> None:
        """Let ``connections`` more connections through (a `cut` with ``hold`` lifted), then refuse
        every new one (as that does, the open ones left as they are) until healed."""

        def action() -> None:
            self.hold = False
            self.let_through = self.accepted + connections

        self._do(action)

    def retarget(self, master_port: int, master_host: str = "127.0.0.1") -> None:
        """Connect new connections to another master at the same address the slave knows (a store
        replaced under its master's address)."""

        def action() -> None:
            self.master = (master_host, master_port)

        self._do(action)

    def stall(self) -> None:
        self._modes("stall", "stall")

    def half_open(self, direction: str) -> None:
        assert direction in ("up", "down")
        self._modes("stall" if direction == "up" else "flow", "stall" if direction == "down" else "flow")

    def slow(self, bytes_per_s: int) -> None:
        def action() -> None:
            self.rate = float(bytes_per_s)

        self._do(action)

    def vanish(self, peer: str) -> None:
        assert peer in ("slave", "master")

        def action() -> None:
            for pair in list(self.pairs):
                gone, kept = (
                    (pair.slave_side, pair.master_side)
                    if peer == "slave"
                    else (pair.master_side, pair.slave_side)
                )
                self.pairs.remove(pair)
                _reset(gone)
                self.zombies.append(kept)

        self._do(action)

    def heal(self) -> None:
        def action() -> None:
            self.up_mode = self.down_mode = "flow"
            self.rate = None
            self.hold = False
            self.let_through = None
            while self.zombies:
                _reset(self.zombies.pop())

        self._do(action)

    def _modes(self, up: str, down: str) -> None:
        def action() -> None:
            self.up_mode, self.down_mode = up, down

        self._do(action)

    def close(self) -> None:
        self._stop = True
        self._wake_w.send(b"\0")
        self._thread.join(10)
        for pair in self.pairs:
            _reset(pair.slave_side)
            _reset(pair.master_side)
        for sock in self.zombies:
            _reset(sock)
        self.pairs.clear()
        self.zombies.clear()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the relay's thread

    def _run(self) -> None:
        try:
            last = time.monotonic()
            while not self._stop:
                now = time.monotonic()
                self._refill(now - last)
                last = now
                self._pass()
        except BaseException as exc:  # surfaced by the next command
            self._error = exc

    def _refill(self, elapsed_s: float) -> None:
        for pair in self.pairs:
            for d in (pair.up, pair.down):
                if self.rate is None:
                    d.allowance = float("inf")
                else:  # at most two ticks' worth banked: a rate, not a burst after a pause
                    banked = 0.0 if d.allowance == float("inf") else d.allowance
                    d.allowance = min(banked + self.rate * elapsed_s, max(self.rate * 2 * TICK_S, 1.0))

    def _directions(self) -> list[tuple[_Pair, _Direction, str]]:
        return [
            (pair, d, name)
            for pair in self.pairs
            for d, name in ((pair.up, "up"), (pair.down, "down"))
            if (self.up_mode if name == "up" else self.down_mode) == "flow" and not d.shut
        ]

    def _pass(self) -> None:
        readers: list[socket.socket] = [self.listener, self._wake_r]
        writers: list[socket.socket] = []
        active = self._directions()
        for _pair, d, _name in active:
            if d.buf:
                if d.allowance >= 1:
                    writers.append(d.dst)
            elif not d.eof:
                readers.append(d.src)
        readable, writable, _ = select.select(readers, writers, [], TICK_S)
        if self._wake_r in readable:
            while True:
                try:
                    if not self._wake_r.recv(256):
                        break
                except BlockingIOError:
                    break
            self._apply_commands()
            return  # the modes may have changed: recompute what to watch
        if self.listener in readable:
            self._accept()
        for pair, d, name in active:
            if pair not in self.pairs:
                continue
            try:
                if d.src in readable and not d.buf:
                    data = d.src.recv(READ_BYTES)
                    if data:
                        d.buf += data
                    else:
                        d.eof = True
                if d.dst in writable and d.buf and d.allowance >= 1:
                    n = d.dst.send(d.buf[: int(min(len(d.buf), d.allowance))])
                    del d.buf[:n]
                    d.allowance -= n
                    self.forwarded[name] += n
                if d.eof and not d.buf and not d.shut:
                    d.shut = True
                    d.dst.shutdown(socket.SHUT_WR)
                if pair.up.shut and pair.down.shut:
                    self._end(pair, reset=False)
            except OSError:  # a reset from either side: the other gets one too
                self._end(pair, reset=True)

    def _apply_commands(self) -> None:
        while True:
            try:
                action, done = self._commands.get_nowait()
            except queue.Empty:
                return
            action()
            done.set()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        self.accepted += 1
        if self.hold or (self.let_through is not None and self.accepted > self.let_through):
            _reset(client)
            return
        try:
            upstream = socket.create_connection(self.master, timeout=5)
        except OSError:
            _reset(client)  # the master refuses: so does the relay
            return
        client.setblocking(False)
        upstream.setblocking(False)
        self.pairs.append(
            _Pair(client, upstream, up=_Direction(client, upstream), down=_Direction(upstream, client))
        )

    def _end(self, pair: _Pair, reset: bool) -> None:
        if pair in self.pairs:
            self.pairs.remove(pair)
        for sock in (pair.slave_side, pair.master_side):
            if reset:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
