"""Loops on one executor: ingress, feedback through the executor's queue, egress, nesting,
the iteration bound, and the errors that name the steps."""

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, Timestamp, Tumbling, sinks
from slashrt._dataflow import UnionSpec
from slashrt.errors import DataflowError, OperatorError

REC = np.dtype([("v", "<i8"), ("n", "<i8"), ("t", "<i8")])


def records(values, times) -> np.ndarray:
    a = np.zeros(len(values), REC)
    a["v"], a["t"] = values, times
    return a


def plus_one(column):
    def inc(batch):
        out = batch.to_numpy(REC).copy()
        out[column] += 1
        return out

    return inc


class StepOnNotify(Operator):
    """Holds each time's batches until the time is complete, then emits them with n + 1: every
    iteration goes through a notification, and logs the order of events."""

    def __init__(self, log):
        self.held, self.log = {}, log

    async def on_batch(self, ctx, port, batch):
        self.log.append(("batch", ctx.time))
        self.held.setdefault(ctx.time, []).append(batch.to_numpy(REC).copy())
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time):
        self.log.append(("notify", time))
        out = np.concatenate(self.held.pop(time))
        out["n"] += 1
        await ctx.emit(out)


def test_a_loop_counts_to_k_one_notification_per_iteration():
    k, log = 5, []
    flow = Dataflow("count")
    src = flow.source("src", REC, time="t")
    with flow.loop("up") as loop:
        step = loop.enter(src).operator(StepOnNotify(log), name="step")
        loop.feed_back(step.filter(lambda b: b["n"] < k))
        done = loop.leave(step.filter(lambda b: b["n"] >= k))
    out = sinks.Collect()
    done.sink(out)
    data = records(np.arange(30), np.repeat([0, 1, 2], 10))
    result = slashrt.run(flow, {"src": data}, slot_size=64, slots=4)
    assert sorted(out.records["v"].tolist()) == list(range(30))
    assert set(out.records["n"].tolist()) == {k}
    notified = [t for what, t in log if what == "notify"]
    assert sorted(notified, key=Timestamp.sort_key) == [Timestamp(e, (i,)) for e in range(3) for i in range(k)]
    assert len(set(notified)) == len(notified)  # exactly once each
    for i, (what, t) in enumerate(log):  # never early: no batch at a time <= t after on_notify(t)
        if what == "notify":
            assert not any(w == "batch" and b.less_equal(t) for w, b in log[i + 1:])
    assert all(v == [] for v in result.frontiers.values())


def test_nested_loops_two_deep():
    seen = set()

    def record_time(batch):
        return batch

    class Seen(Operator):
        async def on_batch(self, ctx, port, batch):
            seen.add(ctx.time)
            await ctx.emit(batch)

    flow = Dataflow("nest")
    src = flow.source("src", REC, time="t")
    with flow.loop("outer") as outer:
        o = loop_in = outer.enter(src)
        with outer.loop("inner") as inner:
            i = inner.enter(o).operator(Seen(), name="seen").apply(plus_one("n"), name="inc_n")
            inner.feed_back(i.filter(lambda b: b["n"] % 3 != 0))
            after_inner = inner.leave(i.filter(lambda b: b["n"] % 3 == 0))
        o2 = after_inner.apply(plus_one("v"), name="inc_v")
        outer.feed_back(o2.filter(lambda b: b["n"] < 6), into=loop_in)
        done = outer.leave(o2.filter(lambda b: b["n"] >= 6))
    out = sinks.Collect()
    done.sink(out)
    slashrt.run(flow, {"src": records([0, 100], [7, 7])})
    assert sorted(out.records[["v", "n"]].tolist()) == [(2, 6), (102, 6)]
    assert seen == {Timestamp(7, (o, i)) for o in range(2) for i in range(3)}
    assert record_time  # (kept simple: the times above are the loop counters of each pass)


def spin_flow(bound: int, spinning=lambda batch: batch["n"] >= 0) -> Dataflow:
    """A loop that feeds back the `spinning` records forever (n counts their iterations), and
    lets the others leave: it fails once a spinning record reaches the bound."""
    flow = Dataflow("spin")
    src = flow.source("src", REC, time="t")
    with flow.loop("forever", max_iterations=bound) as loop:
        x = loop.enter(src).apply(plus_one("n"), name="inc")
        loop.feed_back(x.filter(spinning, name="again"))
        loop.leave(x.filter(lambda b: ~spinning(b), name="done")).sink(sinks.Collect(), name="out")
    return flow


def test_max_iterations_reached_fails_naming_loop_epoch_and_bound():
    flow = spin_flow(7)
    with pytest.raises(OperatorError, match=r"loop 'spin.forever' reached its bound of max_iterations=7 at epoch 42"):
        slashrt.run(flow, {"src": records([1], [42])})


def test_loop_converging_within_its_bound_is_fine():
    flow = Dataflow("ok")
    src = flow.source("src", REC, time="t")
    with flow.loop("l", max_iterations=3) as loop:
        x = loop.enter(src).apply(plus_one("n"), name="inc")
        loop.feed_back(x.filter(lambda b: b["n"] <= 3))
        out = sinks.Collect()
        loop.leave(x.filter(lambda b: b["n"] > 3)).sink(out)
    slashrt.run(flow, {"src": records([1, 2], [0, 1])})
    assert out.records["n"].tolist() == [4, 4]


def test_scope_errors_name_the_steps():
    flow = Dataflow("s")
    src = flow.source("src", REC, time="t")
    other = flow.source("other", REC, time="t")
    with flow.loop("l") as loop:
        inside = loop.enter(src, name="in")
        with pytest.raises(DataflowError, match=r"steps 's.in' .* and 's.other' .* different loop scopes"):
            inside.union(other)
        with pytest.raises(DataflowError, match=r"different loop scopes"):
            inside.connect(other)
        with pytest.raises(DataflowError, match=r"feed_back\(\) takes a stream of the loop, but step 's.other'"):
            loop.feed_back(other)
        with pytest.raises(DataflowError, match=r"leave\(\) takes a stream of the loop, but step 's.other'"):
            loop.leave(other)
        with pytest.raises(DataflowError, match=r"enter\(\) takes a stream of the scope around the loop"):
            loop.enter(inside)
        loop.enter(other, name="in2")
        with pytest.raises(DataflowError, match="2 streams were entered; say which one"):
            loop.feed_back(inside)


def test_a_cycle_without_feedback_is_refused_naming_its_steps():
    flow = Dataflow("cyc")
    src = flow.source("src", REC)
    # a union that reads a step downstream of itself (no public method makes this: by hand)
    flow._add(UnionSpec("cyc.merge", ("cyc.src", "cyc.again")))
    merged = slashrt.Stream(flow, "cyc.merge", dict(src.fields), None)
    merged.apply(lambda b: b, name="again").sink(sinks.Collect())
    with pytest.raises(DataflowError, match=r"cycle cyc\.merge -> cyc\.again -> cyc\.merge does not advance"):
        slashrt.run(flow, {"src": records([1], [0])})


@pytest.mark.parametrize("per_time", [True, "grouped"])
@pytest.mark.parametrize("max_delay, want", [(0, {0: [0, 1], 1: [2, 3, 4], 2: [5, 6, 7]}), (1, {-1: [0, 1], 0: [2, 3, 4], 1: [5, 6, 7]})])
def test_a_source_feeding_a_loop_gives_each_record_its_time(max_delay, want, per_time):
    """Each record is at the running maximum of its event times minus max_delay, so an
    epoch's records are never processed at an earlier epoch's time: per_time=True cuts the
    batch into pieces of one time each (ctx.time); the default takes it whole, each record's
    time in ctx.times (ctx.time the least)."""
    got, calls = {}, []

    class Times(Operator):
        async def on_batch(self, ctx, port, batch):
            calls.append(ctx.time.epoch)
            assert (ctx.times >= ctx.time.epoch).all()
            for epoch, v in zip(ctx.times.tolist(), batch["v"].tolist()):
                got.setdefault(epoch, []).append(v)
            await ctx.emit(batch)

    Times.per_time = per_time

    flow = Dataflow("cut")
    src = flow.source("src", REC, time="t", max_delay=max_delay)
    with flow.loop("l") as loop:
        x = loop.enter(src).operator(Times(), name="times")
        loop.leave(x).sink(sinks.Collect())
    slashrt.run(flow, {"src": records(np.arange(8), [0, 0, 1, 1, 0, 2, 2, 1])})
    assert got == want
    assert len(calls) == (3 if per_time is True else 1) and calls[0] == min(want)


def test_windows_after_a_loop_fire_on_its_frontier():
    """Records leave the loop at their epoch; a window downstream counts them per window."""
    flow = Dataflow("after")
    src = flow.source("src", REC, time="t")
    with flow.loop("l", max_iterations=3) as loop:
        x = loop.enter(src).apply(plus_one("n"), name="inc")
        loop.feed_back(x.filter(lambda b: b["n"] < 3))
        done = loop.leave(x.filter(lambda b: b["n"] >= 3))
    out = sinks.Collect()
    done.window(Tumbling(ms=10)).count(key="n", name="win").sink(out)
    times = np.arange(0, 100, 3)
    result = slashrt.run(flow, {"src": records(np.arange(len(times)), times)}, slot_size=64, slots=4)
    got = {int(r["window_start"]): int(r["count"]) for r in out.records}
    assert got == {s: int(((times >= s) & (times < s + 10)).sum()) for s in range(0, 100, 10)}
    assert result.late_records == {"after.win": 0}


def test_label_propagation_in_a_loop_with_two_entered_streams():
    """The connected-components shape: labels and edges enter one loop, a two-input operator
    takes one propagation step per iteration (on its notification), changed labels go round
    again; the labels that leave give every node the least node id of its component."""
    nodes, rng = 40, np.random.default_rng(3)
    edge_dt = np.dtype([("u", "<i8"), ("v", "<i8"), ("t", "<i8")])
    label_dt = np.dtype([("node", "<i8"), ("label", "<i8"), ("t", "<i8")])
    edges = np.zeros(30, edge_dt)
    edges["u"], edges["v"], edges["t"] = rng.integers(0, nodes, 30), rng.integers(0, nodes, 30), np.repeat([0, 1, 2], 10)
    initial = np.zeros(nodes, label_dt)
    initial["node"] = initial["label"] = np.arange(nodes)

    class Propagate(Operator):
        def __init__(self):
            self.labels = np.arange(nodes)
            self.u, self.v = np.empty(0, np.int64), np.empty(0, np.int64)

        async def on_batch(self, ctx, port, batch):
            if port == 0:
                np.minimum.at(self.labels, batch["node"], batch["label"])
            else:
                self.u, self.v = np.concatenate([self.u, batch["u"]]), np.concatenate([self.v, batch["v"]])
            ctx.notify_at(ctx.time)

        async def on_notify(self, ctx, time):
            new = self.labels.copy()  # one step along every edge, both ways
            np.minimum.at(new, self.v, self.labels[self.u])
            np.minimum.at(new, self.u, self.labels[self.v])
            changed = np.flatnonzero(new < self.labels)
            self.labels = new
            out = np.zeros(len(changed), label_dt)
            out["node"], out["label"], out["t"] = changed, new[changed], time.epoch
            await ctx.emit(out)

    flow = Dataflow("cc")
    labels_in = flow.source("labels", label_dt, time="t")
    edges_in = flow.source("edges", edge_dt, time="t")
    with flow.loop("cc", max_iterations=nodes) as loop:
        labels = loop.enter(labels_in)
        step = labels.connect(loop.enter(edges_in)).operator(Propagate(), name="propagate")
        loop.feed_back(step, into=labels)
        final = loop.leave(step)
    out = sinks.Collect()
    final.sink(out)
    slashrt.run(flow, {"labels": initial, "edges": edges})
    got = np.arange(nodes)
    np.minimum.at(got, out.records["node"], out.records["label"])
    want = np.arange(nodes)  # reference: propagate to the fixed point in numpy
    while True:
        new = want.copy()
        np.minimum.at(new, edges["v"], want[edges["u"]])
        np.minimum.at(new, edges["u"], want[edges["v"]])
        if np.array_equal(new, want):
            break
        want = new
    assert np.array_equal(got, want)
    assert len(np.unique(want)) < nodes  # some components merged


def test_a_feedback_must_have_the_columns_of_the_stream_it_goes_back_to():
    flow = Dataflow("fb")
    src = flow.source("src", REC, time="t")
    with flow.loop("l") as loop:
        x = loop.enter(src)
        with pytest.raises(slashrt.SchemaError, match=r"the feedback of 'fb.project_\d' has columns"):
            loop.feed_back(x.project("v", "t"))
        with pytest.raises(DataflowError, match="into= must be a stream entered with this loop's enter"):
            loop.feed_back(x, into=src)
