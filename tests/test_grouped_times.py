"""A user operator takes whole batches with each record's time (issue 20, item 12): the
default `per_time="grouped"` calls `on_batch` once per batch however many distinct event
times it holds, `ctx.times` gives each record's time, and the results are those of one call
per time (`per_time=True`, the per-record reference), on 1 and 2 executors."""

import os

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, Schema, State, Timestamp
from slashrt.ops.sinks import Collect

SCHEMA = Schema([("t", "<i8"), ("k", "<i8"), ("v", "<i8")])
OUT = {"epoch": "<i8", "k": "<i8", "s": "<i8", "calls": "<i8", "pid": "<i8"}
OUT_DTYPE = np.dtype([(n, t) for n, t in OUT.items()])
N = 800  # records per source, nearly every one at its own millisecond


class TimeSums(Operator):
    """Per (time, key) sums, emitted once the time is complete; vectorised: it holds
    (epoch, key, value) rows, asks to be notified at the batch's last time, and then sums
    every held row at or before the notified time. Its rows carry how many on_batch calls it
    had so far, and its process."""

    def __init__(self, per_time):
        self.per_time = per_time
        self.held = np.zeros(0, OUT_DTYPE)
        self.calls = 0

    async def on_batch(self, ctx, port, batch):
        self.calls += 1
        assert len(ctx.times) == len(batch) and (ctx.times >= ctx.time.epoch).all()
        rows = np.zeros(len(batch), OUT_DTYPE)
        rows["epoch"], rows["k"], rows["s"] = ctx.times, batch["k"], batch["v"]
        self.held = np.concatenate([self.held, rows])
        ctx.notify_at(Timestamp(int(ctx.times.max())))

    async def on_notify(self, ctx, time):
        due = self.held["epoch"] <= time.epoch
        now, self.held = self.held[due], self.held[~due]
        keys, inverse = np.unique(np.stack([now["epoch"], now["k"]], axis=1), axis=0, return_inverse=True)
        out = np.zeros(len(keys), OUT_DTYPE)
        out["epoch"], out["k"] = keys[:, 0], keys[:, 1]
        out["s"] = np.bincount(inverse.ravel(), weights=now["s"], minlength=len(keys)).astype(np.int64)
        out["calls"], out["pid"] = self.calls, os.getpid()
        await ctx.emit(out)

    def snapshot(self):
        return State({"held": self.held}, {"calls": self.calls})

    def restore(self, state):
        self.held, self.calls = state.arrays["held"], state.meta["calls"]


def _data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(N, SCHEMA.dtype)
    out["t"] = np.sort(rng.integers(0, 2 * N, N)) + rng.integers(0, 3, N)  # ms times, a little out of order
    out["k"] = rng.integers(0, 50, N)
    out["v"] = rng.integers(-100, 100, N)
    return out


def _flow(per_time) -> Dataflow:
    f = Dataflow("grouped")
    a = f.source("a", SCHEMA, time="t", max_delay=2)
    b = f.source("b", SCHEMA, time="t", max_delay=2).filter(lambda x: x["v"] != 0, name="nonzero")
    step = a.union(b, name="both").exchange(key="k", name="by_k")
    step.operator(TimeSums(per_time), name="sums", schema=OUT).sink(Collect(), name="out")
    return f


def _run(per_time, executors):
    # (an input array shared out across executors keeps each record's watermark: `Share`)
    result = slashrt.run(_flow(per_time), {"a": _data(1), "b": _data(2)}, executors=executors, slot_size=4096)
    out = result.outputs["grouped.out"]
    calls = sum(int(out["calls"][out["pid"] == pid].max()) for pid in np.unique(out["pid"]))
    rows = sorted(map(tuple, out[["epoch", "k", "s"]].tolist()))
    return rows, calls, sum(s.buffers for s in result.stats)


@pytest.fixture(scope="module")
def reference():
    """One call per distinct time, on one executor: the per-record reference."""
    rows, calls, _ = _run(True, 1)
    return rows, calls


@pytest.mark.parametrize("executors", [1, 2])
def test_one_call_per_batch_with_the_results_of_one_call_per_time(reference, executors):
    ref_rows, ref_calls = reference
    rows, calls, buffers = _run("grouped", executors)
    assert rows == ref_rows
    assert ref_calls > N  # a call per distinct time (of two sources)
    # each buffer a source read is one batch here, and once more on the peer its records were
    # shipped to (a shipment arrives at its batch's time)
    assert calls <= executors * buffers and calls * 20 < ref_calls, (calls, buffers, ref_calls)


def test_a_wrong_per_time_is_refused_naming_the_step():
    with pytest.raises(slashrt.DataflowError, match=r"step 'grouped.sums': TimeSums.per_time is 'each'; it must be"):
        slashrt.run(_flow("each"), {"a": _data(1), "b": _data(2)})


def test_bench_operators_checks_its_results_and_counts_the_calls():
    """`slashrt bench operators` (small): both flows exact in both modes; one call per batch
    against one per distinct time."""
    from slashrt.bench.operators import bench

    result = bench(records=600, baseline=True)
    assert result["correct"]
    assert result["sums_grouped"]["on_batch_calls"] <= 2 < result["distinct_times"] == result["sums_per_time"]["on_batch_calls"]
    assert result["join_grouped"]["on_batch_calls"] <= 4 < result["join_per_time"]["on_batch_calls"]
