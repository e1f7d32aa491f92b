"""The pointer table: fixed, aligned 64-bit slots shared by every process of a running store.

The only table of shared-memory offsets for it (docs/architecture.md, "Shared memory"). Each field names its one
writing role or the lock it is written under; `PointerTable.set` refuses any other writer, so a
wrong writer fails loudly in tests, and `PointerTable.words` refuses a hot path whose declared
stores name a field its role does not write (tests/unit/test_writers.py checks that each
module's writes are its role's, by reading the code). Readers take no lock: aligned 8-byte loads and stores are
single instructions on x86-64 and aarch64. The supervisor may initialise any field before the
first worker starts (state STARTING).

Slot map (index x 8 = byte offset):
    0..31    header, log positions, timestamps, flags, statistics (FIELDS below)
    32..36   put journal (undo record for a put interrupted by its producer's death)
    37..63   cleaner: disk check, last run, manual requests, a file waiting on its readers
    64..95   pool buffers: file offset held by buffer i, -1 when free (POOL_SLOTS max)
    96..207  per worker: WORKER_FIELDS for each role in shm.roles.ROLES (seven roles)
    208..223 the fence (a start stopped or started over takes no put), the flags lock's owner
    272..399 operator fields (recovery time, metrics port, records readers skipped)
    400..432 replication (the ha worker): listener, acknowledged offset, connection slots, bound port
    448      the supervisor's process start time (a reused pid is not the supervisor)
    464..479 live settings: what a reload applies to the workers
    480..511 failover: the metadata channel, the role a promotion gave (504..511 reserved below)
    504..507 rmq-admin deleteTopic: requests, the supervisor's and reput's progress
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shm.roles import ROLES, Role


class Lock(enum.Enum):
    PUT = "put lock"
    FLAGS = "flags lock"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    index: int
    writers: frozenset[Role]
    lock: Lock | None
    doc: str

    @property
    def offset(self) -> int:
        return self.index * 8


def _f(name: str, index: int, *writers: Role, lock: Lock | None = None, doc: str = "") -> Field:
    return Field(name, index, frozenset(writers), lock, doc)


MAGIC_VALUE = 0x524D514D50303031  # "RMQMP001"
LAYOUT_VERSION = 3  # 2: PUT_LOCK_KIND, the atomic put lock; 3: the put's cache lines (words 8-15, 232)

# State values of STATE.
STARTING, RUNNING, STOPPING, STOPPED = 0, 1, 2, 3

MAGIC = _f("magic", 0, Role.SUPERVISOR)
VERSION = _f("version", 1, Role.SUPERVISOR)
GENERATION = _f("generation", 2, Role.SUPERVISOR, doc="incremented at every supervisor start")
SUPERVISOR_PID = _f("supervisor_pid", 3, Role.SUPERVISOR)
SUPERVISOR_HEARTBEAT_MS = _f(
    "supervisor_heartbeat_ms", 4, Role.SUPERVISOR, doc="workers exit when it goes stale"
)
STATE = _f("state", 5, Role.SUPERVISOR, doc="STARTING, RUNNING, STOPPING, STOPPED")
FILE_SIZE = _f("file_size", 6, Role.SUPERVISOR, doc="mappedFileSizeCommitLog")
MIN_OFFSET = _f(
    "min_offset",
    7,
    Role.CLEANER,
    Role.HA,
    doc="first readable commit-log byte; a file being deleted is already below it; on an empty SLAVE the "
    "ha worker sets it once, where its master's first frame starts the log (workers/ha_start.py), "
    "without a lock: an empty log has nothing the cleaner could delete",
)
# Words 8-15 are one cache line (the table starts a page): everything a put writes under the put
# lock but the journal's four words (33-36) and its queue's offset. The lock word itself is alone
# in its line (232; 233-239 stay unused), so the waiters' spinning reads do not pull this line from
# the holder while it writes. No worker writes here (the committed, flushed and dispatched positions
# are words 20-22, the allocator's end word 32). On 16 cores (bench/NOTES.md) this moved `send` with
# 2-8 producers from 0.79-1.06M to 0.96-1.25M msgs/s.
WROTE_POSITION = _f(
    "wrote_position",
    8,
    Role.PRODUCER,
    Role.HA,
    lock=Lock.PUT,
    doc="end of appended records; on a SLAVE (producers refused) the ha worker is its one writer",
)
COMMITTED_POSITION = _f(
    "committed_position", 21, Role.COMMITTER, doc="end of bytes copied from pool buffers to files"
)
FLUSHED_POSITION = _f(
    "flushed_position", 22, Role.FLUSHER, doc="end of bytes known durable; never advanced on a failed fsync"
)
REPUT_FROM_OFFSET = _f("reput_from_offset", 20, Role.REPUT, doc="end of dispatched records")
ALLOCATED_UNTIL = _f(
    "allocated_until",
    32,
    Role.ALLOCATOR,
    doc="commit-log offset below which, from the write position on, disk blocks are reserved",
)
LAST_STORE_TIMESTAMP = _f("last_store_timestamp", 13, Role.PRODUCER, lock=Lock.PUT)
PUT_LOCK_OWNER_PID = _f(
    "put_lock_owner_pid",
    232,
    Role.PRODUCER,
    lock=Lock.PUT,
    doc="0 when free; with PUT_LOCK_KIND atomic, the lock word itself (`lock_owner` reads the pid)",
)
PUT_LOCK_SINCE_MS = _f(
    "put_lock_since_ms", 15, Role.PRODUCER, lock=Lock.PUT, doc="OS_PAGECACHE_BUSY and dead-owner checks"
)
PHYSIC_MSG_TIMESTAMP = _f("physic_msg_timestamp", 16, Role.FLUSHER)
LOGICS_MSG_TIMESTAMP = _f("logics_msg_timestamp", 17, Role.REPUT)
INDEX_MSG_TIMESTAMP = _f("index_msg_timestamp", 18, Role.REPUT)
RUNNING_FLAGS = _f(
    "running_flags",
    19,
    Role.FLUSHER,
    Role.CLEANER,
    lock=Lock.FLAGS,
    doc="RocketMQ RunningFlags bits: NOT_WRITEABLE (flusher), DISK_FULL (cleaner)",
)
FLUSH_REQUEST_SEQ = _f(
    "flush_request_seq", 11, Role.PRODUCER, lock=Lock.PUT, doc="next SYNC flush-request ticket"
)
PUT_COUNT = _f("put_count", 9, Role.PRODUCER, lock=Lock.PUT)
PUT_BYTES = _f("put_bytes", 10, Role.PRODUCER, lock=Lock.PUT)
FLUSH_COUNT = _f("flush_count", 23, Role.FLUSHER)
FLUSH_FAILURES = _f("flush_failures", 24, Role.FLUSHER)
COMMIT_COUNT = _f("commit_count", 25, Role.COMMITTER)
DISPATCH_COUNT = _f("dispatch_count", 26, Role.REPUT)
RECOVERY_DROPPED_BYTES = _f("recovery_dropped_bytes", 27, Role.SUPERVISOR)
POOL_SIZE = _f("pool_size", 28, Role.SUPERVISOR, doc="buffers in the TransientStorePool, 0 = pool off")
POOL_MLOCK_FAILED = _f("pool_mlock_failed", 29, Role.SUPERVISOR, doc="buffers whose mlock failed")
FLUSH_DISK_SYNC = _f("flush_disk_sync", 30, Role.SUPERVISOR, doc="1 for SYNC_FLUSH")
LOCK_RECOVERIES = _f(
    "lock_recoveries", 31, Role.PRODUCER, lock=Lock.PUT, doc="put locks taken over from a dead owner"
)

# The put journal: written under the put lock before a put changes anything, cleared after.
JOURNAL_ACTIVE = _f("journal_active", 12, Role.PRODUCER, lock=Lock.PUT)
JOURNAL_WROTE_BEFORE = _f("journal_wrote_before", 33, Role.PRODUCER, lock=Lock.PUT)
JOURNAL_QUEUE_SLOT = _f(
    "journal_queue_slot", 34, Role.PRODUCER, lock=Lock.PUT, doc="-1 when no queue offset changed"
)
JOURNAL_QUEUE_OFFSET_BEFORE = _f("journal_queue_offset_before", 35, Role.PRODUCER, lock=Lock.PUT)
JOURNAL_WROTE_AFTER = _f(
    "journal_wrote_after", 36, Role.PRODUCER, lock=Lock.PUT, doc="end the put meant to reach"
)

# The cleaner (workers/cleaner.py): its disk check, what its last run did and why, manual requests.
DISK_CHECK_MS = _f(
    "disk_check_ms", 37, Role.CLEANER, doc="time of the last disk check (its own schedule, #1400)"
)
DISK_USED_PERMILLE = _f(
    "disk_used_permille", 38, Role.CLEANER, doc="commit-log partition, used / (used + available)"
)
CQ_DISK_USED_PERMILLE = _f("cq_disk_used_permille", 39, Role.CLEANER, doc="consume-queue partition, likewise")
CLEAN_RUNS = _f("clean_runs", 40, Role.CLEANER, doc="commit-log cleaning runs that had a trigger")
CLEAN_LAST_RUN_MS = _f("clean_last_run_ms", 41, Role.CLEANER)
CLEAN_LAST_TRIGGERS = _f("clean_last_triggers", 42, Role.CLEANER, doc="TRIGGER_* bits of the last run")
CLEAN_LAST_DELETED_FILES = _f("clean_last_deleted_files", 43, Role.CLEANER)
CLEAN_LAST_DELETED_BYTES = _f("clean_last_deleted_bytes", 44, Role.CLEANER)
CLEAN_LAST_OUTCOME = _f("clean_last_outcome", 45, Role.CLEANER, doc="OUTCOME_*: why the last run stopped")
CLEAN_LAST_OUTCOME_OFFSET = _f(
    "clean_last_outcome_offset", 46, Role.CLEANER, doc="the file the last run stopped at"
)
CLEAN_LAST_OUTCOME_DETAIL = _f(
    "clean_last_outcome_detail",
    47,
    Role.CLEANER,
    doc="age in s, holder pid or protected phy offset, by outcome",
)
CLEAN_DELETED_FILES = _f("clean_deleted_files", 48, Role.CLEANER, doc="commit-log files deleted since start")
CLEAN_DELETED_BYTES = _f("clean_deleted_bytes", 49, Role.CLEANER)
CLEAN_FORCED_DESTROYS = _f(
    "clean_forced_destroys",
    50,
    Role.CLEANER,
    doc="files deleted while a reader held them, after the forcible interval",
)
CLEAN_CQ_DELETED_FILES = _f(
    "clean_cq_deleted_files", 51, Role.CLEANER, doc="ConsumeQueue files deleted since start"
)
CLEAN_INDEX_DELETED_FILES = _f(
    "clean_index_deleted_files", 52, Role.CLEANER, doc="index files deleted since start"
)
CLEAN_PENDING_OFFSET = _f(
    "clean_pending_offset", 53, Role.CLEANER, doc="file made unavailable but still held by a reader, -1 none"
)
CLEAN_PENDING_SINCE_MS = _f(
    "clean_pending_since_ms", 54, Role.CLEANER, doc="when that file was first made unavailable"
)
MANUAL_DELETE_SEQ = _f(
    "manual_delete_seq", 55, Role.CONSUMER, lock=Lock.FLAGS, doc="manual deletion requests (rmq-admin)"
)
MANUAL_DELETE_DONE_SEQ = _f(
    "manual_delete_done_seq", 56, Role.CLEANER, doc="the last request a finished run served"
)
CLEAN_CQ_MIN_PHY_OFFSET = _f(
    "clean_cq_min_phy_offset",
    57,
    Role.CLEANER,
    doc="commit-log minimum the ConsumeQueues and index were cleaned to",
)

# Dispatch fault codes (DISPATCH_FAILED_QUEUES' per-queue dispatch_error, INDEX_DISPATCH_ERROR): an
# errno (> 0), or one of these for a fault that is not an OSError (reput.log has the whole message).
FAULT_CONFIG, FAULT_OTHER = -1, -2

# CLEAN_LAST_TRIGGERS bits: why a run deleted anything at all (RocketMQ's three triggers).
TRIGGER_TIME, TRIGGER_SPACE, TRIGGER_MANUAL, TRIGGER_FORCIBLY = 1, 2, 4, 8
# CLEAN_LAST_OUTCOME values: why the last run stopped where it did (RocketMQ issue #4042).
(
    OUTCOME_NONE,
    OUTCOME_NOTHING_LEFT,
    OUTCOME_NOT_EXPIRED,
    OUTCOME_CURRENT_FILE,
    OUTCOME_UNDISPATCHED,
    OUTCOME_HELD_BY_READER,
    OUTCOME_PROTECTED,
    OUTCOME_BATCH_LIMIT,
    OUTCOME_DELETE_FAILED,
) = range(9)

# Operator fields (slots 272..399; 37..63 and 240..271 are reserved for other work).
RECOVERY_MS = _f("recovery_ms", 272, Role.SUPERVISOR, doc="wall time of the last startup recovery")
METRICS_PORT = _f(
    "metrics_port", 273, Role.SUPERVISOR, doc="port the Prometheus endpoint listens on, 0 = off"
)
READ_SKIPPED_RECORDS = _f(
    "read_skipped_records",
    276,
    Role.CONSUMER,
    lock=Lock.FLAGS,
    doc="records readers skipped rather than serve (body CRC, a queue entry not matching its record), "
    "each once per reading process (rmq_mp/store/read_damage.py)",
)

# Reput's quarantined queues and paused index (workers/reput.py): what status and metrics show.
DISPATCH_FAILED_QUEUES = _f(
    "dispatch_failed_queues", 280, Role.REPUT, doc="queues quarantined (see each one's dispatch_error)"
)
QUEUE_REDISPATCH_FROM = _f(
    "queue_redispatch_from",
    281,
    Role.REPUT,
    doc="while queues are quarantined: the first record one still lacks",
)
INDEX_DISPATCH_ERROR = _f(
    "index_dispatch_error", 282, Role.REPUT, doc="0, or why indexing is paused (errno or FAULT_*)"
)
INDEX_RESUME_OFFSET = _f(
    "index_resume_offset", 283, Role.REPUT, doc="while indexing is paused: the first record not indexed"
)
PUT_LOCK_KIND = _f(
    "put_lock_kind",
    301,
    Role.SUPERVISOR,
    doc="LOCK_SEMAPHORE or LOCK_ATOMIC, chosen at creation: every producer of the store takes that lock",
)
CONFIG_PERSIST_FAILURES = _f(
    "config_persist_failures",
    300,
    Role.SUPERVISOR,
    doc="persists of config/*.json that raised OSError (retried)",
)

# The fence (rmq_mp/put/fence.py; slots 208..223): a start that someone stops or starts over
# takes no put. Set under the put lock by whoever fences (a stop, a start over a dead supervisor's
# shared memory, the supervisor's own shutdown), read under it by every put (a word read).
FENCE = _f(
    "fence",
    208,
    Role.PRODUCER,
    lock=Lock.PUT,
    doc="0 open; else FENCED_BY_* (who fenced this start): every put refuses once it is set",
)
FENCE_PID = _f("fence_pid", 209, Role.PRODUCER, lock=Lock.PUT, doc="the process that set FENCE")
FENCE_MS = _f("fence_ms", 210, Role.PRODUCER, lock=Lock.PUT, doc="when FENCE was set (wall clock)")

# The flags lock's owner (shm/store_shm.py `StoreShm.flags_lock`): any role takes that lock, so
# any role writes these, under it. A dead owner is detected and the lock taken over.
FLAGS_LOCK_OWNER_PID = _f(
    "flags_lock_owner_pid", 211, *Role, lock=Lock.FLAGS, doc="0 when free; written just after taking it"
)
FLAGS_LOCK_SINCE_MS = _f("flags_lock_since_ms", 212, *Role, lock=Lock.FLAGS, doc="when its holder took it")
FLAGS_LOCK_RECOVERIES = _f(
    "flags_lock_recoveries", 213, *Role, lock=Lock.FLAGS, doc="flags locks taken over from a dead holder"
)
FLAGS_LOCK_LAST_DEAD_PID = _f(
    "flags_lock_last_dead_pid", 214, *Role, lock=Lock.FLAGS, doc="the last dead holder taken over from"
)

# FENCE values: who fenced the start (`rmq_mp.put.fence.FENCERS` words each).
FENCE_OPEN, FENCED_BY_SHUTDOWN, FENCED_BY_STOP, FENCED_BY_START = 0, 1, 2, 3

# Live settings (slots 464..479): broker.conf keys a reload applies to the workers without a restart
# (rmq_mp/config/live.py PUBLISHED_KEYS, in order, one word each), written by the supervisor at start
# and at each reload it accepts, then LIVE_SETTINGS_GENERATION; a worker re-reads them when it moves.
LIVE_SETTINGS_GENERATION = _f(
    "live_settings_generation",
    464,
    Role.SUPERVISOR,
    doc="reloads applied since start: workers re-read live_setting*",
)
RELOADS_DONE = _f(
    "reloads_done",
    465,
    Role.SUPERVISOR,
    doc="reload requests (SIGHUP) handled, applied or refused: `rmq-mp reload` waits on it",
)
LIVE_BASE = 466
LIVE_SLOTS = 14


def live_setting(index: int) -> Field:
    """The ``index``-th live worker setting's word (rmq_mp/config/live.py says which key)."""
    assert 0 <= index < LIVE_SLOTS
    return _f(f"live_setting{index}", LIVE_BASE + index, Role.SUPERVISOR)


# Replication (workers/ha.py, docs/replication.md). On a master: the listener, the best offset any
# slave acknowledged, and one slot per connection; on a SLAVE: where its own log stands.
HA_LISTEN_PORT = _f("ha_listen_port", 400, Role.HA, doc="port the HA listener is bound to, 0 = none")
HA_ACKED_OFFSET = _f(
    "ha_acked_offset",
    401,
    Role.HA,
    doc="highest commit-log end any slave acknowledged (RocketMQ's push2SlaveMaxOffset); never decreases",
)
HA_CONNECTIONS = _f("ha_connections", 402, Role.HA, doc="slave connections open now")
HA_REFUSED_PEERS = _f(
    "ha_refused_peers", 403, Role.HA, doc="connections refused: outside haAllowedSlaves, or past 32 at once"
)
HA_SLAVE_RECEIVED_END = _f(
    "ha_slave_received_end",
    404,
    Role.HA,
    doc="SLAVE: end of the master's bytes written to its files (what it reports); WROTE_POSITION "
    "stops at the last whole record below it",
)
HA_SLAVE_CONNECTS = _f("ha_slave_connects", 405, Role.HA, doc="SLAVE: connections made to its master")
HA_SLAVE_STATE = _f("ha_slave_state", 406, Role.HA, doc="SLAVE: SLAVE_* below")
HA_SLAVE_LAST_HEARD_MS = _f("ha_slave_last_heard_ms", 407, Role.HA, doc="SLAVE: last bytes from its master")
HA_DROPPED = _f(
    "ha_dropped", 408, Role.HA, doc="connections closed for silence, a report beyond the end or a bad frame"
)
HA_REQUEST_SEQ = _f(
    "ha_request_seq",
    409,
    Role.PRODUCER,
    lock=Lock.PUT,
    doc="SYNC_MASTER: next replica-request ticket (shm/replica_requests.py)",
)
HA_SLAVE_NOT_AVAILABLE = _f(
    "ha_slave_not_available",
    410,
    Role.PRODUCER,
    lock=Lock.FLAGS,
    doc="SYNC_MASTER puts answered SLAVE_NOT_AVAILABLE",
)
HA_FLUSH_SLAVE_TIMEOUT = _f(
    "ha_flush_slave_timeout",
    411,
    Role.PRODUCER,
    lock=Lock.FLAGS,
    doc="SYNC_MASTER puts answered FLUSH_SLAVE_TIMEOUT",
)
HA_BOUND_PORT = _f(
    "ha_bound_port",
    432,
    Role.HA,
    doc="haListenPort=0: the port an earlier listener got, bound again by a restarted ha worker",
)
HA_CONN_BASE = 412
HA_CONN_SLOTS = 4
HA_CONN_FIELDS = ("peer", "acked", "last_heard_ms", "caught_up_ms", "state")
# HA_SLAVE_STATE values, and a connection slot's state on a master. VERIFYING: comparing the
# master's bytes with its own log's tail; FORKED: its log parts from the master's at
# HA_SLAVE_FORK_OFFSET (what only it had set aside; a restart truncates there); REFUSED: it cannot
# tell where the logs part, HA_SLAVE_FORK_OFFSET is where it asked (workers/ha_fork.py).
SLAVE_IDLE, SLAVE_CONNECTING, SLAVE_CONNECTED, SLAVE_BACKOFF = 0, 1, 2, 3
SLAVE_VERIFYING, SLAVE_FORKED, SLAVE_REFUSED = 4, 5, 6
HA_SLAVE_FORK_OFFSET = _f(
    "ha_slave_fork_offset",
    224,
    Role.HA,
    doc="SLAVE: FORKED, the last offset its log shares with its master's; REFUSED, the offset it "
    "could not decide at; -1 otherwise",
)
CONN_FREE, CONN_WAITING_REPORT, CONN_TRANSFERRING, CONN_BEHIND_MIN_OFFSET = 0, 1, 2, 3


def ha_connection_field(slot: int, name: str) -> Field:
    """A master's connection slot (the ha worker): peer (IPv4 address << 16 | port, 0 other), the
    slave's last acknowledged offset (-1: none yet), when it was last heard and last caught up
    with the master's end (ms), and its CONN_* state."""
    assert 0 <= slot < HA_CONN_SLOTS
    return _f(
        f"ha_conn{slot}.{name}",
        HA_CONN_BASE + slot * len(HA_CONN_FIELDS) + HA_CONN_FIELDS.index(name),
        Role.HA,
    )


# PUT_LOCK_KIND values. LOCK_SEMAPHORE: a POSIX semaphore, the owner's pid written after taking it
# (shm/semaphores.py `PutLock`, the pure-Python reference). LOCK_ATOMIC: the low 32 bits of
# PUT_LOCK_OWNER_PID are the lock, compare-and-swapped from 0 to the owner's pid, bit 30 set while
# a waiter may sleep on it in a futex (rmq_mp/put/_core.c; shm/put_lock.py `AtomicPutLock`).
LOCK_SEMAPHORE, LOCK_ATOMIC = 0, 1
LOCK_WAITERS_BIT = 1 << 30
LOCK_OWNER_MASK = LOCK_WAITERS_BIT - 1


def lock_owner(word: int) -> int:
    """The owner's pid in PUT_LOCK_OWNER_PID's value (0: free), whichever the lock kind."""
    return word & LOCK_OWNER_MASK


# Slots 448..463: process identity.
SUPERVISOR_START_MS = _f(
    "supervisor_start_ms", 448, Role.SUPERVISOR,
    doc="the supervisor's process start time (psutil): with supervisor_pid, who it is; a reused pid is not it",
)  # fmt: skip

# Slots 480..511: failover (workers/ha_meta.py, rmq_mp/tools/promote.py; docs/replication.md):
# the metadata channel beside the HA port, and the role a promotion gave the running store.
HA_META_LISTEN_PORT = _f(
    "ha_meta_listen_port", 480, Role.HA, doc="port the metadata listener is bound to, 0 = none"
)
HA_META_CONNECTIONS = _f("ha_meta_connections", 481, Role.HA, doc="metadata connections open (master)")
HA_META_REFUSED = _f(
    "ha_meta_refused", 482, Role.HA,
    doc="metadata peers refused: outside haAllowedSlaves, past 32 at once, or a malformed or oversized message (either side)",
)  # fmt: skip
HA_META_SENT = _f("ha_meta_sent", 483, Role.HA, doc="MASTER: metadata snapshots sent")
HA_META_APPLIED = _f("ha_meta_applied", 484, Role.HA, doc="SLAVE: metadata snapshots applied")
HA_META_APPLIED_MS = _f("ha_meta_applied_ms", 485, Role.HA, doc="SLAVE: when the last snapshot was applied")
HA_META_MASTER_END = _f(
    "ha_meta_master_end", 486, Role.HA,
    doc="SLAVE: the master's commit-log end as its last snapshot said (what promotion compares with)",
)  # fmt: skip
HA_META_RESET_MS = _f(
    "ha_meta_reset_ms", 487, Role.CONSUMER, lock=Lock.FLAGS,
    doc="MASTER: time of this start's last deliberate move of group offsets (rmq-admin), 0 none: "
    "a slave copies the master's offsets exactly once for each new value, otherwise never lowers one",
)  # fmt: skip
HA_META_APPLIED_RESET_MS = _f(
    "ha_meta_applied_reset_ms", 488, Role.HA, doc="SLAVE: the master's reset time it last copied exactly"
)
BROKER_ROLE_NOW = _f(
    "broker_role_now", 489, Role.SUPERVISOR,
    doc="0: the descriptor's brokerRole; else the role a promotion gave (ROLE_CODES): what producers, "
    "workers and attaches read",
)  # fmt: skip
PROMOTE_REQUEST = _f(
    "promote_request", 490, Role.CONSUMER, Role.SUPERVISOR, lock=Lock.FLAGS,
    doc="rmq-admin promote: the role code asked for (the supervisor clears it when done)",
)  # fmt: skip
PROMOTIONS_DONE = _f(
    "promotions_done",
    491,
    Role.SUPERVISOR,
    doc="promotions the supervisor finished (rmq-admin promote waits on it)",
)
HA_META_MALFORMED = _f(
    "ha_meta_malformed", 492, Role.HA, doc="metadata connections closed for a malformed message"
)
HA_META_DELAY_FROM = _f(
    "ha_meta_delay_from", 493, Role.HA,
    doc="SLAVE: deliveries of delayed messages below this commit-log offset are in the followed delay "
    "offsets; a promotion looks above it for ones that are not (workers/promotion.py)",
)  # fmt: skip

FORK_READ_END = _f(
    "fork_read_end", 494, Role.SUPERVISOR, Role.HA,
    doc="SLAVE: readers serve nothing at or past this commit-log offset, where its log forks from its "
    "master's (the ha worker sets it the moment it finds the fork, the supervisor's restart cuts "
    "there), or from where it is not yet confirmed as its master's (HA_UNCONFIRMED_FROM, set by the "
    "supervisor's start); -1 none",
)  # fmt: skip
FORK_RESTARTS = _f(
    "fork_restarts", 495, Role.SUPERVISOR, doc="restarts this supervisor made by itself to cut a forked log"
)
HA_META_APPLIED_FULL = _f(
    "ha_meta_applied_full", 496, Role.HA,
    doc="SLAVE: full metadata snapshots applied (the master sends one after each change it sees; "
    "the rest of HA_META_APPLIED are heartbeats)",
)  # fmt: skip
# Slots 497, 498: a delete met in the log (the marker, rmq_mp/format/topic_marker.py): on a SLAVE
# (and a master whose supervisor died between the marker and its tombstone) reput writes the
# tombstone, the supervisor then drops the topic's group offsets and topics.json entry.
TOPIC_DELETE_MARKERS_APPLIED = _f(
    "topic_delete_markers_applied", 497, Role.REPUT,
    doc="deleteTopic markers reput met with no tombstone of theirs yet, and wrote it ('pending')",
)  # fmt: skip
TOPIC_DELETE_MARKERS_FINISHED = _f(
    "topic_delete_markers_finished", 498, Role.SUPERVISOR,
    doc="topic_delete_markers_applied the supervisor has finished (group offsets, topics.json): the "
    "metadata channel takes a full snapshot again when it moves",
)  # fmt: skip
HA_UNCONFIRMED_FROM = _f(
    "ha_unconfirmed_from", 499, Role.SUPERVISOR, Role.HA,
    doc="SLAVE: its log is confirmed as its master's only below this offset (rmq_mp/store/ha_log.py: "
    "set by the supervisor's start, FORK_READ_END equal to it, until the ha worker's first comparison "
    "finds the logs equal); -1 all of it, or a fork was found (then FORK_READ_END alone)",
)  # fmt: skip
# Slots 504..507: rmq-admin deleteTopic (rmq_mp/config/deleted_topics.py): asked by rmq-admin, done
# by the supervisor under the put lock, applied to the queue files by reput.
TOPIC_DELETE_REQUESTS = _f(
    "topic_delete_requests", 504, Role.CONSUMER, lock=Lock.FLAGS,
    doc="rmq-admin deleteTopic: deletes asked for (each a 'requested' tombstone in deletedTopics.json)",
)  # fmt: skip
TOPIC_DELETES_DONE = _f(
    "topic_deletes_done", 505, Role.SUPERVISOR,
    doc="the requests the supervisor has carried out (rmq-admin deleteTopic waits on it)",
)  # fmt: skip
TOPIC_DELETE_GENERATION = _f(
    "topic_delete_generation", 506, Role.SUPERVISOR, lock=Lock.PUT,
    doc="topics deleted this start: bumped under the put lock once a deleted topic's next offsets are 0",
)  # fmt: skip
TOPIC_DELETES_APPLIED = _f(
    "topic_deletes_applied", 507, Role.REPUT,
    doc="the topic_delete_generation reput has applied: old queue files gone, queue offsets reset "
    "(readers drop their cached queues when it moves)",
)  # fmt: skip
QUEUE_RESETS = _f(
    "queue_resets", 215, Role.REPUT, lock=Lock.FLAGS,
    doc="odd while reput removes deleted topics' queues and zeroes their offsets, even once done: the "
    "cleaner publishes a queue minimum, and deletes its files, only if it held still since the plan",
)  # fmt: skip

# Slot 508: reput's scheduling under SYNC_FLUSH (workers/reput.py `follow_backlog`).
REPUT_BEHIND_PASSES = _f(
    "reput_behind_passes", 508, Role.REPUT,
    doc="reputSyncFlushSchedIdle: passes that started IDLE_BACKLOG_BYTES behind and so left SCHED_IDLE",
)  # fmt: skip

# Slot 216: the flusher's gather under SYNC_FLUSH (workers/flusher.py `GroupGather`).
FLUSH_GATHER_TICKET = _f(
    "flush_gather_ticket", 216, Role.FLUSHER,
    doc="while the flusher gathers, the flush-request ticket whose producer posts its wakeup (the "
    "last one it waits for; 0: none): one wake a gather, not one a request",
)  # fmt: skip

ROLE_CODES = {"ASYNC_MASTER": 1, "SYNC_MASTER": 2, "SLAVE": 3}
"""BROKER_ROLE_NOW's values."""

FIELDS: tuple[Field, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Field))

POOL_BASE = 64
POOL_SLOTS = 32


def pool_file_offset(buffer: int) -> Field:
    """File start offset the pool buffer serves, -1 free. Borrowed by a producer under the put
    lock (a free buffer, for the file the put is starting), returned by the committer without it
    (a buffer whose file it has wholly committed, so no put writes there any more): a producer
    stores only into a free buffer's word and the committer only into a serving one's, so the
    two never store the same word at once; each store is one aligned word."""
    assert 0 <= buffer < POOL_SLOTS
    return _f(f"pool{buffer}_file_offset", POOL_BASE + buffer, Role.PRODUCER, Role.COMMITTER)


WORKER_BASE = 96
WORKER_FIELDS = (
    "pid",
    "state",
    "heartbeat_ms",
    "restarts",
    "notified",
    "last_work_ms",
    "work_count",
    "errors",
    "stop",
)
WORKER_STRIDE = 16


def worker_field(role: str, name: str) -> Field:
    """Per-worker fields: pid, restarts and stop by the supervisor; notified by any waker (the worker
    clears it, a benign race: a lost flag costs one interval); the rest by the worker itself."""
    index = WORKER_BASE + ROLES.index(role) * WORKER_STRIDE + WORKER_FIELDS.index(name)
    worker_role = Role(role)
    if name in ("pid", "restarts", "stop"):
        return _f(f"{role}.{name}", index, Role.SUPERVISOR)
    if name == "notified":
        return _f(f"{role}.{name}", index, *Role)
    return _f(f"{role}.{name}", index, worker_role)


# Worker states (written by the worker).
W_STOPPED, W_STARTING, W_READY, W_STOPPING = 0, 1, 2, 3

TABLE_SLOTS = max(
    WORKER_BASE + len(ROLES) * WORKER_STRIDE,
    HA_CONN_BASE + HA_CONN_SLOTS * len(HA_CONN_FIELDS),
    LIVE_BASE + LIVE_SLOTS,
    *(f.index + 1 for f in FIELDS),
)
TABLE_SIZE = ((TABLE_SLOTS * 8 + 4095) // 4096) * 4096


def all_fields() -> list[Field]:
    """Every field of the table: the named ones, the pool slots, each worker's, each replication
    connection's and the live settings."""
    pool = [pool_file_offset(i) for i in range(POOL_SLOTS)]
    workers = [worker_field(role, name) for role in ROLES for name in WORKER_FIELDS]
    ha = [ha_connection_field(slot, name) for slot in range(HA_CONN_SLOTS) for name in HA_CONN_FIELDS]
    live = [live_setting(i) for i in range(LIVE_SLOTS)]
    return [*FIELDS, *pool, *workers, *ha, *live]


def check_layout() -> None:
    """The table proves itself at import: no two fields share a slot, every field lies inside
    the segment, and each names a writer (a field nobody may write is a typo)."""
    owner: dict[int, str] = {}
    for f in all_fields():
        if not 0 <= f.index < TABLE_SIZE // 8:
            raise AssertionError(f"pointer-table field {f.name} at slot {f.index} lies outside the table")
        if f.index in owner:
            raise AssertionError(f"pointer-table fields {owner[f.index]} and {f.name} share slot {f.index}")
        if not f.writers:
            raise AssertionError(f"pointer-table field {f.name} names no writer")
        owner[f.index] = f.name
    if len(WORKER_FIELDS) > WORKER_STRIDE:
        raise AssertionError("a worker's fields overflow its stride")


check_layout()
