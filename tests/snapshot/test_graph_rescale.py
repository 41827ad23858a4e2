"""Rescaling a graph flow's checkpoint (`slashrt.snapshot.rescale`): resumed on another number
of executors (or in the other mode) from a checkpoint in the middle of the previous run, each
flow of tests/snapshot/_graph_flow.py publishes exactly one uninterrupted run's output: union,
an exchange by key into a user operator with keyed state and notifications, a keyed window on
another key behind it, connect(...).apply; a loop shipping every round to another executor
(the feedback edges' logs, the exchanges' outboxes); a keyed window inside a loop (every
iteration's window cut by key partition). Real agent processes over shm and tcp, rings of four
256-byte slots (every channel wraps ~100 times).

- a chain of resumes: one executor -> 2 (slash, shm) -> 3 (uppar, tcp) -> 2 (slash, tcp) -> one;
- what a graph flow's checkpoint cannot give another count is refused in one sentence before
  any agent starts: an operator whose state is not keyed, keyed state not behind an exchange;
- a sliding window with late records whose owners had fired it up to different times (each on
  the progress it had heard of), in a linear flow, behind a union and inside a loop, taken on 3
  executors and resumed on 2 and on 4 in the other mode, publishes exactly one uninterrupted
  run's windows.

(A linear flow's chains of resumes, from the command line too: tests/snapshot/test_rescale.py.)
"""

import shutil
from pathlib import Path

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, Schema, State
from slashrt.errors import SlashError
from slashrt.snapshot import SnapshotStore

from tests.snapshot import _fired_apart, _graph_flow, _rescale_job
from tests.snapshot._paced import Paced
from slashrt.bench.chaos import published

from tests.snapshot.test_graph_cluster_checkpoints import fed

RINGS = {"slot_size": 256, "slots": 4}


class Job:
    """A flow of tests/snapshot/_graph_flow.py (or _fired_apart.py, _rescale_job.py): its job
    name, sinks (directories under "out"), inputs, and the step of its sliding window."""

    def __init__(self, name: str, make, sinks: tuple[str, ...], inputs, window: str = "win"):
        self.name, self.make, self.sinks, self.inputs = name, make, sinks, inputs
        self.window = f"{name}.{window}"

    def flow(self, directory: Path, pace: Paced | None = None) -> Dataflow:
        return self.make(directory / "out") if pace is None else self.make(directory / "out", pace)

    def outputs(self, directory: Path) -> dict:
        return {name: published(directory / "out" / name) for name in self.sinks}


JOBS = {
    "operators-windows": Job("graph-ckpt", _graph_flow.flow, _graph_flow.SINKS, _graph_flow.inputs),
    # every round ships each record to another executor: the feedback edges' logs and the
    # exchanges' outboxes go with the checkpoints
    "loop-shipping": Job("hop-ckpt", _graph_flow.hop_flow, ("hopped",), lambda: {"a": _graph_flow.inputs()["a"]}),
    # a keyed window inside a loop: every iteration's window cut by key partition
    "loop-window": Job("lw-ckpt", lambda out, pace=None: _graph_flow.loop_window_flow(out / "lw", pace), ("lw",),
                       _graph_flow.loop_window_inputs),
}


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """`one_run(job)`: one uninterrupted run's outputs of `job` on one executor (its final
    checkpoint commits them), run once for every test and mode that compares with it."""
    outputs = {}

    def of(job: Job) -> dict:
        if job.name not in outputs:
            directory = tmp_path_factory.mktemp(f"reference-{job.name}")
            slashrt.run(job.flow(directory), job.inputs(), checkpoint_dir=directory / "chk")
            outputs[job.name] = job.outputs(directory)
            # (a fired-apart flow's late records too)
            assert all(sum(rows.values()) > 100 for rows in outputs[job.name].values()), outputs[job.name].keys()
        return outputs[job.name]

    return of


def options(on) -> dict:
    if on == "local":
        return dict(RINGS)
    executors, mode, transport = on
    return dict(executors=executors, mode=mode, transport=transport, partitions=16, **RINGS)


def stage(job: Job, directory: Path, on, resume: bool):
    # (the default alignment timeout: checkpoints that align slowly hold records in flight, which
    # go to their keys' new owners; test_graph_cluster_unaligned.py makes sure of some)
    # Paced until two checkpoints of this stage completed: however fast the machine, a resumed
    # stage cannot feed the input it has left before its first checkpoint (the next stage
    # resumes from one taken in the middle of the feed). hop_flow paces its feedback edge,
    # which holds its source through the exchange's backlog.
    manifests = directory / "chk" / job.name / "chk-*" / "_manifest.json"
    return slashrt.run(
        job.flow(directory, Paced(seconds=0.004, until=(manifests, 2), fresh=True)), job.inputs(),
        checkpoint={"interval": 0.002, "keep": 1000},
        checkpoint_dir=directory / "chk", resume_from="latest" if resume else None, **options(on),
    )


def crash_after_a_mid_run_checkpoint(job: Job, directory: Path, resumed: int | None) -> tuple[Path, int]:
    """What a crash right after a checkpoint in the middle of the run in `directory` committed
    leaves: the output published up to it and the checkpoints up to it (in a new directory)."""
    store = SnapshotStore(directory / "chk", job=job.name, keep=1000)
    mine = [n for n in store.checkpoints() if resumed is None or n > resumed]
    end = fed(store.load(mine[-1]).meta)
    during = [n for n in mine[:-1] if 0 < fed(store.load(n).meta) < end]
    assert during, [(n, fed(store.load(n).meta)) for n in mine]
    mid = during[len(during) // 3]
    return crash_after(job, directory, mid, directory.parent / f"{directory.name}+"), mid


def crash_after(job: Job, directory: Path, n: int, after: Path) -> Path:
    """What a crash right after checkpoint n of the run in `directory` committed leaves, in
    `after`: the output published up to it and the checkpoints up to it."""
    for name in job.sinks:
        (after / "out" / name).mkdir(parents=True)
        for part in (directory / "out" / name).glob("part-*.csv"):
            if int(part.name.split("-")[1]) <= n:
                shutil.copy(part, after / "out" / name / part.name)
    shutil.copytree(directory / "chk", after / "chk")
    for m in SnapshotStore(directory / "chk", job=job.name, keep=1000).checkpoints():
        if m > n:
            shutil.rmtree(after / "chk" / job.name / f"chk-{m}")
    return after


def count(on) -> int:
    return 1 if on == "local" else on[0]


CHAIN = ["local", (2, "slash", "shm"), (3, "uppar", "tcp"), (2, "slash", "tcp"), "local"]


@pytest.mark.parametrize("name", list(JOBS))
def test_a_graph_flow_resumed_on_other_executor_counts_publishes_one_runs_output(tmp_path, one_run, name):
    job = JOBS[name]
    reference = one_run(job)
    directory, resumed = tmp_path / "0", None
    for k, on in enumerate(CHAIN):
        result = stage(job, directory, on, resume=k > 0)
        assert result.resumed_from == resumed
        # the first runs' output up to their checkpoints and this run's: one run's output, exactly
        assert job.outputs(directory) == reference, (k, on)
        store = SnapshotStore(directory / "chk", job=job.name, keep=1000)
        assert store.load(store.checkpoints()[-1]).meta["executors"] == count(on)
        if k + 1 < len(CHAIN):
            directory, resumed = crash_after_a_mid_run_checkpoint(job, directory, resumed)


# -- refused in one sentence --------------------------------------------------------------------------
SCHEMA = Schema({"t": "i8", "k": "i8"})
COUNTS = np.dtype([("k", "<i8"), ("n", "<i8")])


class Counts(Operator):
    """How many records of each key it saw, kept as a table keyed by k (`keyed_by`), or not."""

    keyed_by = "k"

    def __init__(self):
        self.seen = np.zeros(0, COUNTS)

    async def on_batch(self, ctx, port, batch):
        keys = np.concatenate([self.seen["k"], batch["k"]])
        merged, inverse = np.unique(keys, return_inverse=True)
        table = np.zeros(len(merged), COUNTS)
        table["k"] = merged
        table["n"] = np.bincount(inverse, np.concatenate([self.seen["n"], np.ones(len(batch), np.int64)]))
        self.seen = table

    def snapshot(self) -> State:
        return State({"seen": self.seen}, {})

    def restore(self, state: State) -> None:
        self.seen = state.arrays["seen"].copy()


class UnkeyedCounts(Counts):
    keyed_by = None


class BadlyKeyed(Counts):
    def snapshot(self) -> State:
        return State({"seen": self.seen, "total": np.array([len(self.seen)])}, {})


def counted(op, exchanged: bool = True) -> Dataflow:
    flow = Dataflow("keyed")
    stream = flow.source("s", SCHEMA, time="t")
    (stream.exchange(key="k", name="by_k") if exchanged else stream).operator(op, name="counts").sink(
        slashrt.sinks.Collect(), name="out")
    return flow


def one_executors_checkpoint(tmp_path, flow, inputs) -> Path:
    slashrt.run(flow, inputs, checkpoint_dir=tmp_path / "chk")
    return tmp_path / "chk"


INPUT = {"s": np.array([(t, t % 13) for t in range(2000)], SCHEMA.dtype)}


@pytest.mark.parametrize(("op", "exchanged", "why"), [
    (UnkeyedCounts, True, r"the state of user operator 'keyed.counts' is not keyed, so it is not cut by key \(as Flink's "
                          r"non-keyed operator state\); resume it with executors=1, or key it"),
    (Counts, False, r"user operator 'keyed.counts' keeps keyed state, but its input from 'keyed.s' does not pass an "
                    r"exchange\(key=...\), so its keys were not at their owners; resume it with executors=1"),
])
def test_operator_state_that_is_not_cut_by_key_is_refused(tmp_path, op, exchanged, why):
    chk = one_executors_checkpoint(tmp_path, counted(op(), exchanged), INPUT)
    with pytest.raises(SlashError, match=r"^run\(\): checkpoint \d+ was taken on 1 executor\(s\) and cannot resume on 2: " + why):
        slashrt.run(counted(op(), exchanged), INPUT, executors=2, checkpoint_dir=chk, resume_from="latest")


def test_a_keyed_state_is_checked_when_it_is_taken_and_when_it_is_cut(tmp_path):
    from slashrt.errors import DataflowError, OperatorError
    from slashrt.ops.operator import keyed_rows

    # every array a table with the key's integer field: said when the checkpoint is taken
    with pytest.raises(OperatorError, match=r"BadlyKeyed.keyed_by is 'k', so every state array is a table of records "
                                            r"with an integer field 'k' .* and array 'total' is int64"):
        slashrt.run(counted(BadlyKeyed()), INPUT, checkpoint_dir=tmp_path)

    class NoState(Operator):
        keyed_by = "k"

        async def on_batch(self, ctx, port, batch):
            pass

    with pytest.raises(DataflowError, match="NoState.keyed_by is 'k' but it declares no state"):
        slashrt.run(counted(NoState()), INPUT)
    # cut: each executor the rows of its keys, every requested time; a meta that differs is refused
    table = np.zeros(4, COUNTS)
    table["k"], table["n"] = [1, 2, 3, 4], [10, 20, 30, 40]
    requested = [np.array([[5]], np.int64), np.array([[7], [5]], np.int64)]
    states = [State({"requested": r, "user.seen": table[i * 2:(i + 1) * 2]},
                    {"kind": "operator", "version": 1, "user": {}, "keyed_by": "k"}) for i, r in enumerate(requested)]
    odd = keyed_rows("x", states, "k", lambda keys: keys % 2 == 1)
    assert odd.arrays["user.seen"].tolist() == [(1, 10), (3, 30)]
    assert odd.arrays["requested"].tolist() == [[5], [7]]
    states[1].meta["user"] = {"total": 2}
    with pytest.raises(SlashError, match="step 'x': its keyed state's meta differs between the executors that took it"):
        keyed_rows("x", states, "k", lambda keys: keys % 2 == 1)


# -- a sliding window its owners had fired up to different times --------------------------------------
FIRED_APART = {
    # one source into a tumbling and a sliding window (its second), the rescaling tests' job
    "linear": Job("rescale", _rescale_job.flow, _rescale_job.OUTPUTS, lambda: {"r": _rescale_job.records()},
                  "sum_window_2"),
    "union": Job("fa", _fired_apart.union_flow, ("out", "late"), _fired_apart.union_inputs),
    "loop": Job("fal", _fired_apart.loop_flow, ("out", "late"), _fired_apart.loop_inputs),
}


@pytest.mark.parametrize("mode", ["uppar", "slash"])
@pytest.mark.parametrize("name", list(FIRED_APART))
def test_a_sliding_window_its_owners_had_fired_to_different_times_resumes_on_2_and_4_exactly(tmp_path, one_run, name, mode):
    """Each owner of a graph flow's window fires on the progress it has heard of: a checkpoint
    taken on 3 executors in the middle of the stream (which stays slow until one completed)
    whose owners of a sliding window with late records had fired it up to different times
    (inside a loop: some iteration's), resumed on 2 executors and on 4 in the other mode,
    publishes exactly one uninterrupted run's windows and late records: the windows between
    the owners' times fire again with the keys of the owners that had not fired them only."""
    job = FIRED_APART[name]
    reference = one_run(job)
    directory, step, records = tmp_path / "3", job.window, sum(map(len, job.inputs().values()))
    pace = Paced(seconds=0.004, until=_fired_apart.FiredApart(directory / "chk", job.name, step, records))
    slashrt.run(job.make(directory / "out", pace), job.inputs(), checkpoint={"interval": 0.002, "keep": 1000},
                checkpoint_dir=directory / "chk", **options((3, mode, "shm")))
    assert job.outputs(directory) == reference
    store = SnapshotStore(directory / "chk", job=job.name, keep=1000)
    taken = {n: store.load(n) for n in store.checkpoints()}
    apart = {n: _fired_apart.fired_apart(c, step) for n, c in taken.items() if _fired_apart.fed(c) < records}
    n = min((n for n, where in apart.items() if where), default=None)
    assert n is not None, apart
    other = {"slash": "uppar", "uppar": "slash"}[mode]
    for on in [(2, mode, "tcp"), (4, other, "shm")]:
        after = crash_after(job, directory, n, tmp_path / f"{on[0]}")
        result = slashrt.run(job.flow(after), job.inputs(), checkpoint={"keep": 1000}, checkpoint_dir=after / "chk",
                             resume_from=n, **options(on))
        assert result.resumed_from == n
        assert job.outputs(after) == reference, (n, apart[n], on)
