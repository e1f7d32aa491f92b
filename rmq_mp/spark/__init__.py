"""rmq-mp on Spark: the `rmq` data source (batch and streaming reads, a sink) and `rmq-spark` jobs.

Spark is an optional extra (``pip install .[spark]``); nothing here is imported by the store.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``rmq`` format with a SparkSession (``spark.read.format("rmq")``, …)."""
    from rmq_mp.spark.source import RmqDataSource

    spark.dataSource.register(RmqDataSource)
