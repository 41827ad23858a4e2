"""A checkpointed dataflow with a loop (or a stateful user operator) that resumes from its
checkpoint directory and may SIGKILL itself.

    python _loop_child.py <directory> <job> <kill>

<job>: "cc" (connected components, `slashrt.examples.cc`, edges in EPOCHS epochs), "pagerank"
(`slashrt.examples.pagerank`, ITERATIONS power iterations per epoch) or "counter" (a user
operator counting records per key and epoch, with notifications, in a graph flow with a
union). Output into a transactional CSV sink under <directory>/out; checkpoints every 2 ms into
<directory>/chk; `resume_from="latest"`. <kill> is "none", or "<point>:<k>": SIGKILL this
process at the k-th time it reaches <point>: "queued" (a fed-back batch is about to be
delivered round the loop: in the middle of an epoch's iterations), "logged" (a batch arriving
on a back edge was logged: a loop head's log is open), "replayed" (a logged batch is delivered
again after a restore), "notify" (an operator is about to get a notification), "write_part"
(a part written, before the rest) or "complete" (a manifest written, before the sinks commit).
Prints "done" at the end."""

import os
import signal
import sys

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, sinks
from slashrt.examples import EDGES

NODES, EDGE_COUNT, EPOCHS, ITERATIONS = 40_000, 60_000, 16, 12


def edges(seed: int = 7) -> np.ndarray:
    """The same edges in every process, in epoch order."""
    rng = np.random.default_rng(seed)
    out = np.zeros(EDGE_COUNT, EDGES)
    out["src"], out["dst"] = rng.integers(0, NODES, EDGE_COUNT), rng.integers(0, NODES, EDGE_COUNT)
    out["epoch"] = np.sort(rng.integers(0, EPOCHS, EDGE_COUNT))
    return out


COUNTED = Schema({"t": "i8", "k": "i8", "v": "i8"})


class CountPerKey(slashrt.Operator):
    """Counts records and sums v per key over all time; on each epoch's notification emits the
    running totals of the keys that epoch touched."""

    def __init__(self):
        self.totals = np.zeros((50, 2), np.int64)  # per key: count, sum
        self.touched: dict[int, np.ndarray] = {}  # epoch -> keys seen in it

    def snapshot(self) -> slashrt.State:
        epochs = sorted(self.touched)
        keys = [self.touched[e] for e in epochs]
        return slashrt.State(
            {"totals": self.totals, "epochs": np.array(epochs, np.int64),
             "touched": np.array(keys, bool).reshape(len(epochs), 50)}, {"keys": 50},
        )

    def restore(self, state: slashrt.State) -> None:
        self.totals = np.array(state.arrays["totals"])
        self.touched = {int(e): np.array(row) for e, row in zip(state.arrays["epochs"], state.arrays["touched"])}

    async def on_batch(self, ctx, port, batch):
        k = batch["k"]
        np.add.at(self.totals[:, 0], k, 1)
        np.add.at(self.totals[:, 1], k, batch["v"])
        if ctx.time.epoch not in self.touched:
            self.touched[ctx.time.epoch] = np.zeros(50, bool)
            ctx.notify_at(ctx.time)
        self.touched[ctx.time.epoch][k] = True

    async def on_notify(self, ctx, time):
        keys = np.flatnonzero(self.touched.pop(time.epoch))
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


def job(name: str, directory: str):
    sink = sinks.CsvFile(f"{directory}/out", transactional=True)
    if name == "cc":
        from slashrt.examples.cc import LABELS, cc_flow

        flow, _ = cc_flow(sink)
        return flow, {"edges": edges(), "labels": np.empty(0, LABELS)}
    if name == "pagerank":
        from slashrt.examples.pagerank import RANKS, pagerank_flow

        return pagerank_flow(sink, ITERATIONS, nodes=NODES), {"edges": edges(), "ranks": np.empty(0, RANKS)}
    flow = Dataflow("counter")
    a, b = (flow.source(n, COUNTED, time="t") for n in ("a", "b"))
    a.union(b).operator(CountPerKey(), name="count").sink(sink, name="out")
    return flow, counter_inputs()


def kill_at(target, name: str, k: int):
    """`target.name`, SIGKILLing this process at its k-th call (after it returned, for plain
    functions; before the k-th coroutine runs, for async ones)."""
    original, calls = getattr(target, name), [0]

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(target, name, wrapped)


def main(directory: str, name: str, kill: str) -> None:
    from slashrt.ops.operator import OperatorNode
    from slashrt.scheduler._pointstamp import PointstampProgress
    from slashrt.snapshot.loops import BackEdgeLog
    from slashrt.snapshot.storage import SnapshotStore

    point, _, k = kill.partition(":")
    targets = {
        "queued": (PointstampProgress, "run_queued"), "logged": (BackEdgeLog, "record"),
        "replayed": (BackEdgeLog, "replay"), "notify": (OperatorNode, "notify"),
        "write_part": (SnapshotStore, "write_part"), "complete": (SnapshotStore, "complete"),
    }
    if point != "none":
        kill_at(*targets[point], int(k))
    flow, inputs = job(name, directory)
    slashrt.run(
        flow, inputs, checkpoint={"interval": 0.002, "keep": 2}, checkpoint_dir=f"{directory}/chk",
        resume_from="latest", slots=4, slot_size=1024,
    )
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
