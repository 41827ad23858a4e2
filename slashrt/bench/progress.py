"""Distributed pointstamp progress end to end: notification latency, a loop's round trip and
progress traffic, on real executor processes (`slashrt bench progress`).

    slashrt bench progress [--executors K] [--transport shm|tcp] [--epochs E] [--epoch-gap-us G] --json

Three runs of flows on K executors (every executor gets the same generated stream, so
every executor sees every epoch); user operators stamp their events with CLOCK_MONOTONIC (one
clock for every process of the machine) and the executor's pid, and the stamps come back
through the sinks:

- notify latency: source -> Stamp (notify_at every batch's time). For epoch t, from the moment
  the last executor consumed its last record of t (its last batch at t; its source's capability
  leaves t with the next record) to the moment the last executor ran `on_notify(t)`
  (`notify_latency_us_p50/p99`). The sources feed at full speed, or an epoch every
  `--epoch-gap-us` (executors idle between epochs: the protocol's latency without the
  processor's time slices when executors outnumber cores);
- loop round trip (on 2 executors whatever K): one epoch, a record per executor, source ->
  loop(enter -> Round -> feedback while n < ROUNDS) -> leave. Round holds each time's batch until notified and sends it round again
  with n + 1: from the last executor's `on_notify((e, i))` to the last one's `on_notify((e, i + 1))`,
  a feedback, the queue, the progress exchange and the next notification
  (`loop_round_trip_us_p50`);
- progress traffic on a YSB-shaped flow: views -> campaign -> a user operator counting
  views per campaign per 10 s window, emitting on the window end's notification. Progress bytes
  (every executor's bus, to all peers) per byte of input records, and progress messages per
  epoch (10 s window) (`progress_bytes_per_data_byte`, `progress_messages_per_epoch`).

`correct`: every notification came, the loop's records went round ROUNDS times, and the YSB
counts equal plain numpy's.
"""

from __future__ import annotations

import os
import time

import numpy as np

import slashrt
from slashrt import Dataflow, Operator, Timestamp, sinks
from slashrt.bench import ysb
from slashrt.cluster import PerExecutor

__all__ = ["bench", "ROUNDS"]

REC = np.dtype([("v", "<i8"), ("n", "<i8"), ("t", "<i8")])
STAMP = {"kind": "<i8", "epoch": "<i8", "counter": "<i8", "ns": "<i8", "pid": "<i8"}
STAMP_DTYPE = np.dtype(list(STAMP.items()))
BATCH, NOTIFY = 0, 1
ROUNDS = 100
WINDOW_MS = ysb.WINDOW_MS


def _stamp(kind: int, time_: Timestamp) -> np.ndarray:
    counter = time_.counters[-1] if time_.counters else 0
    return np.array([(kind, time_.epoch, counter, time.monotonic_ns(), os.getpid())], STAMP_DTYPE)


class Stamp(Operator):
    """A row per batch and per notification (kind, time, monotonic ns, pid)."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    async def on_batch(self, ctx, port, batch):
        ctx.notify_at(ctx.time)
        await ctx.emit(_stamp(BATCH, ctx.time))

    async def on_notify(self, ctx, time_):
        await ctx.emit(_stamp(NOTIFY, time_))


class Round(Operator):
    """Holds each time's records until notified, then sends them on with n + 1 and the
    notification's stamp."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.held = {}

    async def on_batch(self, ctx, port, batch):
        rows = batch.to_numpy(ROUND_DTYPE)
        self.held.setdefault(ctx.time, []).append(rows.copy())
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time_):
        out = np.concatenate(self.held.pop(time_))
        out["n"] += 1
        out["ns"], out["pid"] = time.monotonic_ns(), os.getpid()
        await ctx.emit(out)


ROUND_DTYPE = np.dtype([("v", "<i8"), ("n", "<i8"), ("t", "<i8"), ("ns", "<i8"), ("pid", "<i8")])


class WindowCount(Operator):
    """Views per campaign per tumbling 10 s window, emitted when the window's end is complete."""

    def __init__(self):
        self.counts = {}

    async def on_batch(self, ctx, port, batch):
        rows = batch.to_numpy()
        windows = rows["event_time"] // WINDOW_MS
        pairs, counts = np.unique(np.stack([windows, rows["campaign_id"]], axis=1), axis=0, return_counts=True)
        for w in np.unique(pairs[:, 0]).tolist():
            self.counts.setdefault(w, []).append((pairs[pairs[:, 0] == w], counts[pairs[:, 0] == w]))
            ctx.notify_at(Timestamp((w + 1) * WINDOW_MS))

    async def on_notify(self, ctx, time_):
        w = time_.epoch // WINDOW_MS - 1
        parts = self.counts.pop(w)
        pairs = np.concatenate([p for p, _ in parts])
        counts = np.concatenate([c for _, c in parts])
        keys, inverse = np.unique(pairs[:, 1], return_inverse=True)
        out = np.zeros(len(keys), ysb.RESULT_DTYPE)
        out["window_start_ms"], out["campaign_id"] = w * WINDOW_MS, keys
        out["count"] = np.bincount(inverse, weights=counts).astype(np.int64)
        await ctx.emit(out)


def _epochs(epochs: int, per_epoch: int):
    def make(index: int, executors: int) -> np.ndarray:
        a = np.zeros(epochs * per_epoch, REC)
        a["v"] = np.arange(len(a)) * executors + index
        a["t"] = np.arange(len(a)) // per_epoch
        return a

    return make


def _paced_epochs(epochs: int, per_epoch: int, gap_us: float):
    """The same stream as `_epochs`, made chunk by chunk with `gap_us` between chunks (a
    `PerExecutor` chunk stream: its worker thread sleeps, the executor does not). Chunk k holds
    epoch k's records after its first and the first record of epoch k + 1, so each chunk closes
    its epoch (the source's capability leaves k within the chunk, as at full speed) and the
    executors are idle between epochs."""
    whole = _epochs(epochs, per_epoch)

    def make(index: int, executors: int):
        a = whole(index, executors)
        for start in range(0, len(a), per_epoch):
            time.sleep(gap_us / 1e6)
            yield a[start + (start > 0): start + per_epoch + 1]

    return make


def _percentile_us(ns: np.ndarray, q: float) -> float:
    return round(float(np.percentile(ns, q)) / 1e3, 1) if len(ns) else float("nan")


def notify_latency(
    executors: int | list[str], transport: str, epochs: int, per_epoch: int = 64, gap_us: float = 0, **options
) -> tuple[np.ndarray, bool]:
    """`executors`: a count (local processes) or agents' "HOST:PORT" addresses (`options`:
    e.g. their cluster `secret`). `gap_us` > 0: each executor's source feeds an epoch every
    `gap_us` (`_paced_epochs`) instead of at full speed, so the figure is the protocol's and not
    the processor's when there are more executors than cores."""
    flow = Dataflow("notify")
    flow.source("src", REC, time="t").operator(Stamp(), name="stamp", schema=STAMP).sink(sinks.Collect(), name="out")
    make = _paced_epochs(epochs, per_epoch, gap_us) if gap_us > 0 else _epochs(epochs, per_epoch)
    result = slashrt.run(flow, {"src": PerExecutor(make)}, executors=executors,
                         transport=transport, slot_size=per_epoch * REC.itemsize, slots=8, **options)
    rows = result.outputs["notify.out"]
    batches, notes = rows[rows["kind"] == BATCH], rows[rows["kind"] == NOTIFY]
    latencies = []
    for t in range(epochs - 1):  # the last epoch completes with the end of input
        consumed = batches["ns"][batches["epoch"] == t].max()
        notified = notes["ns"][notes["epoch"] == t]
        latencies.append(notified.max() - consumed)
    n = executors if isinstance(executors, int) else len(executors)
    correct = len(notes) == n * epochs and (np.array(latencies) > 0).all()
    return np.array(latencies), bool(correct)


def loop_round_trip(transport: str, rounds: int = ROUNDS) -> tuple[np.ndarray, bool]:
    """One epoch (a record per executor) goes round `rounds` times: nothing else in the loop,
    so a round is the feedback, the queue, one progress exchange and the next notification."""
    flow = Dataflow("loop")
    src = flow.source("src", REC, time="t").with_column("ns", lambda b: np.zeros(len(b), np.int64), dtype="<i8")
    src = src.with_column("pid", lambda b: np.zeros(len(b), np.int64), dtype="<i8")
    with flow.loop("rounds") as loop:
        step = loop.enter(src).operator(Round(), name="round")
        loop.feed_back(step.filter(lambda b: b["n"] < rounds))
        loop.leave(step).sink(sinks.Collect(), name="out")
    result = slashrt.run(flow, {"src": PerExecutor(_epochs(1, 1))}, executors=2, transport=transport)
    rows = result.outputs["loop.out"]
    last = [rows["ns"][rows["n"] == i].max() for i in range(1, rounds + 1)]
    correct = len(rows) == 2 * rounds and sorted(rows["n"].tolist()) == sorted(list(range(1, rounds + 1)) * 2)
    return np.diff(last), bool(correct)


def progress_traffic(executors: int, transport: str, events: int) -> tuple[dict, bool]:
    campaigns = 100
    mapping = ysb.campaign_map(campaigns)
    flow = Dataflow("ysbg")
    views = flow.source("events", ysb.YSB_SCHEMA, time="event_time").filter(lambda b: b["event_type"] == ysb.VIEW)
    counts = views.with_column("campaign_id", lambda b: mapping[b["ad_id"]], dtype="<i8")
    counts.operator(WindowCount(), name="count", schema=dict(ysb.RESULT_DTYPE.descr)).sink(sinks.Collect(), name="out")

    def make(index: int, n: int) -> np.ndarray:
        return ysb.generate(events // n, campaigns, events_per_ms=20, seed=index)

    result = slashrt.run(flow, {"events": PerExecutor(make)}, executors=executors, transport=transport)
    data = np.concatenate([make(i, executors) for i in range(executors)])
    mine = np.sort(result.outputs["ysbg.out"], order=["window_start_ms", "campaign_id"])
    # one window's rows come from every executor: sum them per (window, campaign)
    pairs, inverse = np.unique(np.stack([mine["window_start_ms"], mine["campaign_id"]], axis=1), axis=0, return_inverse=True)
    summed = np.bincount(inverse.ravel(), weights=mine["count"]).astype(np.int64)
    want = ysb.reference(data, mapping)
    correct = bool(
        len(summed) == len(want) and (pairs[:, 0] == want["window_start_ms"]).all()
        and (pairs[:, 1] == want["campaign_id"]).all() and (summed == want["count"]).all()
    )
    progress_bytes = sum(s.progress_bytes for s in result.stats)
    messages = sum(s.progress_messages for s in result.stats)
    windows = len(np.unique(data["event_time"] // WINDOW_MS))
    return {
        "ysb_events": len(data),
        "data_bytes": data.nbytes,
        "progress_bytes": progress_bytes,
        "progress_bytes_per_data_byte": round(progress_bytes / data.nbytes, 6),
        "progress_messages_per_epoch": round(messages / windows, 1),
        "ysb_seconds": round(result.seconds, 3),
    }, correct


def bench(
    *, executors: int = 2, transport: str = "shm", epochs: int = 200, events: int = 600_000, epoch_gap_us: float = 0
) -> dict:
    latencies, ok_notify = notify_latency(executors, transport, epochs, gap_us=epoch_gap_us)
    trips, ok_loop = loop_round_trip(transport)
    traffic, ok_ysb = progress_traffic(executors, transport, events)
    return {
        "executors": executors,
        "transport": transport,
        "epochs": epochs,
        "epoch_gap_us": epoch_gap_us,
        "notify_latency_us_p50": _percentile_us(latencies, 50),
        "notify_latency_us_p99": _percentile_us(latencies, 99),
        "loop_round_trip_us_p50": _percentile_us(trips, 50),
        "loop_round_trip_executors": 2,
        **traffic,
        "correct": ok_notify and ok_loop and ok_ysb,
    }
