"""Ingestion over verbs: Spark tasks' partitions as RDMA WRITEs into the ingest endpoint's ring.

Inside the VM the endpoint finds rxe0 and offers a verbs listener beside its TCP one; tasks on
this host then send over verbs ("auto"), and the exactly-once protocol is unchanged: a task
killed mid-partition and its retry, a duplicate, the driver's commit (over TCP). The last test
runs the whole pipeline in real PySpark (local mode; its JVM start is the slowest part under
the emulated CPU, so it is one test with one small job).
"""

import contextlib

import numpy as np
import pytest
import trio

from slashrt._buffer import Control
from slashrt._runtime import run_receivers
from slashrt.spark import IngestEndpoint
from slashrt.spark._ingest import _driver_send, _PartitionPusher
from slashrt.transport._auth import generate_secret

# the host suite's ingest helpers (tests/ is on sys.path: its packages are imported from there)
from spark.test_endpoint import PLAN, batches, flow_and_sink, reference, rows_of

from . import _spark_jvm


async def test_task_attempts_stream_over_verbs_and_only_committed_ones_count(rdma_device):
    secret = generate_secret()
    flow, sink = flow_and_sink()
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=8)

    async def attempt(target, partition, attempt_id, data, fail_after=None):
        def fault(p, number, rows):
            if fail_after is not None and rows >= fail_after:
                raise RuntimeError("task killed")

        return await _PartitionPusher(target, PLAN, 9, secret, fault=fault)._push(iter(data), partition, attempt_id, 0)

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
    assert rows_of(sink) == reference(np.arange(5000))


JVM_ATTEMPTS = 3


def _start_spark():
    """A fresh local session (`_spark_jvm`: its options and class-data archive). Under qemu's
    emulated CPU the JVM now and then dies of SIGSEGV in its own generated code (seen at
    start-up and in a job, with and without AVX): a dead JVM's context is forgotten first, so
    the next session gets a new JVM."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    SparkContext._active_spark_context = SparkContext._gateway = SparkContext._jvm = None
    SparkSession._instantiatedSession = SparkSession._activeSession = None
    return _spark_jvm.session("slashrt-rdma-vm")


def test_spark_ingests_a_dataframe_over_verbs_exactly(rdma_device):
    """Only a JVM that died (py4j lost its connection) is retried, with a new JVM and a new
    dataflow; any other failure fails the test at once."""
    from py4j.protocol import Py4JNetworkError

    n = 20_000
    crashes = []
    for _ in range(JVM_ATTEMPTS):
        spark = None
        try:
            spark = _start_spark()
            report, result, stats, sink = _spark_jvm.ingest_job(spark, n, check_verbs=True)
            break
        except (Py4JNetworkError, ConnectionRefusedError) as exc:
            crashes.append(f"{type(exc).__name__}: {exc}")
        finally:
            if spark is not None:
                with contextlib.suppress(Exception):
                    spark.stop()
    else:
        pytest.fail(f"Spark's JVM died in all {JVM_ATTEMPTS} attempts under the emulated CPU: {crashes}")
    assert report.verbs_partitions == [0, 1], report.partitions
    assert report.rows == n == result.records
    assert stats.verbs_connections == 2 and stats.rows_committed == n
    assert rows_of(sink) == reference(np.arange(n))
