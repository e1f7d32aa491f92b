"""What the supervisor keeps of each worker process, and which workers a store's role runs.
Apart from workers/supervisor.py so that workers/promotion.py, which the supervisor calls,
can restart the ha worker without importing the supervisor back."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from workers.spawn import WorkerProcess


def replicates(config: MessageStoreConfig) -> bool:
    """Whether the store runs the ha worker: a master with haListenPort set (RocketMQ always
    listens; rmq-mp where asked), or a SLAVE with haMasterAddress."""
    if config.broker_role is BrokerRole.SLAVE:
        return bool(config.ha_master_address)
    return config.ha_listen_port >= 0


@dataclass
class WorkerHandle:
    role: str
    process: WorkerProcess | None = None
    restarts: int = 0
    consecutive: int = 0
    restart_at: float = 0.0
    started_at: float = field(default_factory=time.monotonic)
