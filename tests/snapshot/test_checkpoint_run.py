"""Barrier snapshots in a run on one executor (`slashrt.snapshot.runtime`).

- consistency of alignment: every checkpoint's state holds exactly the records each source had
  fed when it sent the barrier (its recorded position), nothing after a barrier, also with one
  input's barrier coming long after the other's;
- checkpoints complete during runs with windows, late records, several sources and a union, and
  do not change the results (barrier snapshots, and the stop-the-world baseline);
- exactly once under fire: a real child process running a checkpointed job is SIGKILLed at
  chosen points (during the asynchronous write, between pre-commit and commit, after a
  manifest before the commit, after some records; twice in a row) and resumed by a new process
  from the directory: the published CSV output equals a failure-free run's;
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
from slashrt.errors import DataflowError, OptionError
from slashrt.snapshot import SnapshotStore
from slashrt.transport import RingSpec, open_inproc_channel
from tests.snapshot import _children
from tests.snapshot._children import run_child

CHILD = Path(__file__).with_name("_checkpoint_child.py")
SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
OUTPUTS = ("out_a", "late_a", "out_bc")


def child(directory: Path, kill: str = "none") -> subprocess.CompletedProcess:
    """Run the checkpointed job in a new process (killed at `kill`); it resumes from `directory`."""
    return run_child(CHILD, directory, kill)


def published(directory: Path) -> dict[str, list[str]]:
    return _children.published(directory, OUTPUTS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("reference")
    done = child(directory)
    assert done.returncode == 0, done.stderr
    rows = published(directory)
    assert all(rows.values()) and len(rows["late_a"]) > 100  # late records are part of the test
    return rows


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
    for kill in kills:
        crashed = child(tmp_path, kill)
        assert crashed.returncode == -signal.SIGKILL, (kill, crashed.returncode, crashed.stderr[-2000:])
        assert "done" not in crashed.stdout
    resumed = child(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert published(tmp_path) == reference


def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path, reference):
    crashed = child(tmp_path, "complete:3")  # checkpoint 3 complete, its output not yet published
    assert crashed.returncode == -signal.SIGKILL
    store = SnapshotStore(tmp_path / "chk", job="chaos")
    latest = store.checkpoints()[-1]
    part = sorted((tmp_path / "chk" / "chaos" / f"chk-{latest}").glob("*.state"))[0]
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    part.write_bytes(bytes(raw))
    assert store.latest().number == latest - 1
    assert [s.checkpoint for s in store.skipped] == [latest] and "corrupt" in store.skipped[0].reason
    resumed = child(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert published(tmp_path) == reference


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
    inputs = {"a": source_records(60_000, 0, seed=1), "b": source_records(480_000, 1, seed=2)}
    flow = Dataflow("align")
    a, b = (flow.source(name, SCHEMA, time="t") for name in inputs)
    a.union(b).window(Tumbling(ms=10**9)).count(key="k").sink(sinks.Collect(transactional=True), name="out")
    result = slashrt.run(
        flow, inputs, checkpoint={"interval": 0.002, "keep": 1000}, checkpoint_dir=tmp_path, slots=8, slot_size=2048
    )
    store = SnapshotStore(tmp_path, job="align", keep=1000)
    numbers = store.checkpoints()
    assert [c["checkpoint"] for c in result.checkpoints if c["status"] == "completed"] == numbers
    both_running = 0
    for n in numbers:
        checkpoint = store.load(n)
        fed = {step.split(".")[1]: position["fed"] for step, position in checkpoint.meta["sources"].items()}
        (window,) = [s for s in checkpoint.states.values() if "slices.keys" in s.arrays]
        counted = np.bincount(window.arrays["slices.keys"], window.arrays["slices.counts"], minlength=2)
        if fed != {"a": len(inputs["a"]), "b": len(inputs["b"])}:  # else the end fired the window
            assert counted.tolist() == [fed["a"], fed["b"]], (n, numbers, fed, result.checkpoints)
        both_running += 0 < fed["a"] < len(inputs["a"]) and 0 < fed["b"] < len(inputs["b"])
    assert both_running >= 1 and len(numbers) >= 3, (numbers, result.checkpoints)
    assert sorted(result["align.out"]["count"].tolist()) in ([60_000, 480_000],)


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


def test_a_source_that_cannot_rewind_is_refused(tmp_path):
    flow = Dataflow("chan")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect())
    _, receiver = open_inproc_channel(RingSpec(slots=4, slot_size=4096, record_size=SCHEMA.record_size))
    with pytest.raises(DataflowError, match="cannot rewind to a checkpoint"):
        slashrt.run(flow, {"a": receiver}, checkpoint_dir=tmp_path)


def test_a_user_operator_is_refused(tmp_path):
    class Keep(slashrt.Operator):
        async def on_batch(self, ctx, port, batch):
            await ctx.emit(batch)

    flow = Dataflow("user")
    flow.source("a", SCHEMA, time="t").operator(Keep(), name="keep").sink(sinks.Collect())
    with pytest.raises(DataflowError, match="'user.keep' is a user operator"):
        slashrt.run(flow, {"a": source_records(10, 0, seed=0)}, checkpoint_dir=tmp_path)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"checkpoint": 1.0}, OptionError, "need checkpoint_dir"),
        ({"resume_from": "latest"}, OptionError, "need checkpoint_dir"),
        ({"checkpoint": {"interval": 1, "mode": "slow"}, "checkpoint_dir": "DIR"}, OptionError, "mode must be one of"),
        ({"checkpoint": {"every": 1}, "checkpoint_dir": "DIR"}, OptionError, "unknown key"),
        ({"checkpoint_dir": "DIR", "resume_from": "first"}, OptionError, "resume_from must be"),
        ({"checkpoint": 1.0, "executors": 2}, OptionError, "need checkpoint_dir"),
        ({"checkpoint": {"mode": "sync"}, "checkpoint_dir": "DIR", "executors": 2}, OptionError, "mode 'abs'"),
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
    # on a cluster: barrier snapshots only (no stop-the-world baseline), each executor generating its share
    args = ["bench", "checkpoint", "--executors", "2", "--events", "600000", "--interval", "0.01", "--repeat", "1"]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["executors"] == 2 and result["checkpoints_abs"] >= 1
    assert result["records_per_s_abs"] > 0 and result["abs_over_none"] > 0 and result["sync_over_none"] is None
