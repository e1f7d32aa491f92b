"""rmq-mp: RocketMQ 4.9's storage engine in Python, byte-compatible with its store directory.

The library half: open a store directory (`MessageStore`), put and read messages, recover from
crashes, inspect files. The service half (supervisor, shared memory, worker processes) builds on
it. See README.md.
"""

from rmq_mp.config import BrokerRole, FlushDiskType, MessageStoreConfig
from rmq_mp.errors import (
    ConfigError,
    ConfigFileError,
    CorruptFileError,
    CorruptRecordError,
    InvalidMessageIdError,
    MessageNotFoundError,
    StoreError,
    StoreLockedError,
    StoreReadOnlyError,
)
from rmq_mp.message import Message, MessageExt
from rmq_mp.message_store import MessageStore, QueueStatus
from rmq_mp.status import (
    AppendMessageStatus,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

__all__ = [
    "AppendMessageStatus",
    "BrokerRole",
    "ConfigError",
    "ConfigFileError",
    "CorruptFileError",
    "CorruptRecordError",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "InvalidMessageIdError",
    "Message",
    "MessageExt",
    "MessageNotFoundError",
    "MessageStore",
    "MessageStoreConfig",
    "PutMessageResult",
    "PutMessageStatus",
    "QueueStatus",
    "StoreError",
    "StoreLockedError",
    "StoreReadOnlyError",
]
