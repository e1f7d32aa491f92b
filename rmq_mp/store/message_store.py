"""MessageStore: a store directory opened as a library, the read API and an in-process writer.

Mirrors the data side of `DefaultMessageStore`: open (lock, load, recover, abort marker), put
by the producers' own sequence (`put_rules`: checks, delay rewrite, encode, queue-offset rule;
the append is `CommitLog.append`, see put_rules for why), and the reads RocketMQ offers
(getMessage, lookMessageByOffset, viewMessageById, queryMessage, getOffsetInQueueByTime). In this
library form dispatch runs inline after each put; the service moves it to the reput worker.

``read_only=True`` opens any store, a crashed one or one on a read-only medium included, without
taking the lock or writing a byte: recovery's analysis runs in memory only.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rmq_mp import file_modes
from rmq_mp import validators as v
from rmq_mp.config.config_manager import CHECKSUMS_NAME, LoadResult
from rmq_mp.config.deleted_topics import DONE, PENDING, REQUESTED, DeletedTopics
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.config.store_config import BrokerRole, MessageStoreConfig
from rmq_mp.config.topics import TopicConfigManager
from rmq_mp.errors import (
    ConfigError,
    ConsumerOffsetLossError,
    CorruptRecordError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MessageNotFoundError,
    StoreError,
    StoreLockedError,
    StorePathError,
    StoreReadOnlyError,
)
from rmq_mp.format import message as m
from rmq_mp.format import record, topic_marker
from rmq_mp.format.queue_entry import CQ_ENTRY, CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import (
    AppendMessageStatus,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)
from rmq_mp.paths import StorePaths, fsync_dir
from rmq_mp.store import fork, ha_log, put_rules, read_damage
from rmq_mp.store.checkpoint import StoreCheckpoint
from rmq_mp.store.commit_log import CommitLog
from rmq_mp.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from rmq_mp.store.dispatch import Dispatcher
from rmq_mp.store.index_service import IndexService
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.mapping_pool import process_pool
from rmq_mp.store.read_damage import INDEX_ENTRY_INVALID, RECORD_INVALID, ReadSkips, queue_message
from rmq_mp.store.recovery import RecoveryReport, cut_at, recover
from rmq_mp.store.reporter import Reporter
from rmq_mp.store.topic_deletion import remove_old_queues

log = logging.getLogger(__name__)

MAX_TIMESTAMP = (1 << 63) - 1
TOTAL_MEMORY_BYTES = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
"""Physical memory (RocketMQ's StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE): `accessMessageInMemoryMaxRatio`
percent of it is taken to hold the newest commit-log bytes in the page cache."""


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One queue's offsets, as mqadmin topicStatus shows them."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int


class MessageStore:
    """A store directory. Use `MessageStore.open`; close it (or use ``with``) to shut down cleanly."""

    def __init__(self, config: MessageStoreConfig, *, read_only: bool) -> None:
        self.config = config
        self.writable = not read_only
        if len(config.commit_log_dirs) > 1 or config.read_only_commit_log_dirs:
            raise ConfigError(
                "storePathCommitLog with several directories and readOnlyCommitLogStorePaths are not "
                "supported yet (RocketMQ's MultiPathMappedFileQueue): use one commit-log directory"
            )
        self.paths = StorePaths.of(config.store_path_root_dir, config.commit_log_dir)
        self.reporter = Reporter()
        self.read_skips = ReadSkips(self.reporter)
        """Records reads skipped rather than serve (rmq_mp/store/read_damage.py), reported to ``reporter``."""
        self.delay_level_ms = record.parse_delay_levels(config.message_delay_level)
        self.commit_log = CommitLog(
            self.paths.commit_log,
            config.mapped_file_size_commit_log,
            writable=self.writable,
            reporter=self.reporter,
            delay_level_ms=self.delay_level_ms,
        )
        self.cq_table = ConsumeQueueTable(
            self.paths.consume_queue,
            config.mapped_file_size_consume_queue,
            writable=self.writable,
            reporter=self.reporter,
            pool=process_pool(config.max_open_consume_queue_files),
        )
        self.index_service = (
            IndexService(
                self.paths.index,
                config.max_hash_slot_num,
                config.max_index_num,
                writable=self.writable,
                reporter=self.reporter,
                max_msgs_num_batch=config.max_msgs_num_batch,
            )
            if config.message_index_enable
            else None
        )
        self.checkpoint = StoreCheckpoint(self.paths.checkpoint, writable=self.writable)
        self.consumer_offsets = ConsumerOffsetManager(self.paths.consumer_offset)
        """Loaded by a writable `open` (see `_load_consumer_offsets`); the supervisor serves them."""
        self.dispatcher = Dispatcher(self.find_consume_queue, self.index_service, self.checkpoint)
        self.dispatcher.on_marker = self._apply_marker
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.store_host: m.Host = (config.broker_ip1, config.listen_port)
        self.recovery: RecoveryReport | None = None
        self.deleted_topics = DeletedTopics(self.paths.deleted_topics)
        """config/deletedTopics.json: rmq-admin deleteTopic's tombstones, honoured by dispatch."""
        self._put_lock = threading.Lock()
        self._encoders: dict[m.Host, record.RecordEncoder] = {}
        """Store host -> its encoder (a `Message` may name its own store host)."""
        self._lock_fd = -1
        self._closed = False
        self.read_end = -1
        """A reader's window (read-only opens): nothing at or past this commit-log offset is served
        or counted, -1 none. A stopped store's comes from its files (`ha_log.stopped_read_end`: a
        fork not cut yet, a slave's log not confirmed as its master's); rmq-admin sets a running
        store's from its pointer table (`FORK_READ_END`)."""

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls,
        store_dir: str | Path | None = None,
        config: MessageStoreConfig | None = None,
        *,
        read_only: bool = False,
    ) -> MessageStore:
        """Open (creating if needed, unless read-only) and recover the store at ``store_dir``
        (a str or path; `InvalidArgumentTypeError` otherwise, not a directory named after it)."""
        if config is not None and not isinstance(config, MessageStoreConfig):
            raise InvalidArgumentTypeError(
                f"config must be a MessageStoreConfig, not {type(config).__name__}"
            )
        config = config or MessageStoreConfig()
        if store_dir is not None:
            path = (
                store_dir
                if isinstance(store_dir, str)
                else os.fspath(store_dir)
                if isinstance(store_dir, os.PathLike)
                else None
            )
            if not isinstance(path, str):
                raise InvalidArgumentTypeError(
                    f"store_dir must be a str or a path, not {type(store_dir).__name__}"
                )
            config = config.replace(store_path_root_dir=path)
        file_modes.apply(config.store_group_access)  # this process's files of the store: private by default
        paths = StorePaths.of(config.store_path_root_dir, config.commit_log_dir)
        store: MessageStore | None = None
        try:
            paths.check_kinds()
            store = cls(config, read_only=read_only)
            store._start()
        except OSError as exc:  # a read, a directory or a write the store needs failed
            if store is not None:
                store._release()
            where = exc.filename or paths.root
            raise StorePathError(f"{where}: {exc.strerror or exc}") from exc
        except BaseException:
            if store is not None:
                store._release()
            raise
        return store

    def _start(self) -> None:
        root = self.paths.root
        if self.writable:
            root.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
            self._take_lock()
        last_exit_ok = not self.paths.abort.exists()
        self.commit_log.load()
        self.cq_table.load()
        if self.index_service is not None:
            self.index_service.load()
        cut = fork.pending_cut(root) if self.writable else None
        if cut is not None:  # a slave's log that forked from its master's: cut, then recover as after a crash
            log.warning(
                "cutting the log at %d, where it forks from the master's (bytes [%d, %d) set aside in %s)",
                cut.fork_offset,
                cut.fork_offset,
                cut.end,
                cut.folder,
            )
            cut_at(self, cut.fork_offset)
            last_exit_ok = False
        self.deleted_topics.load()
        if cut is not None:
            self._forget_cut_deletes(cut.fork_offset)
        self._begin_deletes()
        self.recovery = recover(self, last_exit_ok=last_exit_ok)
        if self.writable:
            self._load_consumer_offsets()
            self._finish_deletes()
            self._flush_all()
            if cut is not None:
                fork.clear_pending_cut(root)
            self.paths.abort.touch(mode=file_modes.file_mode())
            fsync_dir(root)
        else:
            self.read_end = ha_log.stopped_read_end(root)

    def _forget_cut_deletes(self, fork_offset: int) -> None:
        """A slave's log cut where it forks from its master's: a delete whose marker lay at or past
        the cut is not its master's (the new master never deleted the topic), so its tombstone
        goes, and the topic's records are its queues' again."""
        tombstones = self.deleted_topics
        gone = [
            t for t, s in tombstones.table.items() if s.state != REQUESTED and s.phy_offset >= fork_offset
        ]
        if gone:
            tombstones.table = {t: s for t, s in tombstones.table.items() if t not in gone}
            tombstones.persist()
            log.warning(
                "deleteTopic %s: its marker was cut with the fork: the topic is its master's again", gone
            )

    def _begin_deletes(self) -> None:
        """Before recovery: a deleted topic's records below its tombstone get no queue entry, and
        its old queues go (rmq_mp/config/deleted_topics.py). A delete the supervisor never began
        (``requested``) drops every record of the topic: all are from before it."""
        bounds = self.deleted_topics.bounds()
        if self.writable:
            for topic, stone in self.deleted_topics.table.items():
                if stone.state == REQUESTED:
                    bounds[topic] = 1 << 62
            remove_old_queues(self.cq_table, bounds)
        self.dispatcher.dropped = bounds

    def _append_marker(self, topics: list[str]) -> int:
        """deleteTopic's marker for ``topics`` (rmq_mp/format/topic_marker.py) appended at the
        log's end as `put_message` appends, and dispatched (which applies it); its offset."""
        now_ms = int(time.time() * 1000)
        encoded = topic_marker.encode(self._encoder_for(self.store_host), topics, now_ms)
        key = (topic_marker.TOPIC, topic_marker.QUEUE_ID)
        with self._put_lock:
            queue_offset = self.topic_queue_table.get(key, 0)
            sys_flag = record.peek_sys_flag(encoded, 0)
            result = self.commit_log.append(
                encoded,
                sys_flag=sys_flag,
                queue_offset=queue_offset,
                store_timestamp=now_ms,
                crc=self.config.enabled_append_prop_crc,
            )
            if result.status is not AppendMessageStatus.PUT_OK:
                raise StoreError(f"append failed: {result.status.name}")
            self.topic_queue_table[key] = queue_offset + 1
            self.dispatcher.dispatch(
                record.DispatchRequest(
                    size=result.wrote_bytes,
                    success=True,
                    topic=topic_marker.TOPIC,
                    queue_id=topic_marker.QUEUE_ID,
                    phy_offset=result.phy_offset,
                    store_timestamp=now_ms,
                    queue_offset=queue_offset,
                    keys=" ".join(topics),
                    sys_flag=sys_flag,
                )
            )
        return result.phy_offset

    def _apply_marker(self, phy_offset: int) -> list[str]:
        """A deleteTopic marker met by recovery's dispatch (rmq_mp/format/topic_marker.py): as
        reput applies one (workers/reput.py `apply_marker`): a named topic without a tombstone at
        or past it gets one there, ``pending`` (a writable store persists it and removes the old
        queues; `_finish_deletes` then drops its offsets and config), and its records below it
        are not dispatched to it from here on. A kill -9 between the marker and its application
        is finished here: the replay from the checkpoint meets the marker again."""
        try:
            topics = topic_marker.decode(self.commit_log.look_message_by_offset(phy_offset).body)
        except StoreError as exc:
            log.error("deleteTopic marker at %d not applied: %s", phy_offset, exc)
            return []
        tombstones = self.deleted_topics
        met = {}
        for topic in topics:
            stone = tombstones.table.get(topic)
            if stone is None or stone.phy_offset < phy_offset:
                tombstones.set(topic, phy_offset, PENDING)
                met[topic] = phy_offset
        if met:
            log.warning("deleteTopic %s: met its marker at %d in the log", ", ".join(met), phy_offset)
            if self.writable:
                tombstones.persist()
                remove_old_queues(self.cq_table, met)
            self.dispatcher.dropped = {**self.dispatcher.dropped, **met}
        return topics

    def _finish_deletes(self) -> None:
        """After the offsets are loaded: a delete cut short (``pending``) loses its group offsets
        and topics.json entry here, then is ``done``; done tombstones whose records the log no
        longer holds are dropped."""
        tombstones = self.deleted_topics
        requested = sorted(t for t, s in tombstones.table.items() if s.state == REQUESTED)
        if requested and self.config.broker_role is not BrokerRole.SLAVE:
            try:  # its dispatch writes the tombstones at it (`_apply_marker`), as on a running store
                self._append_marker(requested)
            except (StoreError, OSError) as exc:
                log.error(
                    "deleteTopic %s: its marker was not stored (%s): slaves keep the topic", requested, exc
                )
        for topic, stone in tombstones.table.items():
            if stone.state == REQUESTED:  # its offset: the recovered log's end
                tombstones.set(topic, self.commit_log.max_offset(), PENDING)
            if topic in requested:
                log.warning("deleteTopic %s was asked for and not begun: finished now", topic)
        pending = sorted(t for t, s in tombstones.table.items() if s.state == PENDING)
        if pending:
            offsets = self.consumer_offsets
            suffixes = tuple(f"{topic}@" for topic in pending)
            kept = {k: q for k, q in offsets.table.items() if not k.startswith(suffixes)}
            if kept != offsets.table:
                offsets.table = kept
                offsets.persist()
            topics = TopicConfigManager(self.paths.topics)
            if topics.load() and any(t in topics.table for t in pending):
                topics.table = {t: c for t, c in topics.table.items() if t not in pending}
                topics.counter += 1
                topics.timestamp_ms = time.time_ns() // 1_000_000
                topics.persist()
            for topic in pending:
                tombstones.set(topic, tombstones.table[topic].phy_offset, DONE)
            log.warning("deleteTopic finished at start: %s", ", ".join(pending))
        if tombstones.prune(self.min_phy_offset()) or pending:
            tombstones.persist()
        self.dispatcher.dropped = tombstones.bounds()

    def _load_consumer_offsets(self) -> None:
        """config/consumerOffset.json, under the loss policy: a store whose commit log holds
        messages refuses to start (`ConsumerOffsetLossError`, nothing changed) when the file is
        missing, damaged or older than last persisted, unless ``acceptConsumerOffsetLoss``; then,
        or when the log is empty, the damaged files are kept aside and the salvaged offsets
        persisted, so the next start is clean. RocketMQ starts every group from scratch, silently."""
        offsets = self.consumer_offsets
        if offsets.load():
            return
        result = offsets.last_load
        for path in result.damaged or (result.path,):
            size = path.stat().st_size if path.exists() else 0
            self.reporter.report("consumer-offsets-lost", str(path), 0, size, result.describe())
        if self.max_phy_offset() > 0 and not self.config.accept_consumer_offset_loss:
            raise ConsumerOffsetLossError(offset_loss_message(result, self.config.source))
        moved = offsets.set_aside()
        offsets.persist()
        log.error(
            "%s: %s; started with these offsets (acceptConsumerOffsetLoss=%s, commit log %s)%s",
            result.path,
            result.describe(),
            str(self.config.accept_consumer_offset_loss).lower(),
            "holds messages" if self.max_phy_offset() > 0 else "empty",
            f"; damaged file(s) kept as {', '.join(p.name for p in moved)}" if moved else "",
        )

    def _take_lock(self) -> None:
        """`lock` file: exclusive flock, content ``lock`` (RocketMQ writes the same 4 bytes)."""
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, file_modes.file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"store {self.paths.root} is already open in another process (lock file {self.paths.lock})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"lock", 0)
        os.fsync(fd)
        self._lock_fd = fd

    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created empty (no file until the first entry) when new."""
        return self.cq_table.find(topic, queue_id)

    def all_consume_queues(self) -> list[ConsumeQueue]:
        return self.cq_table.all()

    def destroy_consume_queues(self) -> None:
        self.cq_table.destroy_all()

    def recover_topic_queue_table(self) -> None:
        """`recoverTopicQueueTable`: next queue offset per queue, and min offsets corrected."""
        min_phy = self.commit_log.min_offset()
        self.topic_queue_table = {}
        for cq in self.all_consume_queues():
            self.topic_queue_table[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue()
            cq.correct_min_offset(min_phy)

    def flush(self) -> None:
        """Force the commit log, queues, index and checkpoint to disk."""
        if self.writable:
            self._flush_all()

    def _flush_all(self) -> None:
        self.commit_log.flush()
        for cq in self.all_consume_queues():
            cq.flush()
        if self.index_service is not None:
            self.index_service.flush()
        last = self.commit_log.mfq.last_file()
        if last is not None and last.last_store_timestamp:
            self.checkpoint.physic_msg_timestamp = last.last_store_timestamp
        if self.index_service is not None and self.index_service.files:
            self.checkpoint.index_msg_timestamp = self.index_service.files[-1].end_timestamp
        self.checkpoint.flush()

    def close(self) -> None:
        """Clean shutdown: flush everything, remove `abort`, release the lock."""
        if self._closed:
            return
        try:
            if self.writable:
                self._flush_all()
                self.paths.abort.unlink(missing_ok=True)
                fsync_dir(self.paths.root)
        finally:
            self._release()

    def handover(self) -> None:
        """Recovery is done and the service takes over the files: flush and unmap everything but
        keep the store lock and the `abort` marker (the supervisor holds both while running)."""
        self._flush_all()
        self.commit_log.close()
        self.cq_table.close()
        if self.index_service is not None:
            self.index_service.close()

    def finish_service(self, *, clean: bool) -> None:
        """The service stopped: remove `abort` if it stopped cleanly, then release the lock."""
        try:
            if clean and self.writable:
                self.paths.abort.unlink(missing_ok=True)
                fsync_dir(self.paths.root)
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        self.commit_log.close()
        for cq in self.all_consume_queues():
            cq.close()
        if self.index_service is not None:
            self.index_service.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ write

    def put_message(self, message: m.Message) -> PutMessageResult:
        """Append one message and dispatch it (RocketMQ's putMessage + reput, in-process). A
        message the store refuses is answered MESSAGE_ILLEGAL with the reason, nothing stored;
        a field of the wrong type raises `InvalidArgumentTypeError` (as `Producer.send_batch`)."""
        if not isinstance(message, m.Message):
            raise InvalidArgumentTypeError(f"put_message takes a Message, not {type(message).__name__}")
        if not self.writable:
            raise StoreReadOnlyError(f"store {self.paths.root} is open read-only")
        if self._closed:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason="store is closed")
        if type(message.flag) is not int or type(message.queue_id) is not int:
            v.message_problem(message)  # a bool (an int to the encoder) or another type raises
        if not message.born_timestamp:
            message.born_timestamp = int(time.time() * 1000)
        try:
            encoder = self._encoder_for(message.store_host or self.store_host)
            stored = put_rules.encode_put(
                message,
                encoder,
                max_message_size=self.config.max_message_size,
                max_delay_level=len(self.delay_level_ms),
            )
        except RecordRejected as exc:
            return PutMessageResult(exc.status, reason=exc.reason)
        except (TypeError, ValueError) as exc:  # a store host that is no (IP address, port) pair
            reason = put_rules.refused_send(exc, v.message_problem(message))
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, reason=reason)
        message, encoded, sys_flag = stored.message, stored.data, stored.sys_flag
        dispatchable = put_rules.takes_queue_offset(sys_flag)
        with self._put_lock:
            key = (message.topic, message.queue_id)
            queue_offset = self.topic_queue_table.get(key, 0) if dispatchable else 0
            store_timestamp = int(time.time() * 1000)
            try:
                result = self.commit_log.append(
                    encoded,
                    sys_flag=sys_flag,
                    queue_offset=queue_offset,
                    store_timestamp=store_timestamp,
                    crc=self.config.enabled_append_prop_crc,
                )
            except OSError as exc:  # a new file or its blocks refused (a full disk): nothing written
                return PutMessageResult(
                    PutMessageStatus.CREATE_MAPEDFILE_FAILED, reason=f"commit-log append failed: {exc}"
                )
            if result.status is not AppendMessageStatus.PUT_OK:
                status = (
                    PutMessageStatus.MESSAGE_ILLEGAL
                    if result.status is AppendMessageStatus.MESSAGE_SIZE_EXCEEDED
                    else PutMessageStatus.UNKNOWN_ERROR
                )
                return PutMessageResult(status, reason=f"append failed: {result.status.name}")
            if dispatchable:
                self.topic_queue_table[key] = queue_offset + 1
            self.dispatcher.dispatch(
                record.DispatchRequest(
                    size=result.wrote_bytes,
                    success=True,
                    topic=message.topic,
                    queue_id=message.queue_id,
                    phy_offset=result.phy_offset,
                    tags_code=record.cq_tags_code(
                        message.topic, message.properties, store_timestamp, self.delay_level_ms
                    ),
                    store_timestamp=store_timestamp,
                    queue_offset=queue_offset,
                    keys=message.properties.get(m.PROPERTY_KEYS, ""),
                    uniq_key=message.properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
                    sys_flag=sys_flag,
                    prepared_transaction_offset=message.prepared_transaction_offset,
                    properties=message.properties,
                )
            )
        return PutMessageResult(
            PutMessageStatus.PUT_OK,
            msg_id=m.create_message_id(encoder.store_ip, encoder.store_port, result.phy_offset),
            queue_offset=queue_offset,
            phy_offset=result.phy_offset,
            wrote_bytes=result.wrote_bytes,
            msg_num=1,
            store_timestamp=store_timestamp,
        )

    def _encoder_for(self, store_host: m.Host) -> record.RecordEncoder:
        """The encoder stamping ``store_host`` (a `Message` may name its own), made once."""
        encoder = self._encoders.get(store_host)
        if encoder is None:
            encoder = record.RecordEncoder(store_host, append_crc=self.config.enabled_append_prop_crc)
            self._encoders[store_host] = encoder
        return encoder

    # ------------------------------------------------------------------ read

    def min_phy_offset(self) -> int:
        return self.commit_log.min_offset()

    def max_phy_offset(self) -> int:
        return self.commit_log.max_offset()

    def topics(self) -> list[str]:
        """Topics with at least one queue, in Java string order."""
        return self.cq_table.topics()

    def queue_status(self, topic: str) -> list[QueueStatus]:
        """Per-queue min/max offsets and the store time of the newest message (within `read_end`)."""
        result = []
        for queue_id in sorted(self.cq_table.queues.get(topic, {})):
            cq = self.cq_table.queues[topic][queue_id]
            max_offset = self._queue_end(cq)
            last = cq.get_entry(max_offset - 1) if max_offset > cq.min_offset_in_queue() else None
            last_update = self.commit_log.store_timestamp_at(last[0], last[1]) if last else 0
            result.append(
                QueueStatus(topic, queue_id, cq.min_offset_in_queue(), max_offset, max(last_update, 0))
            )
        return result

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        *,
        tags: frozenset[str] | None = None,
    ) -> GetMessageResult:
        """`getMessage`: statuses and next offset as RocketMQ computes them; ``tags`` filters.
        Arguments are checked as `Consumer.pull` checks them (`validators.check_get`)."""
        topic, queue_id, offset, max_msgs, tags = v.check_get(topic, queue_id, offset, max_msgs, tags)
        cq = self.cq_table.get(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        return read_queue(
            cq,
            self.commit_log,
            self.config,
            offset=offset,
            max_msgs=max_msgs,
            min_offset=cq.min_offset_in_queue(),
            max_offset=cq.max_offset_in_queue(),
            skips=self.read_skips,
            tags=tags,
            fork_read_end=self.read_end,
        )

    def _queue_end(self, cq: ConsumeQueue) -> int:
        """The queue's max offset within `read_end`."""
        return queue_end_below(
            cq.min_offset_in_queue(),
            cq.max_offset_in_queue(),
            lambda offset: (cq.get_entry(offset) or (0,))[0],
            self.read_end,
        )

    def _check_served(self, phy_offset: int) -> None:
        """`MessageNotFoundError` for a record at or past `read_end`: it is not served."""
        if 0 <= self.read_end <= phy_offset:
            raise MessageNotFoundError(
                f"commit-log offset {phy_offset} is past this store's read window {self.read_end} (its "
                f"log is not its master's from there: docs/replication.md)"
            )

    def look_message_by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> m.MessageExt:
        """The message at one queue offset, checked as a pull checks it: `MessageNotFoundError`
        where the queue or the log holds none, `CorruptRecordError` (`BodyCrcError` for a body
        whose CRC fails) naming why the entry's record must not be served."""
        cq = self.cq_table.get(topic, queue_id)
        entry = (
            cq.get_entry(queue_offset)
            if cq is not None and cq.min_offset_in_queue() <= queue_offset < cq.max_offset_in_queue()
            else None
        )
        if entry is None or entry[1] == PRE_BLANK_SIZE:
            raise MessageNotFoundError(f"{topic}/{queue_id} has no message at queue offset {queue_offset}")
        self._check_served(entry[0])
        try:
            return queue_message(
                self.commit_log, entry[:2], topic=topic, queue_id=queue_id, queue_offset=queue_offset
            )
        except CorruptRecordError as exc:
            raise type(exc)(
                f"{topic}/{queue_id} queue offset {queue_offset} (commit-log offset {entry[0]}, "
                f"size {entry[1]}): {exc}"
            ) from exc

    def look_message_by_offset(self, phy_offset: int) -> m.MessageExt:
        """The record at a commit-log offset; MessageNotFoundError where the log holds none,
        CorruptRecordError (BodyCrcError for a body whose CRC fails) for a record that must not
        be served: a damaged record is never returned."""
        phy_offset = v.check_offset(phy_offset, "phy_offset", negative_ok=True)
        self._check_served(phy_offset)
        return self.commit_log.look_message_by_offset(phy_offset)

    def view_message_by_id(self, msg_id: str) -> m.MessageExt:
        """The record an offset msgId names (`viewMessageById`), checked as
        `look_message_by_offset`."""
        if not isinstance(msg_id, str):
            raise InvalidArgumentTypeError(f"msg_id must be a str, not {type(msg_id).__name__}")
        _host, phy_offset = m.decode_message_id(msg_id)
        self._check_served(phy_offset)
        return self.commit_log.look_message_by_offset(phy_offset)

    def query_message(
        self, topic: str, key: str, max_num: int | None = None, begin: int = 0, end: int = MAX_TIMESTAMP
    ) -> list[m.MessageExt]:
        """Messages of ``topic`` whose UNIQ_KEY or one of whose KEYS equals ``key``, newest first,
        store time within [begin, end] at second granularity, at most ``max_num``
        (`defaultQueryMaxNum` if not given; `maxMsgsNumBatch` caps it). Each index hit is checked
        against its record, so a hash collision never returns another key's message (RocketMQ #3613);
        a hit whose record must not be served (its body CRC fails, or no record starts there) is
        skipped and reported (`read_skips`). `InvalidArgumentError` for a topic the store cannot
        hold, a key that is not a str, a ``max_num`` below 1 or times that are not Java longs."""
        topic = v.check_topic(topic)
        if not isinstance(key, str):
            raise InvalidArgumentTypeError(f"key must be a str, not {type(key).__name__} ({key!r})")
        if max_num is None:
            max_num = self.config.default_query_max_num
        elif v.integer(max_num, "max_num") < 1:
            raise InvalidArgumentError(f"max_num {max_num} is below 1")
        begin = v.check_offset(begin, "begin", negative_ok=True)
        end = v.check_offset(end, "end", negative_ok=True)
        if self.index_service is None:
            return []
        found = []
        deleted_below = self.dispatcher.dropped.get(topic, -1)  # rmq-admin deleteTopic's tombstone
        for phy in self.index_service.query_offset(f"{topic}#{key}", max_num, begin, end):
            if phy < deleted_below or 0 <= self.read_end <= phy:
                continue
            try:
                msg = self.commit_log.look_message_by_offset(phy)
            except MessageNotFoundError:
                continue
            except CorruptRecordError as exc:
                self.read_skips.bad_record(self.commit_log, phy, exc, invalid_kind=INDEX_ENTRY_INVALID)
                continue
            if msg.topic == topic and (msg.uniq_key == key or key in m.split_keys(msg.keys)):
                found.append(msg)
        return found

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        topic, queue_id = v.check_topic(topic), v.check_queue_id(queue_id)
        timestamp_ms = v.check_offset(timestamp_ms, "timestamp_ms", negative_ok=True)
        cq = self.cq_table.get(topic, queue_id)
        return cq.offset_in_queue_by_time(timestamp_ms, self.commit_log) if cq else 0

    def iter_messages(self, from_offset: int | None = None) -> Iterator[m.MessageExt]:
        """Every record in commit-log order (blank records skipped), up to the valid end.

        A record that must not be served is skipped and reported (`read_skips`): one whose body
        CRC fails (the walk steps over it by its TOTALSIZE), and bytes before the end that are no
        record at all (RECORD_INVALID, up to where the walk goes on: past a record whose size is
        sound, else at the next file, as reput does)."""
        offset = self.commit_log.min_offset() if from_offset is None else from_offset
        end = self.commit_log.max_offset()
        if self.read_end >= 0:
            end = min(end, self.read_end)
        while offset < end:
            resume = end
            for phy, req in self.commit_log.iter_dispatch(offset, check_crc=False):
                if phy >= end:  # `read_end`: nothing past the window
                    return
                if req.success:
                    if req.size > 0:
                        try:
                            msg = self.commit_log.look_message_by_offset(phy)
                        except CorruptRecordError as exc:
                            self.read_skips.bad_record(
                                self.commit_log, phy, exc, invalid_kind=RECORD_INVALID, size=req.size
                            )
                            continue
                        yield msg
                    continue
                resume = min(phy + req.size if req.size > 0 else self.commit_log.roll_next_file(phy), end)
                self.read_skips.skip(
                    RECORD_INVALID,
                    read_damage.log_file(self.commit_log, phy),
                    phy,
                    resume,
                    f"no valid record at commit-log offset {phy}, before the log's end {end}: {req.reason}",
                )
            offset = resume


def offset_loss_message(result: LoadResult, conf: str) -> str:
    """`ConsumerOffsetLossError`'s one line: the file, what is wrong, what survives, the way out."""
    path = result.path
    if result.used is not None:
        kept = f"{result.used.name} holds an older copy"
    elif result.salvaged:
        kept = f"salvaged {result.salvaged}"
    else:
        kept = "nothing could be salvaged, so every consumer group would start over"
    if not path.parent.exists():
        wrong = f"the directory {path.parent.name}/ is missing"
    else:
        wrong = "; ".join(f"{p.name} is {why}" for p, why in result.problems)
    if result.expected and not result.damaged:
        wrong += f"; {CHECKSUMS_NAME} records that it was written"
    aside = f" (damaged files are kept as {path.name}.damaged-<time>)" if result.damaged else ""
    return (
        f"{path}: consumer offsets lost ({wrong}) while the commit log holds messages; {kept}. "
        f"Not started: restore the file, or set acceptConsumerOffsetLoss=true in {conf} to start with "
        f"{'those offsets' if result.used is not None or result.salvaged else 'none'}{aside}"
    )


def offset_status(offset: int, min_offset: int, max_offset: int) -> GetMessageResult | None:
    """`getMessage`'s answer when the offsets alone decide it (no message can be returned), else
    None: a long poll asks this before mapping anything."""
    if max_offset == 0:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
    if offset < min_offset:
        return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
    if offset == max_offset:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
    if offset > max_offset:
        next_offset = min_offset if min_offset == 0 else max_offset
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, next_offset, min_offset, max_offset)
    return None


def queue_end_below(low: int, high: int, phy_at: Callable[[int], int], read_end: int) -> int:
    """A queue's end for a reader whose window ends at commit-log offset ``read_end`` (a slave's
    `FORK_READ_END`, -1 none): the first queue offset in ``[low, high)`` whose entry (``phy_at``:
    its commit-log offset) is at or past it, ``high`` when none is. A queue's entries rise with
    the log, so a binary search finds it; the one search `Consumer.max_offset`, topicStatus and the
    Spark source's plan share, so each ends a queue where a pull does (`read_queue`)."""
    if read_end < 0:
        return high
    while low < high:
        mid = (low + high) // 2
        if phy_at(mid) >= read_end:
            high = mid
        else:
            low = mid + 1
    return low


def queue_end_in_files(
    config: MessageStoreConfig, topic: str, queue_id: int, low: int, high: int, read_end: int
) -> int:
    """`queue_end_below` with each entry read from the queue's files by position, for a reader that
    holds no ConsumeQueue (rmq-admin consumerProgress, status' lag); an entry whose file is gone
    counts as below the window (the cleaner's, which only takes the oldest)."""
    size = config.mapped_file_size_consume_queue

    def phy_at(offset: int) -> int:
        position = offset * CQ_STORE_UNIT_SIZE
        path = (
            config.consume_queue_dir / topic / str(queue_id) / offset_to_file_name(position - position % size)
        )
        try:
            with path.open("rb") as f:
                raw = os.pread(f.fileno(), CQ_STORE_UNIT_SIZE, position % size)
        except FileNotFoundError:
            return 0
        return int(CQ_ENTRY.unpack(raw)[0]) if len(raw) == CQ_STORE_UNIT_SIZE else 0

    return queue_end_below(low, high, phy_at, read_end)


def read_queue(
    cq: ConsumeQueue,
    commit_log: CommitLog,
    config: MessageStoreConfig,
    *,
    offset: int,
    max_msgs: int,
    min_offset: int,
    max_offset: int,
    skips: ReadSkips,
    tags: frozenset[str] | None = None,
    fork_read_end: int = -1,
) -> GetMessageResult:
    """The body of `getMessage` over one queue, shared by `MessageStore` and the service's
    `Consumer` (which takes the offsets from shared memory). ``tags``: only messages whose TAGS is
    one of these (tags-code match on the queue entry, then the string, as RocketMQ's broker and
    client filters do); unmatched entries are skipped and counted in the next offset.

    Each record is checked before it is served (`read_damage.queue_message`: body CRC, a whole
    record, the one its entry promises). A bad one is skipped like a filtered entry and reported
    to ``skips`` (once per record per process): the result holds the good messages around it and
    its next offset is past it, so a consumer is never stuck there. A pull that finds only bad
    (or filtered) entries answers NO_MATCHED_MESSAGE with the next offset past them, RocketMQ's
    status for entries read but none served: its broker answers it with PULL_RETRY_IMMEDIATELY
    and the client pulls again from that offset (OFFSET_FOUND_NULL would say the queue has no
    entry there, which is not so).

    ``fork_read_end`` (a slave's `FORK_READ_END`, -1 none): the queue ends, for this read, at its
    first entry at or past it: those records are not the master's, and the cut at the restart
    replaces them with the master's, so they are neither served nor skipped."""
    decided = offset_status(offset, min_offset, max_offset)
    if decided is not None:
        return decided
    entries = cq.entries(offset, min(max(16000 // CQ_STORE_UNIT_SIZE, max_msgs), max_offset - offset))
    first = next(entries, None)
    if first is None:
        per_file = cq.mapped_file_size // CQ_STORE_UNIT_SIZE
        return GetMessageResult(
            GetMessageStatus.OFFSET_FOUND_NULL, offset + per_file - offset % per_file, min_offset, max_offset
        )
    codes = {m.tags_code(t) for t in tags} if tags is not None else None
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    messages: list[m.MessageExt] = []
    total_bytes = 0
    min_phy = commit_log.min_offset()
    # RocketMQ's checkInDiskByCommitOffset: records further than this behind the log's end are
    # taken to be on disk, not in the page cache, and a pull returns fewer of them.
    in_memory_bytes = TOTAL_MEMORY_BYTES * config.access_message_in_memory_max_ratio // 100
    end_phy = commit_log.max_offset()
    scanned = 0
    topic, queue_id = cq.topic, cq.queue_id
    for phy, size, tags_code in itertools.chain((first,), entries):
        if messages:  # RocketMQ's isTheBatchFull
            if end_phy - phy > in_memory_bytes:
                max_count = config.max_transfer_count_on_message_in_disk
                max_bytes = config.max_transfer_bytes_on_message_in_disk
            else:
                max_count = config.max_transfer_count_on_message_in_memory
                max_bytes = config.max_transfer_bytes_on_message_in_memory
            if len(messages) >= min(max_msgs, max_count) or total_bytes + size > max_bytes:
                break
        queue_offset = offset + scanned
        if 0 <= fork_read_end <= phy and size != PRE_BLANK_SIZE:
            max_offset = queue_offset
            if not scanned:
                return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
            break
        scanned += 1
        if size == PRE_BLANK_SIZE or (codes is not None and tags_code not in codes):
            continue
        if 0 <= phy < min_phy:
            if not messages:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
            continue
        try:
            msg = queue_message(
                commit_log,
                (phy, size),
                topic=topic,
                queue_id=queue_id,
                queue_offset=queue_offset,
                end_offset=end_phy,
            )
        except MessageNotFoundError:
            if not messages:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
            continue
        except CorruptRecordError as exc:
            log_path = read_damage.log_file(commit_log, phy)
            skips.bad_entry(log_path, cq.mfq.store_dir, cq.mapped_file_size, queue_offset, (phy, size), exc)
            continue
        if tags is not None and msg.tags not in tags:
            continue
        messages.append(msg)
        total_bytes += size
        status = GetMessageStatus.FOUND
    return GetMessageResult(status, offset + scanned, min_offset, max_offset, messages)
