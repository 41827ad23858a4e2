"""Stop with a savepoint on clusters of real agent processes (`run(..., executors=N, stop=StopHandle())`).

The coordinator runs in this process, so a test asks its `StopHandle` at a chosen moment of the
protocol (after the k-th checkpoint's manifest, or before the run starts, or once every executor
drained); agents exchange over rings of 4 and 8 slots (every ring wraps many times):

- the run stops with savepoint n (kind "savepoint", taken in the middle of the stream) and returns
  it; the first operator of all executors together saw exactly the records the savepoint's
  source positions cover, none beyond (the cut); resuming from "latest", on as many executors or (SSB) on another number, continues there:
  the committed output of both runs together equals one uninterrupted run's (2 executors over
  shm, 3 over tcp; SSB and UpPar);
- a stop asked before the run starts stops it at its first barrier; one asked once every executor
  drained changes nothing (the final checkpoint covers the end, the run finishes);
- a savepoint that aborts lets the job go on: the sources feed on, the run finishes with all its
  output and reports no savepoint;
- `stop=` that is not a StopHandle, or without a checkpoint directory, is refused in one sentence.

Agents are reaped by the coordinator on every path (a failed assertion happens after a run
returned; a run that raises reaps before raising).
"""

import numpy as np
import pytest
import trio

import slashrt
from slashrt import Dataflow, StopHandle, Tumbling
from slashrt.bench import chaos
from slashrt.bench.chaos import ChaosCollect
from slashrt.cluster import run_cluster_async
from slashrt.errors import OptionError
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot import cluster as cluster_snapshots
from slashrt.snapshot import storage
from slashrt.snapshot.restart import FixedDelay

from tests.snapshot import _cluster_child
from tests.snapshot._paced import Paced

N = _cluster_child.N
RINGS = {"slots": 8, "slot_size": 1024, "partitions": 16, "exchange_slots": 4}


def window_flow(out: Collect, late: Collect, pace: Paced = Paced()) -> Dataflow:
    job = Dataflow("cluster-stop")
    source = job.source("r", _cluster_child.SCHEMA, time="t", max_delay=20).filter(pace, name="paced")
    source.window(Tumbling(ms=100), late=late).sum("v", key="k", output="total").sink(out, name="out")
    return job


def run(directory, executors: int, transport: str = "shm", mode: str = "slash", pace=Paced(), sink=Collect, **options):
    """The job on a cluster, its sinks transactional Collects (`sink`): (result, committed rows per sink)."""
    out, late = sink(transactional=True), sink(transactional=True)

    async def main():
        with trio.fail_after(90):  # a hang fails the test, and the coordinator reaps its agents
            return await run_cluster_async(
                window_flow(out, late, pace), {"r": _cluster_child.records()}, executors=executors,
                transport=transport, mode=mode, checkpoint_dir=directory, **RINGS, **options,
            )

    result = trio.run(main)
    return result, {"out": out.records, "late": late.records}


def rows(*outputs) -> dict:
    return {name: np.sort(np.concatenate([o[name] for o in outputs])) for name in outputs[0]}


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference() -> dict:
    """One uninterrupted run (on one executor: a cluster's output is the same)."""
    out, late = Collect(), Collect()
    slashrt.run(window_flow(out, late), {"r": _cluster_child.records()})
    assert len(late.records) > 1000  # late records are part of the test
    return rows({"out": out.records, "late": late.records})


def stop_after_manifest(monkeypatch, stop: StopHandle, k: int, saved=None, when=None) -> None:
    """Ask `stop` once the coordinator wrote its k-th manifest (the checkpoint is complete), and
    with `when` (a function of nothing) at the first manifest from then on for which it holds.
    With `saved` (a directory), the savepoint's manifest leaves the file `savepoint` there: a
    `Paced(until=(saved, 1))` slows the stream until the stop happened, so a loaded run cannot feed
    its whole input before the savepoint's barriers."""
    complete, written = storage.SnapshotStore.acomplete, [0]

    async def acomplete(self, n, meta=None, *args, **kwargs):
        result = await complete(self, n, meta, *args, **kwargs)
        written[0] += 1
        if written[0] >= k and not stop.requested and (when is None or when()):
            stop.request()
        if saved is not None and (meta or {}).get("kind") == "savepoint":
            (saved / "savepoint").touch()
        return result

    monkeypatch.setattr(storage.SnapshotStore, "acomplete", acomplete)


def savepoint_fed(directory, n: int, executors: int) -> int:
    saved = SnapshotStore(directory, job="cluster-stop").load(n)
    assert saved.meta["kind"] == "savepoint" and saved.meta["executors"] == executors
    return sum(p["fed"] for p in saved.meta["sources"]["cluster-stop.r"].values())


CASES = [  # resumed on as many executors, or (SSB: partitions reassigned) on another number
    pytest.param(2, "shm", "slash", 1, (3, "tcp"), id="2-shm-slash-resumed-on-3-tcp"),
    pytest.param(3, "tcp", "uppar", 1, (3, "tcp"), id="3-tcp-uppar-resumed-on-3-tcp"),
]
SLOW = dict(after=8_000, seconds=0.004)  # the stopped runs' tail: up to ~1,000 batches of 4 ms each, until the savepoint


@pytest.mark.parametrize("executors, transport, mode, k, resume_on", CASES)
def test_a_cluster_stopped_with_a_savepoint_resumes_exactly_where_it_stopped(
    tmp_path, monkeypatch, reference, executors, transport, mode, k, resume_on
):
    stop, tally, saved = StopHandle(), tmp_path / "tally", tmp_path / "saved"
    tally.mkdir(), saved.mkdir()
    stop_after_manifest(monkeypatch, stop, k, saved)
    stopped, first = run(tmp_path, executors, transport, mode, pace=Paced(**SLOW, tally=tally, until=(saved, 1)),
                         checkpoint=0.005, stop=stop)
    ended = {c["checkpoint"]: c for c in stopped.checkpoints}
    assert stopped.savepoint is not None and ended[stopped.savepoint]["status"] == "completed"
    assert max(ended) == stopped.savepoint  # no checkpoint after it, no final one
    fed = savepoint_fed(tmp_path, stopped.savepoint, executors)
    assert 0 < fed < N  # stopped in the middle of the stream
    # the cut: the first operator of every executor saw exactly what the sources had fed before
    # the savepoint's barriers, not one record beyond
    assert sum(int(f.read_text()) for f in tally.iterdir()) == fed
    monkeypatch.undo()
    resumed, second = run(tmp_path, resume_on[0], resume_on[1], mode, checkpoint=0.005, resume_from="latest")
    assert resumed.resumed_from == stopped.savepoint and resumed.savepoint is None
    assert equal(rows(first, second), reference)


def test_a_stop_asked_before_the_cluster_starts_stops_it_at_its_first_barrier(tmp_path, reference):
    stop = StopHandle()
    stop.request()
    out, late = Collect(transactional=True), Collect(transactional=True)
    stopped = slashrt.run(window_flow(out, late), {"r": _cluster_child.records()}, executors=2,
                          checkpoint_dir=tmp_path, stop=stop, slots=8, slot_size=1024, partitions=16)
    assert stopped.savepoint == 1 and [c["checkpoint"] for c in stopped.checkpoints] == [1]
    assert savepoint_fed(tmp_path, 1, 2) < N
    resumed, second = run(tmp_path, 2, "shm", resume_from="latest")
    assert resumed.resumed_from == 1
    assert equal(rows({"out": out.records, "late": late.records}, second), reference)


def test_a_stop_asked_once_every_executor_drained_changes_nothing(tmp_path, monkeypatch, reference):
    stop = StopHandle()
    final = cluster_snapshots.ClusterCheckpoints.final

    async def asked_first(self, agents):
        stop.request()  # every executor drained: the final checkpoint covers the end
        await trio.sleep(0.05)
        return await final(self, agents)

    monkeypatch.setattr(cluster_snapshots.ClusterCheckpoints, "final", asked_first)
    result, out = run(tmp_path, 2, checkpoint=0.005, stop=stop)
    assert result.savepoint is None and result.checkpoints[-1]["status"] == "completed"
    store = SnapshotStore(tmp_path, job="cluster-stop")
    assert store.load(store.checkpoints()[-1]).meta["kind"] == "final"
    assert equal(rows(out), reference)


def test_a_failed_savepoint_lets_the_cluster_go_on(tmp_path, monkeypatch, reference):
    stop = StopHandle()
    stop_after_manifest(monkeypatch, stop, 2)
    on_ack = cluster_snapshots.ClusterCheckpoints._on_ack

    declined = tmp_path / "declined"
    declined.mkdir()

    async def decline_the_savepoint(self, executor, payload):
        if self._kinds.get(payload[0]) == "savepoint":
            (declined / "savepoint").touch()
            return await self._on_decline(executor, (payload[0], "forced by the test"))
        return await on_ack(self, executor, payload)

    monkeypatch.setattr(cluster_snapshots.ClusterCheckpoints, "_on_ack", decline_the_savepoint)
    # slowed until the savepoint was declined (it fails in the middle of the stream), then at full
    # speed (slowed 100 batches only, with 50 ms fsyncs the stream ended before the savepoint)
    result, out = run(tmp_path, 2, pace=Paced(after=8_000, seconds=0.004, until=(declined, 1)), checkpoint=0.005,
                      stop=stop)
    assert result.savepoint is None
    ended = {c["checkpoint"]: c for c in result.checkpoints}
    (failed,) = [n for n, c in ended.items() if c["savepoint"] and c["status"] == "aborted"]
    assert "forced by the test" in ended[failed]["reason"]
    assert ended[max(ended)]["status"] == "completed" and max(ended) > failed  # the final one, at least
    assert equal(rows(out), reference)


class StopWhenRecovering(FixedDelay):
    """Restarts at once; asks `stop` at the first failure (the kill came before the stop)."""

    def __init__(self, stop: StopHandle):
        super().__init__(attempts=2, delay=0)
        self.stop = stop

    def on_failure(self, now: float):
        self.stop.request()
        return super().on_failure(now)


def test_a_stop_asked_while_a_killed_cluster_recovers_stops_the_recovered_run_at_its_first_barrier(
    tmp_path, monkeypatch, reference
):
    """An agent SIGKILLed between pre-commit and commit of the second checkpoint; the stop is asked
    as the restart strategy decides to recover: the recovered run restores the last complete
    checkpoint and stops at its first barrier; resuming that savepoint is exactly once."""
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv(chaos.KILLS_ENV, "pre_commit:2")
    monkeypatch.setenv(chaos.MARKS_ENV, str(tmp_path / "marks"))
    stop = StopHandle()
    stopped, first = run(tmp_path, 2, pace=Paced(**SLOW), sink=ChaosCollect, checkpoint=0.005, stop=stop,
                         restart=StopWhenRecovering(stop))
    (recovery,) = stopped.recoveries
    assert "killed by signal 9 (SIGKILL)" in recovery["cause"] and stopped.resumed_from == recovery["checkpoint"]
    assert stopped.savepoint is not None and [c["checkpoint"] for c in stopped.checkpoints] == [stopped.savepoint]
    assert savepoint_fed(tmp_path, stopped.savepoint, 2) < N
    monkeypatch.delenv(chaos.KILLS_ENV)
    resumed, second = run(tmp_path, 2, "shm", resume_from="latest")
    assert resumed.resumed_from == stopped.savepoint and resumed.savepoint is None
    assert equal(rows(first, second), reference)


def test_stop_on_a_cluster_needs_a_checkpoint_directory_and_a_handle(tmp_path):
    flow = window_flow(Collect(), Collect())
    data = {"r": _cluster_child.records()[:1000]}
    with pytest.raises(OptionError, match="stop= need checkpoint_dir"):
        slashrt.run(flow, data, executors=2, stop=StopHandle())
    with pytest.raises(OptionError, match="stop= takes a slashrt.StopHandle, got Event"):
        slashrt.run(flow, data, executors=2, checkpoint_dir=tmp_path, stop=trio.Event())
