"""What the master's two listeners share: the ha worker's for slaves (workers/ha.py) and the
metadata channel's (workers/ha_meta.py). Both bind as RocketMQ binds `haListenAddress` (empty:
every interface, IPv4 and IPv6 on one dual-stack socket where IPv6 is there) and refuse a peer
outside `haAllowedSlaves` at accept, before it is read or sent a byte."""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rmq_mp.config.store_config import peer_allowed

log = logging.getLogger("rmq_mp.ha")

ACCEPTS_PER_PASS = 16
"""Connections taken per readable listener, so a flood of them does not starve the served ones."""
MAX_PEERS = 32
"""Connections one listener serves at once (a master has a few slaves); past it a peer is refused
at accept, as one outside haAllowedSlaves is. Each holds a descriptor and up to a batch of unsent
bytes: unbounded, 1,011 peers that connected and never read took the ha worker's descriptors past
1023 and wedged it (select's ValueError every pass; its good slave cut off for good)."""

Networks = tuple[Any, ...]
"""`parse_allowed_slaves`' result: the allowed networks, empty for any peer."""


def listen(address: str, port: int, backlog: int, what: str) -> socket.socket:
    """A non-blocking listener on `address` (empty: every interface) and `port` (0: any). The
    OSError of a failed bind or listen is logged under `what` and raised."""
    family = socket.AF_INET6 if ":" in address or (not address and socket.has_ipv6) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and not address:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        log.error("%s: cannot listen on %s:%d: %s", what, address or "*", port, exc)
        raise
    sock.setblocking(False)
    return sock


def peer_name(address: tuple[Any, ...]) -> str:
    """`host:port`, `[v6]:port`; an IPv4 peer on a dual-stack socket as IPv4."""
    host = str(address[0]).removeprefix("::ffff:")
    return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"


def accept_allowed(
    listener: socket.socket, allowed: Networks, what: str, refused: Callable[[], object], served: int
) -> Iterator[tuple[socket.socket, tuple[Any, ...], str]]:
    """The pending connections (at most ACCEPTS_PER_PASS), each allowed one as a non-blocking
    socket with its address and name, while fewer than MAX_PEERS are served (``served`` before
    this call, each one yielded counted); a refused one is logged, counted (`refused`) and closed."""
    for _ in range(ACCEPTS_PER_PASS):
        try:
            sock, address = listener.accept()
        except BlockingIOError:
            return
        name = peer_name(address)
        if not peer_allowed(address[0], allowed):
            why = "not in haAllowedSlaves"
        elif served >= MAX_PEERS:
            why = f"already serving {MAX_PEERS} connections, the most one listener takes"
        else:
            sock.setblocking(False)
            served += 1
            yield sock, address, name
            continue
        log.warning("%s: refused %s: %s", what, name, why)
        refused()  # counted after its line: whoever sees the count finds the line
        sock.close()


def ready(
    read: Iterable[socket.socket], write: Iterable[socket.socket], timeout_s: float
) -> tuple[set[int], set[int]]:
    """`select.select` by poll: the descriptors of ``read`` with something to read (a hang-up or
    an error too: the read then says which) and of ``write`` with room, within ``timeout_s``.
    Poll takes any descriptor; select none past 1023 (FD_SETSIZE), whatever else the process
    holds open (mapped files, the other listener's peers)."""
    masks: dict[int, int] = {}
    for sock in read:
        masks[sock.fileno()] = select.POLLIN
    for sock in write:
        masks[sock.fileno()] = masks.get(sock.fileno(), 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    readable: set[int] = set()
    writable: set[int] = set()
    for fd, events in poller.poll(timeout_s * 1000):
        if events & (select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL):
            readable.add(fd)
        if events & (select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL):
            writable.add(fd)
    return readable, writable
