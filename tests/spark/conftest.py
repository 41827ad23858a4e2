"""One local SparkSession for the whole test session (starting a JVM costs seconds).

`local[2,4]`: two task threads, and a task may fail up to 4 times before its job fails (the
retry tests need Spark to retry). Small Arrow batches so that a partition is several batches
and a failure can happen in the middle of one. The UI is off; the session stops at the end.
"""

import pytest

from slashrt.spark.demo import local_session


@pytest.fixture(scope="session")
def spark():
    session, _ = local_session(
        "local[2,4]",
        app="slashrt-tests",
        driver_memory="1g",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "5000",
        },
    )
    yield session
    session.stop()
