"""The fault relay itself, between two plain sockets on loopback: each fault does what it says
(a relay that silently passed everything would make the fault tests prove nothing)."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.ha.relay import Relay


@pytest.fixture
def link() -> Iterator[tuple[Relay, socket.socket, socket.socket, socket.socket]]:
    """(relay, listener standing in for the master, the 'slave' end, the 'master' end)."""
    server = socket.create_server(("127.0.0.1", 0))
    relay = Relay(server.getsockname()[1])
    client = socket.create_connection(("127.0.0.1", relay.port), timeout=10)
    server.settimeout(10)
    upstream, _ = server.accept()
    upstream.settimeout(10)
    try:
        yield relay, server, client, upstream
    finally:
        relay.close()
        client.close()
        upstream.close()
        server.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def _connect_and_read(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        return sock.recv(10)


def _silent(sock: socket.socket) -> bool:
    """Nothing readable now (no byte, no FIN, no RST) after the relay did a whole pass."""
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable


def test_flows_both_ways(link: tuple[Relay, socket.socket, socket.socket, socket.socket]) -> None:
    relay, _, client, upstream = link
    client.sendall(b"up" * 1000)
    assert _recv_exactly(upstream, 2000) == b"up" * 1000
    upstream.sendall(b"down" * 50_000)
    assert _recv_exactly(client, 200_000) == b"down" * 50_000
    relay.sync()  # its counting done (the bytes may arrive before the relay's thread counts them)
    assert relay.forwarded == {"up": 2000, "down": 200_000}


@pytest.mark.parametrize("how", ["rst", "fin"])
def test_cut(link: tuple[Relay, socket.socket, socket.socket, socket.socket], how: str) -> None:
    relay, server, client, upstream = link
    relay.cut(how)
    for sock in (client, upstream):
        if how == "rst":
            with pytest.raises(ConnectionResetError):
                sock.recv(10)
        else:
            assert sock.recv(10) == b""
    again = socket.create_connection(("127.0.0.1", relay.port), timeout=10)  # later ones flow
    other, _ = server.accept()
    again.sendall(b"x")
    assert other.recv(1) == b"x"
    again.close()
    other.close()


def test_cut_and_hold_resets_new_connections_until_healed(
    link: tuple[Relay, socket.socket, socket.socket, socket.socket],
) -> None:
    relay, server, _, _ = link
    relay.cut("rst", hold=True)
    with pytest.raises(ConnectionResetError):  # at connect or at the first read
        _connect_and_read(relay.port)
    relay.heal()
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
        other, _ = server.accept()
        sock.sendall(b"y")
        assert other.recv(1) == b"y"
        other.close()


def test_stall_keeps_the_sockets_open_and_forwards_nothing_until_healed(
    link: tuple[Relay, socket.socket, socket.socket, socket.socket],
) -> None:
    relay, _, client, upstream = link
    relay.stall()
    client.sendall(b"a" * 100)
    upstream.sendall(b"b" * 100)
    relay.sync()
    relay.sync()
    assert _silent(client)
    assert _silent(upstream)
    assert relay.forwarded == {"up": 0, "down": 0}
    relay.heal()
    assert _recv_exactly(upstream, 100) == b"a" * 100
    assert _recv_exactly(client, 100) == b"b" * 100


def test_half_open_drops_one_direction_without_a_fin(
    link: tuple[Relay, socket.socket, socket.socket, socket.socket],
) -> None:
    relay, _, client, upstream = link
    relay.half_open("down")
    upstream.sendall(b"d" * 10)
    client.sendall(b"u" * 10)
    assert _recv_exactly(upstream, 10) == b"u" * 10  # up still flows
    relay.sync()
    assert _silent(client)  # no data, no FIN
    relay.heal()
    assert _recv_exactly(client, 10) == b"d" * 10  # delayed, never lost or spliced


def test_slow_limits_the_rate(link: tuple[Relay, socket.socket, socket.socket, socket.socket]) -> None:
    relay, _, client, upstream = link
    relay.slow(50_000)
    started = time.monotonic()
    upstream.sendall(b"s" * 25_000)
    assert _recv_exactly(client, 25_000) == b"s" * 25_000
    assert time.monotonic() - started >= 0.3  # 25 KB at 50 KB/s: half a second, give or take a tick


@pytest.mark.parametrize("peer", ["slave", "master"])
def test_vanish_keeps_the_other_side_open_and_silent(
    link: tuple[Relay, socket.socket, socket.socket, socket.socket], peer: str
) -> None:
    relay, _, client, upstream = link
    relay.vanish(peer)
    gone, kept = (client, upstream) if peer == "slave" else (upstream, client)
    with pytest.raises(ConnectionResetError):
        gone.recv(10)
    kept.sendall(b"k" * 10)  # taken by the kernel, never answered, never closed
    relay.sync()
    assert _silent(kept)
    relay.heal()  # the kept side is reset now
    with pytest.raises(ConnectionResetError):
        kept.recv(10)
