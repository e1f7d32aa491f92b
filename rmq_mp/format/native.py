"""Whether this process decodes CommitLog runs with the compiled scan (rmq_mp/format/_scan.c)
or the numpy reference (rmq_mp/format/record_batch.py), and the switch both compiled parts obey.

The scan is built by the install command with the put core (setup.py, an optional extension).
It is used unless ``RMQ_PURE_PYTHON=1`` is set (the tests run both ways) or it is missing (a
machine without a C compiler: one warning, then the reference). It holds no layout of its own:
`configure` hands it the offsets of `record.fixed_fields`, the magic code, the host flags and
the property names, so the bytes keep one definition.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

from rmq_mp.format import message as m
from rmq_mp.format import record

log = logging.getLogger("rmq_mp")

PURE_ENV = "RMQ_PURE_PYTHON"
pure_requested = os.environ.get(PURE_ENV, "") not in ("", "0")
"""RMQ_PURE_PYTHON=1: every compiled part steps aside for its Python reference."""


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
        "KEYS": m.PROPERTY_KEYS.encode(),
        "UNIQ_KEY": m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode(),
        "SCHEDULE_TOPIC": m.SCHEDULE_TOPIC.encode(),
    }


def _load() -> tuple[ModuleType | None, str]:
    try:
        import rmq_mp.format._scan as scan
    except ImportError as exc:
        return None, f"the compiled record scan is not built ({exc}); reinstall with a C compiler"
    scan.configure(scan_layout())
    return scan, ""


_built, why_not_built = _load()
scanner: ModuleType | None = None if pure_requested else _built
"""The compiled scan for `record_batch.scan_segment`, or None: the numpy reference runs."""
why_reference = f"{PURE_ENV} is set" if pure_requested else why_not_built
"""Why this process decodes with the reference ('' when it runs the compiled scan)."""
if scanner is None and not pure_requested:
    log.warning("rmq-mp decodes CommitLog runs in Python: %s", why_reference)
