"""A push-consumer process for tests: ``python -m tests.push_member <store> <group> <topic> <out>``.

Runs a `PushConsumer` (CLUSTERING, 4 consume threads) whose listener appends each message's
body to ``out`` (one line each, flushed before it answers CONSUME_SUCCESS, so a kill -9 leaves
every message it acknowledged on disk), until SIGTERM, then shuts down cleanly.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from rmq_mp.client.push_consumer import ConsumeConcurrentlyContext, PushConsumer
from rmq_mp.format.message import MessageExt
from rmq_mp.outcomes import ConsumeConcurrentlyStatus


def main() -> int:
    store, group, topic, out_path = sys.argv[1:5]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    lock = threading.Lock()
    with open(out_path, "a", encoding="utf-8") as out:

        def listener(msgs: list[MessageExt], _c: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            time.sleep(0.001)  # work that takes time: both members are still at it when one dies
            with lock:
                out.write("".join(f"{msg.body.decode()}\n" for msg in msgs))
                out.flush()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(store, group, persist_consumer_offset_interval_ms=200)
        consumer.subscribe(topic, "*")
        consumer.register_message_listener(listener)
        consumer.start()
        stop.wait()
        consumer.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
