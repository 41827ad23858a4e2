"""Barrier snapshots of cluster pipelines whose exchanges feed exchanges (alignment exchange by
exchange: `slashrt.snapshot.cluster_graph`): a count per key and window, then a sum of those
counts per another key (`g = k % G`) and window, on real agent processes with rings that wrap
many times.

- checkpointed runs (SSB and UpPar; 2 executors over shm, 3 over tcp) give a numpy reference,
  as the unchecked cluster run does;
- every checkpoint is a consistent cut through both stages: the records its sources fed before
  their barriers are exactly the counts left in stage 1's windows (fragments and owners') plus
  the counts summed in stage 2's, plus what the channel state holds in flight (an SSB partial
  row standing for its count), also while SSB epochs of both stages are open;
  resuming from such a checkpoint in the middle gives the reference;
- SIGKILL of an agent at chosen points (the chaos hooks), recovered by `restart=`, or resumed on
  another number of executors (SSB partitions of both stages reassigned): the committed output
  (transactional CSV) is the failure-free one.
"""

import collections

import numpy as np
import pytest

from slashrt import Dataflow, Schema, Tumbling
from slashrt.bench import chaos
from slashrt.bench.chaos import ChaosCsv, published
from slashrt.errors import SlashError
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore
from slashrt.ssb.graph_window import is_partial

from tests.snapshot._paced import Paced, behind
from tests.snapshot.test_recovery import bounded

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
N, KEYS, G = 60_000, 3000, 13
SMALL = {"slots": 8, "slot_size": 1024, "partitions": 16}  # 8 KiB rings: the input is ~180 of them


def records(n: int = N) -> np.ndarray:
    rng = np.random.default_rng(11)
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 10_000 // n  # in order: nothing is late
    out["k"] = rng.integers(0, KEYS, n)
    out["v"] = rng.integers(-100, 100, n)
    return out


def two_stages(name: str, sink, first_ms: int = 100, second_ms: int = 500, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind the source (`tests.snapshot._paced.Paced`), or none."""
    job = Dataflow(name)
    source = job.source("r", SCHEMA, time="t")
    source = behind(source, pace)
    counts = source.window(Tumbling(ms=first_ms)).count(key="k", output="n")
    counts = counts.with_column("g", lambda b: b["k"] % G, dtype="i8")
    counts.window(Tumbling(ms=second_ms)).sum("n", key="g", output="total").sink(sink, name="out")
    return job


def reference(data: np.ndarray, first_ms: int = 100, second_ms: int = 500) -> np.ndarray:
    """The two stages in numpy: counts per (window, key); each row's time is its window's end."""
    pairs, counts = np.unique(np.stack([data["t"] // first_ms, data["k"]], axis=1), axis=0, return_counts=True)
    second = (pairs[:, 0] + 1) * first_ms // second_ms
    groups, at = np.unique(np.stack([second, pairs[:, 1] % G], axis=1), axis=0, return_inverse=True)
    out = np.zeros(len(groups), [("window_start", "<i8"), ("window_end", "<i8"), ("g", "<i8"), ("total", "<i8")])
    out["window_start"], out["window_end"] = groups[:, 0] * second_ms, (groups[:, 0] + 1) * second_ms
    out["g"], out["total"] = groups[:, 1], np.bincount(at.ravel(), weights=counts).astype(np.int64)
    return np.sort(out)


@pytest.mark.parametrize("mode,transport,executors", [
    ("slash", "shm", 2), ("uppar", "shm", 2), ("slash", "tcp", 3), ("uppar", "tcp", 3),
])
def test_a_checkpointed_chained_pipeline_equals_the_unchecked_run_and_numpy(tmp_path, mode, transport, executors):
    data = records()
    options = {"executors": executors, "mode": mode, "transport": transport, "epoch_bytes": 4096, **SMALL}
    expected = reference(data)
    if mode == "uppar":  # the unchecked cluster run too
        plain = Collect()
        bounded(two_stages("chain", plain), {"r": data}, **options)
        np.testing.assert_array_equal(np.sort(plain.records), expected)
    out = Collect(transactional=True)
    result = bounded(two_stages("chain", out), {"r": data}, checkpoint=0.005, checkpoint_dir=tmp_path, **options)
    assert len(expected) > 200
    np.testing.assert_array_equal(np.sort(out.records), expected)
    completed = [c for c in result.checkpoints if c["status"] == "completed"]
    assert len(completed) >= 2 and completed[-1]["savepoint"]
    store = SnapshotStore(tmp_path, job="chain")
    steps = {step for step, _ in store.load(store.checkpoints()[-1]).states}
    assert {c["acks"] for c in completed} == {executors * len(steps)}  # both stages of every executor acked


def test_three_stages_align_as_two_do(tmp_path):
    # the sums per g feed a third window keyed by g % 3: three chained exchanges, no case per depth
    data = records()
    job = Dataflow("three")
    counts = job.source("r", SCHEMA, time="t").window(Tumbling(ms=100)).count(key="k", output="n")
    totals = counts.with_column("g", lambda b: b["k"] % G, dtype="i8").window(Tumbling(ms=500)).sum(
        "n", key="g", output="total")
    out = Collect(transactional=True)
    totals.with_column("h", lambda b: b["g"] % 3, dtype="i8").window(Tumbling(ms=1000)).sum(
        "total", key="h", output="grand").sink(out)
    result = bounded(job, {"r": data}, executors=3, mode="uppar", transport="tcp", checkpoint=0.005,
                     checkpoint_dir=tmp_path, **SMALL)
    second = reference(data)
    groups, at = np.unique(np.stack([second["window_end"] // 1000, second["g"] % 3], axis=1), axis=0,
                           return_inverse=True)
    expected = np.zeros(len(groups), out.records.dtype)
    expected["window_start"], expected["window_end"] = groups[:, 0] * 1000, (groups[:, 0] + 1) * 1000
    expected["h"], expected["grand"] = groups[:, 1], np.bincount(at.ravel(), weights=second["total"])
    np.testing.assert_array_equal(np.sort(out.records), np.sort(expected))
    assert sum(c["status"] == "completed" for c in result.checkpoints) >= 2


def held(checkpoint, step: str, column: str) -> int:
    """What the windows of `step` hold in `checkpoint` on every executor (fragments, leader
    state and tails; an UpPar owner's window is a step of its own, named by `step` too)."""
    return sum(
        int(array.sum()) for (s, _), state in checkpoint.states.items() if s.startswith(step)
        for name, array in state.arrays.items() if name.endswith(column)
    )


def stands_for(channel, second: str) -> int:
    """The input records a channel state stands for: a source's records and stage 1's routed
    rows one each, stage 2's rows their counts `n`; an SSB partial row its count (stage 1) or
    its sum of counts (stage 2)."""
    records = channel.arrays["records"]
    to_second = channel.meta["source"].startswith(second)
    if is_partial(records):
        return int(records["value" if to_second else "count"].sum())
    return int(records["n"].sum()) if to_second else len(records)


@pytest.mark.parametrize("mode", ["slash", "uppar"])
def test_every_chained_checkpoint_is_a_consistent_cut_through_both_stages_and_resumes_to_the_reference(tmp_path, mode):
    # stage 1 fires every 200 ms of event time into stage 2, whose one window lasts the whole run:
    # every record is counted in stage 1's open windows or in stage 2's sums, never both, never lost.
    # Epochs: stage 1's end where its fragments are due (every 200 ms of event time) and every
    # 256 KiB of input, stage 2's every 256 KiB of counts (~2 firings), so most barriers find an
    # epoch open in both
    data = records(5 * N)
    options = {"executors": 2, "mode": mode, "epoch_bytes": 1 << 18, **SMALL}
    # past a third of its records, each executor's batches take 4 ms more until 4 more checkpoints
    # completed: cuts through both stages' open windows however fast the machine or slow the
    # fsyncs (at full speed a run completes ~20, with 50 ms fsyncs none in the middle)
    pace = Paced(after=len(data) // 6, seconds=0.004, until=(tmp_path / "cut" / "chk-*" / "_manifest.json", 4),
                 fresh=True)
    bounded(two_stages("cut", Collect(transactional=True), 200, 10**9, pace), {"r": data},
            checkpoint={"interval": 0.002, "keep": 1000}, checkpoint_dir=tmp_path, **options)
    store = SnapshotStore(tmp_path, job="cut", keep=1000)
    first, second = "cut.count_window_1", "cut.sum_window_3"
    middle, in_flight = [], []
    for n in store.checkpoints():
        checkpoint = store.load(n)
        fed = sum(p["fed"] for p in checkpoint.meta["sources"]["cut.r"].values())
        if fed == len(data):  # taken after the end: every window fired
            continue
        counted, summed = held(checkpoint, first, ".counts"), held(checkpoint, second, ".vals")
        # (past the alignment timeout, half the interval, what is in the sources' rings and in
        # flight between executors is the checkpoint's channel state: test_cluster_unaligned.py)
        flying = sum(stands_for(s, second) for s in checkpoint.states.values() if s.meta.get("kind") == "channel_state")
        assert counted + summed + flying == fed, (n, counted, summed, flying, fed)
        if counted and summed:
            middle.append(n)
        ssb = [s.meta for (step, _), s in checkpoint.states.items() if s.meta.get("kind") == "ssb_graph_window"]
        open_epochs = {m["step"] for m in ssb if m["counters"][0] > 0}
        if summed and open_epochs == {first, second}:  # stage 2 took what stage 1 shipped, both have an epoch open
            in_flight.append(n)
    assert middle  # a cut in the middle of the stream, through both stages
    if mode == "slash":
        assert in_flight
    # resume from one of them: stage 2 fires at the end only, so the resumed run gives everything
    n = (in_flight or middle)[0]
    out = Collect()
    bounded(two_stages("cut", out, 200, 10**9), {"r": data}, checkpoint={"keep": 1000}, checkpoint_dir=tmp_path,
            resume_from=n, **options)
    np.testing.assert_array_equal(np.sort(out.records), reference(data, 200, 10**9))


def chaos_run(tmp_path, monkeypatch, kills: str, restart="fixed-delay:attempts=5,delay=0", n: int = 5 * N,
              checkpoint=None, **options):
    """The two stages over `records(n)` into a transactional CSV directory, with SIGKILLs at the
    chosen points."""
    (tmp_path / "marks").mkdir(exist_ok=True)
    monkeypatch.setenv(chaos.KILLS_ENV, kills)
    monkeypatch.setenv(chaos.MARKS_ENV, str(tmp_path / "marks"))
    return bounded(two_stages("chaos", ChaosCsv(tmp_path / "out", transactional=True)), {"r": records(n)},
                   # (several in flight: a slow fsync on a loaded disk does not hold back the next checkpoints,
                   # so the chosen points come while the sources still feed)
                   checkpoint=checkpoint or {"interval": 0.005, "keep": 2, "max_in_flight": 3},
                   checkpoint_dir=tmp_path / "chk",
                   restart=restart, epoch_bytes=4096, **options, **SMALL)


def csv_lines(n: int) -> collections.Counter:
    """The failure-free output of `records(n)` as CSV lines (the reference, as the sink writes it)."""
    return collections.Counter(",".join(str(v) for v in row) for row in reference(records(n)).tolist())


@pytest.fixture(scope="module")
def committed() -> collections.Counter:
    return csv_lines(5 * N)


@pytest.mark.parametrize("mode,transport,executors,kills", [
    pytest.param("slash", "shm", 2, "align:2;async:2", id="slash-shm-2-alignment-then-async-write"),
    pytest.param("uppar", "tcp", 3, "pre_commit:2;pre_commit:1", id="uppar-tcp-3-twice-in-a-row"),
])
def test_sigkill_and_restart_commit_exactly_the_failure_free_output(tmp_path, monkeypatch, committed, mode, transport,
                                                                     executors, kills):
    result = chaos_run(tmp_path, monkeypatch, kills, mode=mode, transport=transport, executors=executors)
    planned = len(kills.split(";"))
    assert len(list((tmp_path / "marks").iterdir())) == planned  # every chosen kill fired
    assert len(result.recoveries) == planned
    assert all("killed by signal 9 (SIGKILL)" in r["cause"] for r in result.recoveries), result.recoveries
    assert published(tmp_path / "out") == committed  # nothing lost, nothing twice


def test_a_chained_pipeline_killed_on_2_executors_resumes_on_3_with_exactly_the_failure_free_output(
        tmp_path, monkeypatch, committed):
    # SSB partitions of both stages are reassigned to the new leaders; stage 2 fires mid-run
    with pytest.raises(SlashError, match="SIGKILL"):
        chaos_run(tmp_path, monkeypatch, "pre_commit:4", "none", mode="slash", transport="shm", executors=2)
    store = SnapshotStore(tmp_path / "chk", job="chaos")
    latest = store.latest()
    assert latest.meta["executors"] == 2
    assert 0 < sum(p["fed"] for p in latest.meta["sources"]["chaos.r"].values()) < 5 * N  # mid-run
    monkeypatch.delenv(chaos.KILLS_ENV)
    result = bounded(two_stages("chaos", ChaosCsv(tmp_path / "out", transactional=True)), {"r": records(5 * N)},
                     checkpoint={"keep": 2}, checkpoint_dir=tmp_path / "chk", resume_from="latest", mode="slash",
                     transport="tcp", executors=3, epoch_bytes=4096, **SMALL)
    assert result.resumed_from == latest.number
    assert published(tmp_path / "out") == committed
    assert store.load(store.checkpoints()[-1]).meta["executors"] == 3
