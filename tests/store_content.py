"""A seeded message mix like the RocketMQ fixtures': empty and 3 KiB bodies, a 100-character
topic and a UTF-8 one, IPv6 hosts, multi-key messages, transactions, user properties."""

from __future__ import annotations

import random

from rmq_mp.format import message as m

TOPICS = {
    "OrderTopic": 1,
    "Payments": 4,
    "t_%RETRY%x_long-topic-name_" + "abcdefghijklmnopqrstuvwxyz0123456789" * 2 + "a": 8,
    "主题-τ": 2,
}
TAGS = [None, "TagA", "TagB", "标签", "tag-😀", "café"]
NOTES = ["a b=c&d;e", "line1\nline2", 'quote"back\\slash', "☃ 🚀", "tab\there"]


def make_messages(count: int, seed: int) -> list[m.Message]:
    rnd = random.Random(seed)
    messages = []
    for i in range(count):
        topic = rnd.choice(list(TOPICS))
        size = rnd.choice([0, rnd.randint(1, 100), rnd.randint(101, 1000), 3072])
        props: dict[str, str] = {"CLUSTER": "DefaultCluster", "seq": str(i)}
        tags = rnd.choice(TAGS)
        if tags:
            props[m.PROPERTY_TAGS] = tags
        nkeys = rnd.choice([0, 1, 2, 3])
        if nkeys:
            props[m.PROPERTY_KEYS] = " ".join(
                rnd.choice([f"ORD{rnd.randint(0, 50)}", f"订单-{i}", f"k{i:x}"]) for _ in range(nkeys)
            )
        if rnd.random() < 0.5:
            props[m.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = f"7F000001{rnd.getrandbits(96):024X}"
        if rnd.random() < 0.3:
            props["note"] = rnd.choice(NOTES)
        sys_flag = rnd.choice(
            [0] * 17 + [m.TRANSACTION_PREPARED_TYPE, m.TRANSACTION_COMMIT_TYPE, m.TRANSACTION_ROLLBACK_TYPE]
        )
        if sys_flag:
            props[m.PROPERTY_TRANSACTION_PREPARED] = "true"
            props[m.PROPERTY_PRODUCER_GROUP] = "tx-group"
        v6 = rnd.random() < 0.1
        messages.append(
            m.Message(
                topic=topic,
                body=rnd.randbytes(size),
                flag=rnd.choice([0, rnd.randint(-(2**31), 2**31 - 1)]),
                properties=props,
                queue_id=rnd.randrange(TOPICS[topic]),
                sys_flag=sys_flag,
                born_timestamp=1_795_345_092_000 + i,
                born_host=("2001:db8::96ca:1", 5000 + i % 1000)
                if v6
                else (f"10.1.{i % 250}.{i % 7}", 30000 + i),
                store_host=("2001:db8:0:1::5", 10911) if rnd.random() < 0.05 else None,
                reconsume_times=rnd.choice([0, 0, rnd.randint(0, 16)]),
                prepared_transaction_offset=0,
            )
        )
    return messages
