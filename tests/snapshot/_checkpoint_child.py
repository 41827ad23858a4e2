"""A checkpointed job that resumes from its checkpoint directory and may SIGKILL itself.

    python _checkpoint_child.py <directory> <kill>

The job: source "a" out of order beyond its bound (some records are late) into a tumbling-window
sum per key; sources "b" and "c" (within their bound: what is late under a union depends on how
the two interleave) joined by a union into another; the sums and a's late records each into a
transactional CSV sink under <directory> (out_a, late_a, out_bc); checkpoints every 10 ms into <directory>/chk; `resume_from="latest"`.
<kill> is "none", or "<point>:<k>": SIGKILL this process at the k-th time it reaches <point>:
"records" (k thousand records processed), "pre_commit" (a sink pre-committed, before the state
is written), "write_part" (a part written, before the rest: during the asynchronous write) or
"complete" (a manifest written, before the sinks commit). Prints "done" at the end."""

import os
import signal
import sys

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
SIZES = {"a": 200_000, "b": 120_000, "c": 60_000}
DISORDER = {"a": 40, "b": 20, "c": 20}


def records(name: str) -> np.ndarray:
    """Each source's input, the same in every process."""
    rng = np.random.default_rng(len(name) + ord(name))
    n = SIZES[name]
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 20_000 // n - rng.integers(0, DISORDER[name], n)
    out["k"] = rng.integers(0, 50, n)
    out["v"] = rng.integers(-1000, 1000, n)
    return out


def flow(directory: str) -> Dataflow:
    job = Dataflow("chaos")
    a, b, c = (job.source(name, SCHEMA, time="t", max_delay=20) for name in SIZES)
    late = sinks.CsvFile(f"{directory}/late_a", transactional=True)
    a.window(Tumbling(ms=100), late=late).sum("v", key="k").sink(sinks.CsvFile(f"{directory}/out_a", transactional=True))
    b.union(c).window(Tumbling(ms=100)).sum("v", key="k").sink(sinks.CsvFile(f"{directory}/out_bc", transactional=True))
    return job


def main(directory: str, kill: str) -> None:
    from _children import kill_at  # run as a script: this directory is on its path

    from slashrt.snapshot.commit import PartFiles
    from slashrt.snapshot.storage import SnapshotStore

    point, _, k = kill.partition(":")
    on_records = None if point != "records" else lambda n: n >= int(k) * 1000 and os.kill(os.getpid(), signal.SIGKILL)
    if point not in ("none", "records"):
        kill_at({"pre_commit": PartFiles, "write_part": SnapshotStore, "complete": SnapshotStore}[point], point, int(k))
    slashrt.run(
        flow(directory), {name: records(name) for name in SIZES}, checkpoint={"interval": 0.005, "keep": 2},
        checkpoint_dir=f"{directory}/chk", resume_from="latest", slots=8, slot_size=2048, on_records=on_records,
    )
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
