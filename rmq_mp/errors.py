"""Typed, picklable exceptions: misuse and faults, never outcomes.

Outcomes of puts and gets are RocketMQ status enums (`rmq_mp.outcomes`). Exceptions are for
what a caller did wrong or what is broken on disk. Every class keeps its constructor
arguments in ``args`` so instances cross process boundaries through pickle unchanged.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error rmq-mp raises on purpose."""


class ConfigError(StoreError):
    """`conf/broker.conf` (or a programmatic override) names an unknown key or a value the
    store cannot run with. The message names the property and, for a misspelling, the closest
    valid name (RocketMQ ignores such keys silently: issue #2260)."""


class StoreLockedError(StoreError):
    """Another process holds the store's `lock` file: RocketMQ's "Lock failed,MQ already
    started"."""


class CorruptFileError(StoreError):
    """A store file cannot be used as it is and recovery must not guess: a CommitLog or
    ConsumeQueue file that is not the last one has the wrong size, or a name that is not an
    offset; or a running store's file a read needs is gone (deleted under it)."""


class CorruptRecordError(StoreError):
    """Bytes at a CommitLog position are not a valid record (bad magic, size or CRC), or not the
    record a ConsumeQueue entry promised, when the caller asked for that exact record. Scans and
    queue reads report, count and skip such a record instead of raising (rmq_mp/store/read_damage.py)."""


class BodyCrcError(CorruptRecordError):
    """The record is whole and well-formed, but the CRC-32 of its stored body is not its BODYCRC
    field: body bytes changed on disk (a bad sector, a stray write). Its body is never served."""


class ConfigFileError(StoreError):
    """A `config/*.json` file and its `.bak` are both missing or unparseable where the caller
    required content."""


class ConsumerOffsetLossError(ConfigFileError):
    """The commit log holds messages but ``config/consumerOffset.json`` is missing, damaged or
    older than what was last persisted, so consumer groups would silently go back (or forward).
    The message names the file, what could be salvaged and the setting that accepts the loss
    (``acceptConsumerOffsetLoss``); nothing was changed on disk."""


class StorePathError(StoreError):
    """A path the store needs is not what belongs there (a directory where a file belongs or
    the reverse, a store root that is a file or on a pseudo-filesystem such as /proc) or cannot
    be read or created. The message names the path; nothing was changed on disk."""


class MessageNotFoundError(StoreError):
    """A lookup by commit-log offset or msgId points outside the stored range."""


class InvalidMessageIdError(StoreError):
    """A msgId string is not 32 (IPv4) or 56 (IPv6) hexadecimal characters."""


class StoreReadOnlyError(StoreError):
    """A write was attempted on a store opened read-only."""


class ShmAttachError(StoreError):
    """Attaching to a running store's shared memory failed: the store is not running, or it
    belongs to another user (segments are created with mode 0600)."""


class StoreNotRunningError(ShmAttachError):
    """The store named is not running (no supervisor holds its shared memory)."""


class FenceRefusedError(StoreError):
    """A start of the store could not be fenced (`rmq_mp.put.fence`): a live producer of it holds
    its put lock (stopped mid-put, or hung) longer than the fencer waits, so its files may still
    be written and must not be saved, recovered or reused. The message names the pid."""


class FileChangedError(StoreError):
    """A store file changed while recovery or a reader of a stopped store read it: another
    process (an old start's producer or worker) still writes it. Nothing is cut or repaired."""


class DataLossError(StoreError):
    """Messages a Spark query asked for are gone: below the queue's minimum offset (the cleaner
    deleted their files) or their files vanished while reading. Raised unless the query set
    ``failOnDataLoss=false``, as Spark's Kafka source does."""


class InvalidBatchError(StoreError):
    """A `MessageBatch` that cannot be one: several topics or queues, per-message properties,
    a delay level, or a keys list whose length is not the bodies'."""


class OffsetTableFullError(StoreError):
    """A shared offset table holds its configured capacity already: a commit of new group
    offsets past ``maxConsumerOffsetNum`` (nothing of that commit is recorded), or a queue past
    ``maxConsumeQueueNum`` outside `send` (which answers LMQ_CONSUME_QUEUE_NUM_EXCEEDED). The
    message names the setting to raise."""


class InvalidArgumentError(StoreError, ValueError):
    """An argument of a public call (`Producer.attach`, `Consumer.attach`, `pull`, `commit`,
    `subscribe`, ...) that RocketMQ would refuse: a group name breaking `Validators.checkGroup`
    (blank, over 255 characters, outside ``^[%|a-zA-Z0-9_-]+$``), a queue id outside 0..2^31-1,
    an offset that is negative or not a Java long, a topic the store can never hold. Raised
    before anything is read or written; the message names the rule. A send answers such values
    with MESSAGE_ILLEGAL instead (a status, as RocketMQ's store does)."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (a str body, a float queue id, a None topic), where Java's
    signatures would not compile: raised by every public call, sends included, before anything
    is read or written, naming the argument and the type it needs."""


class SendRefusedError(StoreError):
    """`SendResult.raise_for_status` / `SendBatchResult.raise_for_status`: a send was not ok
    (its PutMessageStatus is not PUT_OK). ``status`` and ``reason`` say why; ``stored`` whether
    the message is in the log all the same (FLUSH_DISK_TIMEOUT and the like: retrying it stores
    it twice)."""

    def __init__(self, message: str, status: object, reason: str, stored: bool) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.stored = stored


class HaProtocolError(StoreError):
    """A replication peer sent bytes RocketMQ's HA protocol does not allow (a frame longer than a
    batch can be, a negative length or offset, a frame not at the slave's end, a report beyond
    the master's end): the connection is closed and nothing of it is written."""
