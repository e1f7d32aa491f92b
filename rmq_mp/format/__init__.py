"""Bytes only: messages, CommitLog records and their batch decoding (docs/format.md §2)."""
