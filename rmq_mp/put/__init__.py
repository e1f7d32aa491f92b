"""The put path: a producer process appends to the store's commit log itself.

- `producer`: `Producer`, the pure-Python reference (routing, encoding, the put lock's append
  with its journal and undo) and the front of the compiled core;
- `results`: `SendResult`, `SendBatchResult`;
- `flush_wait`: SYNC_FLUSH's flush request and wait;
- `metrics`: the producer's latency and lock-hold histograms in shared memory;
- `native`: which path runs (the compiled core `_core`, built from `_core.c` by the install, or
  the reference: ``RMQ_PURE_PYTHON=1``, or no compiler).
"""
