"""Every shared-memory segment and semaphore name, derived from the store directory.

Names derive from the store (or the `shmName` setting), so two stores on one machine never
collide and a restarted supervisor finds what a crashed run left behind.
POSIX names: one leading slash, no other; Linux shows segments as /dev/shm/<name> and
semaphores as /dev/shm/sem.<name>.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from rmq_mp.errors import ConfigError

_VALID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def valid_base(name: str) -> bool:
    """Whether ``name`` may be a store's shm name (the shmName rule; derived names follow it)."""
    return bool(_VALID.match(name))


@dataclass(frozen=True, slots=True)
class ShmNames:
    """The names of one store's shared objects. Picklable: workers receive this, never live objects."""

    base: str

    @classmethod
    def for_store(cls, store_root: str, shm_name: str = "") -> ShmNames:
        if shm_name:
            if not _VALID.match(shm_name):
                raise ConfigError(f"shmName {shm_name!r}: use 1-64 letters, digits, '_', '-' or '.'")
            return cls(shm_name)
        digest = hashlib.sha1(os.path.realpath(store_root).encode("utf-8")).hexdigest()[:12]
        return cls(f"rmq_{digest}")

    def _name(self, what: str) -> str:
        return f"/{self.base}_{what}"

    @property
    def pointer_table(self) -> str:
        return self._name("ptr")

    @property
    def descriptor(self) -> str:
        return self._name("desc")

    @property
    def queue_offsets(self) -> str:
        return self._name("qot")

    @property
    def group_offsets(self) -> str:
        return self._name("gof")

    @property
    def members(self) -> str:
        return self._name("mbr")

    @property
    def metrics(self) -> str:
        return self._name("metrics")

    @property
    def consume_counts(self) -> str:
        return self._name("consumed")

    @property
    def schedule_offsets(self) -> str:
        return self._name("sched")

    @property
    def flush_requests(self) -> str:
        return self._name("frq")

    @property
    def waiters(self) -> str:
        return self._name("wait")

    def pool_buffer(self, index: int) -> str:
        return self._name(f"pool{index}")

    @property
    def put_lock(self) -> str:
        return self._name("putlock")

    @property
    def flags_lock(self) -> str:
        return self._name("flagslock")

    def wakeup(self, role: str) -> str:
        return self._name(f"wake_{role}")

    def ready(self, role: str) -> str:
        return self._name(f"ready_{role}")

    @property
    def replica_requests(self) -> str:
        return self._name("hrq")

    @property
    def ha_wake(self) -> bytes:
        """The master's ha worker's wake-up socket (a Linux abstract UNIX address): a SYNC_MASTER
        put pokes it so the worker's select, which waits on sockets, sends at once."""
        return f"\0{self.base}_hawake".encode()

    def replica_done(self, slot: int) -> str:
        return self._name(f"hdone{slot}")

    def flush_done(self, slot: int) -> str:
        return self._name(f"fdone{slot}")

    def waiter(self, slot: int) -> str:
        return self._name(f"cw{slot}")

    def leftovers(self) -> list[str]:
        """Names under /dev/shm that belong to this store (segments and semaphores)."""
        try:
            entries = os.listdir("/dev/shm")
        except FileNotFoundError:
            return []
        prefixes = (f"{self.base}_", f"sem.{self.base}_")
        return sorted(e for e in entries if e.startswith(prefixes))
