"""rmq-mp: RocketMQ 4.9's storage engine in Python, byte-compatible with its store directory.

The library half: open a store directory (`MessageStore`), put and read messages, recover from
crashes, inspect files. The service half (supervisor, shared memory, worker processes) builds on
it. See README.md.
"""

from rmq_mp.config import BrokerRole, FlushDiskType, MessageStoreConfig
from rmq_mp.errors import (
    BodyCrcError,
    ConfigError,
    ConfigFileError,
    ConsumerOffsetLossError,
    CorruptFileError,
    CorruptRecordError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidMessageIdError,
    MessageNotFoundError,
    OffsetTableFullError,
    ShmAttachError,
    StoreError,
    StoreLockedError,
    StorePathError,
    StoreReadOnlyError,
)
from rmq_mp.message import Message, MessageExt
from rmq_mp.message_store import MessageStore, QueueStatus
from rmq_mp.status import (
    AppendMessageStatus,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

_SERVICE_CLIENTS = {
    "Producer": "rmq_mp.producer",
    "SendResult": "rmq_mp.producer",
    "SendBatchResult": "rmq_mp.producer",
    "MessageBatch": "rmq_mp.message_batch",
    "Consumer": "rmq_mp.consumer",
    "GetResult": "rmq_mp.consumer",
    "PushConsumer": "rmq_mp.push_consumer",
    "ConsumerStateError": "rmq_mp.push_consumer",
    "MessageModel": "rmq_mp.rebalance",
}


def __getattr__(name: str) -> object:
    """The service clients load on first use: they import `shm`, which imports this package."""
    module = _SERVICE_CLIENTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rmq_mp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AppendMessageStatus",
    "BodyCrcError",
    "BrokerRole",
    "ConfigError",
    "ConfigFileError",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyStatus",
    "Consumer",
    "ConsumerOffsetLossError",
    "ConsumerStateError",
    "CorruptFileError",
    "CorruptRecordError",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "GetResult",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidMessageIdError",
    "Message",
    "MessageBatch",
    "MessageExt",
    "MessageModel",
    "MessageNotFoundError",
    "MessageStore",
    "MessageStoreConfig",
    "OffsetTableFullError",
    "Producer",
    "PushConsumer",
    "PutMessageResult",
    "PutMessageStatus",
    "QueueStatus",
    "SendBatchResult",
    "SendResult",
    "ShmAttachError",
    "StoreError",
    "StoreLockedError",
    "StorePathError",
    "StoreReadOnlyError",
]
