"""Which put path this process runs: the compiled core (rmq_mp/put/_core.c) or the pure-Python
reference (rmq_mp/put/producer.py, rmq_mp/format/record.py, shm/semaphores.py).

The core is built by the install command (setup.py, an optional extension). It is used unless
``RMQ_PURE_PYTHON=1`` is set (the tests run the put path both ways), it is missing (a machine
without a C compiler: one warning, then the reference), or the record layout compiled into it
disagrees with `rmq_mp.format.record` (one warning, then the reference: the bytes have one definition).

The put lock follows the store, not the process: the supervisor records at creation which lock
its producers take (`shm.layout.PUT_LOCK_KIND`): the atomic lock when its own process has the
core, the semaphore otherwise. A producer honours the store's choice: with RMQ_PURE_PYTHON=1 in
a store that uses the atomic lock, the reference put path takes that lock through the core's
three lock calls (`lock_core`); only a process that cannot load the core at all is refused.
"""

from __future__ import annotations

import logging
from types import ModuleType

from rmq_mp.format import message as m
from rmq_mp.format import record
from rmq_mp.format.native import PURE_ENV, pure_requested, warn_once
from shm import layout

log = logging.getLogger("rmq_mp")


def _layout_problem(core: ModuleType) -> str:
    """'' when the core's compiled-in record layout is rmq_mp.format.record's, else the difference."""
    want = {
        "MESSAGE_MAGIC_CODE": record.MESSAGE_MAGIC_CODE,
        "POS_QUEUE_OFFSET": record.POS_QUEUE_OFFSET,
        "POS_PHY_OFFSET": record.POS_PHY_OFFSET,
        "POS_SYS_FLAG": record.POS_SYS_FLAG,
        "POS_BORN_HOST": record.POS_BORN_HOST,
        "STOREHOSTADDRESS_V6_FLAG": m.STOREHOSTADDRESS_V6_FLAG,
        "BORNHOST_V6_FLAG": m.BORNHOST_V6_FLAG,
        "MAX_PROPERTIES_BYTES": record.MAX_PROPERTIES_BYTES,
        "END_FILE_MIN_BLANK_LENGTH": record.END_FILE_MIN_BLANK_LENGTH,
    }
    have = core.layout()
    wrong = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    return f"its record layout differs from rmq_mp.format.record: {wrong}" if wrong else ""


def _load() -> tuple[ModuleType | None, str]:
    try:
        import rmq_mp.put._core as _core
    except ImportError as exc:
        return None, f"the compiled put core is not built ({exc}); reinstall with a C compiler"
    problem = _layout_problem(_core)
    if problem:
        return None, f"the compiled put core is out of date: {problem}; reinstall"
    return _core, ""


lock_core, _why_not = _load()
"""The core for the atomic put lock: whenever it loads, RMQ_PURE_PYTHON or not."""
core: ModuleType | None = None if pure_requested else lock_core
"""The core for the whole put path, or None: the reference runs."""
why_reference = f"{PURE_ENV} is set" if pure_requested else _why_not
"""Why this process runs the reference put path ('' when it runs the core)."""
if core is None and not pure_requested:
    warn_once(f"rmq-mp runs its pure-Python put path: {why_reference}")


def store_lock_kind() -> int:
    """The put lock a store created by this process uses (the supervisor's choice)."""
    return layout.LOCK_SEMAPHORE if core is None else layout.LOCK_ATOMIC
