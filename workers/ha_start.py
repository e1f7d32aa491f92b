"""Where a SLAVE's commit log begins: an empty slave of a master with several files.

RocketMQ 4.9.8's master answers a first report of 0 from the start of the file holding its end,
so an empty slave gets only the master's last file. Its slave takes it: `CommitLog.appendData`
creates the first file at that offset, and ConsumeQueues built from it start at non-zero queue
offsets (`ConsumeQueue.putMessagePositionInfo` pads the first file with pre-blank entries,
`fillPreBlank`). rmq-mp's slave does the same (`start_empty_log_at`): the store is then what a
master's cleaner leaves, a log whose first file is not 0, which every reader already handles.

The ha worker is the one writer of the log on a SLAVE; moving the start also moves MIN_OFFSET
(the cleaner's word on a master: a slave with an empty log has nothing to clean) and WROTE, and
removes the empty files made ahead below it (the allocator makes none on an empty slave, but a
store started before, or by an older version, may hold some), so a restart finds one
contiguous log from the new start.
"""

from __future__ import annotations

import logging
import os

from rmq_mp.errors import HaProtocolError
from rmq_mp.store.mapped_file import MappedFile, offset_to_file_name
from rmq_mp.store.running_store import RunningStore
from shm import layout

log = logging.getLogger("rmq_mp.ha")


def log_is_empty(store: RunningStore) -> bool:
    """No record was ever written or dispatched here, and every commit-log file holds zeros only."""
    t = store.table
    if t.get(layout.WROTE_POSITION) or t.get(layout.REPUT_FROM_OFFSET) > t.get(layout.MIN_OFFSET):
        return False
    size = store.config.mapped_file_size_commit_log
    directory = store.paths.commit_log
    for name in sorted(os.listdir(directory)) if directory.is_dir() else []:
        if not name.isdigit():
            continue
        mf = MappedFile(directory / name, size, writable=False)
        try:
            if mf.last_nonzero(0):
                return False
        finally:
            mf.close()
    return True


def start_empty_log_at(store: RunningStore, phy_offset: int) -> None:
    """Begin this empty slave's commit log at ``phy_offset``, the start of a master's file.
    `HaProtocolError` (nothing changed) when it is not a file start or the log is not empty."""
    size = store.config.mapped_file_size_commit_log
    if phy_offset % size:
        raise HaProtocolError(f"an empty slave's first frame at {phy_offset} is not at a file start")
    if not log_is_empty(store):
        raise HaProtocolError(f"the master starts this slave at {phy_offset}, but its own log is not empty")
    t = store.table
    t.set(layout.MIN_OFFSET, phy_offset)  # readers now map from here
    t.set(layout.WROTE_POSITION, phy_offset)
    store.commit_log.release_before(phy_offset)
    directory = store.paths.commit_log
    removed = []
    for name in sorted(os.listdir(directory)) if directory.is_dir() else []:
        if name.isdigit() and int(name) < phy_offset:
            (directory / name).unlink(missing_ok=True)
            removed.append(name)
    if removed:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    log.info(
        "ha: the master starts this empty slave at %d (file %s), the file holding its end: the log "
        "begins there, as RocketMQ's slave's does%s",
        phy_offset,
        offset_to_file_name(phy_offset),
        f"; removed the empty files {', '.join(removed)}" if removed else "",
    )
