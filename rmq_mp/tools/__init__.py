"""Operator tools: rmq-admin, `run.py status`, the metrics endpoint, audits, progress bars."""
