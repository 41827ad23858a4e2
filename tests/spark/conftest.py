"""One local SparkSession for the whole test session (starting a JVM costs seconds).

`local[2,4]`: two task threads, and a task may fail up to 4 times before its job fails (the
retry tests need Spark to retry). Small Arrow batches so that a partition is several batches
and a failure can happen in the middle of one. The UI is off; the session stops at the end.
"""

import os
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    # Spark's Python workers must import this checkout of slashrt with this interpreter
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("slashrt-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "5000")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
