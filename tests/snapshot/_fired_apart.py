"""Sliding windows whose owners had fired them up to different times when a checkpoint was
taken (tests/snapshot/test_graph_rescale.py): two flows, each with late records into
transactional CSV sinks, and what finds such a checkpoint.

- `union_flow`: two sources out of order beyond their bound, union, a sliding window sum per
  key (a route to the keys' owners: each fires on the progress it has heard of);
- `loop_flow`: a sliding window sum per key inside a loop, its sums fed back at an eighth
  until none is left (every iteration's window cut by key partition);
- `fired_apart`: where a checkpoint's owners of a window had fired it up to different times;
  `FiredApart`: the `Paced` condition that one such checkpoint completed in the middle of the
  stream (each executor process reads the store)."""

import os

import numpy as np

from slashrt import Dataflow, Schema, Sliding
from slashrt.ops.sinks import CsvFile
from slashrt.ops.event_time import NO_TIME
from slashrt.snapshot import SnapshotStore

from tests.cluster.test_loop_windows_cluster import tagged
from tests.snapshot import _cluster_child
from tests.snapshot._graph_flow import _Tagging
from tests.snapshot._paced import behind

SCHEMA = _cluster_child.SCHEMA
MAX_DELAY = 20


def union_flow(directory, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind source a (`tests.snapshot._paced.Paced`), or none."""
    job = Dataflow("fa")
    a, b = job.source("a", SCHEMA, time="t", max_delay=MAX_DELAY), job.source("b", SCHEMA, time="t", max_delay=MAX_DELAY)
    late = CsvFile(f"{directory}/late", transactional=True)
    # (a window end every 10 ms of event time: the progress an owner has heard of often differs)
    behind(a, pace).union(b).window(Sliding(100, 10), late=late).sum("v", key="k", output="total", name="win").sink(
        CsvFile(f"{directory}/out", transactional=True), name="out")
    return job


def union_inputs() -> dict:
    """About half of it late for some window (as tests/snapshot/_rescale_job.py's input)."""
    records = _cluster_child.records(30_000, seed=11, span=3_000, disorder=160, keys=301)
    return {"a": records[::2].copy(), "b": records[1::2].copy()}


LOOP_SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
LOOP_KEYS = 7  # (few keys a slice: the state backend's fragments fold records, "auto" keeps them)


def _fed_back(batch) -> np.ndarray:
    """A window's rows as records at its end, at an eighth (each record is in 4 windows), the
    keys moved on."""
    rows = batch.to_numpy()
    out = np.zeros(len(rows), LOOP_SCHEMA.dtype)
    out["t"], out["k"], out["v"] = rows["window_end"], (rows["k"] + 3) % LOOP_KEYS, rows["sum_v"] // 8
    return out[out["v"] > 0]


def loop_flow(directory, pace=None) -> Dataflow:
    job = Dataflow("fal")
    source = behind(job.source("src", LOOP_SCHEMA, time="t", max_delay=10), pace)
    with job.loop("eighths", max_iterations=40) as loop:
        late = CsvFile(f"{directory}/late", transactional=True)
        sums = loop.enter(source).window(Sliding(40, 10), late=late).sum("v", key="k", name="win")
        rows = sums.operator(_Tagging(1, "sum_v"), name="iteration", schema=tagged(1, "sum_v"))
        loop.feed_back(rows.apply(_fed_back, schema=LOOP_SCHEMA, name="eighth"))
        left = loop.leave(rows)
    left.sink(CsvFile(f"{directory}/out", transactional=True), name="out")
    return job


def loop_inputs() -> dict:
    rng = np.random.default_rng(5)
    n = 6000
    out = np.zeros(n, LOOP_SCHEMA.dtype)
    out["t"] = np.arange(n) * 600 // n - rng.integers(0, 30, n)
    out["k"] = rng.integers(0, LOOP_KEYS, n)
    out["v"] = rng.integers(1, 400, n)
    return {"src": out}


def fed(checkpoint) -> int:
    """Records its sources had fed, on every executor."""
    return sum(p["fed"] for per_executor in checkpoint.meta["sources"].values() for p in per_executor.values())


def fired_apart(checkpoint, step: str) -> dict:
    """Where the owners of window `step` had fired it up to different times in `checkpoint`,
    every one of them some windows: {(): ...} outside loops, {counters: ...} per iteration inside
    them, each {executor: fired up to} (an SSB window's: its owner's windows', not its fragments')."""
    fired: dict = {}
    for (at, executor), state in checkpoint.states.items():
        if at != step:
            continue
        meta = state.meta
        if meta["kind"] in ("loop_window", "ssb_loop_window"):
            for counters, until in zip(state.arrays["iterations"].tolist(), state.arrays["fired_until"].tolist()):
                fired.setdefault(tuple(counters), {})[executor] = until
        else:
            fired.setdefault((), {})[executor] = meta["fired_until"]
    return {where: owners for where, owners in fired.items() if len(set(owners.values())) > 1 and min(owners.values()) > NO_TIME}


class FiredApart:
    """`Paced(until=...)`: has a checkpoint of `job` in `directory` completed while its sources
    had fed fewer than `records` whose owners of window `step` had fired it up to different
    times? (The stream stays slow until one has: the job cannot end before.)"""

    def __init__(self, directory, job: str, step: str, records: int):
        self.directory, self.job, self.step, self.records = str(directory), job, step, records
        self.read: set[int] = set()

    def __call__(self) -> bool:
        if not os.path.isdir(os.path.join(self.directory, self.job)):
            return False
        store = SnapshotStore(self.directory, job=self.job, keep=1000, readonly=True)
        for n in store.checkpoints():
            if n not in self.read:
                self.read.add(n)
                checkpoint = store.load(n)
                if fed(checkpoint) < self.records and fired_apart(checkpoint, self.step):
                    return True
        return False
