"""Do checkpoints keep their cadence under backpressure? (`slashrt bench checkpoint --slow-step-ms MS`)

YSB on one executor (or `--executors N`: a cluster, each executor's share behind its own slow
step) with a step after the source that sleeps `slow_step_ms` per buffer (64 KiB of records),
default rings (96 slots): the rings fill and every aligned barrier queues behind their backlog.
`--slow-after exchange` (a cluster) puts it behind the exchange instead: YSB's counts per
campaign in 10 ms windows, the slow step on each window's counts (`slow_step_ms` a window, on
the executor owning its campaigns), then their sums per 10 s window (YSB's result): the
channels between executors and the SSB's ship queues back up, and an aligned barrier waits
behind them. `--slow-after graph` (a cluster) runs YSB with a user step behind an exchange:
an exchange by ad right after the source, the slow step behind it (`slow_step_ms` per buffer of
records), then YSB's views, campaigns and windows (the window's route: an exchange chained after
the first); the peers' channels back up and the ship queues grow behind them. Checkpoints every `interval` with `max_in_flight` 1 and the given
`alignment_timeout` ("auto": half the interval; None: always aligned; 0: unaligned at once,
docs/architecture.md "Unaligned checkpoints"). Reports `checkpoints_expected` (the run's
length over the interval; on a cluster `stream_s`, from the slow step's first call on any
executor to its last, over the interval: the agents' start and the input's shipping are no time
a periodic checkpoint could be taken in), `checkpoints_completed` (periodic ones), `cadence_ratio` (target
>= 0.9), `duration_p99_s` (target <= 2x the interval), `unaligned` (how many were taken
unaligned, with their in-flight records as channel state), and `correct` (the output equals
the numpy reference).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

import slashrt
from slashrt import Dataflow, Tumbling
from slashrt._buffer import DEFAULT_SLOT_SIZE, FOOTER_SIZE
from slashrt.bench import ysb
from slashrt.errors import OptionError
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore

__all__ = ["bench"]

KEEP = 10_000  # every checkpoint stays, to count them and read their manifests


INTERVALS = 20  # a default run lasts about this many checkpoint intervals of the slow step alone


SMALL_WINDOW_MS = 10  # --slow-after exchange: the first windows, whose counts the slow step takes
WATERMARK_EVERY = 4  # --slow-after exchange: buffers between two watermarks of a source (~6 small windows)


def bench(*, slow_step_ms: float, interval: float, events: int | None = None, alignment_timeout="auto",
          executors: int = 1, query: str = "ysb", slow_after: str = "source", **options) -> dict:
    if query != "ysb":
        raise OptionError("bench checkpoint --slow-step-ms measures YSB: drop --query")
    if slow_after not in ("source", "exchange", "graph"):
        raise OptionError(f"bench checkpoint --slow-after must be source, exchange or graph, got {slow_after!r}")
    if slow_after != "source" and executors < 2:
        raise OptionError(f"bench checkpoint --slow-after {slow_after} needs a cluster: give --executors 2 or more")
    per_buffer = (options.get("slot_size", DEFAULT_SLOT_SIZE) - FOOTER_SIZE) // ysb.YSB_SCHEMA.record_size
    calls = max(1, round(INTERVALS * interval / (slow_step_ms / 1000)))  # of the slow step on each executor
    if events is None:  # sized from the interval: the slow step alone takes INTERVALS of them (on each executor)
        # after the exchange each executor's slow step takes every small window once (its campaigns' counts)
        events = calls * SMALL_WINDOW_MS * 100 if slow_after == "exchange" else executors * per_buffer * calls
    if executors > 1:
        options["executors"] = executors  # a cluster (its exchange is a stage of its own: the slow step is before it)
    records, mapping = ysb.generate(events), ysb.campaign_map(1000)

    spans = tempfile.mkdtemp(prefix="slashrt-cadence-spans-")
    first: list[float] = []

    def slow(batch):  # the slow step: `slow_step_ms` per buffer of records (after the exchange: a call)
        time.sleep(slow_step_ms / 1000 * (1 if slow_after == "exchange" else -(-len(batch) // per_buffer)))
        if executors > 1:  # when this executor's stream ran (a system-wide clock: agents are processes)
            first[:] = first or [time.monotonic()]
            with open(f"{spans}/{os.getpid()}", "w") as out:
                out.write(f"{first[0]} {time.monotonic()}")
        return np.ones(len(batch), bool)

    sink = Collect(transactional=True)
    flow = {"source": lambda: ysb.dataflow(mapping, sink, step=slow), "exchange": lambda: _behind_exchange(mapping, sink, slow),
            "graph": lambda: _graph_flow(mapping, sink, slow)}[slow_after]()
    if slow_after == "exchange":  # windows fire a few at a time: no one call holds the slow lane for long
        options.setdefault("watermark_every", WATERMARK_EVERY)
    with tempfile.TemporaryDirectory(prefix="slashrt-cadence-") as directory:
        started = time.perf_counter()
        result = slashrt.run(flow, {"events": records}, checkpoint_dir=directory, **options, checkpoint={
            "interval": interval, "keep": KEEP, "alignment_timeout": alignment_timeout})
        seconds = time.perf_counter() - started
        store = SnapshotStore(directory, job=flow.name, keep=KEEP)
        manifests = [store.load(n).meta for n in store.checkpoints()]
    periodic = [c for c in result.checkpoints if c["status"] == "completed" and not c["savepoint"]]
    durations = [c["seconds"] for c in periodic]
    stream = seconds
    if executors > 1:  # a cluster: the time its streams ran, not the agents' start nor the input's shipping
        times = [tuple(map(float, open(f"{spans}/{name}").read().split())) for name in os.listdir(spans)]
        stream = max(b for _, b in times) - min(a for a, _ in times)
    shutil.rmtree(spans, ignore_errors=True)
    expected = int(stream // interval)
    completed = sum(1 for meta in manifests if meta.get("kind", "checkpoint") == "checkpoint")
    return {
        "query": "ysb", "events": len(records), "executors": executors, "slow_step_ms": slow_step_ms,
        "slow_after": slow_after, "interval_s": interval,
        "alignment_timeout": alignment_timeout, "seconds": round(seconds, 3), "stream_s": round(stream, 3),
        "checkpoints_expected": expected, "checkpoints_completed": completed,
        "cadence_ratio": round(completed / expected, 3) if expected else None,
        "duration_p50_s": round(float(np.percentile(durations, 50)), 3) if durations else None,
        "duration_p99_s": round(float(np.percentile(durations, 99)), 3) if durations else None,
        "unaligned": sum(1 for meta in manifests if meta.get("unaligned")),
        "correct": bool(np.array_equal(ysb.to_result(sink.records), ysb.reference(records, mapping))),
    }


def _behind_exchange(ad_to_campaign: np.ndarray, sink, step) -> Dataflow:
    """YSB with `step` behind its first exchange: views counted per campaign in small windows,
    `step` on each window's counts, summed per YSB window (the same result as YSB's)."""
    flow = Dataflow("ysb")
    views = flow.source("events", ysb.YSB_SCHEMA, time="event_time").filter(
        lambda b: b["event_type"] == ysb.VIEW, name="views")
    counts = (views.with_column("campaign_id", lambda b: ad_to_campaign[b["ad_id"]], dtype="i8")
              .window(Tumbling(ms=SMALL_WINDOW_MS)).count(key="campaign_id").filter(step, name="step"))
    counts.with_column("t", lambda b: b["window_start"], dtype="i8").window(Tumbling(ms=ysb.WINDOW_MS), time="t").sum(
        "count", key="campaign_id", output="count").sink(sink, name="counts")
    return flow


def _graph_flow(ad_to_campaign: np.ndarray, sink, step) -> Dataflow:
    """YSB with `step` behind an exchange by ad (its window's route is a second
    exchange, chained after the first)."""
    flow = Dataflow("ysb")
    events = flow.source("events", ysb.YSB_SCHEMA, time="event_time").exchange(key="ad_id", name="by_ad")
    (events.filter(step, name="step").filter(lambda b: b["event_type"] == ysb.VIEW, name="views")
     .with_column("campaign_id", lambda b: ad_to_campaign[b["ad_id"]], dtype="i8")
     .window(Tumbling(ms=ysb.WINDOW_MS)).count(key="campaign_id").sink(sink, name="counts"))
    return flow
