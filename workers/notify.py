"""sd_notify(3) for the supervisor under systemd's ``Type=notify`` (conf/rmq-mp.service).

systemd passes ``$NOTIFY_SOCKET``, a unix datagram socket (a path, or ``@name`` in the abstract
namespace); a service says how it is doing by sending it ``KEY=VALUE`` lines: ``READY=1`` once
the store runs (systemd holds back units ordered after this one until then, and fails the start
at ``TimeoutStartSec`` if it never comes), ``STOPPING=1`` when the clean stop begins,
``RELOADING=1`` then ``READY=1`` around a reload of broker.conf. One datagram per message, as
libsystemd's sd_notify does; no libsystemd dependency.

The socket is taken out of the environment when `SystemdNotifier.from_environment` reads it, so
the worker processes the supervisor starts do not inherit it (systemd's ``NotifyAccess=main``
would drop their messages anyway, and only the supervisor knows when the store is ready).
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("rmq_mp.supervisor")


class SystemdNotifier:
    """The supervisor's channel to systemd; every call is a no-op when not started by systemd."""

    def __init__(self, address: str | None) -> None:
        self.address = address

    @classmethod
    def from_environment(cls) -> SystemdNotifier:
        """``$NOTIFY_SOCKET`` (removed from the environment: children do not inherit it). A
        vsock or other non-unix address is logged and ignored."""
        raw = os.environ.pop("NOTIFY_SOCKET", "")
        if not raw:
            return cls(None)
        if raw.startswith("@"):
            return cls("\0" + raw[1:])
        if raw.startswith("/"):
            return cls(raw)
        log.warning("NOTIFY_SOCKET=%r is not a unix socket path: systemd notifications are off", raw)
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """One datagram of ``lines``. False, with a warning in the log, if it cannot be sent (the
        store keeps running: systemd then times the start or stop out and says so itself)."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall("\n".join(lines).encode())
        except OSError as exc:
            log.warning("systemd notification %s not sent to NOTIFY_SOCKET: %s", lines[0], exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping")

    def reloading(self) -> bool:
        """RELOADING=1 with the monotonic time systemd's ``Type=notify-reload`` asks for."""
        return self.send(
            "RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
        )
