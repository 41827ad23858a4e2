"""A checkpointed dataflow with a loop (or a stateful user operator) that resumes from its
checkpoint directory and may SIGKILL itself.

    python _loop_child.py <directory> <job> <kill>

<job>: "circulate" (every record goes round a loop of stateless steps ROUNDS times, many
batches in flight on the back edge at once), "cc" (connected components, `slashrt.examples.cc`, edges in EPOCHS epochs), "pagerank"
(`slashrt.examples.pagerank`, ITERATIONS power iterations per epoch) or "counter" (a user
operator counting records per key and epoch, with notifications, in a graph flow with a
union), "windows" / "nested-windows" (a keyed window inside a loop, or two loops deep,
`tests/test_loop_windows.halving`). Output into a transactional CSV sink under <directory>/out; checkpoints every 2 ms into
<directory>/chk; `resume_from="latest"`. <kill> is "none", or "<point>:<k>": SIGKILL this
process at the k-th time it reaches <point>: "queued" (a fed-back batch is about to be
delivered round the loop: in the middle of an epoch's iterations), "logged" (a batch arriving
on a back edge was logged: a loop head's log is open), "replayed" (a logged batch is delivered
again after a restore), "notify" (an operator is about to get a notification), "write_part"
(a part written, before the rest), "fire" (a window is about to fire) or "complete" (a manifest written, before the sinks commit).
Until a kill at a checkpoint's point ("write_part", "complete") has fired, each delivery round the
loop (each batch of the "counter" operator) takes 2 ms more, so that however fast the machine the
job cannot end before it (a run at full speed completes only 3-11 checkpoints); with a kill at the
k-th "queued", each 5 ms more until 2 checkpoints completed, so that the kill finds one to resume
from, holding what the loop had in flight (at full speed only 2 completed before circulate's
2500th delivery, none with 50 ms fsyncs; before the windows job's 120th, with 10 ms fsyncs, one
holding iteration 0 only; with the pace 2, holding 6-11 iterations, also with 30 ms fsyncs).
Prints "done" at the end."""

import os
import sys
import tempfile

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, sinks
from slashrt.examples import EDGES

NODES, EDGE_COUNT, EPOCHS = 40_000, 60_000, 16
PR_NODES, ITERATIONS = 2000, 30  # PageRank emits every node's rank per epoch: fewer nodes


def edges(nodes: int = NODES, seed: int = 7) -> np.ndarray:
    """The same edges in every process, in epoch order."""
    rng = np.random.default_rng(seed)
    out = np.zeros(EDGE_COUNT, EDGES)
    out["src"], out["dst"] = rng.integers(0, nodes, EDGE_COUNT), rng.integers(0, nodes, EDGE_COUNT)
    out["epoch"] = np.sort(rng.integers(0, EPOCHS, EDGE_COUNT))
    return out


ROUNDS = 20
CIRCLING = Schema({"t": "i8", "k": "i8", "n": "i8"})


def circulate_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    rec = np.zeros(20_000, CIRCLING.dtype)
    rec["t"] = np.arange(len(rec)) * 50 // len(rec)
    rec["k"] = rng.integers(0, 1 << 40, len(rec))
    return {"a": rec}


COUNTED = Schema({"t": "i8", "k": "i8", "v": "i8"})


class CountPerKey(slashrt.Operator):
    """Counts records and sums v per key and epoch; once an epoch is complete (notification)
    adds it to the running totals and emits the totals of the keys that epoch touched."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.totals = np.zeros((50, 2), np.int64)  # per key: count, sum, of the epochs notified
        self.open: dict[int, np.ndarray] = {}  # epoch -> per key: count, sum

    def snapshot(self) -> slashrt.State:
        epochs = sorted(self.open)
        return slashrt.State(
            {"totals": self.totals, "epochs": np.array(epochs, np.int64),
             "open": np.array([self.open[e] for e in epochs], np.int64).reshape(len(epochs), 50, 2)}, {"keys": 50},
        )

    def restore(self, state: slashrt.State) -> None:
        self.totals = np.array(state.arrays["totals"])
        self.open = {int(e): np.array(c) for e, c in zip(state.arrays["epochs"], state.arrays["open"])}

    async def on_batch(self, ctx, port, batch):
        if ctx.time.epoch not in self.open:
            self.open[ctx.time.epoch] = np.zeros((50, 2), np.int64)
            ctx.notify_at(ctx.time)
        counts = self.open[ctx.time.epoch]
        np.add.at(counts[:, 0], batch["k"], 1)
        np.add.at(counts[:, 1], batch["k"], batch["v"])

    async def on_notify(self, ctx, time):
        counts = self.open.pop(time.epoch)
        self.totals += counts
        keys = np.flatnonzero(counts[:, 0])
        out = np.zeros(len(keys), COUNTED.dtype)
        out["t"], out["k"], out["v"] = time.epoch, keys, self.totals[keys, 1] * 1000 + self.totals[keys, 0]
        await ctx.emit(out)


def counter_inputs() -> dict[str, np.ndarray]:
    out = {}
    for i, name in enumerate(("a", "b")):
        rng = np.random.default_rng(30 + i)
        n = 60_000
        rec = np.zeros(n, COUNTED.dtype)
        rec["t"] = np.arange(n, dtype=np.int64) * 400 // n
        rec["k"], rec["v"] = rng.integers(0, 50, n), rng.integers(-100, 100, n)
        out[name] = rec
    return out


WINDOW_RECORDS = {"windows": 20_000, "nested-windows": 3000}  # nested: every inner round's rows go round again


def window_inputs(name: str) -> dict[str, np.ndarray]:
    from tests.test_loop_windows import input_records

    return {"src": input_records(11, WINDOW_RECORDS[name])}


def job(name: str, directory: str, pace=None):
    """(flow, inputs) of job `name`; `pace`: a pass-through filter behind circulate's source
    (`tests.snapshot._paced.Paced`), or none."""
    sink = sinks.CsvFile(f"{directory}/out", transactional=True)
    if name in ("windows", "nested-windows"):
        from tests.test_loop_windows import REC, halving

        flow = Dataflow(name)
        halving(flow.source("src", REC, time="t"), nested=name == "nested-windows").sink(sink, name="out")
        return flow, window_inputs(name)
    if name == "cc":
        from slashrt.examples.cc import LABELS, cc_flow

        flow, _ = cc_flow(sink)
        return flow, {"edges": edges(), "labels": np.empty(0, LABELS)}
    if name == "pagerank":
        from slashrt.examples.pagerank import RANKS, pagerank_flow

        return pagerank_flow(sink, ITERATIONS, nodes=PR_NODES), {"edges": edges(PR_NODES), "ranks": np.empty(0, RANKS)}
    if name == "circulate":
        flow = Dataflow("circulate")
        from tests.snapshot._paced import behind

        src = behind(flow.source("a", CIRCLING, time="t"), pace)
        with flow.loop("round", max_iterations=ROUNDS) as loop:
            body = loop.enter(src).with_column("n", lambda b: b["n"] + 1, dtype="i8")
            loop.feed_back(body.filter(lambda b: b["n"] < ROUNDS))
            out = loop.leave(body.filter(lambda b: b["n"] == ROUNDS))
        out.with_column("k", lambda b: b["k"] * 3 + b["n"], dtype="i8").sink(sink, name="out")
        return flow, circulate_inputs()
    flow = Dataflow("counter")
    a, b = (flow.source(n, COUNTED, time="t") for n in ("a", "b"))
    a.union(b).operator(CountPerKey(), name="count").sink(sink, name="out")
    return flow, counter_inputs()


# SLASHRT_TEST_ALIGNMENT_TIMEOUT: the checkpoints' alignment_timeout (0: every one unaligned)
ALIGNMENT = {"alignment_timeout": float(os.environ["SLASHRT_TEST_ALIGNMENT_TIMEOUT"])} \
    if "SLASHRT_TEST_ALIGNMENT_TIMEOUT" in os.environ else {}


def main(directory: str, name: str, kill: str) -> None:
    from _children import kill_at, pace_at  # run as a script: this directory is on its path

    from slashrt.ops.operator import OperatorNode
    from slashrt.ops.window import WindowAggregate
    from slashrt.scheduler._pointstamp import PointstampProgress
    from slashrt.snapshot.loops import BackEdgeLog
    from slashrt.snapshot.storage import SnapshotStore

    point, _, k = kill.partition(":")
    targets = {
        "queued": (PointstampProgress, "run_queued"), "logged": (BackEdgeLog, "record"),
        "replayed": (BackEdgeLog, "replay"), "notify": (OperatorNode, "notify"),
        "write_part": (SnapshotStore, "write_part"), "complete": (SnapshotStore, "complete"),
        "fire": (WindowAggregate, "_fire"),
    }
    if point != "none":
        from tests.snapshot._paced import Paced

        marks = tempfile.mkdtemp(prefix="marks-", dir=directory)
        kill_at(*targets[point], int(k), marker=f"{marks}/killed")
        if point in ("write_part", "complete"):  # slowed until the kill fired
            pace = Paced(seconds=0.002, until=(marks, 1))
        elif point == "queued":  # until 2 checkpoints completed
            pace = Paced(seconds=0.005, until=(f"{directory}/chk/*/chk-*/_manifest.json", 2))
        else:  # (passed as often whatever the timing, and the tests ask nothing of the checkpoints)
            pace = Paced()
        pace_at(*(targets["queued"] if name != "counter" else (CountPerKey, "on_batch")), pace)
    flow, inputs = job(name, directory)
    slashrt.run(
        flow, inputs, checkpoint={"interval": 0.002, "keep": 2, **ALIGNMENT}, checkpoint_dir=f"{directory}/chk",
        resume_from="latest", slots=4, slot_size=1024,
    )
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
