"""Unaligned checkpoints on clusters of real agent processes (`AgentCheckpointing._overtake_sources`).

- past its alignment timeout (0: at once), an executor's checkpoint overtakes what its sources'
  rings hold, and what is in flight between executors (on the peers' channels, in the
  exchanges' ship queues; in mode slash partial rows, with epochs short enough to ship while
  the stream goes on): every checkpoint's window state plus the records in flight (channel
  state) is exactly what the sources fed at their positions, on both executors, while a slow
  step keeps the rings full; a resume from one replays them once: the output is exact;
- exactly once under fire: agents SIGKILLed at chosen points while every periodic checkpoint is
  unaligned (the kill test's job of test_cluster_checkpoints.py, SSB over shm and UpPar over tcp);
- the cadence: with a slow step after the source, more checkpoints complete while the sources
  still feed than aligned barriers could (each waits behind a full ring), counted, not timed;
- a resume on the same executor count replays each executor's channel state (no rescaling); on
  another count (arrays) each old executor's share starts again at its first record in flight;
- `slashrt bench checkpoint --slow-step-ms --executors 2` reports the cadence over the stream;
- the aligner counts overtaken inputs as delivered and their later barriers as stale;
- a slow step after an exchange (the peers' channels and the ship queues overtaken), loops, and
  an exchange's queue overtaken barrier by barrier: test_graph_cluster_unaligned.py.
"""

import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Tumbling
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.alignment import BarrierAligner, Snapshot

from tests.snapshot import _cluster_child
from tests.snapshot._in_flight import SHIPPING_EPOCHS, in_flight
from tests.snapshot._paced import Paced
from tests.snapshot.test_cluster_checkpoints import child, published, reference  # noqa: F401 (a fixture)

SMALL_RINGS = {"slots": 8, "slot_size": 1024, "partitions": 16}


def counting(pace) -> tuple[Dataflow, Collect]:
    """One window over the whole stream counting per key, behind a slow step: its state is how
    many records went in."""
    job = Dataflow("ucount")
    out = Collect(transactional=True)
    job.source("r", _cluster_child.SCHEMA, time="t").filter(pace, name="slow").window(Tumbling(ms=10**9)).count(
        key="k").sink(out, name="out")
    return job, out


def stream() -> np.ndarray:
    data = np.tile(_cluster_child.records(), 2)
    data["t"] = np.arange(len(data)) // 10
    return data


class InFlightTaken:
    """Whether the store holds two checkpoints with records in flight in the sources' rings, one
    of them also between executors (read by each executor's pace; each checkpoint loaded once)."""

    def __init__(self, directory):
        self.directory, self.flying, self.checked = directory, {}, 0.0

    def __call__(self) -> bool:
        if time.monotonic() - self.checked < 0.01:
            return False
        self.checked = time.monotonic()
        store = SnapshotStore(self.directory, job="ucount", keep=1000, readonly=True)
        for n in store.checkpoints():
            if n not in self.flying:
                checkpoint = store.load(n)
                self.flying[n] = (in_flight(checkpoint) > 0, in_flight(checkpoint, sources=False) > 0)
        at_sources = [between for sources, between in self.flying.values() if sources]
        return len(at_sources) >= 2 and any(at_sources)


@pytest.mark.parametrize("mode,transport,epochs", [("slash", "shm", SHIPPING_EPOCHS), ("uppar", "tcp", {})])
def test_an_unaligned_cluster_checkpoint_holds_what_was_in_flight_and_a_resume_replays_it(
        tmp_path, mode, transport, epochs):
    data = stream()
    # each batch 2 ms slower until the checkpoints this test resumes from were taken (whether a
    # barrier finds records ahead of it in a ring is up to the scheduler: counted, not assumed)
    pace = Paced(seconds=0.002, until=InFlightTaken(tmp_path))
    job, out = counting(pace)
    options = dict(executors=2, mode=mode, transport=transport, checkpoint_dir=tmp_path, **epochs, **SMALL_RINGS)
    slashrt.run(job, {"r": data}, checkpoint={"interval": 0.005, "keep": 1000, "alignment_timeout": 0}, **options)
    assert int(out.records["count"].sum()) == len(data)
    store = SnapshotStore(tmp_path, job="ucount", keep=1000)
    middle = []
    for n in store.checkpoints():
        checkpoint = store.load(n)
        fed = sum(p["fed"] for p in checkpoint.meta["sources"]["ucount.r"].values())
        if fed == len(data) and not in_flight(checkpoint):
            continue  # taken after the end: the window may have fired
        counted = sum(int(array.sum()) for (step, _), state in checkpoint.states.items() if step.endswith("window_1")
                      for name, array in state.arrays.items() if name.endswith(".counts"))
        # computed + in flight (in the sources' rings, between executors) = fed, over both
        # executors: nothing lost, nothing twice
        flying = in_flight(checkpoint) + in_flight(checkpoint, sources=False)
        assert counted + flying == fed, (n, counted, in_flight(checkpoint), in_flight(checkpoint, False), fed)
        if in_flight(checkpoint) and fed < len(data):
            middle.append(n)
    # taken while records were in flight, at the sources and between executors
    between = [n for n in middle if in_flight(store.load(n), sources=False)]
    assert len(middle) >= 2 and between, store.checkpoints()
    # on 2 executors each replays its in-flight records once (its feeders post theirs, it
    # computes what its peers' channels held, its exchanges ship again what they had queued),
    # then goes on; on 3 (rescaled) each old executor's share starts again at its first record
    # in flight, and the rows in flight between executors go to their keys' new owners
    for executors, n in [(2, middle[0]), (2, between[-1]), (3, between[-1])]:
        job, out = counting(Paced())
        slashrt.run(job, {"r": data}, checkpoint={"keep": 1000}, resume_from=n, **{**options, "executors": executors})
        expected = np.bincount(data["k"] - data["k"].min())
        got = np.zeros_like(expected)
        np.add.at(got, out.records["k"] - data["k"].min(), out.records["count"])
        assert np.array_equal(got, expected), (executors, n)
        # on 2: resumed as it was taken (each feeder replays), not shared out anew as a rescaling
        newest = store.load(store.checkpoints()[-1]).meta
        assert ("reshared" in newest) == (executors == 3), newest


# SIGKILL one agent at a chosen point while every periodic checkpoint is unaligned
@pytest.mark.parametrize("mode,transport,kill", [
    pytest.param("slash", "shm", "pre_commit:7:1", id="slash-shm-between-pre-commit-and-commit"),
    pytest.param("uppar", "tcp", "commit:4:0", id="uppar-tcp-after-manifest-before-commit"),
])
def test_cluster_killed_during_unaligned_checkpoints_the_output_is_exactly_once(
        tmp_path, reference, mode, transport, kill, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SLASHRT_TEST_ALIGNMENT_TIMEOUT", "0")
    monkeypatch.setenv("SLASHRT_TEST_KEEP", "1000")  # (to count what every checkpoint held in flight)
    crashed = child(tmp_path, mode, transport, kill)
    assert crashed.returncode == 3 and "SIGKILL" in crashed.stdout, (crashed.stdout, crashed.stderr[-2000:])
    store = SnapshotStore(tmp_path / "chk", job="cluster-chaos", keep=1000)
    # checkpoints with records in flight were taken, in the sources' rings or between executors
    # (one taken just after a run of buffers emptied a ring holds none of it;
    # test_an_unaligned_cluster_checkpoint_... resumes from one that does)
    flying = [in_flight(store.load(n)) + in_flight(store.load(n), sources=False) for n in store.checkpoints()]
    assert sum(flying) > 0 and any(store.load(n).meta.get("unaligned") for n in store.checkpoints()), flying
    resumed = child(tmp_path, mode, transport)
    assert resumed.returncode == 0 and "done" in resumed.stdout, resumed.stderr[-2000:]
    assert published(tmp_path) == reference


RINGS = {"slots": 96, "slot_size": 1024, "partitions": 16}  # the default slot count, small slots
PER_BUFFER = (1024 - 32) // _cluster_child.SCHEMA.record_size  # records a buffer holds


class Slow:
    """A step after the source taking `seconds` a buffer (of RINGS' size): its source's ring stays full."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds * -(-len(batch) // PER_BUFFER))
        return np.ones(len(batch), bool)


def test_with_a_slow_step_unaligned_checkpoints_keep_their_cadence_where_aligned_ones_wait(tmp_path):
    data = stream()[:2 * 2 * RINGS["slots"] * PER_BUFFER]  # two rings' worth a share
    # a buffer a pipeline call (longer than the executor's slice), each one slower than the source
    job, out = counting(Slow(0.012))
    slashrt.run(job, {"r": data}, executors=2, checkpoint_dir=tmp_path, **RINGS,
                checkpoint={"interval": 0.005, "keep": 1000, "alignment_timeout": 0})
    assert int(out.records["count"].sum()) == len(data)
    store = SnapshotStore(tmp_path, job="ucount", keep=1000)
    fed = [[p["fed"] for _, p in sorted(store.load(n).meta["sources"]["ucount.r"].items())]
           for n in store.checkpoints()]
    shares = fed[-1]  # the final checkpoint: each executor's whole share
    assert sum(shares) == len(data)
    # completed while both executors' sources still fed
    middle = sum(all(f < share for f, share in zip(at, shares)) for at in fed)
    # an aligned barrier waits behind its source's full ring: checkpoint n + 1 is triggered once n
    # completed, so its barrier goes in a ring's worth of records later at least, and no more than
    # (buffers of a share) / slots + 1 aligned checkpoints can complete before the end
    aligned_at_most = max(shares) // PER_BUFFER // RINGS["slots"] + 1
    assert middle > aligned_at_most, (middle, fed)


def test_the_aligner_counts_overtaken_inputs_as_delivered():
    aligner = BarrierAligner(["s", "p"], clock=lambda: 1.0)
    assert aligner.overtake_inputs(["s"], 3) == [] and aligner.channels.blocked == {"s"}
    assert [type(o) for o in aligner.barrier("p", 3)] == [Snapshot] and aligner.channels.blocked == set()
    assert aligner.barrier("s", 3) == [] and aligner.stale == 1  # its own barrier, later: stale
    assert aligner.barrier("s", 4) == [] and aligner.channels.blocked == {"s"}  # the next one aligns as usual
    assert [type(o) for o in aligner.barrier("p", 4)] == [Snapshot]



def test_bench_checkpoint_slow_step_on_a_cluster_reports_the_cadence(capsys):
    import json
    import math

    from slashrt.cli import main

    args = ["bench", "checkpoint", "--slow-step-ms", "2", "--events", "300000", "--interval", "0.05",
            "--alignment-timeout", "0", "--executors", "2", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["executors"] == 2
    assert 0 < result["stream_s"] < result["seconds"]  # (the agents' start and the input's shipping left out)
    # intervals in the stream's seconds (reported to the ms: 0.35 may be 0.3504, 7 intervals)
    lowest, highest = (math.floor((result["stream_s"] + d) / 0.05 + 1e-9) for d in (-5e-4, 5e-4))
    assert lowest <= result["checkpoints_expected"] <= highest, result
    assert result["checkpoints_completed"] >= result["unaligned"] >= 1


@pytest.mark.parametrize("after", ["exchange", "graph"])
def test_bench_checkpoint_slow_after_the_exchange_reports_the_cadence_and_its_refusals(capsys, after):
    import json

    from slashrt.cli import main

    args = ["bench", "checkpoint", "--slow-step-ms", "2", "--slow-after", after, "--events", "300000",
            "--interval", "0.05", "--alignment-timeout", "0", "--executors", "2", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["slow_after"] == after and result["executors"] == 2
    assert result["checkpoints_completed"] >= result["unaligned"] >= 1
    one_executor = [("1" if args[i - 1] == "--executors" else a) for i, a in enumerate(args)]
    no_slow_step = args[:2] + args[4:]
    for given, sentence in [(one_executor, f"--slow-after {after} needs a cluster: give --executors 2 or more"),
                            (no_slow_step, "--slow-after places the slow step: give --slow-step-ms too")]:
        assert main(given) == 2
        assert sentence in capsys.readouterr().err


@pytest.mark.parametrize("timeout,unaligned_after", [("auto", None), (0.05, 0.05), (None, None)])
async def test_auto_keeps_file_sources_checkpoints_aligned_and_a_given_timeout_does_not(tmp_path, timeout, unaligned_after):
    """A FileSource's checkpoint resumes on another executor count by moving its readers'
    positions, which in-flight records would not follow: the default alignment timeout keeps
    its cluster checkpoints aligned (rescalable); a timeout the user gave is obeyed; an array's
    keep "auto" (their in-flight records are shared out anew)."""
    from slashrt._plan import build_plan
    from slashrt._runtime import _checkpointing
    from slashrt.connectors import FileSource
    from slashrt.snapshot.cluster import cluster_checkpoints
    from tests.connectors.test_executors import records, write_files

    write_files(tmp_path / "in", records(200))
    job, _ = counting(lambda batch: batch)
    plan = build_plan(job)

    def config(value, executors):
        checkpoint = {"interval": 0.2, "alignment_timeout": timeout}
        if executors == 1:  # (a run on one executor decides the same)
            return _checkpointing(job, plan, {"r": value}, checkpoint, tmp_path / "one", None).config
        options = {"checkpoint": checkpoint, "checkpoint_dir": tmp_path / "chk"}
        return cluster_checkpoints(job, plan, plan, {"r": value}, executors, options).job["config"]

    for executors in (1, 2):
        assert config(FileSource(tmp_path / "in"), executors).unaligned_after == unaligned_after
        assert config(stream(), executors).unaligned_after == (0.1 if timeout == "auto" else unaligned_after)
