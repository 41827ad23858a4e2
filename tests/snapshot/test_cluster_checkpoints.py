"""Barrier snapshots on clusters of real agent processes (`slashrt.snapshot.cluster`).

- a checkpointed cluster run (SSB and UpPar, shm and tcp, rings that wrap many times) gives the
  unchecked run's results, and reports its checkpoints;
- alignment holds across executors: every checkpoint's window state holds exactly the records the
  executors' sources fed before their barriers (the partial rows and records a peer sent before
  its barrier in the owner's state, nothing sent after it), with what a checkpoint taken past its
  alignment timeout holds in flight (a partial row counting the records folded into it);
- exactly once under fire: an agent SIGKILLs itself between pre-commit and commit, or after a
  checkpoint's manifest before its commit; a new run with resume_from="latest" publishes exactly
  the failure-free output (transactional CSV: nothing lost, nothing twice);
- what a cluster cannot resume is refused in one sentence before any agent starts.
"""

from pathlib import Path

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Tumbling
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore

from tests.snapshot import _children, _cluster_child  # the kill tests' job; its input for the in-process ones
from tests.snapshot._children import run_child
from tests.snapshot._in_flight import SHIPPING_EPOCHS, in_flight
from tests.snapshot._paced import Paced

CHILD = Path(_cluster_child.__file__)
SMALL_RINGS = {"slots": 8, "slot_size": 1024, "partitions": 16}


def child(directory: Path, mode: str, transport: str, kill: str = "none", executors: int = 2):
    return run_child(CHILD, directory, mode, transport, executors, kill)


def published(directory: Path) -> dict[str, list[str]]:
    return _children.published(directory, ("out", "late"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("reference")
    done = child(directory, "slash", "shm")
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
    rows = published(directory)
    assert rows["out"] and len(rows["late"]) > 1000  # late records are part of the test
    return rows


def window_flow(out: Collect, late: Collect) -> Dataflow:
    job = Dataflow("cluster-ckpt")
    source = job.source("r", _cluster_child.SCHEMA, time="t", max_delay=20)
    source.window(Tumbling(ms=100), late=late).sum("v", key="k", output="total").sink(out, name="out")
    return job


def collected(sink: Collect) -> np.ndarray:
    return np.sort(sink.records, order=list(sink.records.dtype.names))


@pytest.mark.parametrize("mode,transport,checkpoint", [
    ("slash", "shm", 0.01),
    ("uppar", "tcp", 0.01),
    # several in flight, completing while older ones' parts are still written, and keep=1
    # removing them: retention never fails a run nor removes one being completed
    ("slash", "shm", {"interval": 0.001, "max_in_flight": 4, "keep": 1}),
])
def test_a_checkpointed_cluster_run_equals_the_unchecked_run(tmp_path, mode, transport, checkpoint):
    data = _cluster_child.records()
    plain = (Collect(), Collect())
    slashrt.run(window_flow(*plain), {"r": data})
    out, late = Collect(transactional=True), Collect(transactional=True)
    result = slashrt.run(
        window_flow(out, late), {"r": data}, executors=2, mode=mode, transport=transport,
        checkpoint=checkpoint, checkpoint_dir=tmp_path, **SMALL_RINGS,
    )
    assert np.array_equal(collected(out), collected(plain[0]))
    assert np.array_equal(collected(late), collected(plain[1]))
    statuses = [c["status"] for c in result.checkpoints]
    assert len(statuses) >= 2 and statuses[-1] == "completed" and result.checkpoints[-1]["savepoint"]
    # every stateful step of both executors acked every completed checkpoint
    assert {c["acks"] for c in result.checkpoints if c["status"] == "completed"} == {2 * len(store_steps(tmp_path))}
    store = SnapshotStore(tmp_path, job="cluster-ckpt")
    assert store.load(store.checkpoints()[-1]).meta["executors"] == 2


def store_steps(directory: Path) -> set[str]:
    store = SnapshotStore(directory, job="cluster-ckpt")
    return {step for step, _ in store.load(store.checkpoints()[-1]).states}


@pytest.mark.parametrize("mode", ["slash", "uppar"])
def test_every_cluster_checkpoint_holds_exactly_what_the_sources_fed_before_their_barriers(tmp_path, mode):
    # one window for the whole stream, a count per key: the state is how many records went in
    data = np.tile(_cluster_child.records(), 4)  # long enough for several checkpoints in the middle
    data["t"] = np.arange(len(data)) // 10
    job = Dataflow("align")
    # each batch 4 ms slower until 4 checkpoints completed: the stream cannot end before (a run
    # at full speed completes ~12, with 50 ms fsyncs 2)
    pace = Paced(seconds=0.004, until=(tmp_path / "align" / "chk-*" / "_manifest.json", 4))
    job.source("r", _cluster_child.SCHEMA, time="t").filter(pace, name="paced").window(Tumbling(ms=10**9)).count(
        key="k").sink(Collect(transactional=True), name="out")
    slashrt.run(
        job, {"r": data}, executors=2, mode=mode, checkpoint={"interval": 0.005, "keep": 1000},
        checkpoint_dir=tmp_path, **(SHIPPING_EPOCHS if mode == "slash" else {}), **SMALL_RINGS,
    )
    store = SnapshotStore(tmp_path, job="align", keep=1000)
    checked = 0
    for n in store.checkpoints():
        checkpoint = store.load(n)
        fed = sum(p["fed"] for p in checkpoint.meta["sources"]["align.r"].values())
        if fed == len(data):  # taken after the end: the window fired, nothing is left in it
            continue
        counted = sum(
            int(array.sum()) for (step, _), state in checkpoint.states.items() if step.endswith("window_1")
            for name, array in state.arrays.items() if name.endswith(".counts")
        )
        # past the alignment timeout (half the interval) what was in flight is the checkpoint's
        # channel state (test_cluster_unaligned.py): records in the sources' rings, and the
        # partial rows on their way between executors, each standing for its count (an epoch
        # folds its records: a key repeated in it is one row of count 2 or more)
        flying = in_flight(checkpoint) + in_flight(checkpoint, sources=False)
        assert counted + flying == fed, (n, counted, in_flight(checkpoint), in_flight(checkpoint, False), fed)
        checked += fed > 0
    assert checked >= 2  # checkpoints in the middle of the stream, not only at its ends


# SIGKILL one agent at a chosen point (the k-th time its sinks pass it), resume from the directory
KILLS = [
    pytest.param("slash", "shm", "pre_commit:3:1", id="slash-shm-between-pre-commit-and-commit"),
    pytest.param("uppar", "tcp", "commit:2:0", id="uppar-tcp-after-manifest-before-commit"),
    pytest.param("slash", "tcp", "commit:5:1", id="slash-tcp-after-checkpoint-2-committed"),
    pytest.param("uppar", "shm", "pre_commit:6:0", id="uppar-shm-between-pre-commit-and-commit"),
]


@pytest.mark.parametrize("mode,transport,kill", KILLS)
def test_cluster_output_is_exactly_once_after_sigkill_and_resume(tmp_path, reference, mode, transport, kill):
    crashed = child(tmp_path, mode, transport, kill)
    assert crashed.returncode == 3 and "SIGKILL" in crashed.stdout, (crashed.stdout, crashed.stderr[-2000:])
    resumed = child(tmp_path, mode, transport)
    assert resumed.returncode == 0 and "done" in resumed.stdout, resumed.stderr[-2000:]
    assert published(tmp_path) == reference


# (the executor killed between pre-commit and commit: its pending output goes to its successor, or
# is settled where it has none; more counts and paths: test_rescale.py)
@pytest.mark.parametrize("mode,before,after,kill", [
    ("slash", 2, 3, "pre_commit:4:1"), ("slash", 3, 2, "pre_commit:4:1"), ("uppar", 2, "local", "pre_commit:4:1"),
])
def test_resuming_on_another_number_of_executors_gives_the_failure_free_output(
    tmp_path, reference, mode, before, after, kill
):
    crashed = child(tmp_path, mode, "shm", kill, executors=before)
    assert crashed.returncode == 3 and "SIGKILL" in crashed.stdout, (crashed.stdout, crashed.stderr[-2000:])
    store = SnapshotStore(tmp_path / "chk", job="cluster-chaos")
    latest = store.latest()
    assert latest.meta["executors"] == before
    fed = sum(p["fed"] for p in latest.meta["sources"]["cluster-chaos.r"].values())
    assert 0 < fed < _cluster_child.N  # resumed from the middle of the stream
    resumed = child(tmp_path, mode, "tcp", executors=after)
    assert resumed.returncode == 0 and "done" in resumed.stdout, resumed.stderr[-2000:]
    assert published(tmp_path) == reference
    assert store.load(store.checkpoints()[-1]).meta["executors"] == (1 if after == "local" else after)
