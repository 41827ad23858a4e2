"""Liveness does not depend on how user code splits its work (issue 20, item 7): many short
operator calls inside one pipeline call keep heartbeats and reports to their period, and one
call longer than the heartbeat timeout fails the job with a sentence naming its step."""

import os
import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, Schema
from slashrt.cluster import ClusterError, PerExecutor
from slashrt.ops.sinks import Collect

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8")])
TIMES = 300  # distinct event times per executor: one on_batch call each (per_time=True)


def _spin(seconds: float) -> None:
    """Busy in pure Python (as user code is): the interpreter still switches threads."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class ShortCalls(Operator):
    """One call per distinct time, each busy `each` s: together far longer than the timeout."""

    per_time = True
    stateless = True

    def __init__(self, each: float):
        self.each = each

    async def on_batch(self, ctx, port, batch):
        _spin(self.each)
        await ctx.emit(batch)


class OneLongCall(Operator):
    """Executor 1's first call is busy `seconds` s in one go."""

    per_time = False

    def __init__(self, seconds: float):
        self.seconds, self.done = seconds, False

    async def on_batch(self, ctx, port, batch):
        if not self.done and len(batch) and batch["key"][0] == 1:
            self.done = True
            _spin(self.seconds)
        await ctx.emit(batch)


def _make(index, executors):
    out = np.zeros(TIMES, SCHEMA.dtype)
    out["ts"] = np.arange(TIMES)  # every record its own millisecond
    out["key"] = index
    return out


def _flow(op) -> tuple[Dataflow, Collect]:
    f, out = Dataflow("busy"), Collect()
    f.source("r", SCHEMA, time="ts").operator(op, name="op").sink(out, name="out")
    return f, out


def test_many_short_calls_in_one_pipeline_call_keep_the_executor_alive():
    """300 calls of 5 ms each (1.5 s in all, in one pipeline call: the input is one
    buffer) on each of 2 executors, heartbeat timeout 1 s: the loop turns between calls, the
    job succeeds (before, the executors were declared dead)."""
    f, out = _flow(ShortCalls(0.005))
    result = slashrt.run(f, {"r": PerExecutor(_make)}, executors=2, heartbeat_interval=0.1, heartbeat_timeout=1)
    assert len(result.outputs["busy.out"]) == 2 * TIMES


def test_one_call_longer_than_the_timeout_fails_naming_the_step():
    """Executor 1 is alive (its stall watch speaks for it) but one call runs 2 s: the job
    fails within the timeout, naming the step (before: "stopped answering")."""
    f, _ = _flow(OneLongCall(2.0))
    with pytest.raises(ClusterError, match=r"executor 1 is alive but stuck: one on_batch\(\) call of step 'busy.op' "
                       r"has run for [\d.]+ s, longer than the heartbeat timeout of 1 s") as err:
        slashrt.run(f, {"r": PerExecutor(_make)}, executors=2, heartbeat_interval=0.1, heartbeat_timeout=1)
    assert "stopped answering" not in str(err.value)


class UntilReported(Operator):
    """Executor 0's first call removes the run's report file; then every call (one per time,
    5 ms each) looks whether the coordinator wrote it again, up to `TIMES` calls, and passes
    its records on with `key` 1 once it did."""

    per_time = True
    stateless = True

    def __init__(self, path: str):
        self.path = path

    async def on_batch(self, ctx, port, batch):
        out = batch.to_numpy().copy()
        if out["key"][0] == 0 and out["ts"][0] == 0:
            os.remove(self.path)
        _spin(0.005)
        out["key"] = os.path.exists(self.path)
        await ctx.emit(out)


def test_reports_keep_their_period_while_operators_run_many_short_calls(tmp_path):
    """The report file is rewritten while the executor is still in the pipeline call that
    runs its 300 calls (before, only after it: the reporting task waited for the loop)."""
    path = tmp_path / "report.json"
    path.write_text("{}")
    f, _ = _flow(UntilReported(str(path)))
    result = slashrt.run(f, {"r": _make(0, 1)}, on_report=str(path), report_every=0.05)
    seen = result.outputs["busy.out"]["key"]
    assert len(seen) == TIMES and seen.any(), "no report was written while the operator ran"
    assert seen[-TIMES // 2:].all()  # within the first half of the calls (0.75 s of 1.5 s)
