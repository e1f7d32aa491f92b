"""RocketMQ 4.9.8 outcome enums (names as in the Java source) and the result values built on them.

See docs/format.md §3.1 (PutMessageStatus, AppendMessageStatus) and §12 (GetMessageStatus).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmq_mp.format.message import MessageExt


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = "LMQ_CONSUME_QUEUE_NUM_EXCEEDED"

    @property
    def ok(self) -> bool:
        """The one meaning of ok, for every put result (`PutMessageResult`, `SendResult`,
        `SendBatchResult`): PUT_OK, the message stored as durable (and replicated) as the put
        asked; RocketMQ's client calls it SEND_OK. What callers branch on: the Spark sink, a
        push consumer's send-back, `rmq-admin sendMessage`'s exit status, the scheduler."""
        return self is PutMessageStatus.PUT_OK

    @property
    def stored(self) -> bool:
        """In the log but maybe not ok: PUT_OK, or FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or
        SLAVE_NOT_AVAILABLE (stored, not flushed or replicated in time). RocketMQ's
        `PutMessageResult.isOk()`; a caller that sends again after one of these stores it twice."""
        return self in _STORED


_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


class AppendMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class ConsumeConcurrentlyStatus(enum.Enum):
    """What a concurrent listener answers for its messages (MessageListenerConcurrently)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener answers (MessageListenerOrderly): SUSPEND_CURRENT_QUEUE_A_MOMENT
    consumes the same messages again after a pause, keeping the queue's order."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass(frozen=True, slots=True)
class PutMessageResult:
    """Outcome of one put (or one batch). Offsets are -1 when nothing was appended."""

    status: PutMessageStatus
    msg_id: str = ""
    queue_offset: int = -1
    phy_offset: int = -1
    wrote_bytes: int = 0
    msg_num: int = 0
    store_timestamp: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        """`PutMessageStatus.ok`: PUT_OK."""
        return self.status is PutMessageStatus.PUT_OK

    @property
    def stored(self) -> bool:
        """`PutMessageStatus.stored`: in the log (RocketMQ's ``isOk()``), maybe not flushed."""
        return self.status in _STORED


@dataclass(frozen=True, slots=True)
class GetMessageResult:
    """Outcome of a read by topic/queue/offset, as RocketMQ's GetMessageResult."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)


class RunningFlags(enum.IntFlag):
    """RocketMQ's RunningFlags bits (docs/format.md §11), kept in the pointer table."""

    NOT_READABLE = 1
    NOT_WRITEABLE = 1 << 1
    WRITE_LOGICS_QUEUE_ERROR = 1 << 2
    WRITE_INDEX_FILE_ERROR = 1 << 3
    DISK_FULL = 1 << 4

    @classmethod
    def put_blockers(cls) -> RunningFlags:
        """The bits `isWriteable()` checks: any of them refuses puts."""
        return cls.NOT_WRITEABLE | cls.WRITE_LOGICS_QUEUE_ERROR | cls.WRITE_INDEX_FILE_ERROR | cls.DISK_FULL

    @classmethod
    def names(cls, bits: int) -> list[str]:
        return [flag.name for flag in cls if bits & flag and flag.name]
