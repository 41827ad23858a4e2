"""Stop with a savepoint of graph flows on clusters (`AgentCheckpointing`), in real agent
processes over rings of four 256-byte slots that every channel wraps many times.

- the acyclic graph flow of tests/snapshot/_graph_flow.py (union, exchange by key into a user
  operator with notifications, a keyed window behind a second exchange, connect().apply),
  stopped after its k-th complete checkpoint (2 executors over shm, 3 over tcp): the savepoint
  is taken mid-job and holds what had not fired (no drain: the user operator's requested
  notifications stay in it), and resuming from "latest" on as many executors publishes, with
  what the stopped run committed, exactly one uninterrupted run's output;
- a loop that ships every round across executors (3 over tcp), stopped while its rounds
  iterate, resumed: exactly once (the savepoint holds the feedback queues' log and the
  exchanges' outboxes);
- connected components (notifications per epoch inside the loop) stopped while an epoch's rounds
  are in flight, its sources ended: after the resume, every epoch's labels equal scipy's,
  nothing published twice;
- a keyed window inside a loop (`LoopWindow`) stopped with windows open: exactly once;
- into sinks that are not transactional (plain Collects, whose every write is output at once),
  a union in front of a keyed window (1 executor, 2 over shm and tcp) and a loop that ships every
  round (1 executor, 2 over shm): the stopped run's output and the resumed run's together equal
  one uninterrupted run's, nothing twice (an executor computes nothing after the savepoint's
  snapshot: what it would fire or iterate there, the resumed run does again).

(Stop with `restart=`, a kill before the stop: tests/snapshot/test_cluster_stop.py.)
"""

import collections

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, StopHandle, Tumbling
from slashrt.bench.chaos import ChaosCsv, published
from slashrt.cluster import PerExecutor
from slashrt.ops.sinks import Collect
from slashrt.examples.cc_partitioned import MESSAGES, cc_partitioned_flow, labels_after
from slashrt.snapshot import SnapshotStore, storage
from slashrt.snapshot.alignment import BarrierAligner
from slashrt.snapshot.cluster_agent import AgentCheckpointing
from slashrt.snapshot.coordinator import CheckpointConfig
from slashrt.snapshot.runtime import SourceBarriers

from tests.cluster import test_cc_partitioned as cc
from tests.snapshot import _graph_flow
from tests.snapshot._paced import Paced, behind, paced_chunks
from tests.snapshot.test_cluster_stop import stop_after_manifest
from tests.snapshot.test_graph_cluster_checkpoints import RINGS, cc_rows, fed, outputs

CHECKPOINTS = {"interval": 0.01, "keep": 1000}
# after its first 300 records, each executor's batches take 20 ms more until the savepoint completed
# (`stop_after_manifest(..., saved)`): a loaded run cannot feed its whole input before the stop
SLOW = dict(after=300, seconds=0.02)


def slowed_until_stopped(tmp_path) -> tuple:
    """The directory the savepoint's manifest marks, and the pace that holds until it does."""
    saved = tmp_path / "saved"
    saved.mkdir()
    return saved, Paced(**SLOW, until=(saved, 1))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, collections.Counter]:
    directory = tmp_path_factory.mktemp("reference")
    slashrt.run(_graph_flow.flow(directory / "out"), _graph_flow.inputs(), checkpoint_dir=directory / "chk")
    return outputs(directory / "out")


def stopped_savepoint(result, directory, job: str):
    ended = {c["checkpoint"]: c for c in result.checkpoints}
    assert result.savepoint is not None and ended[result.savepoint]["status"] == "completed"
    assert max(ended) == result.savepoint  # no checkpoint after it, no final one
    saved = SnapshotStore(directory, job=job, keep=1000).load(result.savepoint)
    assert saved.meta["kind"] == "savepoint"
    return saved


@pytest.mark.parametrize("executors, transport, k", [(2, "shm", 2), (3, "tcp", 3)])
def test_a_graph_flow_stopped_with_a_savepoint_resumes_exactly_once(tmp_path, monkeypatch, reference, executors,
                                                                     transport, k):
    stop, (saved, pace) = StopHandle(), slowed_until_stopped(tmp_path)
    stop_after_manifest(monkeypatch, stop, k, saved)
    options = dict(executors=executors, transport=transport, checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk",
                   **RINGS)
    stopped = slashrt.run(_graph_flow.flow(tmp_path / "out", pace=pace), _graph_flow.inputs(), stop=stop, **options)
    saved = stopped_savepoint(stopped, tmp_path / "chk", "graph-ckpt")
    assert saved.meta["executors"] == executors
    assert fed(saved.meta) < 2 * _graph_flow.N  # stopped before the sources' end
    # no drain: the notifications the user operator waits for, and its rows, stay in the savepoint
    per_time = [state for (step, _), state in saved.states.items() if step == "graph-ckpt.per_time"]
    assert sum(len(s.arrays["requested"]) for s in per_time) and sum(len(s.arrays["user.held"]) for s in per_time)
    assert outputs(tmp_path / "out") != reference  # (not drained: the rest comes with the resume)
    monkeypatch.undo()
    resumed = slashrt.run(_graph_flow.flow(tmp_path / "out", pace=Paced()), _graph_flow.inputs(),
                          resume_from="latest", **options)
    assert resumed.resumed_from == stopped.savepoint and resumed.savepoint is None
    assert outputs(tmp_path / "out") == reference


def test_a_loop_stopped_while_its_rounds_iterate_resumes_exactly_once(tmp_path, monkeypatch):
    """Every round re-ships what the feedback brought back, slowly (`Paced` on the feedback edge):
    stopped after its second checkpoint while the rounds go on, the savepoint holds what was going
    round (the feedback queues' log, the exchanges' outboxes), and the resume finishes them."""
    records = 1_500  # (every round crosses executors: each 1 KB ring still wraps ~20 times)
    inputs = {"a": _graph_flow.inputs()["a"][:records]}
    slashrt.run(_graph_flow.hop_flow(tmp_path / "ref"), inputs, checkpoint_dir=tmp_path / "ref-chk")
    reference = published(tmp_path / "ref" / "hopped")
    stop = StopHandle()
    stop_after_manifest(monkeypatch, stop, 2)
    options = dict(executors=3, transport="tcp", checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk", **RINGS)
    stopped = slashrt.run(_graph_flow.hop_flow(tmp_path / "out", pace=Paced(seconds=0.004)), inputs,
                          stop=stop, **options)
    saved = stopped_savepoint(stopped, tmp_path / "chk", "hop-ckpt")
    in_flight = [step for (step, _), state in saved.states.items()
                 if len(state.arrays.get("rows", ())) or len(state.arrays.get("records", ()))]
    assert in_flight  # the rounds' records in flight: the feedback queues' log, the outboxes
    assert sum(published(tmp_path / "out" / "hopped").values()) < records
    monkeypatch.undo()
    resumed = slashrt.run(_graph_flow.hop_flow(tmp_path / "out", pace=Paced()), inputs, resume_from="latest", **options)
    assert resumed.resumed_from == stopped.savepoint
    assert published(tmp_path / "out" / "hopped") == reference


def test_connected_components_stopped_mid_epoch_resume_to_scipy_labels(tmp_path, monkeypatch):
    """The loop's rounds cross executors (proposals by node owner), with notifications per epoch:
    the stop is asked once a checkpoint caught an epoch's rounds in flight (its notifications still
    requested), while the edges still come (a savepoint asked after the sources ended:
    `test_a_savepoint_request_wakes_the_executor_to_forward_its_barriers`). After the resume every
    epoch's labels equal scipy's, and no change is published twice."""
    def in_epoch(checkpoint) -> bool:  # an epoch's rounds in flight: its notifications still requested
        return any(len(state.arrays["requested"]) for (step, _), state in checkpoint.states.items()
                   if step == "ccp.propagate")

    stop, saved = StopHandle(), tmp_path / "saved"
    saved.mkdir()
    complete = storage.SnapshotStore.acomplete

    async def acomplete(self, n, meta, *args, **kwargs):
        result = await complete(self, n, meta, *args, **kwargs)
        if (meta or {}).get("kind") == "savepoint":
            (saved / "savepoint").touch()
        elif in_epoch(self.load(n)):
            stop.request()
        return result

    def inputs(pace):  # the edges in chunks of 5, each first taking the time `pace` says
        return {"edges": PerExecutor(paced_chunks(cc.share, pace, 5), deterministic=True),
                "proposals": PerExecutor(lambda i, n: np.empty(0, MESSAGES), deterministic=True)}

    monkeypatch.setattr(storage.SnapshotStore, "acomplete", acomplete)
    options = dict(executors=2, transport="shm", checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk", **RINGS)
    # each chunk 20 ms slower until the savepoint completed: an epoch stays open while its edges come,
    # and the job cannot end before the savepoint (at full speed a run completes ~5 checkpoints;
    # with 30 ms fsyncs it ended before one)
    stopped = slashrt.run(cc_partitioned_flow(ChaosCsv(tmp_path / "out", transactional=True)),
                          inputs(Paced(seconds=0.02, until=(saved, 1))), stop=stop, **options)
    stopped_savepoint(stopped, tmp_path / "chk", "ccp")
    monkeypatch.undo()
    resumed = slashrt.run(cc_partitioned_flow(ChaosCsv(tmp_path / "out", transactional=True)), inputs(Paced()),
                          resume_from="latest", **options)
    assert resumed.resumed_from == stopped.savepoint
    assert max(published(tmp_path / "out").values()) == 1  # nothing twice
    changes = cc_rows(tmp_path / "out")
    for epoch, labels in zip(range(cc.EPOCHS), labels_after(changes, cc.NODES, range(cc.EPOCHS))):
        np.testing.assert_array_equal(labels, cc.scipy_labels(epoch), err_msg=f"after epoch {epoch}")


def test_windows_inside_a_loop_stopped_resume_exactly_once(tmp_path, monkeypatch):
    """A keyed window inside a loop (on the state backend, the default: every iteration's
    fragments cross executors), stopped after its second checkpoint with windows still open: the committed windows
    of every iteration, over both runs, equal one executor's."""
    flow, data = _graph_flow.loop_window_flow, _graph_flow.loop_window_inputs()
    slashrt.run(flow(tmp_path / "ref"), data, checkpoint_dir=tmp_path / "ref-chk")
    stop, (saved, pace) = StopHandle(), slowed_until_stopped(tmp_path)
    stop_after_manifest(monkeypatch, stop, 2, saved)
    options = dict(executors=2, transport="shm", checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk", **RINGS)
    stopped = slashrt.run(flow(tmp_path / "out", pace), data, stop=stop, **options)
    saved = stopped_savepoint(stopped, tmp_path / "chk", "lw-ckpt")
    assert fed(saved.meta) < len(data["src"])
    assert sum(len(keys) for (step, _), state in saved.states.items() if step == "lw-ckpt.win"  # (the owners' or,
               for name, keys in state.arrays.items() if name.endswith("slices.keys"))  # on the SSB, fragments)
    assert published(tmp_path / "out") != published(tmp_path / "ref")  # (the rest comes with the resume)
    monkeypatch.undo()
    resumed = slashrt.run(flow(tmp_path / "out", Paced()), data, resume_from="latest", **options)
    assert resumed.resumed_from == stopped.savepoint
    reference = published(tmp_path / "ref")
    assert sum(reference.values()) > 1000 and published(tmp_path / "out") == reference


def test_a_savepoint_request_wakes_the_executor_to_forward_its_barriers():
    """An executor whose sources ended gets no barrier from them: a request must wake it to
    forward at its next turn (`between`), a savepoint's as a checkpoint's, else the savepoint
    waits for every input to end (a drain, not a stop). The agent's side alone, no processes."""

    class Tracker:
        woken = 0

        def wake(self):
            self.woken += 1

    agent = object.__new__(AgentCheckpointing)  # (only what on_message reads)
    agent._requested, agent._kinds, agent._drained, agent._due = set(), {}, False, False
    agent.config, agent.progress = CheckpointConfig(), Tracker()
    agent.sources = {"s": SourceBarriers("s")}
    agent.aligner = BarrierAligner(["s"], clock=lambda: 0.0)
    agent.on_message("savepoint", 7)
    assert agent._due and agent.progress.woken == 1
    assert 7 in agent.sources["s"]._held and agent._kinds[7] == "savepoint"  # halts after barrier 7


def plain_union_flow(out: Collect, pace: Paced) -> Dataflow:
    """A union in front of a keyed tumbling window (a graph flow), into `out`, not transactional."""
    job = Dataflow("plain-stop")
    records = behind(job.source("r", _graph_flow.SCHEMA, time="t", max_delay=20), pace)
    even = records.filter(lambda b: b["k"] % 2 == 0, name="even")
    odd = records.filter(lambda b: b["k"] % 2 == 1, name="odd")
    even.union(odd).window(Tumbling(100)).sum("v", key="k", output="total").sink(out, name="out")
    return job


def plain_records(n: int = 30_000) -> np.ndarray:
    """5 time units a record (a 1 KiB slot of 42 records spans two windows), 13 keys."""
    out = np.zeros(n, _graph_flow.SCHEMA.dtype)
    out["t"] = np.arange(n) * 5
    out["k"], out["v"] = out["t"] * 7919 % 13, out["t"] % 101 - 50
    return out


def plain_hop_flow(out: Collect, pace: Paced) -> Dataflow:
    """`_graph_flow.hop_flow` into `out`, not transactional."""
    return _graph_flow.hop_flow(None, pace, sink=out)


PLAIN = {  # flow, input, records after which (each executor) the pace slows each batch until the savepoint
    "union": (plain_union_flow, {"r": plain_records()}, dict(after=1_000, seconds=0.02)),
    "loop": (plain_hop_flow, {"a": _graph_flow.inputs()["a"][:1_500]}, dict(seconds=0.02)),
}


@pytest.mark.parametrize("case, executors, transport", [
    ("union", 1, None), ("union", 2, "shm"), ("union", 2, "tcp"), ("loop", 1, None), ("loop", 2, "shm"),
])
def test_a_graph_flow_stopped_into_a_plain_sink_emits_nothing_after_its_savepoint(tmp_path, monkeypatch, case,
                                                                                    executors, transport):
    """Before, an executor went on computing between the savepoint's snapshot and the stop: on a
    cluster windows that a peer's progress, arriving after the snapshot, closed fired (the union);
    a loop went on iterating (on one executor until barrier n came back round it, on a cluster
    computing the rows its peers' exchanges shipped after their barriers). A transactional sink
    left that output in n + 1, which a resume aborts; a plain one kept it, and the resumed run,
    from the savepoint, emitted it again."""
    flow, data, slow = PLAIN[case]
    reference = Collect()
    slashrt.run(flow(reference, Paced()), data)
    stop, saved = StopHandle(), tmp_path / "saved"
    saved.mkdir()
    stop_after_manifest(monkeypatch, stop, 2, saved)
    options = dict(checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk", slots=4, slot_size=1024)
    if executors > 1:
        options.update(executors=executors, transport=transport)
    first = Collect()
    stopped = slashrt.run(flow(first, Paced(**slow, until=(saved, 1))), data, stop=stop, **options)
    stopped_savepoint(stopped, tmp_path / "chk", flow(Collect(), Paced()).name)
    assert 0 < len(first.records) < len(reference.records)  # stopped in the middle
    monkeypatch.undo()
    second = Collect()
    resumed = slashrt.run(flow(second, Paced()), data, resume_from="latest", **options)
    assert resumed.resumed_from == stopped.savepoint
    both = np.concatenate([first.records, second.records])
    assert len(np.unique(both)) == len(both)  # nothing twice
    np.testing.assert_array_equal(np.sort(both), np.sort(reference.records))
