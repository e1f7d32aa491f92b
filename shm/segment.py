"""SharedSegment: one named POSIX shared-memory segment, mapped.

One owner per named resource (CPython's multiprocessing.shared_memory lesson): only the
supervisor creates (mode 0600, exclusive) and unlinks; workers, producers and consumers attach
by name and close. Callers read and write through ``buf`` with struct at offsets that only the
layout modules in `shm/` compute.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

import posix_ipc

from rmq_mp import file_modes
from rmq_mp.errors import ShmAttachError

MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault a range in writable without writing it (the mmap module has no name for it)."""
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]  # without them the address is cut to a C int
_libc.mlock.restype = ctypes.c_int


def lock_in_memory(mm: mmap.mmap) -> str:
    """mlock a whole mapping (its pages stay in RAM until it is unmapped): the pool's buffers
    here, a commit-log file with warmMapedFileEnable. '' or why it failed (RLIMIT_MEMLOCK,
    usually)."""
    buf = (ctypes.c_char * len(mm)).from_buffer(mm)
    try:
        if _libc.mlock(ctypes.addressof(buf), len(mm)) != 0:
            return os.strerror(ctypes.get_errno())
    finally:
        del buf
    return ""


class SharedSegment:
    """A mapped segment. `create` (supervisor) or `attach` (anyone else)."""

    def __init__(self, name: str, memory: posix_ipc.SharedMemory, size: int) -> None:
        self.name = name
        self.size = size
        self.mm = mmap.mmap(memory.fd, size)
        memory.close_fd()
        self.locked = False
        self._words: memoryview | None = None

    @property
    def words(self) -> memoryview:
        """The segment as native int64 words, for every shared integer field. A memoryview
        item store or load is one 8-byte instruction; `struct.pack_into`/`unpack_from` copy
        byte by byte in CPython, so a reader in another process can see a torn value (measured:
        thousands of backward reads of a field only ever increased, in a few seconds)."""
        if self._words is None:
            self._words = memoryview(self.mm)[: self.size - self.size % 8].cast("q")
        return self._words

    @classmethod
    def create(cls, name: str, size: int) -> SharedSegment:
        """Create a new zero-filled segment; an existing one of that name is an error."""
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=file_modes.shm_mode(), size=size)
        return cls(name, memory, size)

    @classmethod
    def attach(cls, name: str) -> SharedSegment:
        try:
            memory = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as exc:
            raise ShmAttachError(f"no shared segment {name}: is the store running?") from exc
        except posix_ipc.PermissionsError as exc:
            raise ShmAttachError(f"not allowed to attach to {name} (it belongs to another user)") from exc
        size = os.fstat(memory.fd).st_size
        if size == 0:  # created but not yet sized by its creator: not attachable yet
            memory.close_fd()
            raise ShmAttachError(f"shared segment {name} is still being created: is the store starting?")
        return cls(name, memory, size)

    def mlock(self) -> str:
        """Pin the pages (RocketMQ's TransientStorePool does). Returns '' or why it failed."""
        reason = lock_in_memory(self.mm)
        self.locked = not reason
        return reason

    def close(self) -> None:
        if self._words is not None:  # a live view pins the mapping
            self._words.release()
            self._words = None
        if not self.mm.closed:
            self.mm.close()

    @staticmethod
    def unlink(name: str) -> bool:
        """Remove a segment by name (supervisor only). False if it did not exist."""
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            return False
        return True
