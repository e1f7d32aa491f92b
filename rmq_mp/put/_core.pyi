"""Types of the compiled put core (rmq_mp/put/_core.c)."""

from typing import Any

def crc32(data: bytes, start: int = 0, /) -> int: ...
def _set_clmul(on: bool, /) -> bool: ...
def _crc_fill_prepared(
    record: bytearray,
    tail_len: int,
    queue_offset: int,
    phy_offset: int,
    store_ms: int,
    guess: tuple[int, int, int] | None = None,
    fixed: int = 0,
    /,
) -> None: ...
def _crc_digits(crc: int, /) -> bytes: ...
def encode_own(
    topic_field: bytes,
    body: bytes,
    queue_id: int,
    flag: int,
    born_ms: int,
    props: bytes,
    born_ip: bytes,
    born_port: int,
    store_ip: bytes,
    store_port: int,
    /,
) -> bytearray: ...
def layout() -> dict[str, int]: ...
def lock_acquire(table: Any, index: int, pid: int, spin_ns: int, wait_ms: int, /) -> bool: ...
def lock_release(table: Any, index: int, /) -> None: ...
def lock_cas(table: Any, index: int, expected: int, new: int, /) -> bool: ...
def _set_pause(point: int, /) -> None: ...

class Sender:
    reserved_until: int
    prefault_at: int
    fresh_until_ns: int
    last_hold_ns: int
    sent: int
    crc_misses: int
    crc_templates: int
    def __init__(self, settings: dict[str, Any], /) -> None: ...
    def send_kw(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Any = None,
        properties: Any = None,
        queue_id: int | None = None,
        flag: int = 0,
    ) -> Any: ...
    def bind(self, reference: Any, rotate: Any, prefault: Any, /) -> None: ...
    def send_batch(
        self,
        topic: str,
        bodies: Any,
        tags: str | None,
        keys: Any,
        properties: Any,
        queue_id: int,
        flag: int,
        /,
    ) -> tuple[Any, str, int, int, int, int, int, list[int] | None] | None: ...
    def set_file(
        self,
        dest: Any,
        dest_is_file: bool,
        fd: int,
        file_from_offset: int,
        file_size: int,
        pwrite_min_bytes: int,
        /,
    ) -> None: ...
    def learn(
        self, topic: str, topic_field: bytes, limit: int, queue_id: int, slot: int, word: int, /
    ) -> None: ...
    def learn_topic(self, topic: str, topic_field: bytes, limit: int, /) -> None: ...
    def forget_topics(self) -> None: ...
    def close(self) -> None: ...
