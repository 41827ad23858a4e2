"""Notifications: never early, never lost, exactly once, in order; and the errors of an
operator that acts below the time it holds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, Operator, Timestamp, Tumbling, sinks
from slashrt.errors import OperatorError

REC = np.dtype([("v", "<i8"), ("n", "<i8"), ("t", "<i8")])


def records(times, n=None) -> np.ndarray:
    a = np.zeros(len(times), REC)
    a["v"] = np.arange(len(times))
    a["t"] = times
    if n is not None:
        a["n"] = n
    return a


class Recorder(Operator):
    """Logs every batch and notification; asks to be notified at each batch's time (and,
    with `later`, at a later epoch too); with `hold`, emits its batches only when notified."""

    def __init__(self, hold: bool = False, later: int = 0):
        self.log, self.requested, self.hold, self.later, self.held = [], set(), hold, later, {}

    async def on_batch(self, ctx, port, batch):
        self.log.append(("batch", ctx.time))
        ctx.notify_at(ctx.time)
        self.requested.add(ctx.time)
        if self.later:
            t = Timestamp(ctx.time.epoch + self.later, ctx.time.counters)
            ctx.notify_at(t)
            self.requested.add(t)
        if self.hold:
            self.held.setdefault(ctx.time, []).append(batch.to_numpy(REC).copy())
        else:
            await ctx.emit(batch)

    async def on_notify(self, ctx, time):
        self.log.append(("notify", time))
        if self.hold and time in self.held:
            await ctx.emit(np.concatenate(self.held.pop(time)))

    def check(self):
        notified = [t for what, t in self.log if what == "notify"]
        assert sorted(notified, key=Timestamp.sort_key) == sorted(self.requested, key=Timestamp.sort_key)
        for i, (what, t) in enumerate(self.log):
            if what == "notify":  # never early: nothing at a time <= t arrives after on_notify(t)
                assert not any(w == "batch" and b.less_equal(t) for w, b in self.log[i + 1:]), (t, self.log)
        assert not self.held


def window_rows(batch):
    """A window's rows as records again: v the count, t the window's end."""
    rows = batch.to_numpy()
    out = np.zeros(len(rows), REC)
    out["v"], out["n"], out["t"] = rows["count"], rows["n"], rows["window_end"]
    return out


SCHEMA = {"v": "i8", "n": "i8", "t": "i8"}


def decrement(batch):
    out = batch.to_numpy(REC).copy()
    out["n"] -= 1
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_notifications_are_never_early_and_never_lost(data):
    flow = Dataflow("p")
    recorders = []
    inputs = {}
    streams = []
    for s in range(data.draw(st.integers(1, 3), label="sources")):
        name = f"s{s}"
        times = data.draw(st.lists(st.integers(0, 6), min_size=0, max_size=40), label=name)
        n = data.draw(st.lists(st.integers(0, 3), min_size=len(times), max_size=len(times)), label=f"{name}.n")
        inputs[name] = records(times, n)
        streams.append(flow.source(name, REC, time="t", max_delay=data.draw(st.integers(0, 3))))

    def recorder():
        r = Recorder(hold=data.draw(st.booleans()), later=data.draw(st.integers(0, 2)))
        recorders.append(r)
        return r

    for step in range(data.draw(st.integers(1, 5), label="steps")):
        kind = data.draw(st.sampled_from(["op", "connect", "apply2", "union", "loop", "filter", "window"]))
        a = data.draw(st.sampled_from(streams))
        if kind == "op":
            streams.append(a.operator(recorder(), name=f"op{step}"))
        elif kind == "connect":
            b = data.draw(st.sampled_from(streams))
            streams.append(a.connect(b).operator(recorder(), name=f"co{step}"))
        elif kind == "apply2":  # stateless: takes whole batches at their lower-bound time
            b = data.draw(st.sampled_from(streams))
            streams.append(a.connect(b).apply(lambda x, port: x, name=f"ap{step}"))
        elif kind == "union":
            b = data.draw(st.sampled_from(streams))
            streams.append(a.union(b, name=f"un{step}"))
        elif kind == "window":  # its rows are at their window's end: the source need not cut for what follows
            counts = a.window(Tumbling(ms=data.draw(st.integers(1, 4))), time="t").count(key="n", name=f"wi{step}")
            streams.append(counts.apply(window_rows, schema=SCHEMA, name=f"wr{step}"))
        elif kind == "filter":
            streams.append(a.filter(lambda b: b["v"] % 2 == 0, name=f"fi{step}"))
        else:
            with flow.loop(f"loop{step}", max_iterations=4) as loop:
                body = loop.enter(a).operator(recorder(), name=f"body{step}").apply(decrement, name=f"dec{step}")
                loop.feed_back(body.filter(lambda b: b["n"] >= 0, name=f"again{step}"))
                streams.append(loop.leave(body.filter(lambda b: b["n"] < 0, name=f"done{step}")))
    final = recorder()
    streams[-1].operator(final, name="last").sink(sinks.Collect(), name="out")
    slots = data.draw(st.sampled_from([(64, 4), (256, 8), (4096, 96)]))
    result = slashrt.run(flow, inputs, slot_size=slots[0], slots=slots[1])
    for r in recorders:
        r.check()
    assert all(f == [] for f in result.frontiers.values())


def run_one(op, times=(0, 1, 2)):
    flow = Dataflow("e")
    flow.source("src", REC, time="t").operator(op, name="bad").sink(sinks.Collect())
    return slashrt.run(flow, {"src": records(list(times))})


class EmitPast(Operator):
    """Emits a batch one epoch below its time once a record with v >= `from_v` came (an error);
    the batches before pass on."""

    def __init__(self, from_v: int = 0):
        self.from_v = from_v

    async def on_batch(self, ctx, port, batch):
        wrong = (batch["v"] >= self.from_v).any()
        await ctx.emit(batch, time=Timestamp(ctx.time.epoch - 1) if wrong else ctx.time)


class NotifyPast(Operator):
    """Asks for a notification three epochs below its time once a record with v >= `from_v`
    came (an error); the batches before pass on."""

    def __init__(self, from_v: int = 0):
        self.from_v = from_v

    async def on_batch(self, ctx, port, batch):
        if (batch["v"] >= self.from_v).any():
            ctx.notify_at(Timestamp(ctx.time.epoch - 3))
        await ctx.emit(batch)


def test_emit_below_the_time_held_names_the_operator():
    with pytest.raises(OperatorError, match=r"step 'e.bad': emit at time \(-1\), below the time it holds \(0\)"):
        run_one(EmitPast())


def test_emit_in_on_notify_below_the_notified_time_names_the_operator():
    class NotifyThenPast(Operator):
        async def on_batch(self, ctx, port, batch):
            ctx.notify_at(Timestamp(ctx.time.epoch + 5))

        async def on_notify(self, ctx, time):
            await ctx.emit(np.zeros(1, REC), time=Timestamp(time.epoch - 1))

    with pytest.raises(OperatorError, match=r"step 'e.bad': emit at time \(4\), below the time it holds \(5\)"):
        run_one(NotifyThenPast())


def test_notify_in_the_past_names_the_operator():
    with pytest.raises(OperatorError, match=r"step 'e.bad': notify_at at time \(-3\), below the time it holds"):
        run_one(NotifyPast())


def test_a_context_kept_after_its_call_is_refused():
    kept = []

    class Keep(Operator):
        per_time = True  # (a call per time: several calls)

        async def on_batch(self, ctx, port, batch):
            if kept:
                kept[0].notify_at(kept[0].time)  # time 0 may be complete by now
            kept.append(ctx)

    with pytest.raises(OperatorError, match=r"step 'e.bad': notify_at with a context whose call returned"):
        run_one(Keep())


def test_wrong_depth_and_operator_exceptions_name_the_operator():
    class Depth(Operator):
        async def on_batch(self, ctx, port, batch):
            ctx.notify_at(Timestamp(ctx.time.epoch, (0,)))

    with pytest.raises(OperatorError, match=r"step 'e.bad': notify_at: time \(0, <0>\) has 1 loop counters"):
        run_one(Depth())

    class Boom(Operator):
        async def on_batch(self, ctx, port, batch):
            raise KeyError("x")

    with pytest.raises(OperatorError, match=r"step 'e.bad': operator raised KeyError"):
        run_one(Boom())


def test_notifications_come_in_time_order_after_the_end():
    order = []

    class Late(Operator):
        async def on_batch(self, ctx, port, batch):
            for dt in (3, 1, 2):
                ctx.notify_at(Timestamp(ctx.time.epoch + dt))

        def on_notify(self, ctx, time):  # a plain method works too
            order.append(time.epoch)

    run_one(Late(), times=[10])
    assert order == [11, 12, 13]
