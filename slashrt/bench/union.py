"""A keyed window after a union on the Slash State Backend against routing its records by key
(`slashrt bench union`).

    slashrt bench union [--executors K] [--transport shm|tcp] [--mode slash|uppar|both] [--events N] --json

Two YSB streams per executor (views and clicks, each generated in the executor's process
with its own seed over the same event-time range), a user operator in front of the clicks
(it keeps the clicks: `event_type` 1), their union, the ads mapped to their campaigns, and a
tumbling 10 s count per campaign. On K executors in mode "slash" every executor folds what it
reads into fragments and ships one partial row per campaign and window (`slashrt.ssb.graph_window`);
in mode "uppar" it ships every record whose campaign another executor owns. Per mode:
`records_per_s` (the input records, both streams of every executor, over the wall time),
`bytes_shipped` (what the executors' exchanges sent each other), `record_bytes` (the input),
`correct` (the counts equal numpy's over every executor's streams). With both modes,
`bytes_ratio` is slash's bytes over uppar's, measured in one run.
"""

from __future__ import annotations

import functools

import numpy as np

import slashrt
from slashrt import Dataflow, Operator, Tumbling
from slashrt.bench import ysb
from slashrt.cluster import PerExecutor
from slashrt.ops.sinks import Collect

__all__ = ["bench", "MODES"]

MODES = ("slash", "uppar", "both")
CAMPAIGNS = 100
CLICK = 1


class Clicks(Operator):
    """The user step in front of the union: the clicks of a batch."""

    stateless = True

    async def on_batch(self, ctx, port, batch):
        rows = batch.to_numpy(ysb.YSB_SCHEMA.dtype)
        await ctx.emit(rows[rows["event_type"] == CLICK])


def dataflow(sink) -> Dataflow:
    ads = ysb.campaign_map(CAMPAIGNS)
    flow = Dataflow("union")
    views = flow.source("views", ysb.YSB_SCHEMA, time="event_time")
    clicks = flow.source("clicks", ysb.YSB_SCHEMA, time="event_time").operator(
        Clicks(), name="clicks_only", schema=ysb.YSB_SCHEMA)
    views.filter(lambda b: b["event_type"] == ysb.VIEW, name="views_only").union(clicks).with_column(
        "campaign_id", lambda b: ads[b["ad_id"]], dtype="<i8", name="campaign"
    ).window(Tumbling(ms=ysb.WINDOW_MS)).count(key="campaign_id", name="counts").sink(sink, name="out")
    return flow


def _stream(events: int, seed: int, index: int, executors: int) -> np.ndarray:
    return ysb.generate(events, CAMPAIGNS, seed=seed + 1000 * index)


def reference(events: int, executors: int) -> np.ndarray:
    ads = ysb.campaign_map(CAMPAIGNS)
    kept = []
    for i in range(executors):
        views, clicks = _stream(events, 1, i, executors), _stream(events, 2, i, executors)
        kept += [views[views["event_type"] == ysb.VIEW], clicks[clicks["event_type"] == CLICK]]
    rows = np.concatenate(kept)
    keys, counts = np.unique(
        np.stack([rows["event_time"] // ysb.WINDOW_MS * ysb.WINDOW_MS, ads[rows["ad_id"]]], axis=1),
        axis=0, return_counts=True)
    return np.column_stack([keys, counts])


def _counts(records) -> np.ndarray:
    out = np.sort(records, order=["window_start", "campaign_id"])
    return np.column_stack([out["window_start"], out["campaign_id"], out["count"]])


def _run(mode: str, events: int, executors: int, transport: str, expected: np.ndarray) -> dict:
    sink = Collect()
    inputs = {"views": PerExecutor(functools.partial(_stream, events, 1), deterministic=True),
              "clicks": PerExecutor(functools.partial(_stream, events, 2), deterministic=True)}
    result = slashrt.run(dataflow(sink), inputs, executors=executors, transport=transport, mode=mode)
    seconds = result.seconds  # from the start to the last executor's result (its input made before)
    records = 2 * events * executors
    shipments = [e for per_executor in result.epochs.get("union.counts", []) for e in per_executor]
    return {
        "mode": mode,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "bytes_shipped": sum(s.shipped_bytes for s in result.stats),
        "record_bytes": records * ysb.YSB_SCHEMA.dtype.itemsize,
        "shipments": len(shipments),
        "correct": bool(np.array_equal(_counts(result.outputs["union.out"]), expected)),
    }


def bench(*, executors: int = 2, transport: str = "shm", mode: str = "both", events: int = 2_000_000) -> dict:
    """Run the flow in `mode` ("both": slash, then uppar) on `executors` executors."""
    expected = reference(events, executors)
    runs = [_run(m, events, executors, transport, expected) for m in (("slash", "uppar") if mode == "both" else (mode,))]
    out = {"executors": executors, "transport": transport, "events_per_stream": events, "runs": runs,
           "correct": all(r["correct"] for r in runs)}
    if mode == "both":
        out["bytes_ratio"] = round(runs[0]["bytes_shipped"] / max(1, runs[1]["bytes_shipped"]), 6)
        out["speed_ratio"] = round(runs[0]["records_per_s"] / runs[1]["records_per_s"], 3)
    return out
