"""What a damaged store must still give: every acknowledged record that survives in the commit log
served exactly once, with its acknowledged bytes, by queue and by key; nothing else.

Shared by the file-kind damage tests (tests/integration/test_derived_damage.py) and the seeded
damage test (tests/crash/test_seeded_damage.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.outcomes import GetMessageStatus, PutMessageResult, PutMessageStatus
from rmq_mp.store.message_store import MessageStore
from tests.store_content import make_messages


def write_store(
    config: MessageStoreConfig,
    count: int,
    seed: int,
    *,
    crash: bool,
    commits: Mapping[tuple[str, str, int], int] | None = None,
) -> tuple[list[m.Message], list[PutMessageResult]]:
    """Put ``count`` seeded messages and persist ``commits`` ((topic, group, queue id) ->
    offset) twice, the first one behind (so `.bak` is older and the checksum record exists); with
    ``crash`` leave the store as a killed process would (flushed, `abort` kept), else close it."""
    messages = make_messages(count, seed)
    store = MessageStore.open(config=config)
    results = [store.put_message(msg) for msg in messages]
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    if commits:
        for behind in (1, 0):  # the `.bak` one commit behind the file, as after a live persist
            for (topic, group, queue_id), offset in commits.items():
                store.consumer_offsets.commit_offset(group, topic, queue_id, offset - behind)
            store.consumer_offsets.persist()
    if crash:
        store.flush()
        store._release()
    else:
        store.close()
    return messages, results


def served_by_queue(store: MessageStore) -> list[m.MessageExt]:
    """Every message `get_message` hands out, walking each queue from its first offset to its end."""
    served: list[m.MessageExt] = []
    for topic in store.topics():
        for status in store.queue_status(topic):
            offset = status.min_offset
            while offset < status.max_offset:
                result = store.get_message(topic, status.queue_id, offset, 32)
                served.extend(result.messages)
                if result.next_begin_offset <= offset:
                    assert result.status is GetMessageStatus.OFFSET_FOUND_NULL, result
                    break
                offset = result.next_begin_offset
    return served


def unique_keys(messages: list[m.Message]) -> dict[int, list[str]]:
    """Per message (by position), the keys no other message has: a query must find exactly it."""
    counts = Counter(
        (msg.topic, key)
        for msg in messages
        for key in [msg.properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), *msg.keys]
        if key
    )
    return {
        i: [
            key
            for key in [msg.properties.get(m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), *msg.keys]
            if key and counts[(msg.topic, key)] == 1
        ]
        for i, msg in enumerate(messages)
    }


def assert_intact_served(
    store: MessageStore,
    messages: list[m.Message],
    results: list[PutMessageResult],
    surviving: set[int] | None = None,
    tolerated: AbstractSet[int] = frozenset(),
) -> list[m.MessageExt]:
    """Each acknowledged message whose record survives (``surviving``: the phy offsets the commit
    log still holds intact; default all) is served once by its queue at its acknowledged queue
    offset with its body, and found by each of its unique keys; no other record is served, but
    those ``tolerated`` (damaged only where RocketMQ's format has no check: timestamps, hosts,
    flag, properties), which may be, once and only with their acknowledged body and place.
    Returns what was served."""
    alive = {r.phy_offset for r in results} if surviving is None else surviving
    allowed = alive | tolerated
    expected = {
        r.phy_offset: (msg, r)
        for msg, r in zip(messages, results, strict=True)
        if r.phy_offset in allowed and m.is_dispatchable(msg.sys_flag)
    }
    served = served_by_queue(store)
    counts = Counter(msg.commit_log_offset for msg in served)
    repeated = {phy: n for phy, n in counts.items() if n > 1}
    assert not repeated, f"served more than once: {sorted(repeated.items())[:5]}"
    unexpected = set(counts) - set(expected)
    assert not unexpected, f"served but not an intact acknowledged record: {sorted(unexpected)[:5]}"
    lost = set(expected) - set(counts) - tolerated
    assert not lost, f"{len(lost)} intact records not served, e.g. {sorted(lost)[:5]}"
    for got in served:
        msg, result = expected[got.commit_log_offset]
        assert (got.topic, got.queue_id, got.queue_offset, got.body) == (
            msg.topic,
            msg.queue_id,
            result.queue_offset,
            msg.body,
        )
    keys = unique_keys(messages)
    for i, (msg, result) in enumerate(zip(messages, results, strict=True)):
        if result.phy_offset not in alive or m.transaction_type(msg.sys_flag) == m.TRANSACTION_ROLLBACK_TYPE:
            continue
        for key in keys[i]:
            found = [x.commit_log_offset for x in store.query_message(msg.topic, key)]
            assert found == [result.phy_offset], (msg.topic, key, found, result.phy_offset)
    return served
