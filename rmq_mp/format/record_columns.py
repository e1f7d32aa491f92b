"""Where the fields of many CommitLog records lie, located column-wise: the core that the batch
dispatch decoder (`record_batch`) and the Spark source (`rmq_mp.spark.columns`) share.

Why one core and still a per-record decoder: the layout is defined once (`record.fixed_fields`,
the table the encoder's struct is built from) and every column reader locates fields here, from
that table. The per-record decoder (`record._parse` behind `check_record` and `decode_message`)
stays as the reference: recovery's last records, a pull, and the batch decoder's unusual rows go
through it, and the tests check this core and both column decoders against it record by record
(tests/unit/test_record_columns.py, test_record_batch.py). It cannot be a column decode of one
record: numpy's set-up per call (tens of us) is many times a `struct` unpack of one record, and
reput dispatches a pass's first records one by one for latency (bench/NOTES.md). Above this core
each column reader keeps only what it alone needs from the variable part: dispatch hashes TAGS
and KEYS from a right-aligned gather of each record's tail, Spark builds Arrow arrays of topic,
body and properties.

How: the first `HEAD_BYTES` (112) of every record are gathered in one copy as a structured
dtype whose fields overlap, one per (field, offset) that the four host layouts give; a column is
then picked per record by its SYSFLAG host bits, straight from one dtype field when the records
share one layout (the common case: no choice made per record).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rmq_mp.format import message as m
from rmq_mp.format import record

_INT_CODES = {"i": ">i4", "q": ">i8"}
_NAMES = [name for name, code in record.fixed_fields(False, False) if code in _INT_CODES]
"""The fixed fields read as integers (not the hosts' ip bytes)."""
_POSITION_NAMES = [name for name, _code in record.fixed_fields(False, False)] + ["BODY"]

LAYOUT_OFFSETS: dict[str, tuple[int, ...]] = {
    name: tuple(record.field_offsets(born_v6, store_v6)[name] for born_v6, store_v6 in record.HOST_LAYOUTS)
    for name in _POSITION_NAMES
}
"""Each field's offset in the four host layouts, in `record.HOST_LAYOUTS` order (layout index
= 2 * born_v6 + store_v6)."""


def _key(name: str, offset: int) -> str:
    return f"{name}@{offset}"


def _head_dtype() -> np.dtype[Any]:
    codes = dict(record.fixed_fields(False, False))
    fields = sorted({(offset, name) for name in _NAMES for offset in LAYOUT_OFFSETS[name]})
    itemsize = max(offset + int(codes[name][-1] == "q") * 4 + 4 for offset, name in fields)
    return np.dtype(
        {
            "names": [_key(name, offset) for offset, name in fields],
            "formats": [_INT_CODES[codes[name]] for _offset, name in fields],
            "offsets": [offset for offset, _name in fields],
            "itemsize": itemsize,
        }
    )


HEAD_DTYPE = _head_dtype()
"""Every integer field of the fixed part at each of its offsets over the host layouts."""
HEAD_BYTES = HEAD_DTYPE.itemsize
"""112: up to BODYLEN with two IPv6 hosts. Every record is longer than BODY's offset in its
own layout (88 with IPv4 hosts), but a record near a buffer's end may be shorter than this."""
_HOST_BITS = m.BORNHOST_V6_FLAG | m.STOREHOSTADDRESS_V6_FLAG


# ----------------------------------------------------------------------------------- gathers


def windows(view: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """Every byte of ``view`` as the start of one ``dtype`` item (an overlapping, zero-copy
    view): indexing it with record positions gathers a field of many records in one copy."""
    count = len(view) - dtype.itemsize + 1
    if count <= 0:
        return np.zeros(0, dtype=dtype)
    return np.ndarray((count,), dtype=dtype, buffer=view, strides=(1,))


def gather(view: np.ndarray, positions: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """One ``dtype`` item at each position. Gathered as opaque bytes, then viewed: numpy
    indexes a structured dtype field by field (about 12x slower, measured)."""
    raw = windows(view, np.dtype((np.void, dtype.itemsize)))[positions]
    return raw.view(dtype)


def gather_rows(view: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each position, as an (n, width) uint8 array."""
    if width == 0:
        return np.zeros((len(positions), 0), dtype=np.uint8)
    return gather(view, positions, np.dtype((np.void, width))).view(np.uint8).reshape(-1, width)


def gather_heads(view: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`HEAD_DTYPE` item at each start, bool: the whole head lies in ``view``). A head that
    runs past the end reads what is there and zeros after it (from a small copy of the end)."""
    inside = starts + HEAD_BYTES <= len(view)
    if inside.all():
        return gather(view, starts, HEAD_DTYPE), inside
    base = max(len(view) - HEAD_BYTES, 0)
    edge = np.concatenate((view[base:], np.zeros(HEAD_BYTES, dtype=np.uint8)))
    heads = np.zeros(len(starts), dtype=HEAD_DTYPE)
    heads[inside] = gather(view, starts[inside], HEAD_DTYPE)
    outside = np.clip(starts[~inside] - base, 0, len(edge) - HEAD_BYTES)
    heads[~inside] = gather(edge, outside, HEAD_DTYPE)
    return heads, inside


# ----------------------------------------------------------------------------------- locate


class RecordColumns:
    """The fixed fields of the records starting at ``starts`` in ``view`` (uint8), and where
    each field and the variable part lie, as int64 columns. Nothing is checked here: a column
    reader validates what it reads (a garbage SYSFLAG still picks one of the four layouts)."""

    def __init__(self, view: np.ndarray, starts: np.ndarray) -> None:
        self.starts = starts.astype(np.int64, copy=False)
        self.head, self.inside = gather_heads(view, self.starts)
        self.sys_flag = self.head[_key("SYSFLAG", record.POS_SYS_FLAG)].astype(np.int64)
        host_bits = self.sys_flag & _HOST_BITS
        self.born_v6 = (host_bits & m.BORNHOST_V6_FLAG) != 0
        self.store_v6 = (host_bits & m.STOREHOSTADDRESS_V6_FLAG) != 0
        self.layout = self.born_v6 * 2 + self.store_v6
        """Index into `record.HOST_LAYOUTS` per record."""
        one = len(host_bits) > 0 and int(host_bits.min()) == int(host_bits.max())
        self.one_layout: int | None = int(self.layout[0]) if one else (0 if not len(host_bits) else None)
        """The layout all records share, or None."""

    def raw(self, name: str) -> np.ndarray:
        """Field ``name`` of each record as stored (big-endian int32 or int64)."""
        offsets = LAYOUT_OFFSETS[name]
        if self.one_layout is not None:
            return self.head[_key(name, offsets[self.one_layout])]
        if len(set(offsets)) == 1:
            return self.head[_key(name, offsets[0])]
        return np.choose(self.layout, [self.head[_key(name, offset)] for offset in offsets])

    def field(self, name: str) -> np.ndarray:
        """Field ``name`` of each record, as int64."""
        return self.raw(name).astype(np.int64)

    def offset(self, name: str) -> np.ndarray | int:
        """Where field ``name`` lies in each record (one int when the layouts agree)."""
        offsets = LAYOUT_OFFSETS[name]
        if self.one_layout is not None:
            return offsets[self.one_layout]
        if len(set(offsets)) == 1:
            return offsets[0]
        return np.array(offsets, dtype=np.int64)[self.layout]

    def position(self, name: str) -> np.ndarray:
        """Where field ``name`` lies in ``view``, per record ("BODY": the body's first byte)."""
        return self.starts + self.offset(name)

    def ip_length(self, host: str) -> np.ndarray:
        """The ip bytes of "BORNHOST" or "STOREHOST": 4, or 16 for IPv6."""
        v6 = self.born_v6 if host == "BORNHOST" else self.store_v6
        return np.where(v6, 16, 4)

    def tail_position(self, body_length: np.ndarray) -> np.ndarray:
        """TOPICLEN's position: after the body. TOPIC, PROPLEN and PROPERTIES follow it, and
        PROPERTIES ends at the record's end when TOTALSIZE matches the fields."""
        return self.position("BODY") + body_length
