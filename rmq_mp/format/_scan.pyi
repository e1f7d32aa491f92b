"""Types of the compiled record scan (rmq_mp/format/_scan.c)."""

from typing import Any

HAVE_CRC: int

def configure(layout: dict[str, Any], /) -> None: ...
def scan(
    buf: Any,
    pos: int,
    limit: int,
    max_records: int,
    check_crc: bool,
    topic_ids: dict[bytes, int],
    topics: list[str],
    columns: Any,
    row: int,
    keys: Any,
    key_row: int,
    delay_level_ms: tuple[int, ...] | None = None,
    /,
) -> tuple[int, int, int, int]: ...
def queue_ends(
    buf: Any,
    pos: int,
    limit: int,
    max_records: int,
    skip_topic: bytes,
    topic_ids: dict[bytes, int],
    topics: list[str],
    out: Any,
    /,
) -> tuple[int, int, int, int]: ...
