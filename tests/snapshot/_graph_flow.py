"""The acyclic graph flow the graph-on-cluster checkpoint tests run (tests/snapshot/test_graph_cluster_checkpoints.py):
two sources, union, an exchange by key into a stateful user operator (its state: rows held per time,
a count per key), a keyed window on another key behind it (a `WindowRoute`: an exchange chained
after an exchange), connect(...).apply, each into a transactional CSV directory (`ChaosCsv`, so
`SLASHRT_CHAOS_KILLS` can SIGKILL an agent at a chosen point); and two loops: `hop_flow` (every
round re-ships to another executor) and `loop_window_flow` (a keyed window inside a loop). Also
stopped with savepoints (tests/snapshot/test_graph_cluster_stop.py)."""

import numpy as np

from slashrt import Dataflow, Operator, Schema, State, Tumbling
from slashrt.bench.chaos import ChaosCsv

from tests.cluster.test_loop_windows_cluster import Tag, tagged
from tests.snapshot._paced import behind
from tests.test_loop_windows import REC, halving, input_records

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
OUT_SCHEMA = Schema({"t": "i8", "k": "i8", "g": "i8", "s": "i8", "seen": "i8"})
OUT = OUT_SCHEMA.dtype
SINKS = ("sums", "windows", "both")
N = 4_000  # per source: ~400 slots of 256 bytes, each ring (4 slots) wraps ~100 times


HELD = np.dtype([("time", "<i8"), *SCHEMA.dtype.descr])
SEEN = np.dtype([("k", "<i8"), ("count", "<i8")])


class PerTimeSums(Operator):
    """Per time, once it is complete: each key's sum at that time and how many records of the
    key it has seen so far (deterministic: notifications come in time order). Its state is
    keyed by k (it runs behind exchange(key="k")): a resume on another executor count gives
    each executor the held rows and counts of the keys it owns."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it
    keyed_by = "k"

    def __init__(self):
        self.held: dict = {}
        self.seen: dict[int, int] = {}

    async def on_batch(self, ctx, port, batch):
        self.held.setdefault(ctx.time, []).append(batch.to_numpy(SCHEMA.dtype).copy())
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time):
        parts = self.held.pop(time, [])
        if not parts:  # (a resume on another count notifies every executor at every requested time)
            return
        rows = np.concatenate(parts)
        keys, inverse = np.unique(rows["k"], return_inverse=True)
        out = np.zeros(len(keys), OUT)
        out["t"], out["k"], out["g"] = time.epoch, keys, keys % 7
        out["s"] = np.bincount(inverse, rows["v"], len(keys)).astype(np.int64)
        counts = np.bincount(inverse, minlength=len(keys))
        for i, k in enumerate(keys.tolist()):  # (a test operator: a few hundred keys per time)
            self.seen[k] = self.seen.get(k, 0) + int(counts[i])
            out["seen"][i] = self.seen[k]
        await ctx.emit(out)

    def snapshot(self) -> State:
        held = [np.concatenate(parts) for parts in self.held.values()]
        table = np.zeros(sum(map(len, held)), HELD)
        if held:
            rows = np.concatenate(held)
            table["time"] = np.repeat([t.epoch for t in self.held], [len(h) for h in held])
            for name in SCHEMA.dtype.names:
                table[name] = rows[name]
        seen = np.zeros(len(self.seen), SEEN)
        seen["k"], seen["count"] = list(self.seen), list(self.seen.values())
        return State({"held": table, "seen": seen}, {})

    def restore(self, state: State) -> None:
        from slashrt.progress import Timestamp

        held = state.arrays["held"]
        times = np.unique(held["time"])
        order = np.argsort(held["time"], kind="stable")
        groups = np.split(held[order], np.searchsorted(held["time"][order], times)[1:])
        self.held = {Timestamp(int(t)): [_rows(g)] for t, g in zip(times.tolist(), groups)}
        seen = state.arrays["seen"]
        self.seen = dict(zip(seen["k"].tolist(), seen["count"].tolist()))


def _rows(table: np.ndarray) -> np.ndarray:
    out = np.zeros(len(table), SCHEMA.dtype)
    for name in SCHEMA.dtype.names:
        out[name] = table[name]
    return out


def tag(batch, port):
    out = batch.to_numpy(SCHEMA.dtype).copy()
    out["v"] = out["v"] * 10 + port
    return out


def flow(directory, transactional: bool = True, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind source a (`tests.snapshot._paced.Paced`), or none."""
    job = Dataflow("graph-ckpt")
    a, b = behind(job.source("a", SCHEMA, time="t"), pace), job.source("b", SCHEMA, time="t")
    sums = a.union(b).exchange(key="k", name="by_k").operator(PerTimeSums(), name="per_time", schema=OUT_SCHEMA)
    sums.sink(ChaosCsv(f"{directory}/sums", transactional=transactional), name="sums")
    sums.window(Tumbling(20)).sum("s", key="g", name="by_g").sink(
        ChaosCsv(f"{directory}/windows", transactional=transactional), name="windows")
    a.connect(b).apply(tag, name="tag", schema=SCHEMA).sink(ChaosCsv(f"{directory}/both", transactional=transactional), name="both")
    return job


def inputs() -> dict:
    rng = np.random.default_rng(11)
    out = {}
    for i, name in enumerate("ab"):
        data = np.zeros(N, SCHEMA.dtype)
        data["t"] = np.sort(rng.integers(0, 300, N))
        data["k"] = rng.integers(0, 400, N) + 1000 * i
        data["v"] = rng.integers(-50, 50, N)
        out[name] = data
    return out


ROUNDS = 4


def hop_flow(directory, pace=None, sink=None) -> Dataflow:
    """A loop whose every round sends each record to the executor owning its key (k + round):
    what comes back round the feedback is shipped again at once (the outbox of a checkpoint).
    `pace`: a pass-through filter on the feedback edge (the rounds after the first), or none;
    `sink`: where the records go after their last round (default: a transactional CSV directory
    `<directory>/hopped`)."""
    job = Dataflow("hop-ckpt")
    source = job.source("a", SCHEMA, time="t")
    with job.loop("rounds") as loop:
        entered = loop.enter(source.with_column("n", lambda b: np.zeros(len(b), np.int64), dtype="<i8", name="zero"))
        step = entered.exchange(key="k", name="hop").apply(_next_round, name="next", schema=HOP)
        again = step.filter(lambda b: b["n"] < ROUNDS, name="again")
        loop.feed_back(behind(again, pace))
        left = loop.leave(step.filter(lambda b: b["n"] >= ROUNDS, name="done"))
    left.sink(ChaosCsv(f"{directory}/hopped", transactional=True) if sink is None else sink, name="hopped")
    return job


HOP = Schema({"t": "i8", "k": "i8", "v": "i8", "n": "i8"})


def _next_round(batch):
    out = batch.to_numpy(HOP.dtype).copy()
    out["n"] += 1
    out["k"] += 7919  # another owner next round
    out["v"] = out["v"] * 3 + out["n"]
    return out


class _Tagging(Tag):
    """The loop-window tests' `Tag`, stateless (its attributes are configuration)."""

    stateless = True


def loop_window_flow(directory, pace=None) -> Dataflow:
    """A keyed window inside a loop (a `LoopWindow` behind its route: every iteration's rows cross
    executors) into a transactional CSV directory; `pace`: a pass-through filter behind the source."""
    job = Dataflow("lw-ckpt")
    source = behind(job.source("src", REC, time="t"), pace)
    halving(source, _Tagging(1, "sum_v"), schema=tagged(1, "sum_v"), shift=1).sink(
        ChaosCsv(directory, transactional=True), name="out")
    return job


def loop_window_inputs() -> dict:
    return {"src": input_records(3, 3000)}
