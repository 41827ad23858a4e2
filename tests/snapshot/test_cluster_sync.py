"""Stop-the-world checkpoints (mode "sync") on clusters, in real agent processes with rings that
wrap many times: every executor's sources halt after barrier n, every executor drains what they
fed (across exchanges and SSB epochs), snapshots and writes, the coordinator completes and commits
n, and only then ("go_on" n) the sources feed on.

- sync runs (SSB over shm on 2 executors, UpPar over tcp on 3; two exchanges chained) give the
  numpy reference, as the unchecked run does;
- no source feeds while a sync checkpoint is in progress: every batch a source fed after barrier
  n is processed only once n's manifest exists, on every executor (the same check fails in mode
  "abs"), and every checkpoint's state holds exactly what the sources fed before it;
- SIGKILL during a sync checkpoint (its write; between pre-commit and commit), then
  `restart=`: the committed output is the failure-free one;
- graph flows too (pointstamp progress, aligned exchange by exchange): the halting check on an
  exchange into a window (routed and on the state backend), the graph-flow test flow (union,
  a user operator behind an exchange, a window chained after it, connect) and a loop shipping
  every round equal one executor's, with checkpoints in the middle of the stream.
"""


import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Tumbling
from slashrt.bench.chaos import published
from slashrt.cluster import PerExecutor
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore

from tests.snapshot import _cluster_child, _graph_flow
from tests.snapshot._paced import Paced
from tests.snapshot.test_graph_cluster_checkpoints import RINGS as GRAPH_RINGS
from tests.snapshot.test_chained_checkpoints import N, SMALL, chaos_run, csv_lines, records, reference, two_stages
from tests.snapshot.test_recovery import bounded

SYNC = {"interval": 0.01, "mode": "sync", "keep": 1000}


@pytest.mark.parametrize("mode,transport,executors", [("slash", "shm", 2), ("uppar", "tcp", 3)])
def test_a_stop_the_world_cluster_run_equals_the_unchecked_run(tmp_path, mode, transport, executors):
    # two exchanges chained (stage 2 fed by stage 1's lanes): drained through both; the input is
    # ~180 of each 8 KiB ring
    out = Collect(transactional=True)
    result = bounded(two_stages("sync", out), {"r": records()}, executors=executors, mode=mode, transport=transport,
                     checkpoint=SYNC, checkpoint_dir=tmp_path, **SMALL)
    np.testing.assert_array_equal(np.sort(out.records), reference(records()))
    periodic = [c for c in result.checkpoints if c["status"] == "completed" and not c["savepoint"]]
    assert len(periodic) >= 2 and result.checkpoints[-1]["savepoint"]
    assert all(c["status"] == "completed" for c in result.checkpoints)  # none aborted: every one halted and resumed


EACH = 30_000  # records per executor


def numbered(index: int, executors: int) -> np.ndarray:
    """Executor `index`'s records: `t` is each one's place in its stream (0, 1, ...)."""
    out = np.zeros(EACH, _cluster_child.SCHEMA.dtype)
    out["t"] = np.arange(EACH)
    out["k"] = (np.arange(EACH) * 7 + index) % 1001
    out["v"] = index
    return out


class Watch:
    """A filter right behind the source (same executor): logs, per batch, the executor (`v`), the
    highest place fed, and the checkpoints complete in the store at that moment; keeps every row."""

    def __init__(self, directory: str, job: str):
        self.directory, self.job = directory, job

    def __call__(self, batch) -> np.ndarray:
        store = SnapshotStore(self.directory, job=self.job, keep=1000)
        v, t = np.asarray(batch["v"]), np.asarray(batch["t"])
        if len(t):
            with open(f"{self.directory}/watch-{int(v[0])}.log", "a") as log:
                log.write(f"{int(t.max())} {' '.join(map(str, store.checkpoints()))}\n")
        return np.ones(len(t), bool)


@pytest.mark.parametrize("mode,transport,executors,graph", [
    ("slash", "shm", 2, False), ("uppar", "tcp", 3, False), ("slash", "tcp", 3, True), ("uppar", "shm", 2, True),
])
def test_no_source_feeds_while_a_stop_the_world_checkpoint_is_in_progress(tmp_path, mode, transport, executors, graph):
    """`graph`: an exchange by another key in front of the window makes it a graph flow."""
    job = Dataflow("halt")
    watched = job.source("r", _cluster_child.SCHEMA, time="t").filter(Watch(str(tmp_path), "halt"))
    if graph:
        watched = watched.exchange(key="t")
    # one window for the whole stream, a count per key: the state is how many records went in
    watched.window(Tumbling(ms=10**9)).count(key="k").sink(Collect(transactional=True), name="out")
    bounded(job, {"r": PerExecutor(numbered, deterministic=True)}, executors=executors, mode=mode, transport=transport,
            checkpoint={**SYNC, "interval": 0.005}, checkpoint_dir=tmp_path, **SMALL)
    store = SnapshotStore(tmp_path, job="halt", keep=1000)
    logs = {e: [(int(line.split()[0]), {int(n) for n in line.split()[1:]})
                for line in (tmp_path / f"watch-{e}.log").read_text().splitlines()] for e in range(executors)}
    middle = 0
    for n in store.checkpoints():
        checkpoint = store.load(n)
        positions = {int(e): p["fed"] for e, p in checkpoint.meta["sources"]["halt.r"].items()}
        assert sorted(positions) == list(range(executors))
        # nothing fed after barrier n was processed before n was complete, on any executor
        for e, fed in positions.items():
            after = [complete for highest, complete in logs[e] if highest >= fed]
            assert all(n in complete for complete in after), (n, e, fed)
        if sum(positions.values()) == EACH * executors:  # taken at the end: the window fired
            continue
        counted = sum(int(array.sum()) for (step, _), state in checkpoint.states.items() if "window" in step
                      for name, array in state.arrays.items() if name.endswith(".counts"))
        assert counted == sum(positions.values()), (n, counted, positions)  # exactly what was fed before n
        middle += 0 < min(positions.values()) and max(positions.values()) < EACH
    assert middle >= 2  # checkpoints in the middle of every executor's stream


@pytest.mark.parametrize("mode,transport,executors,kills", [
    # during a sync checkpoint's write (every source halted), then between the next one's
    # pre-commit and commit (its snapshot taken, nothing written)
    pytest.param("slash", "shm", 2, "async:2;pre_commit:2", id="slash-shm-2-write-then-pre-commit"),
])
def test_sigkill_during_a_stop_the_world_checkpoint_then_restart_is_exactly_once(
        tmp_path, monkeypatch, mode, transport, executors, kills):
    result = chaos_run(tmp_path, monkeypatch, kills, n=N, checkpoint={"interval": 0.005, "mode": "sync", "keep": 2},
                       mode=mode, transport=transport, executors=executors)
    planned = len(kills.split(";"))
    assert len(list((tmp_path / "marks").iterdir())) == planned  # every chosen kill fired
    assert [("SIGKILL" in r["cause"]) for r in result.recoveries] == [True] * planned, result.recoveries
    assert published(tmp_path / "out") == csv_lines(N)  # nothing lost, nothing twice


@pytest.mark.parametrize("mode,transport,executors", [("uppar", "tcp", 3), ("slash", "shm", 2)])
def test_a_graph_flow_checkpointed_stop_the_world_equals_one_executor(tmp_path, mode, transport, executors):
    graph_sync = {"interval": 0.01, "mode": "sync", "keep": 1000}
    slashrt.run(_graph_flow.flow(tmp_path / "ref"), _graph_flow.inputs(), checkpoint_dir=tmp_path / "ref-chk")
    result = slashrt.run(_graph_flow.flow(tmp_path / "out", pace=Paced(seconds=0.002, batches=200)),
                         _graph_flow.inputs(), executors=executors, transport=transport, mode=mode,
                         checkpoint=graph_sync, checkpoint_dir=tmp_path / "chk", **GRAPH_RINGS)
    for sink in _graph_flow.SINKS:
        assert published(tmp_path / "out" / sink) == published(tmp_path / "ref" / sink), sink
    periodic = [c for c in result.checkpoints if c["status"] == "completed" and not c["savepoint"]]
    assert len(periodic) >= 2 and all(c["status"] == "completed" for c in result.checkpoints)
    assert not any(c["unaligned"] for c in result.checkpoints)  # the world stopped: nothing in flight


def test_a_loop_shipping_every_round_checkpointed_stop_the_world_equals_one_executor(tmp_path):
    inputs = {"a": _graph_flow.inputs()["a"]}
    slashrt.run(_graph_flow.hop_flow(tmp_path / "ref"), inputs, checkpoint_dir=tmp_path / "ref-chk")
    result = slashrt.run(_graph_flow.hop_flow(tmp_path / "out", Paced(seconds=0.002, batches=200)), inputs,
                         executors=2, transport="shm", checkpoint={"interval": 0.01, "mode": "sync", "keep": 1000},
                         checkpoint_dir=tmp_path / "chk", **GRAPH_RINGS)
    assert published(tmp_path / "out" / "hopped") == published(tmp_path / "ref" / "hopped")
    periodic = [c for c in result.checkpoints if c["status"] == "completed" and not c["savepoint"]]
    assert len(periodic) >= 2 and all(c["status"] == "completed" for c in result.checkpoints)
