"""One rotated log per store process under ``<store>/logs/`` (RocketMQ keeps store.log).

``supervisor.log``, ``allocator.log``, ``committer.log``, ``flusher.log``, ``reput.log`` and
``cleaner.log``: INFO and above, the store's own lines only (start and stop, recovery progress,
flushes over 500 ms, put-lock holds over 500 ms, cleaner decisions, worker restarts), so an idle
store writes nothing. Files rotate at `MAX_BYTES` keeping `BACKUPS` old ones. Stderr keeps
warnings and errors (``RMQ_LOG_LEVEL`` changes that level).
"""

from __future__ import annotations

import logging
import os
from logging.handlers import RotatingFileHandler
from pathlib import Path

from rmq_mp import file_modes

MAX_BYTES = 16 * 1024 * 1024
BACKUPS = 5
LOG_DIR = "logs"
FORMAT = "%(asctime)s %(levelname)s {process}[%(process)d] %(name)s: %(message)s"


def log_dir(store_root: str | os.PathLike[str]) -> Path:
    return Path(store_root) / LOG_DIR


def setup_process_logging(store_root: str | os.PathLike[str] | None, process: str) -> Path | None:
    """Configure this process's logging: stderr at ``RMQ_LOG_LEVEL`` (default WARNING) and,
    given a store, ``<store>/logs/<process>.log`` at INFO. Returns the log file's path."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT.format(process=process))
    console = logging.StreamHandler()
    console.setLevel(os.environ.get("RMQ_LOG_LEVEL", "WARNING").upper())
    console.setFormatter(formatter)
    root.addHandler(console)
    root.setLevel(min(console.level, logging.INFO) if store_root is not None else console.level)
    if store_root is None:
        return None
    directory = log_dir(store_root)
    directory.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
    path = directory / f"{process}.log"
    file_handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(formatter)
    root.addHandler(file_handler)
    return path
