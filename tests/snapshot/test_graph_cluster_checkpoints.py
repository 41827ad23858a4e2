"""Barrier snapshots of graph flows on clusters (distributed pointstamp progress,
`slashrt.snapshot.cluster_agent`), in real agent processes over shm and tcp with rings of four
256-byte slots that every channel wraps ~100 times. The flow (tests/snapshot/_graph_flow.py):
union, an exchange by key into a stateful user operator with notifications, a keyed window on
another key behind it (an exchange chained after an exchange), connect(...).apply, three
transactional CSV sinks.

- an aligned checkpointed run equals one executor's run, its checkpoints in the middle of the
  stream acked by every (step, executor), none holding channel state;
- exactly once under fire: an agent SIGKILLed at chosen points (during alignment, during the
  asynchronous write, between pre-commit and commit); automatic recovery (`restart=`)
  publishes exactly the failure-free output (the default alignment timeout, half the 10 ms
  interval, makes the checkpoints that align slower unaligned);
- loops (the ABS seed's algorithm 2 on a cluster): connected components killed while an epoch
  iterates recover to scipy's labels; a loop shipping every round across executors, killed and
  resumed with `resume_from="latest"`, is exactly once (its checkpoints hold the feedback
  queues' log and the exchanges' outboxes);
- windows inside a loop (a `LoopWindow` behind its route) recover exactly once;
- its final checkpoint resumed on another executor count has nothing left to do (rescaling
  from the middle of a run: test_graph_rescale.py).
"""

import collections

import numpy as np
import pytest

import slashrt
from slashrt.bench import chaos
from slashrt.bench.chaos import ChaosCsv, published
from slashrt.cluster import PerExecutor
from slashrt.errors import SlashError
from slashrt.snapshot import SnapshotStore

from slashrt.examples.cc_partitioned import MESSAGES, cc_partitioned_flow, labels_after

from tests.cluster import test_cc_partitioned as cc
from tests.snapshot import _graph_flow
from tests.snapshot._paced import Paced, paced_chunks, until_fired

RINGS = {"slot_size": 256, "slots": 4}
CHECKPOINTS = {"interval": 0.01, "keep": 1000}


def outputs(directory) -> dict[str, collections.Counter]:
    return {name: published(directory / name) for name in _graph_flow.SINKS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, collections.Counter]:
    """One executor's output (its final checkpoint commits it)."""
    directory = tmp_path_factory.mktemp("reference")
    slashrt.run(_graph_flow.flow(directory / "out"), _graph_flow.inputs(), checkpoint_dir=directory / "chk")
    rows = outputs(directory / "out")
    assert all(sum(r.values()) > 100 for r in rows.values())
    return rows


def fed(meta: dict) -> int:
    return sum(p["fed"] for per_executor in meta["sources"].values() for p in per_executor.values())


def mid_job(checkpoint) -> bool:
    """Taken before the job's end: input left to feed, or notifications the user operator still waits for."""
    return fed(checkpoint.meta) < 2 * _graph_flow.N or any(
        len(state.arrays["requested"]) for (step, _), state in checkpoint.states.items() if step == "graph-ckpt.per_time"
    )


def test_a_checkpointed_graph_flow_on_a_cluster_equals_one_executor(tmp_path, reference):
    executors, transport = 2, "shm"  # (3 executors over tcp: the restart test below)
    # aligned (no alignment timeout): no checkpoint holds channel state (unaligned ones:
    # test_graph_cluster_unaligned.py)
    result = slashrt.run(
        _graph_flow.flow(tmp_path / "out"), _graph_flow.inputs(), executors=executors, transport=transport,
        checkpoint={**CHECKPOINTS, "alignment_timeout": None}, checkpoint_dir=tmp_path / "chk", **RINGS,
    )
    assert outputs(tmp_path / "out") == reference
    store = SnapshotStore(tmp_path / "chk", job="graph-ckpt", keep=1000)
    steps = {step for step, _ in store.load(store.checkpoints()[-1]).states}
    assert {"graph-ckpt.per_time", "graph-ckpt.by_g"} <= steps  # the user operator's and the routed window's state
    completed = [c for c in result.checkpoints if c["status"] == "completed"]
    assert {c["acks"] for c in completed} == {executors * len(steps)}
    assert any(mid_job(store.load(n)) for n in store.checkpoints())
    assert not any(step.endswith(".channel") or store.load(n).meta.get("unaligned")
                   for n in store.checkpoints() for step, _ in store.load(n).states)
    # its final checkpoint resumed on another count (its state cut by key): nothing left to do
    final = store.checkpoints()[-1]
    again = slashrt.run(_graph_flow.flow(tmp_path / "out"), _graph_flow.inputs(), executors=3,
                        checkpoint_dir=tmp_path / "chk", resume_from="latest", **RINGS)
    assert again.resumed_from == final and again.records == 0
    assert outputs(tmp_path / "out") == reference


def chaos_env(monkeypatch, tmp_path, kills: str):
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv(chaos.KILLS_ENV, kills)
    monkeypatch.setenv(chaos.MARKS_ENV, str(tmp_path / "marks"))


@pytest.mark.parametrize(("mode", "checkpointing"), [("uppar", "abs"), ("slash", "abs"), ("slash", "sync")])
def test_sigkills_recovered_by_restart_publish_exactly_the_failure_free_output(
        tmp_path, monkeypatch, reference, mode, checkpointing):
    """mode="slash": the keyed window folds its records into fragments, shipped to their
    owners as partial states: both, and the partials on their way, are in the checkpoints.
    "sync": stop-the-world checkpoints (every source halted until n is committed)."""
    kills = "align:2;async:4;pre_commit:7"  # during alignment, during the async write, between pre-commit and commit
    chaos_env(monkeypatch, tmp_path, kills)
    # (each batch of source a takes 4 ms more until all three fired: the job cannot end before them)
    pace = until_fired(tmp_path / "marks", kills)
    result = slashrt.run(
        _graph_flow.flow(tmp_path / "out", pace=pace), _graph_flow.inputs(), executors=3, transport="tcp", mode=mode,
        checkpoint={**CHECKPOINTS, "mode": checkpointing}, checkpoint_dir=tmp_path / "chk", restart="fixed-delay:attempts=5,delay=0", **RINGS,
    )
    assert len(list((tmp_path / "marks").iterdir())) == 3 == len(result.recoveries)
    assert all("killed by signal 9 (SIGKILL)" in r["cause"] for r in result.recoveries), result.recoveries
    store = SnapshotStore(tmp_path / "chk", job="graph-ckpt", keep=1000)
    restored = [r["checkpoint"] for r in result.recoveries if r["checkpoint"] is not None]
    assert any(fed(store.load(n).meta) > 0 and mid_job(store.load(n)) for n in restored)  # resumed mid-job
    assert outputs(tmp_path / "out") == reference
    if mode == "slash":
        kinds = {state.meta["kind"] for n in restored for (step, _), state in store.load(n).states.items()
                 if step == "graph-ckpt.by_g"}
        assert kinds == {"ssb_graph_window"}


def cc_rows(directory) -> np.ndarray:
    rows = [tuple(int(x) for x in line.split(",")) for line, count in published(directory).items() for _ in range(count)]
    return np.array(rows, MESSAGES)


def test_connected_components_killed_mid_epoch_recover_to_scipy_labels(tmp_path, monkeypatch):
    """The loop's rounds cross executors (proposals by node owner): a SIGKILL while epochs
    iterate (between pre-commit and commit of the third checkpoint), recovered from a checkpoint
    holding the rounds in flight (notifications still requested); after every epoch the labels
    equal scipy's, and no change is published twice."""
    kills = "pre_commit:3"
    chaos_env(monkeypatch, tmp_path, kills)
    # (the edges in chunks of 5, each 4 ms slower until the kill fired, the last one held until it
    # fired: the job cannot end before the kill. The second checkpoint, the one restored, comes after
    # the first chunk: the first can come before any record, its barrier ahead of them)
    marks = tmp_path / "marks"
    edges = paced_chunks(cc.share, until_fired(marks, kills), 5, last_after=(marks, 1))
    inputs = {"edges": PerExecutor(edges, deterministic=True),
              "proposals": PerExecutor(lambda i, n: np.empty(0, MESSAGES), deterministic=True)}
    result = slashrt.run(
        cc_partitioned_flow(ChaosCsv(tmp_path / "out", transactional=True)), inputs, executors=2, transport="shm",
        checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk", restart="fixed-delay:attempts=5,delay=0", **RINGS,
    )
    assert len(result.recoveries) == 1 == len(list((tmp_path / "marks").iterdir()))
    store = SnapshotStore(tmp_path / "chk", job="ccp", keep=1000)
    restored = [store.load(r["checkpoint"]) for r in result.recoveries if r["checkpoint"] is not None]
    assert any(len(state.arrays["requested"]) for c in restored for (step, _), state in c.states.items()
               if step == "ccp.propagate")  # an epoch's rounds were in flight
    assert max(published(tmp_path / "out").values()) == 1  # nothing twice
    changes = cc_rows(tmp_path / "out")
    for epoch, labels in zip(range(cc.EPOCHS), labels_after(changes, cc.NODES, range(cc.EPOCHS))):
        np.testing.assert_array_equal(labels, cc.scipy_labels(epoch), err_msg=f"after epoch {epoch}")


def test_a_loop_shipping_every_round_killed_on_tcp_and_resumed_from_latest_is_exactly_once(tmp_path, monkeypatch):
    """Every round re-ships what the feedback brought back: rows shipped after an exchange's
    barrier and before the snapshot are the checkpoint's outbox, shipped again on restore. The
    killed run fails (no restart=); a new run with resume_from="latest" finishes it."""
    inputs = {"a": _graph_flow.inputs()["a"]}
    slashrt.run(_graph_flow.hop_flow(tmp_path / "ref"), inputs, checkpoint_dir=tmp_path / "ref-chk")
    reference = published(tmp_path / "ref" / "hopped")
    assert sum(reference.values()) == _graph_flow.N
    chaos_env(monkeypatch, tmp_path, "pre_commit:3")
    options = dict(executors=3, transport="tcp", checkpoint=CHECKPOINTS, checkpoint_dir=tmp_path / "chk", **RINGS)
    # (each round 4 ms slower until the kill fired: with 50 ms fsyncs the job ended before it)
    with pytest.raises(SlashError, match=r"executor \d was killed by signal 9 \(SIGKILL\)"):
        slashrt.run(_graph_flow.hop_flow(tmp_path / "out", until_fired(tmp_path / "marks", "pre_commit:3")), inputs,
                    **options)
    assert sum(published(tmp_path / "out" / "hopped").values()) < _graph_flow.N  # killed mid-job
    store = SnapshotStore(tmp_path / "chk", job="hop-ckpt", keep=1000)
    latest = store.latest()
    monkeypatch.delenv(chaos.KILLS_ENV)
    result = slashrt.run(_graph_flow.hop_flow(tmp_path / "out", Paced()), inputs, resume_from="latest", **options)
    assert result.resumed_from == latest.number
    assert published(tmp_path / "out" / "hopped") == reference
    in_flight = [
        step for n in store.checkpoints() for (step, _), state in store.load(n).states.items()
        if len(state.arrays.get("rows", ())) or len(state.arrays.get("records", ()))
    ]
    assert any(step.endswith(".outbox") for step in in_flight) and any("feedback" in step for step in in_flight)


@pytest.mark.parametrize("mode", ["uppar", "slash"])
def test_windows_inside_a_loop_on_a_cluster_recover_exactly_once(tmp_path, monkeypatch, mode):
    """A keyed window inside a loop (a `LoopWindow` behind its route: every iteration's rows
    cross executors; in mode "slash" every iteration's fragments and partial states): a SIGKILL
    between pre-commit and commit, recovered; the committed windows of every iteration equal
    one executor's."""
    flow, data = _graph_flow.loop_window_flow, _graph_flow.loop_window_inputs()
    slashrt.run(flow(tmp_path / "ref"), data, checkpoint_dir=tmp_path / "ref-chk")
    chaos_env(monkeypatch, tmp_path, "pre_commit:2")
    result = slashrt.run(flow(tmp_path / "out", until_fired(tmp_path / "marks", "pre_commit:2")), data, executors=2,
                         transport="shm", mode=mode, checkpoint=CHECKPOINTS,
                         checkpoint_dir=tmp_path / "chk", restart="fixed-delay:attempts=3,delay=0", **RINGS)
    assert len(result.recoveries) == 1 and result.recoveries[0]["checkpoint"] is not None
    reference = published(tmp_path / "ref")
    assert sum(reference.values()) > 1000 and published(tmp_path / "out") == reference
    restored = SnapshotStore(tmp_path / "chk", job=flow(tmp_path / "x").name, keep=1000).load(result.recoveries[0]["checkpoint"])
    kinds = {state.meta["kind"] for (step, _), state in restored.states.items() if state.meta.get("kind", "").endswith("loop_window")}
    assert kinds == {"ssb_loop_window" if mode == "slash" else "loop_window"}
