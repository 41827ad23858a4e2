"""A checkpointed cluster job that resumes from its checkpoint directory; one of its agents may
SIGKILL itself.

    python _cluster_child.py <directory> <mode> <transport> <executors> <kill> [<checkpoint mode>]

(<executors> "local": one executor in this process, <mode> and <transport> unused.)

The job: one source out of order beyond its bound (some records are late) into a tumbling-window
sum per key, on <executors> agent processes exchanging over <transport> rings of 4 slots (every
channel wraps many times) in <mode> ("slash" or "uppar"); the sums and the late records each into
a transactional CSV sink under <directory> (out, late); checkpoints every 20 ms into
<directory>/chk (<checkpoint mode>: "abs", the default, or "sync"); `resume_from="latest"`. <kill> is "none", or "<point>:<k>:<executor>": that
executor SIGKILLs itself the k-th time its sink reaches <point>: "pre_commit" (output
pre-committed, its state not yet written or acked) or "commit" (entering the commit: the
checkpoint's manifest is written, this executor's output not yet published); until it has
(its marker is in <directory>/marks) each batch takes 4 ms more, so that however fast the machine
the job cannot end before the kill (a run at full speed completes only 4-6 checkpoints).
SLASHRT_TEST_ALIGNMENT_TIMEOUT: the checkpoints' alignment_timeout (0: every periodic one
unaligned; a cluster then computes one buffer a pipeline call, so that the paced sources' rings
hold records whenever a checkpoint overtakes them, not only when their feeders last had a turn); SLASHRT_TEST_KEEP: complete checkpoints kept (default 2). Prints "done" at the end; exits 3 with the error's sentence if the job failed."""

import os
import signal
import sys
from pathlib import Path

import numpy as np
import trio

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.cluster import ClusterError, run_cluster_async
from slashrt.ops.sinks import CsvFile

from tests.snapshot._paced import Paced, behind

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
N = 100_000
ALIGNMENT = {"alignment_timeout": float(os.environ["SLASHRT_TEST_ALIGNMENT_TIMEOUT"])} \
    if "SLASHRT_TEST_ALIGNMENT_TIMEOUT" in os.environ else {}


def records(n: int = N, *, seed: int = 7, span: int = 10_000, disorder: int = 40, keys: int = 3001) -> np.ndarray:
    """The input, the same in every process: `n` records over event times 0..`span`, each up to
    `disorder` behind, over `keys` keys."""
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * span // n - rng.integers(0, disorder, n)
    out["k"] = rng.permutation(n) % keys * 7 - 5000
    out["v"] = rng.integers(-1000, 1000, n)
    return out


class KillingCsv(CsvFile):
    """A transactional CSV sink whose executor `KILL[2]` SIGKILLs itself at its k-th `KILL[0]`,
    leaving a marker in `MARKS` first."""

    KILL, MARKS = ("none", 0, -1), None
    calls = 0

    def for_executor(self, index: int):
        sink = super().for_executor(index)
        sink.index = index
        return sink

    def _reached(self, point: str) -> None:
        name, k, executor = self.KILL
        if name == point and getattr(self, "index", None) == executor:
            type(self).calls += 1
            if type(self).calls == k:
                (Path(self.MARKS) / "killed").touch()
                os.kill(os.getpid(), signal.SIGKILL)

    def pre_commit(self, checkpoint: int) -> None:
        super().pre_commit(checkpoint)
        self._reached("pre_commit")

    def commit(self, checkpoint: int) -> None:
        self._reached("commit")
        super().commit(checkpoint)


def flow(directory: str, pace=None) -> Dataflow:
    job = Dataflow("cluster-chaos")
    source = job.source("r", SCHEMA, time="t", max_delay=20)
    source = behind(source, pace)
    late = KillingCsv(f"{directory}/late", transactional=True)
    out = KillingCsv(f"{directory}/out", transactional=True)
    source.window(Tumbling(ms=100), late=late).sum("v", key="k", output="total").sink(out)
    return job


def main(directory: str, mode: str, transport: str, executors: str, kill: str, checkpoint_mode: str = "abs") -> None:
    pace = None
    if kill != "none":
        point, k, executor = kill.split(":")
        KillingCsv.KILL, KillingCsv.MARKS = (point, int(k), int(executor)), f"{directory}/marks"
        os.makedirs(KillingCsv.MARKS)
        pace = Paced(seconds=0.004, until=(KillingCsv.MARKS, 1))
    checkpoints = dict(checkpoint={"interval": 0.02, "keep": int(os.environ.get("SLASHRT_TEST_KEEP", 2)), "mode": checkpoint_mode, **ALIGNMENT}, checkpoint_dir=f"{directory}/chk", resume_from="latest")
    if executors == "local":  # one executor, in this process (it cannot kill itself: its sinks have no index)
        slashrt.run(flow(directory), {"r": records()}, slots=8, slot_size=1024, **checkpoints)
        print("done", flush=True)
        return
    try:
        result = trio.run(lambda: run_cluster_async(
            flow(directory, pace), {"r": records()}, executors=int(executors), transport=transport, mode=mode,
            partitions=16, slots=8, slot_size=1024, exchange_slots=4, **checkpoints, **({"coalesce": 1} if ALIGNMENT else {}),
        ))
    except ClusterError as exc:
        print(f"failed: {exc}", flush=True)
        sys.exit(3)
    print("checkpoints", [(c["status"], round(c["seconds"], 3), round(c["max_alignment_s"], 3), round(c["max_async_s"], 3)) for c in result.checkpoints], result.seconds, file=sys.stderr)
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
