"""The store against a simple model (hypothesis stateful): puts, reads by queue and offset, key
queries, consumer-offset commits, clean restarts and crashes (the process gone with `abort`
kept, with and without a flush first), on a store whose small files roll every few puts.

The model is a list of bodies per queue and a set of (queue, offset) per key. After every step:
each queue's max offset is its model length, and a read anywhere in it gives the model's
messages in order with their queue offsets, tags and keys; a key query gives exactly the model's
messages with that key, whatever the index's hash collisions (64 slots here); a committed
consumer offset survives a restart and never moves back. A crash loses nothing: every put was
answered PUT_OK in-process, so its bytes are in the page cache the next open reads."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.outcomes import GetMessageStatus, PutMessageStatus
from rmq_mp.store.message_store import MessageStore

QUEUES = {"Orders": 2, "主题-τ": 3}
"""Topics and their queue counts: one ASCII, one UTF-8 name."""
KEYS = ["k1", "k2", "ORD-7", "订单", "x"]
"""Few keys, so that queries find several messages and several keys share the index's slots."""
GROUP = "model-group"


def _config(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig().replace(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=16 * 1024,  # a roll every few puts of the larger bodies
        mapped_file_size_consume_queue=20 * 8,  # a queue file every 8 entries
        max_hash_slot_num=64,
        max_index_num=40,  # an index file every 40 keys
    )


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rmq-model-"))
        self.config = _config(self.tmp / "store")
        self.store: MessageStore | None = None
        self.queues: dict[tuple[str, int], list[tuple[bytes, str | None, tuple[str, ...]]]] = {}
        self.by_key: dict[tuple[str, str], set[tuple[int, int]]] = {}
        self.committed: dict[tuple[str, int], int] = {}

    @initialize()
    def open_store(self) -> None:
        self.store = MessageStore.open(config=self.config)

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def live(self) -> MessageStore:
        assert self.store is not None
        return self.store

    @rule(
        topic=st.sampled_from(sorted(QUEUES)),
        queue=st.integers(0, 2),
        body=st.one_of(st.binary(max_size=64), st.binary(min_size=1000, max_size=4000)),
        tags=st.sampled_from([None, "TagA", "标签"]),
        keys=st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
    )
    def put(self, topic: str, queue: int, body: bytes, tags: str | None, keys: list[str]) -> None:
        queue %= QUEUES[topic]
        props = {}
        if tags:
            props[m.PROPERTY_TAGS] = tags
        if keys:
            props[m.PROPERTY_KEYS] = " ".join(keys)
        result = self.live.put_message(m.Message(topic=topic, body=body, properties=props, queue_id=queue))
        assert result.status is PutMessageStatus.PUT_OK, result
        model = self.queues.setdefault((topic, queue), [])
        assert result.queue_offset == len(model), (result, len(model))
        model.append((body, tags, tuple(keys)))
        for key in keys:
            self.by_key.setdefault((topic, key), set()).add((queue, result.queue_offset))

    @precondition(lambda self: self.queues)
    @rule(data=st.data(), max_msgs=st.integers(1, 8))
    def read(self, data: st.DataObject, max_msgs: int) -> None:
        topic, queue = data.draw(st.sampled_from(sorted(self.queues)))
        model = self.queues[(topic, queue)]
        offset = data.draw(st.integers(0, len(model)))
        result = self.live.get_message(topic, queue, offset, max_msgs)
        if offset == len(model):
            assert result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE, result
            assert not result.messages
            return
        assert result.status is GetMessageStatus.FOUND, result
        want = model[offset : offset + max_msgs]
        got = [(msg.body, msg.tags, tuple(m.split_keys(msg.keys))) for msg in result.messages]
        assert got == want, (offset, got, want)
        assert [msg.queue_offset for msg in result.messages] == list(range(offset, offset + len(got)))
        assert result.next_begin_offset == offset + len(got)

    @precondition(lambda self: self.by_key)
    @rule(data=st.data())
    def query(self, data: st.DataObject) -> None:
        topic, key = data.draw(st.sampled_from(sorted(self.by_key)))
        found = self.live.query_message(topic, key, max_num=64)
        assert {(msg.queue_id, msg.queue_offset) for msg in found} == self.by_key[(topic, key)]
        assert len(found) == len(self.by_key[(topic, key)]), "a message found twice"

    @precondition(lambda self: self.queues)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        topic, queue = data.draw(st.sampled_from(sorted(self.queues)))
        offset = data.draw(
            st.integers(self.committed.get((topic, queue), 0), len(self.queues[(topic, queue)]))
        )
        self.live.consumer_offsets.commit_offset(GROUP, topic, queue, offset)
        self.committed[(topic, queue)] = offset

    @rule()
    def restart_clean(self) -> None:
        self.live.consumer_offsets.persist()
        self.live.close()
        self.store = MessageStore.open(config=self.config)

    @rule(flush_first=st.booleans())
    def crash(self, flush_first: bool) -> None:
        """The process gone: the lock released, `abort` kept, nothing closed; the committed
        offsets persisted first (a live broker persists them every few seconds)."""
        self.live.consumer_offsets.persist()
        if flush_first:
            self.live.flush()
        self.live._release()
        self.store = None
        self.store = MessageStore.open(config=self.config)

    @invariant()
    def queues_end_where_the_model_does(self) -> None:
        if self.store is None:
            return
        for (topic, queue), model in self.queues.items():
            [status] = [s for s in self.live.queue_status(topic) if s.queue_id == queue]
            assert (status.min_offset, status.max_offset) == (0, len(model)), (topic, queue, status)
        for (topic, queue), offset in self.committed.items():
            assert self.live.consumer_offsets.query_offset(GROUP, topic, queue) == offset


StoreModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("RMQ_STORE_MODEL_EXAMPLES", "60")),  # more for a soak
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_store_follows_its_model = StoreModel.TestCase
