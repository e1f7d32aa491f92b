"""The producer's public import path: `Producer`, `SendResult`, `SendBatchResult`.

The put path lives in `rmq_mp.put` (the producer, its results, the flush wait, the compiled
core and its loader); this module keeps ``from rmq_mp.producer import Producer`` working.
"""

from rmq_mp.put.producer import Producer
from rmq_mp.put.results import SendBatchResult, SendResult

__all__ = ["Producer", "SendBatchResult", "SendResult"]
