"""What the cleaner reports, in numbers and in words, and how to ask it for a manual run.

The cleaner process (workers/cleaner.py) records every triggered run in the pointer table;
`CleanerStatistics.read` turns those fields into one frozen value for `run.py status`,
`rmq-admin deleteExpiredCommitLog` and tests. `request_manual_delete` is RocketMQ's
`executeDeleteFilesManually` (which 4.9.8 can reach only through a raw request code): it buys the
next 20 runs a manual trigger, wakes the cleaner and waits for the first of them to finish.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rmq_mp.errors import StoreError
from rmq_mp.store.mapped_file import offset_to_file_name
from shm import layout
from shm.pointer_table import PointerTable

if TYPE_CHECKING:
    from rmq_mp.store.running_store import RunningStore

DELETE_FILES_BATCH_MAX = 10
"""RocketMQ's `DELETE_FILES_BATCH_MAX`: commit-log files one run deletes at most."""
_TRIGGER_NAMES = (
    (layout.TRIGGER_TIME, "deleteWhen"),
    (layout.TRIGGER_SPACE, "disk space"),
    (layout.TRIGGER_MANUAL, "manual"),
    (layout.TRIGGER_FORCIBLY, "clean forcibly"),
)


def describe_triggers(bits: int) -> str:
    return "+".join(name for bit, name in _TRIGGER_NAMES if bits & bit) or "none"


def explain(outcome: int, offset: int, detail: int, *, reserved_hours: int) -> str:
    """Why a run stopped where it did, in words (RocketMQ issue #4042: say why nothing went)."""
    name = offset_to_file_name(offset) if offset >= 0 else "-"
    texts = {
        layout.OUTCOME_NONE: "no cleaning run yet",
        layout.OUTCOME_NOTHING_LEFT: "no commit-log file to delete",
        layout.OUTCOME_NOT_EXPIRED: (
            f"oldest file {name} was modified {detail / 3600:.1f} h ago; fileReservedTime is "
            f"{reserved_hours} h and the disk is not past diskSpaceCleanForciblyRatio"
        ),
        layout.OUTCOME_CURRENT_FILE: f"file {name} is the one being written (never deleted)",
        layout.OUTCOME_UNDISPATCHED: f"file {name} holds records not yet committed or dispatched",
        layout.OUTCOME_HELD_BY_READER: (
            f"file {name} is held by consumer pid {detail}; deleted once released or after "
            "destroyMapedFileIntervalForcibly"
        ),
        layout.OUTCOME_PROTECTED: (
            f"file {name} holds messages a consumer group has not consumed yet (the first at "
            f"commit-log offset {detail}; cleanProtectConsumerOffsets)"
        ),
        layout.OUTCOME_BATCH_LIMIT: f"deleted {DELETE_FILES_BATCH_MAX} files, the most one run deletes",
        layout.OUTCOME_DELETE_FAILED: f"deleting {name} failed (errno {detail})",
    }
    return texts.get(outcome, f"outcome {outcome}")


@dataclass(frozen=True, slots=True)
class CleanerStatistics:
    """The cleaner's disk readings and its last run, as the pointer table holds them."""

    disk_used_ratio: float
    consume_queue_disk_used_ratio: float
    disk_checked_ms: int
    runs: int
    last_run_ms: int
    last_triggers: str
    last_deleted_files: int
    last_deleted_bytes: int
    last_outcome: str
    deleted_files: int
    deleted_bytes: int
    forced_destroys: int
    consume_queue_files_deleted: int
    index_files_deleted: int
    min_offset: int
    pending_file_offset: int

    @classmethod
    def read(cls, table: PointerTable, *, reserved_hours: int) -> CleanerStatistics:
        g = table.get
        return cls(
            disk_used_ratio=g(layout.DISK_USED_PERMILLE) / 1000,
            consume_queue_disk_used_ratio=g(layout.CQ_DISK_USED_PERMILLE) / 1000,
            disk_checked_ms=g(layout.DISK_CHECK_MS),
            runs=g(layout.CLEAN_RUNS),
            last_run_ms=g(layout.CLEAN_LAST_RUN_MS),
            last_triggers=describe_triggers(g(layout.CLEAN_LAST_TRIGGERS)),
            last_deleted_files=g(layout.CLEAN_LAST_DELETED_FILES),
            last_deleted_bytes=g(layout.CLEAN_LAST_DELETED_BYTES),
            last_outcome=explain(
                g(layout.CLEAN_LAST_OUTCOME),
                g(layout.CLEAN_LAST_OUTCOME_OFFSET),
                g(layout.CLEAN_LAST_OUTCOME_DETAIL),
                reserved_hours=reserved_hours,
            ),
            deleted_files=g(layout.CLEAN_DELETED_FILES),
            deleted_bytes=g(layout.CLEAN_DELETED_BYTES),
            forced_destroys=g(layout.CLEAN_FORCED_DESTROYS),
            consume_queue_files_deleted=g(layout.CLEAN_CQ_DELETED_FILES),
            index_files_deleted=g(layout.CLEAN_INDEX_DELETED_FILES),
            min_offset=g(layout.MIN_OFFSET),
            pending_file_offset=g(layout.CLEAN_PENDING_OFFSET),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for `run.py status`."""
        if not self.runs:
            return f"no run yet (disk {self.disk_used_ratio:.0%} used)"
        ran = time.strftime("%H:%M:%S", time.localtime(self.last_run_ms / 1000))
        return (
            f"last run {ran} ({self.last_triggers}): deleted {self.last_deleted_files} file(s), "
            f"{self.last_deleted_bytes} bytes; stopped: {self.last_outcome}"
        )


def request_manual_delete(store: RunningStore, *, wait_s: float) -> CleanerStatistics:
    """`executeDeleteFilesManually` on a running store: the next 20 cleaner
    runs may delete expired files whatever the hour or disk; returns the statistics once the
    first of them finished. Raises StoreError if the cleaner does not answer within ``wait_s``."""
    table = store.shm.table
    with store.shm.flags_lock("file a manual deletion request"):
        seq = table.get(layout.MANUAL_DELETE_SEQ) + 1
        table.set(layout.MANUAL_DELETE_SEQ, seq)
    store.shm.wake("cleaner")
    deadline = time.monotonic() + wait_s
    while table.get(layout.MANUAL_DELETE_DONE_SEQ) < seq:
        if time.monotonic() > deadline:
            raise StoreError(
                f"the cleaner did not run within {wait_s:g} s (is it running? see run.py status)"
            )
        time.sleep(0.01)
    return CleanerStatistics.read(table, reserved_hours=store.config.file_reserved_time)
