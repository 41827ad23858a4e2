"""Checkpoints of slashrt's per-source ("tree") plans, resumed on the one execution model.

Before every flow was a graph, a keyed window on several executors kept its state as kind
"ssb_window" (mode "slash": the leader state beside this executor's fragments, the layout of
`slashrt.ssb.partitioned`), or as a "window" with a "<step>.route" state of kind
"route_by_owner" beside it (mode "uppar": where the router judged its records, its vector
clock). A resume of such a checkpoint goes through the rescaling path (`rescale.RETIRED`,
`reshaped`, `reassigned`), which reads these kinds (`as_partitioned`).

A real checkpoint in the middle of a sliding-window sum with late records (a linear flow) on 2
executors in real agent processes over shm, its window states rewritten in the old kinds (slash:
`rescale._graph_as_partitioned` makes exactly that layout; uppar: a router's state beside each
window as `RouteByOwner` wrote it), written back through the store and resumed on 2 executors and on 3: the output
published up to the checkpoint and the resumed run's are one uninterrupted run's, exactly."""

import shutil

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Sliding
from slashrt.cluster import PerExecutor
from slashrt.errors import SnapshotError
from slashrt.ops.sinks import CsvFile
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.operators import tagged
from slashrt.snapshot.rescale import RETIRED, _graph_as_partitioned

from tests.snapshot._paced import Paced, behind
from tests.snapshot.test_graph_cluster_checkpoints import fed
from tests.snapshot.test_graph_rescale import Job, crash_after

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
N = 20_000
STEP = "tree.agg"
RINGS = {"slot_size": 256, "slots": 4}  # (every ring wraps hundreds of times)
CHECKPOINTS = 6  # each batch slower until this many completed: some fall in the middle of the stream


def records() -> np.ndarray:
    """8 records a ms over 100 keys, one in 20 up to 60 ms behind: late for some windows of
    a Sliding(100, 25) at max_delay=20."""
    rng = np.random.default_rng(5)
    out = np.zeros(N, SCHEMA.dtype)
    out["t"] = np.arange(N) // 8 - np.where(rng.random(N) < 0.05, rng.integers(0, 60, N), 0)
    out["k"] = rng.integers(0, 100, N)
    out["v"] = rng.integers(-50, 50, N)
    return out


def tree_flow(out, pace=None) -> Dataflow:
    job = Dataflow("tree")
    stream = job.source("r", SCHEMA, time="t", max_delay=20)
    behind(stream, pace).window(Sliding(100, 25), late=CsvFile(f"{out}/late", transactional=True)).sum(
        "v", key="k", name="agg").sink(CsvFile(f"{out}/out", transactional=True), name="out")
    return job


JOB = Job("tree", tree_flow, ("out", "late"), lambda: {"r": records()})


def as_tree_plans(store: SnapshotStore, n: int, mode: str) -> None:
    """Rewrite checkpoint n's window states as the tree plans wrote them: slash, each
    executor's "ssb_window" state; uppar, each owner's "window" with its router's
    "route_by_owner" state (judged up to, and every executor's watermark at, where its window
    had fired)."""
    checkpoint = store.load(n)
    written = []
    for (step, executor), state in checkpoint.states.items():
        if step != STEP:
            continue
        if mode == "slash":
            old = _graph_as_partitioned(state, checkpoint.meta["executors"], executor)
            written.append(store.write_part(n, step, executor, old.arrays, old.meta))
        else:
            fired, executors = state.meta["fired_until"], checkpoint.meta["executors"]
            # (where its records were judged and every executor's watermark it had heard of: where
            # its window had fired)
            route = tagged("route_by_owner", 1, {}, step=f"{STEP}.route", fired_until=fired, executors=executors,
                           frontier=[fired] * executors)
            written.append(store.write_part(n, route.meta["step"], executor, route.arrays, route.meta))
    rewritten = {(p.step, p.executor) for p in written}
    store.complete(n, checkpoint.meta, parts=[p for p in checkpoint.parts if (p.step, p.executor) not in rewritten])
    kinds = {(step, state.meta["kind"]) for (step, _), state in store.load(n).states.items()
             if step in (STEP, f"{STEP}.route")}
    assert kinds == ({(STEP, "ssb_window")} if mode == "slash" else {(STEP, "window"), (f"{STEP}.route", "route_by_owner")})
    assert {kind for _, kind in kinds} & RETIRED


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reference")
    slashrt.run(JOB.flow(directory), JOB.inputs(), checkpoint_dir=directory / "chk")
    outputs = JOB.outputs(directory)
    assert sum(outputs["late"].values()) > 100 and sum(outputs["out"].values()) > 1000
    return outputs


@pytest.mark.parametrize("mode", ["slash", "uppar"])
def test_a_tree_plans_checkpoint_resumes_on_the_one_path_exactly(tmp_path, reference, mode):
    taken = tmp_path / "taken"
    pace = Paced(seconds=0.002, until=(taken / "chk" / "tree" / "chk-*" / "_manifest.json", CHECKPOINTS))
    options = dict(mode=mode, transport="shm", **RINGS)
    slashrt.run(JOB.make(taken / "out", pace), JOB.inputs(), executors=2, checkpoint_dir=taken / "chk",
                checkpoint={"interval": 0.005, "keep": 1000, "alignment_timeout": None}, **options)
    assert JOB.outputs(taken) == reference
    store = SnapshotStore(taken / "chk", job="tree", keep=1000)
    numbers = store.checkpoints()
    # in the middle: input left to feed, windows still open held by the owners (slash: and by
    # the fragments, which the old layout keeps beside the leader state)
    held = ("slices.keys",) if mode == "uppar" else ("slices.keys", "fragments.slices.keys")
    mid = [m for m in numbers[:-1] if 0 < fed(store.load(m).meta) < N and all(
        sum(len(s.arrays[tables]) for (step, _), s in store.load(m).states.items() if step == STEP) for tables in held)]
    assert mid, [(m, fed(store.load(m).meta)) for m in numbers]
    n = mid[len(mid) // 2]
    crashed = crash_after(JOB, taken, n, tmp_path / "crashed")
    published = JOB.outputs(crashed)
    assert 0 < sum(published["out"].values()) < sum(reference["out"].values())
    as_tree_plans(SnapshotStore(crashed / "chk", job="tree", keep=1000), n, mode)
    for executors in (2, 3):
        directory = tmp_path / f"on{executors}"
        shutil.copytree(crashed, directory)
        result = slashrt.run(JOB.flow(directory), JOB.inputs(), executors=executors, checkpoint_dir=directory / "chk",
                             resume_from=n, **options)
        assert result.resumed_from == n
        assert JOB.outputs(directory) == reference, f"checkpoint {n} of the tree plan ({mode}) on {executors} executors"
    # this path shares every input out anew: a PerExecutor's streams cannot be, refused in one
    # sentence naming the checkpoint's origin (not an executor count, which is the same)
    directory = tmp_path / "per_executor"
    shutil.copytree(crashed, directory)
    per_executor = PerExecutor(lambda index, executors: records()[index::executors], deterministic=True)
    with pytest.raises(SnapshotError, match=rf"checkpoint {n} was taken by an earlier slashrt's per-source plan and "
                                            r"cannot resume here: source 'tree.r' is a PerExecutor, .* not shared out "
                                            r"anew, as this resume needs; resume it with the slashrt that wrote it"):
        slashrt.run(JOB.flow(directory), {"r": per_executor}, executors=2, checkpoint_dir=directory / "chk",
                    resume_from=n, **options)
