"""Unaligned checkpoints on one executor (`slashrt.snapshot.channel_state`, `Checkpointing._take_unaligned`).

- a checkpoint past its alignment timeout is taken at once: every checkpoint's state plus its
  in-flight records (the channel state) is exactly what each source had fed at its position,
  while a slow step keeps the rings full; resuming from one replays the in-flight records
  first: the output is exactly once;
- killed (SIGKILL, a real child process) while every checkpoint is unaligned, at chosen
  points, the resumed job publishes exactly the failure-free output;
- loops on one executor: a checkpoint taken unaligned holds the batches queued on the back edges
  as its log (and the sources' in-flight records): killed mid-iterations, exactly once;
- the aligner lets a checkpoint overtake its barriers (`BarrierAligner.overtake`);
- the executor shortens the runs of buffers it hands a slow pipeline, so the loop's other tasks
  (the checkpoints' triggers and writes) run between two calls;
- the option is checked.
"""

import signal
import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt.errors import OptionError, SlashError
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.alignment import BarrierAligner, Snapshot
from slashrt.snapshot.channel_state import CHANNEL_KIND
from slashrt.snapshot.coordinator import CheckpointConfig

from tests.snapshot import test_checkpoint_loops as loops
from tests.snapshot.test_checkpoint_loops import references  # noqa: F401 (a fixture)
from tests.snapshot.test_checkpoint_run import child, published, reference  # noqa: F401 (a fixture)

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
SMALL = {"slots": 8, "slot_size": 2048}


def records(n: int, key: int) -> np.ndarray:
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 10_000 // n
    out["k"] = key
    out["v"] = 1
    return out


def slow(batch):  # the slow step after source a: its ring stays full
    time.sleep(0.0005)
    return np.ones(len(batch), bool)


class Slow:
    """A slow step of `seconds` a call, or (`per_buffer`) a buffer of SMALL's rings."""

    def __init__(self, seconds: float, per_buffer: bool = False):
        self.seconds, self.per_buffer = seconds, per_buffer

    def __call__(self, batch):
        buffers = -(-len(batch) // ((SMALL["slot_size"] - 32) // SCHEMA.record_size)) if self.per_buffer else 1
        time.sleep(self.seconds * buffers)
        return np.ones(len(batch), bool)


def counting(name: str, step=slow):
    """Sources a (behind the slow step) and b, one window over the whole stream counting per
    source: its state is how many records of each went in."""
    flow = Dataflow(name)
    a, b = flow.source("a", SCHEMA, time="t"), flow.source("b", SCHEMA, time="t")
    out = sinks.Collect(transactional=True)
    a.filter(step, name="slow").union(b).window(Tumbling(ms=10**9)).count(key="k").sink(out, name="out")
    return flow, out


def in_flight(checkpoint) -> dict[str, int]:
    """Records of each source the checkpoint holds as channel state."""
    return {state.meta["source"].split(".")[1]: len(state.arrays["records"])
            for state in checkpoint.states.values() if state.meta.get("kind") == CHANNEL_KIND}


# 0: taken at once (barriers not sent yet: the positions are the feeders' now); 2 ms behind a
# step of 1 ms a buffer (8 in a's ring): b delivered its barrier and waits (nothing of b in
# flight), a's is in its ring (in flight: what is in front of it), and comes later, stale
@pytest.mark.parametrize("timeout, step", [(0, Slow(0.0005)), (0.002, Slow(0.001, per_buffer=True))],
                         ids=["at-once", "after-2ms"])
def test_an_unaligned_checkpoint_holds_what_was_in_flight_and_a_resume_replays_it(tmp_path, timeout, step):
    inputs = {"a": records(30_000, 0), "b": records(60_000, 1)}
    flow, out = counting("ua", step)
    # runs of 2 buffers a call: the ring holds more than one call takes (as the default rings do)
    slashrt.run(flow, inputs, checkpoint={"interval": 0.01, "alignment_timeout": timeout, "keep": 1000},
                checkpoint_dir=tmp_path, coalesce=2, **SMALL)
    assert sorted(out.records["count"].tolist()) == [30_000, 60_000]
    store = SnapshotStore(tmp_path, job="ua", keep=1000)
    middle = []
    for n in store.checkpoints():
        checkpoint = store.load(n)
        fed = {step.split(".")[1]: position["0"]["fed"] for step, position in checkpoint.meta["sources"].items()}
        if fed == {"a": 30_000, "b": 60_000} and not in_flight(checkpoint):
            continue  # every record computed: the end may have fired the window
        (window,) = [s for s in checkpoint.states.values() if "slices.keys" in s.arrays]
        counted = np.bincount(window.arrays["slices.keys"], window.arrays["slices.counts"], minlength=2)
        flying = in_flight(checkpoint)
        # consumed + in flight = fed, for each source: nothing lost, nothing twice
        assert [counted[0] + flying.get("a", 0), counted[1] + flying.get("b", 0)] == [fed["a"], fed["b"]], n
        assert checkpoint.meta.get("unaligned") or not flying  # (aligned in time: nothing in flight)
        if sum(flying.values()) and (fed["a"] < 30_000 or fed["b"] < 60_000):
            middle.append(n)
    assert middle, store.checkpoints()  # taken while records were in flight
    flow, out = counting("ua", step)
    slashrt.run(flow, inputs, checkpoint={"keep": 1000}, checkpoint_dir=tmp_path, resume_from=middle[0], coalesce=2,
                **SMALL)
    assert sorted(out.records["count"].tolist()) == [30_000, 60_000]  # the in-flight records replayed, once


def test_a_resume_replays_the_in_flight_records_in_order_before_the_rest(tmp_path):
    data = records(30_000, 0)
    data["v"] = np.arange(len(data))

    def stateless(name):
        flow = Dataflow(name)
        out = sinks.Collect()
        flow.source("a", SCHEMA, time="t").filter(slow, name="slow").sink(out, name="out")
        return flow, out

    flow, _ = stateless("uas")
    slashrt.run(flow, {"a": data}, checkpoint={"interval": 0.01, "alignment_timeout": 0, "keep": 1000},
                checkpoint_dir=tmp_path, coalesce=2, **SMALL)
    store = SnapshotStore(tmp_path, job="uas", keep=1000)
    flying = [n for n in store.checkpoints() if in_flight(store.load(n)).get("a")]
    assert flying, store.checkpoints()
    checkpoint = store.load(flying[0])
    fed = checkpoint.meta["sources"]["uas.a"]["0"]["fed"]
    # `slashrt checkpoints DIR` says how many records it holds in flight
    from slashrt.snapshot import listing

    (listed,) = [c for c in listing.describe(str(tmp_path))["jobs"][0]["checkpoints"] if c["checkpoint"] == flying[0]]
    assert listed["in_flight"] == in_flight(checkpoint)["a"] > 0
    assert f"({listed['in_flight']:,} in flight)" in listing.render(listing.describe(str(tmp_path)))
    flow, out = stateless("uas")
    slashrt.run(flow, {"a": data}, checkpoint={"keep": 1000}, checkpoint_dir=tmp_path, resume_from=flying[0], coalesce=2,
                **SMALL)
    # the records in flight first, then the rest: everything after what was computed, once
    assert out.records["v"].tolist() == list(range(fed - in_flight(checkpoint)["a"], len(data)))


def slow_tree(name: str):
    """One source behind the slow step into one window over the whole stream counting per key
    (a tree flow: it rescales)."""
    flow = Dataflow(name)
    out = sinks.Collect(transactional=True)
    flow.source("a", SCHEMA, time="t").filter(slow, name="slow").window(Tumbling(ms=10**9)).count(key="k").sink(
        out, name="out")
    return flow, out


def test_a_checkpoint_with_array_records_in_flight_rescales_them_once(tmp_path):
    data = records(40_000, 0)
    data["k"] = np.arange(len(data)) % 4
    flow, _ = slow_tree("uar")
    slashrt.run(flow, {"a": data}, checkpoint={"interval": 0.01, "alignment_timeout": 0, "keep": 1000},
                checkpoint_dir=tmp_path / "chk", coalesce=2, **SMALL)
    store = SnapshotStore(tmp_path / "chk", job="uar", keep=1000)
    flying = [n for n in store.checkpoints() if in_flight(store.load(n)).get("a")]
    assert flying
    flow, out = slow_tree("uar")
    slashrt.run(flow, {"a": data}, executors=2, checkpoint={"keep": 1000}, checkpoint_dir=tmp_path / "chk",
                resume_from=flying[0], partitions=16, **SMALL)
    # the window's count per key: what the state held plus the rest of the array, shared out
    # anew from the first record in flight (not from the position: that would lose them)
    assert sorted(out.records["count"].tolist()) == [10_000] * 4


def test_a_checkpoint_with_records_in_flight_from_files_is_not_rescaled(tmp_path):
    from slashrt.connectors import FileSource

    data = records(40_000, 0)
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "part-0.npy", data)
    flow, _ = slow_tree("uaf")
    slashrt.run(flow, {"a": FileSource(tmp_path / "in", batch_records=2000)},
                checkpoint={"interval": 0.01, "alignment_timeout": 0, "keep": 1000}, checkpoint_dir=tmp_path / "chk",
                coalesce=2, **SMALL)
    store = SnapshotStore(tmp_path / "chk", job="uaf", keep=1000)
    flying = [n for n in store.checkpoints() if in_flight(store.load(n)).get("a")]
    assert flying
    flow, _ = slow_tree("uaf")
    with pytest.raises(SlashError, match=rf"checkpoint {flying[0]} was taken on 1 executor\(s\) and cannot resume on 2: "
                                         r"it was taken unaligned, with records of source 'uaf\.a' in flight, which are "
                                         r"shared out anew only for in-memory arrays; resume it with executors=1"):
        slashrt.run(flow, {"a": FileSource(tmp_path / "in", batch_records=2000)}, executors=2,
                    checkpoint={"keep": 1000}, checkpoint_dir=tmp_path / "chk", resume_from=flying[0], partitions=16,
                    **SMALL)


@pytest.mark.parametrize("kills", [["write_part:20"], ["pre_commit:6", "write_part:12"]],
                         ids=["during-async-write", "twice-in-a-row"])
def test_killed_during_unaligned_checkpoints_the_output_is_exactly_once(tmp_path, reference, kills, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SLASHRT_TEST_ALIGNMENT_TIMEOUT", "0")  # every periodic checkpoint unaligned
    flying = 0
    # the last kill again (twice at most) until a checkpoint held records in flight: the first,
    # 5 ms in, may come before a starved feeder fed anything, and leave the replay untested
    for attempt, kill in enumerate([*kills, kills[-1], kills[-1]]):
        if attempt >= len(kills) and flying:
            break
        crashed = child(tmp_path, kill)
        assert crashed.returncode == -signal.SIGKILL, (kill, crashed.returncode, crashed.stderr[-2000:])
        latest = SnapshotStore(tmp_path / "chk", job="chaos").latest()
        if latest is not None:  # (one that aligned before the timeout's turn holds none)
            flying += sum(in_flight(latest).values())
    resumed = child(tmp_path, "none")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert published(tmp_path) == reference
    assert flying > 0  # the resume replayed records that were in flight


# (killed while the sources still feed: a checkpoint triggered after they ended is taken at
# once anyway, `LoopHead.trigger`)
# (a barrier may still align before the timeout's turn: the kills land in unaligned checkpoints
# in most runs, the output must be exact in every one)
@pytest.mark.parametrize("name, kills", [("cc", ["queued:20"]), ("circulate", ["queued:300"])])
def test_killed_in_a_loop_during_unaligned_checkpoints_the_output_is_exactly_once(
        tmp_path, references, name, kills, monkeypatch):  # noqa: F811
    expected = references(name)  # (a failure-free run, aligned)
    monkeypatch.setenv("SLASHRT_TEST_ALIGNMENT_TIMEOUT", "0")
    for kill in kills:
        crashed = loops.child(tmp_path, name, kill)
        assert crashed.returncode == -signal.SIGKILL, (kill, crashed.returncode, crashed.stderr[-2000:])
        latest = SnapshotStore(tmp_path / "chk", job=name).latest()
        assert latest is not None
    resumed = loops.child(tmp_path, name)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert loops.published(tmp_path) == expected


def test_a_checkpoint_overtakes_its_barriers():
    aligner = BarrierAligner(["a", "b"], clock=lambda: 1.0)
    assert aligner.barrier("a", 3) == [] and aligner.channels.blocked == {"a"}
    stats = aligner.overtake(3, 2.0)
    assert (stats.started, stats.ended) == (1.0, 2.0) and aligner.channels.blocked == set()
    assert aligner.barrier("b", 3) == [] and aligner.stale == 1  # its barrier, later: stale
    aligner.overtake(4, 3.0)  # before any barrier 4: both inputs may deliver it later
    assert aligner.barrier("a", 4) == [] and aligner.barrier("b", 4) == []
    assert [type(o) for o in aligner.barrier("a", 5) + aligner.barrier("b", 5)] == [Snapshot]


def test_a_slow_pipeline_gets_shorter_runs():
    sizes = []

    def slow_call(batch):
        sizes.append(len(batch))
        time.sleep(0.02)
        return np.ones(len(batch), bool)

    flow = Dataflow("runs")
    out = sinks.Collect()
    flow.source("a", SCHEMA, time="t").filter(slow_call).sink(out)
    per_buffer = (2048 - 32) // SCHEMA.record_size
    slashrt.run(flow, {"a": records(per_buffer * 200, 0)}, slots=64, slot_size=2048, coalesce=32)
    assert len(out.records) == per_buffer * 200
    assert max(sizes) > per_buffer  # runs of buffers at first
    assert sizes[-20:] == [per_buffer] * 20, sizes  # then one buffer a call (20 ms each > the slice)


@pytest.mark.parametrize("value, after", [("auto", 0.25), (None, None), (0, 0.0), ("100ms", 0.1)])
def test_the_alignment_timeout_option(value, after):
    assert CheckpointConfig.from_options(interval=0.5, alignment_timeout=value).unaligned_after == after
    assert CheckpointConfig.from_options(interval=0.5, mode="sync").unaligned_after is None
    with pytest.raises(OptionError, match="alignment_timeout must be a duration >= 0"):
        CheckpointConfig.from_options(interval=0.5, alignment_timeout=-1)


def test_bench_checkpoint_slow_step_reports_the_cadence(capsys):
    import json

    from slashrt.cli import main

    args = ["bench", "checkpoint", "--slow-step-ms", "2", "--events", "150000", "--interval", "0.05",
            "--alignment-timeout", "0", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["alignment_timeout"] == 0
    assert result["checkpoints_completed"] >= result["unaligned"] >= 1
    assert result["cadence_ratio"] == round(result["checkpoints_completed"] / result["checkpoints_expected"], 3)
    assert result["duration_p99_s"] >= result["duration_p50_s"] > 0
