"""`PointstampProgress.hold_deliveries`: while a cluster checkpoint's barriers pass an executor,
counts go on but no frontier change is delivered (no notification, no window fires, no end);
`resume_deliveries` delivers what was held back, once, in order."""

import numpy as np
import trio

from slashrt import Dataflow, Operator, Schema, sinks
from slashrt._batch import Batch
from slashrt._plan import build_plan
from slashrt.scheduler._pointstamp import PointstampProgress

SCHEMA = Schema({"t": "i8", "v": "i8"})


class Notified(Operator):
    """Emits, per notified time, how many records it held at that time."""

    per_time = True  # one call per time: every record at ctx.time

    def __init__(self):
        self.held = {}

    async def on_batch(self, ctx, port, batch):
        self.held[ctx.time] = self.held.get(ctx.time, 0) + len(batch)
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time):
        await ctx.emit(np.array([(time.epoch, self.held.pop(time))], SCHEMA.dtype))


def test_held_deliveries_wait_for_resume_and_come_once():
    out = sinks.Collect()
    flow = Dataflow("held")
    flow.source("a", SCHEMA, time="t").operator(Notified(), name="op").sink(out, name="out")
    plan = build_plan(flow)
    progress = PointstampProgress(plan)
    source = plan.steps["held.a"]

    async def main():
        for sink in plan.sinks:
            sink.open()
        records = np.zeros(6, SCHEMA.dtype)
        records["t"] = [1, 1, 2, 3, 3, 3]
        await source.push(Batch(records))
        before = len(out.records)
        progress.hold_deliveries()
        await source.on_end()  # every time is complete now: the notifications are due
        assert len(out.records) == before  # held: nothing delivered, counts moved on
        assert progress.idle() is False
        progress.resume_deliveries()
        await progress.settle()
        assert sorted(map(tuple, out.records.tolist())) == [(1, 2), (2, 1), (3, 3)]
        assert progress.idle()
        for sink in plan.sinks:
            sink.close()

    trio.run(main)
