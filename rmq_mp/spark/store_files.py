"""What Spark tasks need to know about a store: where it is, its queues' offset ranges, and how
to read ConsumeQueue entries and CommitLog records by path.

Why by path: Spark tasks run in other processes (and, on a cluster, other machines), so they get
a small picklable `StoreRef` and map the files themselves; 1 GiB segments never travel through
Spark. Offsets come from the queue-offset table in shared memory
when the store is running (only what reput has dispatched is visible, as for `Consumer`), and
from a read-only `MessageStore` open (recovery's analysis, in memory) when it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rmq_mp.config.store_config import MessageStoreConfig, parse_properties
from rmq_mp.errors import DataLossError, ShmAttachError, StoreError
from rmq_mp.format.queue_entry import CQ_ENTRY_DTYPE, CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.message_store import MessageStore, queue_end_below
from rmq_mp.store.running_store import resolve_names
from shm import layout
from shm import queue_offsets as qo
from shm.layout import Role
from shm.pointer_table import PointerTable
from shm.queue_offsets import QueueOffsetTable
from shm.store_shm import read_descriptor

RECORD_PAD_BYTES = 256
"""Zero bytes after the last gathered record, so a torn record's header reads stay in bounds."""


@dataclass(frozen=True, slots=True)
class StoreRef:
    """A store as Spark tasks see it: picklable, no open files."""

    root: str
    commit_log_dir: str
    commit_log_file_size: int
    cq_file_size: int
    shm_base: str | None
    """The running store's shm name, None for a store read offline."""

    @property
    def broker(self) -> str:
        """The `broker` column: the store root, one per broker when reading several."""
        return self.root

    @property
    def running(self) -> bool:
        return self.shm_base is not None

    def config(self) -> MessageStoreConfig:
        return MessageStoreConfig().replace(
            store_path_root_dir=self.root,
            store_path_commit_log=self.commit_log_dir,
            mapped_file_size_commit_log=self.commit_log_file_size,
            mapped_file_size_consume_queue=self.cq_file_size,
            message_index_enable=False,
        )

    def cq_dir(self, topic: str, queue_id: int) -> Path:
        return Path(self.root) / "consumequeue" / topic / str(queue_id)


def _first_file_size(directory: Path) -> int | None:
    names = sorted(p for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []
    return names[0].stat().st_size if names else None


def resolve_store(spec: str, conf: str | None = None) -> StoreRef:
    """A store given as a directory or a running store's shm name.

    A running store's settings come from its shared memory. Offline, the file sizes come from
    ``conf`` (a broker.conf) when given, else from the segment files themselves (every segment
    but a torn last one has the configured size)."""
    spec = spec.strip()
    if not Path(spec).is_dir() and "/" in spec.lstrip("/"):
        raise StoreError(f"store {spec!r}: not a directory and no running store has that shm name")
    names = resolve_names(spec)
    try:
        descriptor = read_descriptor(names)
    except (ShmAttachError, ValueError):
        descriptor = None
    if descriptor is not None:
        config = MessageStoreConfig.from_properties(descriptor["properties"], source=f"shm {names.base}")
        root = str(Path(descriptor["root"]).resolve())
        return StoreRef(
            root=root,
            commit_log_dir=str(config.commit_log_dir),
            commit_log_file_size=config.mapped_file_size_commit_log,
            cq_file_size=config.mapped_file_size_consume_queue,
            shm_base=names.base,
        )
    root_path = Path(spec)
    if not root_path.is_dir():
        raise StoreError(f"store {spec!r}: not a directory and no running store has that shm name")
    if conf:
        properties = parse_properties(Path(conf).read_text(encoding="utf-8-sig"), source=conf)
        properties["storePathRootDir"] = str(root_path)
        config = MessageStoreConfig.from_properties(properties, source=conf)
    else:
        config = MessageStoreConfig().replace(store_path_root_dir=str(root_path))
        log_size = _first_file_size(Path(config.commit_log_dir))
        cq_sizes = [
            size
            for topic_dir in sorted((root_path / "consumequeue").glob("*/*"))
            if (size := _first_file_size(topic_dir)) is not None
        ]
        config = config.replace(
            mapped_file_size_commit_log=log_size or config.mapped_file_size_commit_log,
            mapped_file_size_consume_queue=max(cq_sizes, default=config.mapped_file_size_consume_queue),
        )
    if not Path(config.commit_log_dir).is_dir() and not (root_path / "consumequeue").is_dir():
        raise StoreError(f"store {spec!r}: not a store directory (no commitlog/ or consumequeue/)")
    return StoreRef(
        root=str(root_path.resolve()),
        commit_log_dir=str(Path(config.commit_log_dir).resolve()),
        commit_log_file_size=config.mapped_file_size_commit_log,
        cq_file_size=config.mapped_file_size_consume_queue,
        shm_base=None,
    )


@dataclass(frozen=True, slots=True)
class QueueRange:
    """A queue's servable offsets ``[min_offset, max_offset)``."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int


def queue_ranges(store: StoreRef, topics: frozenset[str] | None = None) -> list[QueueRange]:
    """Every queue of ``topics`` (all topics when None), sorted by topic and queue id."""
    found: list[QueueRange] = []
    if store.shm_base is not None:
        names = resolve_names(store.shm_base)
        try:
            table = QueueOffsetTable.attach(names.queue_offsets, Role.CONSUMER)
            pointers = PointerTable.attach(names.pointer_table, Role.CONSUMER)
        except ShmAttachError as exc:
            raise StoreError(f"store {store.root} stopped while planning a read: {exc}") from exc
        try:
            fork_read_end = pointers.get(layout.FORK_READ_END)
            for topic, queue_id, slot in table.queues():
                if topics is None or topic in topics:
                    low, high = table.get(slot, qo.MIN_OFFSET), table.get(slot, qo.DISPATCHED)
                    if fork_read_end >= 0:
                        high = _below_fork(store, topic, queue_id, low, high, fork_read_end)
                    found.append(QueueRange(topic, queue_id, low, high))
        finally:
            pointers.close()
            table.close()
    else:
        with MessageStore.open(config=store.config(), read_only=True) as ms:
            for topic in ms.topics():
                if topics is None or topic in topics:
                    found.extend(
                        QueueRange(topic, q.queue_id, q.min_offset, q.max_offset)
                        for q in ms.queue_status(topic)
                    )
    return sorted(found, key=lambda q: (q.topic, q.queue_id))


def _below_fork(store: StoreRef, topic: str, queue_id: int, low: int, high: int, fork_read_end: int) -> int:
    """The first queue offset in ``[low, high)`` whose entry is at or past a slave's
    `FORK_READ_END` (``high`` when none is): a read planned now ends there, as a consumer's pull
    does (`queue_end_below`, the search `Consumer.max_offset` makes)."""
    return queue_end_below(
        low,
        high,
        lambda offset: int(read_cq_entries(store, topic, queue_id, offset, offset + 1)["phy"][0]),
        fork_read_end,
    )


def read_cq_entries(store: StoreRef, topic: str, queue_id: int, start: int, end: int) -> np.ndarray:
    """ConsumeQueue entries ``[start, end)`` of one queue (structured: phy, size, tags), read
    from the files by position. A missing file is `DataLossError` (deleted by the cleaner)."""
    per_file = store.cq_file_size // CQ_STORE_UNIT_SIZE
    parts = []
    offset = start
    while offset < end:
        file_index = offset // per_file
        count = min(end, (file_index + 1) * per_file) - offset
        path = store.cq_dir(topic, queue_id) / offset_to_file_name(file_index * store.cq_file_size)
        try:
            entries = np.fromfile(
                path,
                dtype=CQ_ENTRY_DTYPE,
                count=count,
                offset=(offset - file_index * per_file) * CQ_STORE_UNIT_SIZE,
            )
        except FileNotFoundError as exc:
            raise DataLossError(f"{topic}/{queue_id} offsets from {offset}: file {path} is gone") from exc
        if len(entries) < count:
            raise StoreError(f"{path}: {len(entries)} entries where {count} were dispatched")
        parts.append(entries)
        offset += count
    return np.concatenate(parts) if parts else np.zeros(0, dtype=CQ_ENTRY_DTYPE)


def valid_entries(entries: np.ndarray) -> np.ndarray:
    """Mask of entries that point at a record (pre-blank padding of a queue starting above 0 not)."""
    return (entries["size"] != PRE_BLANK_SIZE) & (entries["size"] > 0)


class SegmentReader:
    """Gathers records from CommitLog segments mapped read-only; closed after each task."""

    def __init__(self, store: StoreRef) -> None:
        self.store = store
        self._maps: dict[int, np.memmap] = {}
        self._views: dict[int, np.ndarray] = {}

    def segment(self, file_offset: int) -> np.ndarray:
        """The segment's bytes: a plain array over its mapping (a `np.memmap` slice costs a few
        microseconds more, which a read of scattered records, one tag in ten, pays per record)."""
        view = self._views.get(file_offset)
        if view is None:
            path = Path(self.store.commit_log_dir) / offset_to_file_name(file_offset)
            try:
                mm = np.memmap(path, dtype=np.uint8, mode="r")
            except FileNotFoundError as exc:
                raise DataLossError(f"commit-log segment {path} is gone (deleted by the cleaner)") from exc
            self._maps[file_offset] = mm
            view = self._views[file_offset] = mm.view(np.ndarray)
        return view

    def gather(self, phy: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(buffer holding the records back to back, each record's start in it). ``phy`` ascends."""
        file_size = self.store.commit_log_file_size
        file_offsets = phy - phy % file_size
        out = np.empty(int(size.sum()) + RECORD_PAD_BYTES, dtype=np.uint8)
        out[-RECORD_PAD_BYTES:] = 0
        starts = np.zeros(len(phy), dtype=np.int64)
        np.cumsum(size[:-1], out=starts[1:])
        # Copy runs of back-to-back records (same segment, each starting where the last ended) at once.
        ends = phy + size
        breaks = np.flatnonzero((phy[1:] != ends[:-1]) | (file_offsets[1:] != file_offsets[:-1])) + 1
        for lo, hi in zip(np.r_[0, breaks].tolist(), np.r_[breaks, len(phy)].tolist(), strict=True):
            file_offset = int(file_offsets[lo])
            seg = self.segment(file_offset)
            begin, end = int(phy[lo]) - file_offset, int(ends[hi - 1]) - file_offset
            if end > len(seg):
                raise StoreError(f"commit-log record beyond segment {file_offset}'s end")
            base = int(starts[lo])
            out[base : base + end - begin] = seg[begin:end]
        return out, starts

    def close(self) -> None:
        self._views.clear()
        for mm in self._maps.values():
            mm._mmap.close()  # type: ignore[attr-defined]
        self._maps.clear()


def store_timestamp_ms(reader: SegmentReader, phy: int, size: int) -> int:
    """STORETIMESTAMP of one record (for time-based pruning by binary search)."""
    from rmq_mp.format import record

    buf, _ = reader.gather(np.array([phy], dtype=np.int64), np.array([size], dtype=np.int64))
    sys_flag = int.from_bytes(bytes(buf[record.POS_SYS_FLAG : record.POS_SYS_FLAG + 4]), "big", signed=True)
    pos = record.store_timestamp_position(sys_flag)
    return int.from_bytes(bytes(buf[pos : pos + 8]), "big", signed=True)


def first_offset_at_or_after(store: StoreRef, q: QueueRange, lo: int, hi: int, timestamp_ms: int) -> int:
    """The first queue offset in ``[lo, hi)`` whose store time is >= ``timestamp_ms`` (``hi`` if
    none). Store times rise with queue offsets (both are assigned under the put lock), which is
    what RocketMQ's `getOffsetInQueueByTime` relies on too."""
    reader = SegmentReader(store)
    try:
        while lo < hi:
            mid = (lo + hi) // 2
            entry = read_cq_entries(store, q.topic, q.queue_id, mid, mid + 1)[0]
            if (
                int(entry["size"]) == PRE_BLANK_SIZE
                or store_timestamp_ms(reader, int(entry["phy"]), int(entry["size"])) < timestamp_ms
            ):
                lo = mid + 1
            else:
                hi = mid
        return lo
    finally:
        reader.close()
