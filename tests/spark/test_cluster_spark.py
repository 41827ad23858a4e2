"""slashrt clusters with Spark, in real PySpark (the shared local[2,4] session): executors
started as the tasks of a barrier stage, failures that fail the stage and leave no process
behind, and `slashrt spark-demo` (Spark ingesting into a 2-executor cluster)."""

import functools
import json
import os
import re
import signal
import sys
import time

import cloudpickle
import numpy as np
import pyspark.cloudpickle
import pytest

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.bench._common import sort_rows
from slashrt.cluster import ClusterError, Ingest, PerExecutor
from slashrt.errors import DataflowError
from slashrt.spark import run_on_spark

from tests.cluster._processes import parent

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])

# the functions of this module travel by value: Spark's workers and the agents cannot import
# it under the name pytest gives it
for _pickler in {cloudpickle, pyspark.cloudpickle}:
    _pickler.register_pickle_by_value(sys.modules[__name__])


def records(n, *, seed, keys=50, per_ms=20):
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["ts"] = np.arange(n, dtype=np.int64) // per_ms
    out["key"] = rng.integers(0, keys, n) * 7919 - keys
    out["value"] = rng.integers(-1000, 1000, n)
    return out


def summing(sink, apply=None):
    f = Dataflow("spark-p2")
    s = f.source("r", SCHEMA, time="ts", max_delay=0)
    if apply is not None:
        s = s.apply(apply, name="check")
    s.window(Tumbling(ms=250)).sum("value", key="key", output="total").sink(sink, name="out")
    return f


def rows(sink):
    return sort_rows(sink.records, "window_start", "key")


def agents_below(pid):
    """Executor agent processes among the descendants of `pid` (Spark's Python workers start
    them; the workers descend from the JVM, which descends from this test process)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            children.setdefault(parent(entry), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if re.search(rb"slashrt\.cluster\.(agent|_zygote)", f.read()):  # spawned, or forked (and the zygote)
                        found.append(child)
            except OSError:
                pass
    return found


def assert_no_agents_left(timeout=10.0):
    deadline = time.monotonic() + timeout
    while agents_below(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agents_below(os.getpid()) == []


def test_a_barrier_mode_cluster_gives_the_sequential_result(spark):
    data = records(60_000, seed=1)
    expected = slashrt.sinks.Collect()
    slashrt.run(summing(expected), {"r": data})
    sink = slashrt.sinks.Collect()
    result = run_on_spark(spark, summing(sink), {"r": data}, executors=2, partitions=16, epoch_bytes=64 << 10)
    np.testing.assert_array_equal(rows(sink), rows(expected))
    assert result.outputs["spark-p2.out"] is sink.records  # the driver's own sink was filled
    assert [s.executor for s in result.stats] == [0, 1]
    assert all(s.records > len(data) // 3 for s in result.stats)  # each took its share of blocks
    assert_no_agents_left()


def _own_stream(index, executors):
    d = records(20_000, seed=10 + index)
    d["value"] = d["value"] * 2 + index  # odd values: executor 1's stream
    return d


def _fails_on_executor_1(batch, die=False):
    if len(batch) and batch["value"][0] % 2 and batch["ts"][0] > 100:
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("injected failure on executor 1")
    return batch


@pytest.mark.parametrize("how,message", [
    ("raise", r"step '.*check.*': user function raised .*injected failure on executor 1 \(on executor 1\)"),
    ("die", r"executor 1 lost its control connection"),
])
def test_a_failing_executor_fails_the_stage_clearly_and_leaves_no_process(spark, how, message):
    sink = slashrt.sinks.Collect()
    fails = functools.partial(_fails_on_executor_1, die=how == "die")
    started = time.monotonic()
    with pytest.raises(ClusterError, match=message) as info:
        run_on_spark(spark, summing(sink, fails), {"r": PerExecutor(_own_stream)}, executors=2)
    assert "barrier tasks" in str(info.value) and time.monotonic() - started < 60
    assert sink.records is None  # no partial result
    assert_no_agents_left()
    # the session is still usable after the failed stage
    assert spark.sparkContext.parallelize(range(4), 2).sum() == 6


def test_more_executors_than_spark_task_slots_is_refused(spark):
    with pytest.raises(DataflowError, match="task slots"):
        run_on_spark(spark, summing(slashrt.sinks.Collect()), {"r": records(10, seed=0)}, executors=3)


def test_ingest_inputs_need_someone_to_hand_their_targets_to():
    with pytest.raises(DataflowError, match="on_ready"):
        slashrt.run(summing(slashrt.sinks.Collect()), {"r": Ingest()}, executors=2, transport="tcp")


def test_spark_demo_ingests_into_a_two_executor_cluster_exactly(spark, capsys):
    from slashrt import cli

    code = cli.main(["spark-demo", "--events", "100000", "--campaigns", "100", "--partitions", "4", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["correct"] is True
    assert report["rows_ingested"] == 100_000 and report["executors"] == 2 and report["transport"] == "tcp"
    assert report["rows_per_s"] > 0 and report["seconds"] > 0
    split = [report[f"fraction_{k}"] for k in ("spark", "transfer", "slashrt")]
    assert all(0 <= f <= 1 for f in split) and abs(sum(split) - 1) < 0.01
    assert report["late_records"] == 0
    assert_no_agents_left()
