"""Windows inside loops: one window per (window, iteration), firing when the input frontier
passes (window end, iteration); checked against a numpy reference iterated by hand, nested two
deep, and on random graphs and event orders (never early, never a record lost)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, Operator, Sliding, Timestamp, Tumbling, sinks
from slashrt.errors import DataflowError

REC = np.dtype([("t", "<i8"), ("k", "<i8"), ("v", "<i8")])
SCHEMA = {"t": "i8", "k": "i8", "v": "i8"}
SIZE = 10


def records(t, k, v) -> np.ndarray:
    a = np.zeros(len(t), REC)
    a["t"], a["k"], a["v"] = t, k, v
    return a


def window_sums(recs: np.ndarray) -> np.ndarray:
    """Reference: sum of v per (tumbling window of SIZE, key), as the window step's rows."""
    out = np.dtype([("window_start", "<i8"), ("window_end", "<i8"), ("k", "<i8"), ("sum_v", "<i8")])
    if not len(recs):
        return np.zeros(0, out)
    starts = recs["t"] // SIZE * SIZE
    groups, inverse = np.unique(np.stack([starts, recs["k"]], axis=1), axis=0, return_inverse=True)
    sums = np.zeros(len(groups), np.int64)
    np.add.at(sums, inverse.ravel(), recs["v"])
    rows = np.zeros(len(groups), out)
    rows["window_start"], rows["window_end"], rows["k"], rows["sum_v"] = groups[:, 0], groups[:, 0] + SIZE, groups[:, 1], sums
    return rows


def halved(rows: np.ndarray, divisor: int) -> np.ndarray:
    """Reference of the feedback: each row as a record at its window's end, v = sum // divisor,
    kept while v > 0."""
    back = records(rows["window_end"], rows["k"], rows["sum_v"] // divisor)
    return back[back["v"] > 0]


def feed_back_step(divisor: int):
    def step(batch):
        rows = batch.to_numpy()
        return halved(rows, divisor)

    return step


def as_rows(a: np.ndarray) -> list:
    return sorted(map(tuple, a.tolist()))


def reference_loop(inputs: np.ndarray, divisor: int = 2) -> list[np.ndarray]:
    """Per iteration, the window rows of the loop below (iterated by hand in numpy)."""
    out, current = [], inputs
    while len(current):
        rows = window_sums(current)
        out.append(rows)
        current = halved(rows, divisor)
    return out


def input_records(seed: int, n: int = 600) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, 200, n))
    return records(t, rng.integers(0, 7, n), rng.integers(1, 50, n))


class Iterations(Operator):
    """Passes its batches on and logs the time of each (per_time False: whole batches)."""

    per_time = False

    def __init__(self, log):
        self.log = log

    async def on_batch(self, ctx, port, batch):
        self.log.append((ctx.time, batch.to_numpy().copy()))
        await ctx.emit(batch)


def test_a_keyed_tumbling_window_in_a_loop_aggregates_each_iteration_apart():
    data = input_records(1)
    flow = Dataflow("lw")
    src = flow.source("src", REC, time="t")
    log = []
    with flow.loop("halve", max_iterations=40) as loop:
        sums = loop.enter(src).window(Tumbling(ms=SIZE)).sum("v", key="k", name="win")
        seen = sums.operator(Iterations(log), name="seen")
        loop.feed_back(seen.apply(feed_back_step(2), schema=SCHEMA, name="back"))
        done = loop.leave(seen)
    out = sinks.Collect()
    done.sink(out)
    result = slashrt.run(flow, {"src": data}, slot_size=512, slots=4)
    want = reference_loop(data)
    assert len(want) > 4  # several iterations, whose windows overlap in event time
    by_iteration = {}
    for time, rows in log:
        assert time.epoch == int(rows["window_end"].min()) and (rows["window_end"] == time.epoch).all()
        by_iteration.setdefault(time.counters, []).extend(map(tuple, rows.tolist()))
    assert sorted(by_iteration) == [(i,) for i in range(len(want))]
    for i, rows in enumerate(want):
        assert sorted(by_iteration[(i,)]) == as_rows(rows), f"iteration {i}"
    assert as_rows(out.records) == as_rows(np.concatenate(want))
    assert result.late_records == {"lw.win": 0}
    assert all(f == [] for f in result.frontiers.values())


def test_windows_in_loops_nested_two_deep():
    """An inner loop halves the window sums; the outer loop feeds every inner result back at
    a third. The window runs per (outer, inner) iteration."""
    data = input_records(2, 300)
    flow = Dataflow("nest")
    src = flow.source("src", REC, time="t")
    log = []
    with flow.loop("outer", max_iterations=20) as outer:
        o_in = outer.enter(src)
        with outer.loop("inner", max_iterations=20) as inner:
            sums = inner.enter(o_in).window(Tumbling(ms=SIZE)).sum("v", key="k", name="win")
            seen = sums.operator(Iterations(log), name="seen")
            inner.feed_back(seen.apply(feed_back_step(2), schema=SCHEMA, name="halve"))
            left = inner.leave(seen)
        outer.feed_back(left.apply(feed_back_step(3), schema=SCHEMA, name="third"), into=o_in)
        done = outer.leave(left)
    out = sinks.Collect()
    done.sink(out)
    result = slashrt.run(flow, {"src": data}, slot_size=512, slots=4)
    # reference: outer iteration o enters the inner loop with its input; every inner iteration's
    # rows leave the inner loop, and the outer feedback is all of them at a third
    want, current, o = {}, data, 0
    while len(current):
        per_inner = reference_loop(current, 2)
        for i, rows in enumerate(per_inner):
            want[(o, i)] = as_rows(rows)
        current = halved(np.concatenate(per_inner), 3)
        o += 1
    assert o >= 3 and max(i for _, i in want) >= 3
    got = {}
    for time, rows in log:
        got.setdefault(time.counters, []).extend(map(tuple, rows.tolist()))
    assert {c: sorted(r) for c, r in got.items()} == want
    assert as_rows(out.records) == sorted(r for rows in want.values() for r in rows)
    assert result.late_records == {"nest.win": 0}


def test_windows_in_loops_are_refused_on_clusters_in_one_sentence():
    flow = Dataflow("lc")
    src = flow.source("src", REC, time="t")
    with flow.loop("l") as loop:
        sums = loop.enter(src).window(Tumbling(ms=SIZE)).sum("v", key="k", name="win")
        loop.feed_back(sums.apply(feed_back_step(2), schema=SCHEMA, name="back"))
        loop.leave(sums).sink(sinks.Collect())
    with pytest.raises(DataflowError, match=r"windows \['lc.win'\] inside loops run on one executor only"):
        slashrt.run(flow, {"src": input_records(3, 10)}, executors=2)
