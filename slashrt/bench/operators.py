"""User operators on fine-grained event times: one call per batch against one per time.

    slashrt bench operators [--records N] [--baseline] [--json]

Two flows over N records with millisecond event times (most at their own time), on one
executor, each with a
stateful user `Operator` that holds its input until its time is complete (`notify_at`):

- `sums`: per (time, key) sums of one stream (`TimeSums`);
- `join`: an enrichment join, clicks joined with the user profiles known up to their time
  (`connect(...).operator(Enrich())`: profiles on port 1, clicks on port 0).

Both are written against `ctx.times` and run with the default `per_time="grouped"` (one
on_batch call per batch); `--baseline` runs them with `per_time=True` too (one call per
distinct time, the default before). Each run's output is checked against a numpy reference
(`correct`); the JSON gives seconds and on_batch calls of every run.
"""

from __future__ import annotations

import time

import numpy as np

import slashrt
from slashrt import Dataflow, Operator, Schema, State, Timestamp, sinks

__all__ = ["bench"]

CLICK = Schema([("t", "<i8"), ("user", "<i8"), ("v", "<i8")])
PROFILE = Schema([("t", "<i8"), ("user", "<i8"), ("segment", "<i8")])
SUMS = np.dtype([("epoch", "<i8"), ("user", "<i8"), ("s", "<i8")])
ENRICHED = np.dtype([("t", "<i8"), ("user", "<i8"), ("v", "<i8"), ("segment", "<i8")])
USERS = 1000


class TimeSums(Operator):
    """Per (time, user) sums of `v`, emitted once the time is complete."""

    def __init__(self, per_time):
        self.per_time = per_time
        self.held = np.zeros(0, SUMS)
        self.calls = 0

    async def on_batch(self, ctx, port, batch):
        self.calls += 1
        rows = np.zeros(len(batch), SUMS)
        rows["epoch"], rows["user"], rows["s"] = ctx.times, batch["user"], batch["v"]
        self.held = np.concatenate([self.held, rows])
        ctx.notify_at(Timestamp(int(ctx.times.max())))

    async def on_notify(self, ctx, time):
        due = self.held["epoch"] <= time.epoch
        now, self.held = self.held[due], self.held[~due]
        await ctx.emit(_sum(now))

    def snapshot(self):
        return State({"held": self.held}, {})

    def restore(self, state):
        self.held = state.arrays["held"]


def _sum(rows: np.ndarray) -> np.ndarray:
    keys, inverse = np.unique(np.stack([rows["epoch"], rows["user"]], axis=1), axis=0, return_inverse=True)
    out = np.zeros(len(keys), SUMS)
    out["epoch"], out["user"] = keys[:, 0], keys[:, 1]
    out["s"] = np.bincount(inverse.ravel(), weights=rows["s"], minlength=len(keys)).astype(np.int64)
    return out


class Enrich(Operator):
    """Clicks (port 0) with the segment of their user's latest profile (port 1) at or before
    the click's time; a click waits until its time is complete at both inputs."""

    def __init__(self, per_time):
        self.per_time = per_time
        self.segments = np.full(USERS, -1, np.int64)
        self.profiles = np.zeros(0, PROFILE.dtype)  # profiles not applied yet, with their times
        self.clicks = np.zeros(0, CLICK.dtype)
        self.click_times = np.zeros(0, np.int64)
        self.calls = 0

    async def on_batch(self, ctx, port, batch):
        self.calls += 1
        if port == 1:
            rows = batch.to_numpy(PROFILE.dtype).copy()
            rows["t"] = ctx.times
            self.profiles = np.concatenate([self.profiles, rows])
        else:
            self.clicks = np.concatenate([self.clicks, batch.to_numpy(CLICK.dtype)])
            self.click_times = np.concatenate([self.click_times, ctx.times])
        ctx.notify_at(Timestamp(int(ctx.times.max())))

    async def on_notify(self, ctx, time):
        due = self.click_times <= time.epoch
        clicks = self.clicks[due]
        self.clicks, self.click_times = self.clicks[~due], self.click_times[~due]
        applied = self.profiles["t"] <= time.epoch
        profiles, self.profiles = self.profiles[applied], self.profiles[~applied]
        out = _enrich(clicks, profiles, self.segments)
        if len(profiles):  # each user's latest segment so far
            key = np.lexsort((profiles["t"], profiles["user"]))
            self.segments[profiles["user"][key]] = profiles["segment"][key]  # (the last write per user wins)
        await ctx.emit(out)

    def snapshot(self):
        return State({"segments": self.segments, "profiles": self.profiles, "clicks": self.clicks,
                      "click_times": self.click_times}, {})

    def restore(self, state):
        for name, array in state.arrays.items():
            setattr(self, name, array)


def _enrich(clicks: np.ndarray, profiles: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Each click with the segment of its user's latest profile at or before its time among
    `profiles`, else `known[user]` (what earlier profiles said)."""
    out = np.zeros(len(clicks), ENRICHED)
    for name in ("t", "user", "v"):
        out[name] = clicks[name]
    out["segment"] = known[clicks["user"]]
    if not len(profiles) or not len(clicks):
        return out
    key = profiles["user"] * (1 << 40) + profiles["t"]
    order = np.argsort(key, kind="stable")
    at = np.searchsorted(key[order], clicks["user"] * (1 << 40) + clicks["t"], side="right") - 1
    ok = (at >= 0) & (profiles["user"][order][np.maximum(at, 0)] == clicks["user"])
    out["segment"][ok] = profiles["segment"][order][at[ok]]
    return out


def _clicks(records: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(records, CLICK.dtype)
    out["t"] = np.sort(rng.integers(0, 2 * records, records))  # ms: about half the records at their own time
    out["user"] = rng.integers(0, USERS, records)
    out["v"] = rng.integers(1, 100, records)
    return out


def _profiles(records: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = max(records // 20, 1)
    out = np.zeros(n, PROFILE.dtype)
    out["t"] = np.sort(rng.integers(0, 2 * records, n))
    out["user"] = rng.integers(0, USERS, n)
    out["segment"] = rng.integers(0, 10, n)
    return out


def _sums_reference(clicks: np.ndarray) -> np.ndarray:
    rows = np.zeros(len(clicks), SUMS)
    rows["epoch"], rows["user"], rows["s"] = clicks["t"], clicks["user"], clicks["v"]  # sorted times: time = t
    return _sum(rows)


def _join_reference(clicks: np.ndarray, profiles: np.ndarray) -> np.ndarray:
    return _enrich(clicks, profiles, np.full(USERS, -1, np.int64))


def _rows(a: np.ndarray) -> np.ndarray:
    return np.sort(a, order=list(a.dtype.names))


def _run(kind: str, per_time, clicks, profiles) -> dict:
    flow = Dataflow(f"{kind}")
    out = sinks.Collect()
    click = flow.source("clicks", CLICK, time="t")
    if kind == "sums":
        op = TimeSums(per_time)
        click.operator(op, name="op", schema={n: "<i8" for n in SUMS.names}).sink(out, name="out")
        inputs, want = {"clicks": clicks}, _sums_reference(clicks)
    else:
        op = Enrich(per_time)
        profile = flow.source("profiles", PROFILE, time="t")
        click.connect(profile).operator(op, name="op", schema={n: "<i8" for n in ENRICHED.names}).sink(out, name="out")
        inputs, want = {"clicks": clicks, "profiles": profiles}, _join_reference(clicks, profiles)
    started = time.perf_counter()
    result = slashrt.run(flow, inputs)
    seconds = time.perf_counter() - started
    got = result.outputs[f"{kind}.out"]
    correct = len(got) == len(want) and bool(np.array_equal(_rows(got.astype(want.dtype)), _rows(want)))
    return {"seconds": round(seconds, 3), "on_batch_calls": op.calls, "correct": correct}


def bench(records: int = 200_000, baseline: bool = False) -> dict:
    """One executor; `baseline`: also with per_time=True (one call per time)."""
    clicks, profiles = _clicks(records, 1), _profiles(records, 2)
    result = {"records": records, "distinct_times": int(len(np.unique(clicks["t"]))), "executors": 1}
    modes = [("grouped", "grouped")] + ([("per_time", True)] if baseline else [])
    for kind in ("sums", "join"):
        for name, per_time in modes:
            result[f"{kind}_{name}"] = _run(kind, per_time, clicks, profiles)
    result["correct"] = all(v["correct"] for v in result.values() if isinstance(v, dict))
    return result
