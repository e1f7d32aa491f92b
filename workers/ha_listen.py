"""What the master's two listeners share: the ha worker's for slaves (workers/ha.py) and the
metadata channel's (workers/ha_meta.py). Both bind as RocketMQ binds `haListenAddress` (empty:
every interface, IPv4 and IPv6 on one dual-stack socket where IPv6 is there) and refuse a peer
outside `haAllowedSlaves` at accept, before it is read or sent a byte."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from rmq_mp.config.store_config import peer_allowed

log = logging.getLogger("rmq_mp.ha")

ACCEPTS_PER_PASS = 16
"""Connections taken per readable listener, so a flood of them does not starve the served ones."""

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
    listener: socket.socket, allowed: Networks, what: str, refused: Callable[[], object]
) -> Iterator[tuple[socket.socket, tuple[Any, ...], str]]:
    """The pending connections (at most ACCEPTS_PER_PASS), each allowed one as a non-blocking
    socket with its address and name; a refused one is logged, counted (`refused`) and closed."""
    for _ in range(ACCEPTS_PER_PASS):
        try:
            sock, address = listener.accept()
        except BlockingIOError:
            return
        name = peer_name(address)
        if not peer_allowed(address[0], allowed):
            refused()
            log.warning("%s: refused %s: not in haAllowedSlaves", what, name)
            sock.close()
            continue
        sock.setblocking(False)
        yield sock, address, name
