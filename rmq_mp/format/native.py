"""The compiled parts below the put path, and the switch every compiled part obeys.

- `scan` (rmq_mp/format/_scan.c): `record_batch.scan_segment`'s decode of the common record;
- `index` (rmq_mp/store/_index.c): `IndexFile.put_hashes`' entry and slot writes.

Both are built by the install command with the put core (setup.py, optional extensions). Each is
used unless ``RMQ_PURE_PYTHON=1`` is set (the tests run both ways) or it is missing (a machine
without a C compiler: one warning for all compiled parts, then the numpy references). Neither holds a layout of
its own: `configure` hands the scan the offsets of `record.fixed_fields`, the magic code, the
host flags and the property names, so the bytes keep one definition; the index takes its
positions from `index_file` on every call.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from types import ModuleType

from rmq_mp.format import message as m
from rmq_mp.format import record

log = logging.getLogger("rmq_mp")

PURE_ENV = "RMQ_PURE_PYTHON"
pure_requested = os.environ.get(PURE_ENV, "") not in ("", "0")
"""RMQ_PURE_PYTHON=1: every compiled part steps aside for its Python reference."""


@dataclass(slots=True)
class Extension:
    """One compiled part: ``built`` when it loads, ``active`` when this process uses it."""

    built: ModuleType | None
    why_not_built: str
    active: ModuleType | None
    why_reference: str
    """Why this process runs the reference ('' when it runs the compiled part)."""


def load(module: str, what: str) -> Extension:
    """Import ``module``; warn once when it is missing and RMQ_PURE_PYTHON does not ask for that."""
    try:
        built: ModuleType | None = importlib.import_module(module)
        why_not = ""
    except ImportError as exc:
        built, why_not = None, f"the compiled {what} is not built ({exc}); reinstall with a C compiler"
    if pure_requested:
        return Extension(built, why_not, None, f"{PURE_ENV} is set")
    if built is None:
        warn_once(f"rmq-mp runs its Python {what}: {why_not}")
    return Extension(built, why_not, built, why_not)


_warned = False


def warn_once(text: str) -> None:
    """A process says once that a compiled part is missing (a machine without a compiler lacks
    them all: one warning, not one per part); the rest go to the debug log."""
    global _warned
    log.log(logging.DEBUG if _warned else logging.WARNING, "%s", text)
    _warned = True


def scan_layout() -> dict[str, object]:
    """What `_scan.configure` needs, from record.py's layout table and message.py's names."""
    offsets = [record.field_offsets(born_v6, store_v6) for born_v6, store_v6 in record.HOST_LAYOUTS]
    v4 = offsets[0]
    return {
        "MESSAGE_MAGIC_CODE": record.MESSAGE_MAGIC_CODE,
        "BORNHOST_V6_FLAG": m.BORNHOST_V6_FLAG,
        "STOREHOSTADDRESS_V6_FLAG": m.STOREHOSTADDRESS_V6_FLAG,
        **{name: v4[name] for name in ("BODYCRC", "QUEUEID", "QUEUEOFFSET", "SYSFLAG")},
        **{name: tuple(o[name] for o in offsets) for name in ("STORETIMESTAMP", "BODYLEN", "BODY")},
        "NAME_VALUE_SEPARATOR": ord(m.NAME_VALUE_SEPARATOR),
        "PROPERTY_SEPARATOR": ord(m.PROPERTY_SEPARATOR),
        "KEY_SEPARATOR": ord(m.KEY_SEPARATOR),
        "TAGS": m.PROPERTY_TAGS.encode(),
        "KEYS": m.INDEX_KEY_WORDS.encode(),
        "UNIQ_KEY": m.INDEX_KEY_WHOLE.encode(),
        "DELAY": m.PROPERTY_DELAY_TIME_LEVEL.encode(),
        "SCHEDULE_TOPIC": m.SCHEDULE_TOPIC.encode(),
        "PROPERTY_CRC32": record.PROPERTY_CRC32.encode(),
        "CRC32_RESERVED_LEN": record.CRC32_RESERVED_LEN,
    }


scan = load("rmq_mp.format._scan", "record scan")
"""The compiled scan for `record_batch.scan_segment` (``scan.active``), or the numpy reference."""
if scan.built is not None:
    scan.built.configure(scan_layout())
index = load("rmq_mp.store._index", "index writes")
"""The compiled entry and slot writes for `IndexFile.put_hashes` (``index.active``)."""
