"""Barrier snapshots in a run on one executor (`slashrt.snapshot.runtime`).

- consistency of alignment: every checkpoint's state holds exactly the records each source had
  fed when it sent the barrier (its recorded position), nothing after a barrier, also with one
  input's barrier coming long after the other's;
- checkpoints complete during runs with windows, late records, several sources and a union, and
  do not change the results (barrier snapshots, and the stop-the-world baseline);
- exactly once under fire: a real child process running a checkpointed job is SIGKILLed at
  chosen points (during the asynchronous write, between pre-commit and commit, after a
  manifest before the commit, after some records; twice in a row) and at seeded random ones,
  and resumed by a new process from the directory: the published CSV output equals a
  failure-free run's; the same with every source a FileSource (Parquet, CSV, .npy files) into
  Parquet and CSV sinks, and a RedisStream into RedisStreamSinks on a real redis-server
  (sources rewound to the positions their checkpoint recorded);
- a corrupt latest checkpoint: the resume falls back to the one before;
- what cannot be checkpointed is refused in one sentence.
"""

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt._runtime import run_receivers
from slashrt.cluster import Ingest, PerExecutor
from slashrt.errors import DataflowError, OptionError, SnapshotError
from slashrt.snapshot import SnapshotStore
from slashrt.connectors import read_stream
from slashrt.transport import RingSpec, open_inproc_channel
from tests.snapshot._children import run_child
from tests.snapshot._paced import Paced, behind

from . import _checkpoint_child as job

CHILD = Path(__file__).with_name("_checkpoint_child.py")
SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})


def child(directory: Path, kill: str = "none", inputs: str = "arrays") -> subprocess.CompletedProcess:
    """Run the checkpointed job in a new process (killed at `kill`); it resumes from `directory`."""
    return run_child(CHILD, directory, kill, inputs)


def published(directory: Path, inputs: str = "arrays") -> dict[str, list[tuple]]:
    """Every sink's committed rows (what a reader of the directories or streams sees), sorted."""
    import pyarrow.parquet as pq

    kind, _, where = inputs.partition(":")
    rows = {}
    for name in job.OUTPUTS:
        if kind == "redis":
            found = read_stream(where, name, job_dtype(name)).tolist()
        else:
            found = []
            for part in (directory / name).glob("part-*"):
                if part.suffix == ".parquet":
                    found += [tuple(r.values()) for r in pq.read_table(part).to_pylist()]
                else:
                    found += [tuple(map(int, line.split(","))) for line in part.read_text().splitlines()[1:]]
        rows[name] = sorted(found)
    return rows


def job_dtype(name: str) -> np.dtype:
    """The records sink `name` of the job gets."""
    if name == "late_a":
        return SCHEMA.dtype
    return np.dtype([("window_start", "<i8"), ("window_end", "<i8"), ("k", "<i8"), ("sum_v", "<i8")])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, list[tuple]]:
    """A failure-free run's published output (its inputs from arrays: the same records as files
    or streams give)."""
    directory = tmp_path_factory.mktemp("reference")
    done = child(directory)
    assert done.returncode == 0, done.stderr
    rows = published(directory)
    assert all(rows.values()) and len(rows["late_a"]) > 100  # late records are part of the test
    return rows


def crash_then_resume(directory: Path, kills: list[str], inputs: str = "arrays") -> None:
    """Run the job killed at each of `kills` in turn, then to its end, each a new process."""
    for kill in kills:
        crashed = child(directory, kill, inputs)
        assert crashed.returncode == -signal.SIGKILL, (kill, crashed.returncode, crashed.stderr[-2000:])
        assert "done" not in crashed.stdout
        if kill.startswith("commit"):  # a checkpoint completed before the kill, the run went on
            assert SnapshotStore(directory / "chk", job="chaos").checkpoints()
    resumed = child(directory, "none", inputs)
    assert resumed.returncode == 0, resumed.stderr[-2000:]


# each point is reached in every run (a run of the child passes "records" up to 380 (k), each
# other point more than its top below): SIGKILL after the k-th pass
KILLS = [
    pytest.param(["pre_commit:4"], id="between-pre-commit-and-commit"),
    pytest.param(["write_part:9"], id="during-async-write"),
    pytest.param(["complete:3"], id="after-manifest-before-commit"),
    pytest.param(["records:70"], id="after-70k-records"),
    pytest.param(["write_part:5", "pre_commit:2"], id="twice-in-a-row"),
    # seeded random moments: a point and how often it is passed first
    *(pytest.param([kill], id=f"seeded-{kill}") for kill in (
        f"{point}:{rng.integers(1, top)}" for rng in [np.random.default_rng(14)]
        for point, top in [("records", 180), ("write_part", 25), ("complete", 6)]
    )),
]


@pytest.mark.parametrize("kills", KILLS)
def test_output_is_exactly_once_after_sigkill_and_resume(tmp_path, reference, kills):
    crash_then_resume(tmp_path, kills)
    assert published(tmp_path) == reference


# the connectors' sources rewind to their recorded positions: the same kills, from files and
# streams. Each sink pre-commits and commits once a checkpoint (3 a checkpoint), a run passes
# "write_part" 4 times a checkpoint, "records" up to 380 (k); a run on a loaded machine (slow
# fsyncs) may complete only a few checkpoints, so the points come early
def rewind_kills(seed: int) -> list:
    rng = np.random.default_rng(seed)
    point, top = [("records", 300), ("write_part", 8), ("pre_commit", 6), ("commit", 6)][rng.integers(4)]
    seeded = f"{point}:{rng.integers(1, top)}"  # a seeded random moment
    return [
        pytest.param(["commit:4"], id="during-the-run-after-a-checkpoint-completed"),
        pytest.param(["pre_commit:4"], id="between-pre-commit-and-commit"),
        pytest.param(["commit:4", "pre_commit:2"], id="twice-in-a-row"),
        pytest.param([seeded], id=f"seeded-{seeded}"),
    ]


@pytest.fixture(scope="module")
def file_inputs(tmp_path_factory) -> str:
    data = tmp_path_factory.mktemp("inputs")
    job.write_inputs(f"files:{data}")
    return f"files:{data}"


@pytest.mark.parametrize("kills", rewind_kills(9))
def test_file_sources_into_file_sinks_are_exactly_once_after_sigkill_and_resume(tmp_path, reference, file_inputs, kills):
    crash_then_resume(tmp_path, kills, file_inputs)
    assert published(tmp_path, file_inputs) == reference


@pytest.mark.parametrize("kills", rewind_kills(14))
def test_redis_streams_into_redis_sinks_are_exactly_once_after_sigkill_and_resume(tmp_path, reference, redis, kills):
    inputs = f"redis:{redis.url}"
    job.write_inputs(inputs)
    crash_then_resume(tmp_path, kills, inputs)
    assert published(tmp_path, inputs) == reference


# -- in process ------------------------------------------------------------------------------------
def source_records(n: int, key: int, *, seed: int, disorder: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 10_000 // n - (rng.integers(0, disorder, n) if disorder else 0)
    out["k"] = key
    out["v"] = rng.integers(-100, 100, n)
    return out


def test_every_checkpoint_holds_exactly_what_each_source_fed_before_its_barrier(tmp_path):
    # one window for the whole stream, a count per source: the state is how many records of
    # each source went in; input "b" is 8x longer, so its barrier often comes long after a's
    inputs = {"a": source_records(240_000, 0, seed=1), "b": source_records(1_920_000, 1, seed=2)}
    flow = Dataflow("align")
    a, b = (flow.source(name, SCHEMA, time="t") for name in inputs)
    # slowed until 3 checkpoints completed, whatever their writes cost: a loaded machine took
    # 0.6 s for the first one, when the whole stream takes less
    pace = Paced(seconds=0.01, until=(tmp_path / "align" / "chk-*" / "_manifest.json", 3))
    behind(a.union(b), pace).window(Tumbling(ms=10**9)).count(key="k").sink(sinks.Collect(transactional=True), name="out")
    result = slashrt.run(  # aligned: every checkpoint's state is what came before its barriers (unaligned
        # ones hold records in flight beside it: tests/snapshot/test_unaligned.py)
        flow, inputs, checkpoint={"interval": 0.002, "keep": 1000, "alignment_timeout": None}, checkpoint_dir=tmp_path,
        slots=8, slot_size=2048
    )
    store = SnapshotStore(tmp_path, job="align", keep=1000)
    numbers = store.checkpoints()
    reported = [c["checkpoint"] for c in result.checkpoints if c["status"] == "completed"]
    assert reported == numbers[-len(reported):]  # (the report keeps the last 100)
    both_running = 0
    for n in numbers:
        checkpoint = store.load(n)
        fed = {step.split(".")[1]: position["0"]["fed"] for step, position in checkpoint.meta["sources"].items()}
        (window,) = [s for s in checkpoint.states.values() if "slices.keys" in s.arrays]
        counted = np.bincount(window.arrays["slices.keys"], window.arrays["slices.counts"], minlength=2)
        if fed != {"a": len(inputs["a"]), "b": len(inputs["b"])}:  # else the end fired the window
            assert counted.tolist() == [fed["a"], fed["b"]], (n, numbers, fed, result.checkpoints)
        both_running += 0 < fed["a"] < len(inputs["a"]) and 0 < fed["b"] < len(inputs["b"])
    assert both_running >= 1 and len(numbers) >= 3, (numbers, result.checkpoints)
    assert sorted(result["align.out"]["count"].tolist()) == [len(inputs["a"]), len(inputs["b"])]


def test_checkpoints_change_no_result_with_windows_late_records_and_a_union(tmp_path):
    inputs = {
        "a": source_records(100_000, 0, seed=3, disorder=60),
        "b": source_records(80_000, 1, seed=4),
        "c": source_records(50_000, 2, seed=5),
    }

    def run(**options):
        flow = Dataflow("mixed")
        a, b, c = (flow.source(name, SCHEMA, time="t", max_delay=20) for name in inputs)
        late = sinks.Collect(transactional=bool(options))
        a.window(Tumbling(ms=50), late=late).sum("v", key="k").sink(sinks.Collect(transactional=bool(options)), name="sa")
        b.union(c).window(Tumbling(ms=50)).sum("v", key="k").sink(sinks.Collect(transactional=bool(options)), name="sbc")
        result = slashrt.run(flow, inputs, slots=8, slot_size=2048, **options)
        return result, np.sort(late.records, order=["t", "v"])

    plain, plain_late = run()
    configs = [  # sync: the stop-the-world baseline
        {"interval": 0.003, "mode": "abs"}, {"interval": 0.001, "max_in_flight": 3}, {"interval": 0.01, "min_pause": 0.01, "mode": "sync"},
    ]
    for i, config in enumerate(configs):
        checked, checked_late = run(checkpoint=config, checkpoint_dir=tmp_path / str(i))
        completed = [c for c in checked.checkpoints if c["status"] == "completed"]
        assert len(completed) >= 2 and all(c["bytes"] > 0 for c in completed)
        assert plain.late_records == checked.late_records and sum(plain.late_records.values()) > 0
        assert np.array_equal(plain_late, checked_late)
        for sink in ("mixed.sa", "mixed.sbc"):
            assert np.array_equal(np.sort(plain[sink]), np.sort(checked[sink]))


@pytest.mark.parametrize(
    "make_input, message",
    [
        (lambda: open_inproc_channel(RingSpec(slots=4, slot_size=4096, record_size=SCHEMA.record_size))[1],
         r"reads from a channel \(InprocReceiver\), which cannot rewind to a checkpoint: its producer \(Spark ingestion"),
        (lambda: Ingest(), r"reads from a channel \(Ingest\), which cannot rewind .* exactly once within a run, not across"),
        (lambda: PerExecutor(lambda i, n: source_records(10, 0, seed=0)),
         r"reads from a PerExecutor function not declared deterministic, which cannot rewind to a checkpoint: declare "
         r"PerExecutor\(make, \.\.\., deterministic=True\)"),
        (lambda: slashrt.Paced(lambda i, n: source_records(10, 0, seed=0), rate=1000),
         r"reads from a Paced function not declared deterministic, which cannot rewind to a checkpoint: declare "
         r"Paced\(make, \.\.\., deterministic=True\)"),
        (lambda: [1, 2, 3], r"reads from list, which cannot rewind to a checkpoint \(arrays, deterministic PerExecutor"),
    ],
    ids=["channel", "spark-ingest", "per-executor", "paced", "list"],
)
def test_a_source_that_cannot_rewind_is_refused(tmp_path, make_input, message):
    flow = Dataflow("chan")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect())
    with pytest.raises(DataflowError, match=rf"^run\(\): source 'chan.a' {message}.*; or run it without checkpoint_dir=$"):
        slashrt.run(flow, {"a": make_input()}, checkpoint_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything was written


async def test_receivers_and_ingest_servers_refuse_checkpoints(tmp_path):
    from slashrt.spark import IngestCluster, IngestServer

    flow = Dataflow("chan")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect())
    _, receiver = open_inproc_channel(RingSpec(slots=4, slot_size=4096, record_size=SCHEMA.record_size))
    with pytest.raises(DataflowError, match=r"reads from a channel \(InprocReceiver\), which cannot rewind"):
        await run_receivers(flow, {"a": receiver}, checkpoint_dir=tmp_path)
    with pytest.raises(DataflowError, match=r"reads from a channel \(Ingest\), which cannot rewind"):
        IngestServer(flow, checkpoint=1.0, checkpoint_dir=tmp_path)  # before anything listens
    with pytest.raises(DataflowError, match=r"reads from a channel \(Ingest\), which cannot rewind"):
        IngestCluster(flow, executors=2, checkpoint_dir=tmp_path)  # before any executor starts


def counting_flow(name: str):
    flow = Dataflow(name)
    out = sinks.Collect(transactional=True)
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=10**9)).count(key="k").sink(out, name="out")
    return flow, out


def test_a_deterministic_per_executor_input_is_made_again_and_resumes_at_its_position(tmp_path):
    made = []

    def make(index, executors):
        made.append((index, executors))
        return np.concatenate([source_records(150_000, 0, seed=1), source_records(100_000, 1, seed=2)])

    flow, out = counting_flow("gen")
    slashrt.run(flow, {"a": PerExecutor(make, deterministic=True)}, checkpoint={"interval": 0.001, "keep": 1000},
                checkpoint_dir=tmp_path, slots=8, slot_size=2048)
    assert sorted(out.records["count"].tolist()) == [100_000, 150_000] and made == [(0, 1)]
    store = SnapshotStore(tmp_path, job="gen", keep=1000)
    middle = [n for n in store.checkpoints() if 0 < store.load(n).meta["sources"]["gen.a"]["0"]["fed"] < 250_000]
    assert middle, store.checkpoints()
    flow, out = counting_flow("gen")
    slashrt.run(flow, {"a": PerExecutor(make, deterministic=True)}, checkpoint={"keep": 1000}, checkpoint_dir=tmp_path,
                resume_from=middle[-1], slots=8, slot_size=2048)
    assert made == [(0, 1), (0, 1)]  # made again, fed from the checkpoint's position on
    assert sorted(out.records["count"].tolist()) == [100_000, 150_000]


def test_a_resume_with_an_input_of_another_length_is_refused(tmp_path):
    flow, _ = counting_flow("len")
    slashrt.run(flow, {"a": source_records(1000, 0, seed=1)}, checkpoint_dir=tmp_path)
    flow, _ = counting_flow("len")
    with pytest.raises(SnapshotError, match=r"source 'len.a': the checkpoint was taken of an input of 1000 records, "
                                            r"this run's has 999: resume with the input the checkpointed run had"):
        slashrt.run(flow, {"a": source_records(999, 0, seed=1)}, checkpoint_dir=tmp_path, resume_from="latest")


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"checkpoint": 1.0}, OptionError, "need checkpoint_dir"),
        ({"resume_from": "latest"}, OptionError, "need checkpoint_dir"),
        ({"checkpoint": {"interval": 1, "mode": "slow"}, "checkpoint_dir": "DIR"}, OptionError, "mode must be one of"),
        ({"checkpoint": {"every": 1}, "checkpoint_dir": "DIR"}, OptionError, "unknown key"),
        ({"checkpoint_dir": "DIR", "resume_from": "first"}, OptionError, "resume_from must be"),
        ({"checkpoint": 1.0, "executors": 2}, OptionError, "need checkpoint_dir"),
    ],
)
def test_bad_checkpoint_options_are_refused(tmp_path, options, error, message):
    flow = Dataflow("opts")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect())
    options = {k: str(tmp_path) if v == "DIR" else v for k, v in options.items()}
    with pytest.raises(error, match=message):
        slashrt.run(flow, {"a": source_records(10, 0, seed=0)}, **options)


def test_bench_checkpoint_measures_the_three_modes_and_checks_them(capsys):
    from slashrt.cli import main

    assert main(["bench", "checkpoint", "--events", "2000000", "--interval", "0.005", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["events"] == 2_000_000
    assert result["checkpoints_abs"] >= 1 and result["snapshot_bytes"] > 0 and result["state_bytes"] > 0
    for field in ("records_per_s_none", "records_per_s_abs", "records_per_s_sync", "abs_over_none", "sync_over_none"):
        assert result[field] > 0
    # one round: its ratios are the ratios of the runs' seconds
    assert result["abs_over_none_rounds"] == [result["abs_over_none_median"]]
    assert result["abs_over_none_median"] == pytest.approx(result["abs_over_none"], abs=2e-3)
    # on a cluster, each executor generating its share: the three modes too (stop-the-world halts
    # every executor's sources at each checkpoint)
    args = ["bench", "checkpoint", "--executors", "2", "--events", "6000000", "--interval", "0.002", "--repeat", "1"]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["executors"] == 2
    assert result["checkpoints_abs"] >= 1 and result["checkpoints_sync"] >= 1
    for field in ("records_per_s_abs", "records_per_s_sync", "abs_over_none", "sync_over_none"):
        assert result[field] > 0


def test_positions_are_kept_per_source_and_executor():
    from types import SimpleNamespace

    from slashrt.snapshot.runtime import Checkpointing, SourceBarriers, source_position, source_positions

    barriers = [SourceBarriers("j.a", 0), SourceBarriers("j.a", 1), SourceBarriers("j.b", 0)]
    for i, source in enumerate(barriers):
        source.positions[4] = {"kind": "array_source", "fed": i}
    meta = {"sources": source_positions(barriers, 4)}
    assert meta == {"sources": {"j.a": {"0": {"kind": "array_source", "fed": 0}, "1": {"kind": "array_source", "fed": 1}},
                                "j.b": {"0": {"kind": "array_source", "fed": 2}}}}
    assert all(4 not in source.positions for source in barriers)  # taken out
    assert source_position(meta, "j.a", 1)["fed"] == 1 and source_position(meta, "j.b", 1) is None
    legacy = {"sources": {"j.a": {"kind": "array_source", "fed": 7}}}  # one executor's, before executors were keys
    assert source_position(legacy, "j.a", 0)["fed"] == 7
    def on(executor):
        return SimpleNamespace(restored=SimpleNamespace(meta=meta, number=4), executor=executor, rescaled=None)

    assert Checkpointing.position(on(1), "j.a").meta["fed"] == 1
    with pytest.raises(SnapshotError, match="positions of source 'j.a' for executors 0, 1, not 2: resume it on as many"):
        Checkpointing.position(on(2), "j.a")
    with pytest.raises(SnapshotError, match="holds no position for source 'j.c' on executor 0: it was written by another"):
        Checkpointing.position(on(0), "j.c")
