"""Ingestion over verbs: Spark tasks' partitions as RDMA WRITEs into the ingest endpoint's ring.

Inside the VM the endpoint finds rxe0 and offers a verbs listener beside its TCP one; tasks on
this host then send over verbs ("auto"), and the exactly-once protocol is unchanged: a task
killed mid-partition and its retry, a duplicate, the driver's commit (over TCP). The last test
runs the whole pipeline in real PySpark (local mode; its JVM start costs about 100 s under
the emulated CPU, so it is one test with one small job).
"""

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import trio

import slashrt
from slashrt import Schema, Tumbling
from slashrt._buffer import Control
from slashrt._runtime import run_receivers
from slashrt.spark import IngestEndpoint, IngestServer, ingest, plan_columns
from slashrt.spark._ingest import _driver_send, _PartitionPusher
from slashrt.transport._auth import generate_secret

REPO = str(Path(__file__).resolve().parents[2])
SCHEMA = Schema({"t": "i8", "key": "i8"})


def counts_flow():
    flow = slashrt.Dataflow("counts")
    events = flow.source("events", SCHEMA, time="t")
    sink = slashrt.sinks.Collect()
    events.window(Tumbling(ms=100)).count(key="key").sink(sink, name="out")
    return flow, sink


def batches(start, end, per_batch=700):
    for a in range(start, end, per_batch):
        ids = np.arange(a, min(end, a + per_batch), dtype=np.int64)
        yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(ids % 5)], names=["t", "key"])


def expected(ts):
    ts = np.asarray(ts)
    pairs, counts = np.unique(np.stack([ts // 100 * 100, ts % 5], axis=1), axis=0, return_counts=True)
    return sorted(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), counts.tolist()))


def rows_of(sink):
    r = sink.records
    return sorted(zip(r["window_start"].tolist(), r["key"].tolist(), r["count"].tolist()))


async def test_task_attempts_stream_over_verbs_and_only_committed_ones_count(rdma_device):
    from pyspark.sql import types as T

    plan = plan_columns(T.StructType([T.StructField("t", T.LongType(), False), T.StructField("key", T.LongType(), False)]), SCHEMA)
    secret = generate_secret()
    flow, sink = counts_flow()
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=8)

    async def attempt(target, partition, attempt_id, data, fail_after=None):
        def fault(p, number, rows):
            if fail_after is not None and rows >= fail_after:
                raise RuntimeError("task killed")

        return await _PartitionPusher(target, plan, 9, secret, fault=fault)._push(iter(data), partition, attempt_id, 0)

    async with endpoint, trio.open_nursery() as nursery:
        target = endpoint.target
        assert target.verbs_address is not None, "the endpoint found no RDMA device in the VM"
        nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
        with pytest.raises(RuntimeError, match="task killed"):  # dies mid-partition, over verbs
            await attempt(target, 0, 10, batches(0, 3000), fail_after=1400)
        first = await attempt(target, 0, 11, batches(0, 3000))  # its retry
        second = await attempt(target, 1, 12, batches(3000, 5000))
        speculative = await attempt(target, 1, 13, batches(3000, 5000))  # a copy of partition 1
        picks = [(Control.INGEST_PICK, 11, 3000, 0), (Control.INGEST_PICK, 13, 2000, 1)]
        await _driver_send(target, secret, picks + [(Control.INGEST_COMMIT, 9, 2, 0), (Control.INGEST_END, 0, 0, 0)])
    stats = endpoint.stats
    assert [r["verbs"] for r in (first, second, speculative)] == [1, 1, 1]
    assert stats.verbs_connections == 4 and stats.connections == 5  # four attempts over verbs, the driver over tcp
    assert (stats.attempts_aborted, stats.attempts_dropped, stats.rows_committed) == (1, 1, 5000)
    assert rows_of(sink) == expected(np.arange(5000))


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    # qemu's emulated AVX miscomputes some of the JIT's code (seen: the JVM died with SIGSEGV
    # in SharedRuntime::generate_class_cast_message); without AVX it runs
    os.environ["JAVA_TOOL_OPTIONS"] = "-XX:UseAVX=0"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("slashrt-rdma-vm")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_spark_ingests_a_dataframe_over_verbs_exactly(rdma_device, spark):
    n = 20_000
    flow, sink = counts_flow()
    df = spark.range(0, n, numPartitions=2).selectExpr("id as t", "id % 5 as key")
    with IngestServer(flow) as server:
        target = server.target()
        assert target.verbs_address is not None
        report = ingest(df, target, secret=server.secret, check="tasks", end=True)
        result = server.result(timeout=120)
        stats = server.endpoints["events"].stats
    assert report.verbs_partitions == [0, 1], report.partitions
    assert report.rows == n == result.records
    assert stats.verbs_connections == 2 and stats.rows_committed == n
    assert rows_of(sink) == expected(np.arange(n))
