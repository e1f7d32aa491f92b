"""A local SparkSession set up the way rmq-mp's source needs it (Arrow on, a small local master, quiet logs).

Why each setting: Spark's Python workers must run this interpreter (`PYSPARK_PYTHON`), the JVM
must bind loopback (`SPARK_LOCAL_IP`; the host name resolves to 127.0.0.1 here), timestamps are
shown and filtered in UTC, and the UI and console progress bars are noise for a job or a test.
`spark.sql.python.filterPushdown.enabled` stays off: the source pushes no filter down (PySpark
4.3 reuses one query's pushed filters for the next query on the DataFrame: source.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG4J = Path(__file__).with_name("log4j2.properties")


def local_session(
    app_name: str = "rmq-mp",
    *,
    master: str = "local[2]",
    work_dir: str | os.PathLike[str] | None = None,
    shuffle_partitions: int = 2,
    fast_start: bool = False,
    extra: dict[str, str] | None = None,
) -> Any:
    """A local SparkSession with the ``rmq`` format registered. ``fast_start`` trades JIT for
    start-up time (C1 only): for tests, never for jobs (2-3x slower heavy work)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from rmq_mp.spark import register

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    if fast_start:
        java_opts += " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.log.level", "ERROR")
    )
    if work_dir is not None:
        work = Path(work_dir)
        builder = builder.config("spark.local.dir", str(work / "local")).config(
            "spark.sql.warehouse.dir", str(work / "warehouse")
        )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
