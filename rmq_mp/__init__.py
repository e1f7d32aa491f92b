"""rmq-mp: RocketMQ 4.9's storage engine in Python, byte-compatible with its store directory.

The library half: open a store directory (`MessageStore`), put and read messages, recover from
crashes, inspect files. The service half (supervisor, shared memory, worker processes) builds on
it. See README.md and docs/architecture.md for the tree:

    format/  bytes: messages, records          put/     a producer appends to the commit log
    store/   the store's files and engine      client/  consumers of a running store
    config/  broker.conf and config/*.json     tools/   rmq-admin, status, metrics
    spark/   the `rmq` data source and jobs    outcomes.py, errors.py  what calls answer

Every public name loads on first use (PEP 562): `import rmq_mp.errors`, the first thing `shm/`
and every worker process imports, must not load the whole library (numpy, the put path).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmq_mp.client.consumer import ConsumeFromWhere, Consumer, GetResult, QueueNotAssignedError
    from rmq_mp.client.push_consumer import ConsumerStateError, PushConsumer
    from rmq_mp.client.rebalance import MessageModel
    from rmq_mp.config.store_config import BrokerRole, FlushDiskType, MessageStoreConfig
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
        SendRefusedError,
        ShmAttachError,
        StoreError,
        StoreLockedError,
        StorePathError,
        StoreReadOnlyError,
    )
    from rmq_mp.format.message import Message, MessageExt
    from rmq_mp.format.message_batch import MessageBatch
    from rmq_mp.outcomes import (
        AppendMessageStatus,
        ConsumeConcurrentlyStatus,
        ConsumeOrderlyStatus,
        GetMessageResult,
        GetMessageStatus,
        PutMessageResult,
        PutMessageStatus,
    )
    from rmq_mp.put.locked import ThreadSafeProducer
    from rmq_mp.put.producer import Producer
    from rmq_mp.put.results import SendBatchResult, SendResult
    from rmq_mp.store.message_store import MessageStore, QueueStatus

_HOMES = {
    "rmq_mp.client.consumer": ("ConsumeFromWhere", "Consumer", "GetResult", "QueueNotAssignedError"),
    "rmq_mp.client.push_consumer": ("ConsumerStateError", "PushConsumer"),
    "rmq_mp.client.rebalance": ("MessageModel",),
    "rmq_mp.config.store_config": ("BrokerRole", "FlushDiskType", "MessageStoreConfig"),
    "rmq_mp.errors": (
        "BodyCrcError",
        "ConfigError",
        "ConfigFileError",
        "ConsumerOffsetLossError",
        "CorruptFileError",
        "CorruptRecordError",
        "InvalidArgumentError",
        "InvalidArgumentTypeError",
        "InvalidMessageIdError",
        "MessageNotFoundError",
        "OffsetTableFullError",
        "SendRefusedError",
        "ShmAttachError",
        "StoreError",
        "StoreLockedError",
        "StorePathError",
        "StoreReadOnlyError",
    ),
    "rmq_mp.format.message": ("Message", "MessageExt"),
    "rmq_mp.format.message_batch": ("MessageBatch",),
    "rmq_mp.outcomes": (
        "AppendMessageStatus",
        "ConsumeConcurrentlyStatus",
        "ConsumeOrderlyStatus",
        "GetMessageResult",
        "GetMessageStatus",
        "PutMessageResult",
        "PutMessageStatus",
    ),
    "rmq_mp.put.locked": ("ThreadSafeProducer",),
    "rmq_mp.put.producer": ("Producer",),
    "rmq_mp.put.results": ("SendBatchResult", "SendResult"),
    "rmq_mp.store.message_store": ("MessageStore", "QueueStatus"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'rmq_mp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AppendMessageStatus",
    "BodyCrcError",
    "BrokerRole",
    "ConfigError",
    "ConfigFileError",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
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
    "QueueNotAssignedError",
    "QueueStatus",
    "SendBatchResult",
    "SendRefusedError",
    "SendResult",
    "ShmAttachError",
    "StoreError",
    "StoreLockedError",
    "StorePathError",
    "StoreReadOnlyError",
    "ThreadSafeProducer",
]
