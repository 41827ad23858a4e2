"""The executor with its tracker: it settles the frontiers before its first input, so a source
whose input ends at once (a run restored at its end) still moves them, and the windows it held
back fire, whichever task trio runs first (the schedule drawn by hypothesis)."""

import numpy as np
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt import Batch, Dataflow, Schema, Tumbling, sinks
from slashrt._plan import build_plan
from slashrt.scheduler import Executor, Input
from slashrt.scheduler._pointstamp import PointstampProgress
from slashrt.snapshot.operators import restore_plan, snapshot_plan
from slashrt.transport import RingSpec, open_inproc_channel

SCHEMA = Schema({"t": "i8", "v": "i8"})


def counting():
    """A source, one window over the whole stream counting per v, a sink."""
    out = sinks.Collect()
    flow = Dataflow("r")
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=10**9)).count(key="v", name="counts").sink(out, name="out")
    plan = build_plan(flow)
    for sink in plan.sinks:
        sink.open()
    return plan, PointstampProgress(plan), out


# trio's scheduler draws from a random that hypothesis seeds per example (`random_module`):
# the pollers may run before the compute coroutine's first turn or after it
@settings(max_examples=20, deadline=None)
@given(st.random_module())
def test_a_restored_window_fires_when_its_source_ends_before_anything_else(_):
    records = np.zeros(7, SCHEMA.dtype)
    records["t"] = np.arange(7)
    records["v"] = [1, 2, 1, 3, 1, 2, 1]

    async def main():
        first, first_progress, _ = counting()
        await first.roots["r.a"].push(Batch(records))
        await first_progress.settle()
        states = snapshot_plan(first)  # the window holds every record, not fired
        plan, progress, out = counting()
        restore_plan(plan, states)
        progress.recount()
        tx, rx = open_inproc_channel(RingSpec(slots=4, slot_size=256, record_size=SCHEMA.dtype.itemsize))
        await tx.aclose()  # its input ends before the executor starts
        await Executor([Input("r.a", rx, plan.roots["r.a"], SCHEMA.dtype)], progress=progress).run()
        assert sorted(zip(out.records["v"].tolist(), out.records["count"].tolist())) == [(1, 4), (2, 2), (3, 1)]
        assert progress.idle()

    trio.run(main)
