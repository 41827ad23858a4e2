"""The FileSource rescaling tests' job (tests/connectors/test_file_rescale.py): the files under
$SLASHRT_TEST_OUT/in into a paced tumbling-window sum per key, into a transactional CSV
directory $SLASHRT_TEST_OUT/out; `job()` is the same for `slashrt run _file_job.py:job`."""

import os
from pathlib import Path

from slashrt import Dataflow, Tumbling
from slashrt.bench.chaos import ChaosCsv
from slashrt.connectors import FileSource

from tests.connectors.test_executors import SCHEMA
from tests.snapshot._paced import Paced


def flow(directory, pace: Paced = Paced()) -> Dataflow:
    job = Dataflow("w")
    job.source("events", SCHEMA, time="t", max_delay=20).filter(pace, name="paced").window(Tumbling(ms=100)).sum(
        "v", key="k", output="total").sink(ChaosCsv(Path(directory) / "out", transactional=True), name="out")
    return job


def source(directory) -> FileSource:
    return FileSource(Path(directory) / "in", batch_records=500)  # batches of 500: positions inside the files


def job():
    return flow(os.environ["SLASHRT_TEST_OUT"]), {"events": source(os.environ["SLASHRT_TEST_OUT"])}
