"""Rescaling by snapshot (`slashrt.snapshot.rescale`): a job resumed from a mid-run checkpoint on
another number of executors, or in the other mode, publishes exactly what one uninterrupted run
publishes, and what numpy computes.

- chains of resumes through real agent processes (shm and tcp rings of 8 slots of 1 KiB: the
  input is ~90 times one ring): one executor -> 2 -> 3 -> 2 -> 1 -> 1 -> 3 in mode slash,
  1 -> 3 -> 2 -> 1 -> 2 -> 3 in mode uppar, 3 uppar -> 3 slash -> 3 -> 3 uppar -> 1 (the other
  mode on as many executors is a rescaling too; a resume on the same count in the same mode
  from a rescaled run's checkpoint makes its shares again); each stage resumes from a
  checkpoint in the middle of the previous stage's run, as a crash right after that checkpoint
  committed leaves it (later checkpoints and output gone), the last stage of each chain through
  `slashrt run FILE --resume-from latest --executors M` (on 256 SSB partitions where the
  checkpoint has 16: keys are cut by their partition of the new run); a late-heavy input (about
  half of it late for some window) into a tumbling and a sliding window (tails of partly late
  records);
- split then merge gives the state back (property test over random window states with tails);
- what cannot be rescaled (or resumed in the other mode) is refused in one sentence before
  anything runs.

(This job's sliding window resumed from a checkpoint whose owners had fired it up to different
times, beside a union's and a loop's: tests/snapshot/test_graph_rescale.py.)
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Sliding, Tumbling
from slashrt.cli import main
from slashrt.cluster import PerExecutor
from slashrt.errors import SlashError
from slashrt.ops.window import WindowAggregate
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.operators import unpack_tables
from slashrt.ssb.partitioned import merge_partitions, split_partitions
from slashrt.snapshot.rescale import as_partitioned, as_window
from slashrt.ssb.partitions import Partitioning

from tests.snapshot import _rescale_job as job
from tests.snapshot._children import ROOT, published

RINGS = {"slots": 8, "slot_size": 1024}
JOB = str(Path(job.__file__))


@pytest.fixture(scope="module")
def expected() -> dict[str, list[str]]:
    rows = job.expected()
    assert len(rows["late_t"]) > job.N // 3 and rows["late_s"]  # late-heavy
    return rows


def options(on) -> dict:
    """slashrt.run's options for a stage on `on`: "local" (one executor, in this process) or
    (executors, mode, transport)."""
    if on == "local":
        return dict(RINGS)
    executors, mode, transport = on
    return dict(executors=executors, mode=mode, transport=transport, partitions=16, **RINGS)


def cli_options(on) -> list[str]:
    if on == "local":
        return ["--executors", "1"]
    executors, mode, transport = on
    return ["--executors", str(executors), "--mode", mode, "--transport", transport]  # (256 partitions: not 16)


def fed(store: SnapshotStore, n: int) -> int:
    return sum(p["fed"] for p in store.load(n).meta["sources"]["rescale.r"].values())


def crash_after_a_mid_run_checkpoint(directory: Path, resumed: int | None) -> tuple[Path, int]:
    """What a crash right after a checkpoint in the middle of the run in `directory` committed
    leaves: the output published up to it (in a new directory) and the checkpoints up to it."""
    store = SnapshotStore(directory / "chk", job="rescale", keep=1000)
    mine = [n for n in store.checkpoints() if resumed is None or n > resumed]
    end = fed(store, mine[-1])
    # taken while the sources still fed (the run went on after it); an early one, so that
    # later stages of a chain still have input to checkpoint in the middle of
    during = [n for n in mine[:-1] if 0 < fed(store, n) < end]
    assert during, [(n, fed(store, n)) for n in mine]
    mid = during[len(during) // 4]
    return crash_after(directory, mid, directory.parent / f"{directory.name}+"), mid


def crash_after(directory: Path, n: int, after: Path) -> Path:
    """What a crash right after checkpoint n of the run in `directory` committed leaves, in
    `after`: the output published up to it and the checkpoints up to it."""
    for name in job.OUTPUTS:
        (after / name).mkdir(parents=True)
        for part in (directory / name).glob("part-*.csv"):
            if int(part.name.split("-")[1]) <= n:
                shutil.copy(part, after / name / part.name)
    shutil.copytree(directory / "chk", after / "chk")
    for m in SnapshotStore(directory / "chk", job="rescale", keep=1000).checkpoints():
        if m > n:
            shutil.rmtree(after / "chk" / "rescale" / f"chk-{m}")
    return after


def stage(directory: Path, on, resume: bool):
    return slashrt.run(
        job.flow(directory), {"r": job.records()}, checkpoint={"interval": 0.002, "keep": 1000},
        checkpoint_dir=directory / "chk", resume_from="latest" if resume else None, **options(on),
    )


def cli_stage(directory: Path, on) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLASHRT_TEST_OUT": str(directory)}
    done = subprocess.run(
        [sys.executable, "-m", "slashrt", "run", f"{JOB}:job", "--checkpoint-dir", str(directory / "chk"),
         "--checkpoint-interval", "2ms", "--resume-from", "latest", "--slots", "8", "--slot-size", "1024", "--json",
         *cli_options(on)],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


CHAINS = [
    pytest.param(["local", (2, "slash", "shm"), (3, "slash", "tcp"), (2, "slash", "tcp"), "local", "local",
                  (3, "slash", "shm")], id="slash-1-2-3-2-1-1-3"),
    pytest.param(["local", (3, "uppar", "tcp"), (2, "uppar", "shm"), "local", (2, "uppar", "tcp"), (3, "uppar", "shm")],
                 id="uppar-1-3-2-1-2-3"),
    # the other mode on as many executors (its windows' states turned into the other kind's, the
    # input shared out anew, as on another count), a resume on the same count in the same mode
    # (no rescaling: the shares made again from the checkpoint's record of the rescalings), back
    # to the first mode, then on one executor
    pytest.param([(3, "uppar", "tcp"), (3, "slash", "shm"), (3, "slash", "tcp"), (3, "uppar", "shm"), "local"],
                 id="uppar3-slash3-3-uppar3-1"),
]


@pytest.mark.parametrize("chain", CHAINS)
def test_resumed_on_other_executor_counts_from_mid_run_checkpoints_publishes_one_runs_output(tmp_path, expected, chain):
    directory, resumed, rescalings = tmp_path / "0", None, 0
    for k, on in enumerate(chain):
        if k + 1 < len(chain):
            result = stage(directory, on, resume=k > 0)
            assert result.resumed_from == resumed
            # the late counts carried over: the whole input's, counted once
            assert result.late_records == {"rescale.sum_window_1": len(expected["late_t"]),
                                           "rescale.sum_window_2": len(expected["late_s"])}
        else:  # the last stage from the command line
            summary = cli_stage(directory, on)
            assert summary["resumed_from"] == resumed and summary["executors"] == count(on)
        # the first run's output up to its checkpoint and the resumed run's: one run's output, exactly
        assert published(directory, job.OUTPUTS) == expected, (k, on)
        store = SnapshotStore(directory / "chk", job="rescale", keep=1000)
        last = store.load(store.checkpoints()[-1])
        assert last.meta["executors"] == count(on)
        assert len(last.meta.get("reshared", [])) == rescalings  # its sources' shares, made again on a resume
        if k + 1 < len(chain):
            directory, resumed = crash_after_a_mid_run_checkpoint(directory, resumed)
            rescalings += count(chain[k + 1]) != count(on) or count(on) > 1 and chain[k + 1][1] != on[1]


def count(on) -> int:
    return 1 if on == "local" else on[0]


# -- split then merge: the state back -----------------------------------------------------------------------
def window_state(seed: int, windows, fired_slices: int):
    """A whole window's state: random keys in random slices, tails of partly late partials,
    some windows fired, overflow flags."""
    rng = np.random.default_rng(seed)
    flow = slashrt.Dataflow("w")
    flow.source("src", job.SCHEMA, time="t").window(windows).sum("v", key="k", name="agg").sink(slashrt.sinks.Collect())
    op = WindowAggregate(flow.steps["w.agg"])
    fired = fired_slices * op.slice_len
    trio.run(op.on_watermark, fired)  # nothing to fire yet: it is closed up to there
    for s in rng.integers(fired_slices, fired_slices + 8, rng.integers(1, 6)):
        keys = rng.integers(-10**6, 10**6, rng.integers(0, 200))
        n = len(keys)
        closed = int(op._earliest_end(s)) if rng.random() < 0.4 else -(2**63)  # a tail: its first window closed
        if op._latest_end(s) > max(closed, op.fired_until):
            op.merge_slice(int(s), keys, np.ones(n, np.int64), rng.integers(-100, 100, n), closed)
    for table in list(op.slices.values())[:1]:
        table.overflowed = bool(rng.random() < 0.5)
    op.late_records = int(rng.integers(0, 1000))
    return op.snapshot()


def rows_of(state, prefix: str) -> dict:
    """Table id -> (sorted (key, count, value) rows, overflowed) of one table set."""
    return {
        tid: (sorted(zip(keys.tolist(), counts.tolist(), vals.tolist())), overflowed)
        for tid, keys, counts, vals, overflowed in unpack_tables(prefix, state.arrays)
    }


def same_window(a, b) -> None:
    for prefix in ("slices", "tails"):
        assert rows_of(a, prefix) == rows_of(b, prefix), prefix
    keys = ("next_start", "fired_until", "late_records", "size", "slide", "value_dtype")
    assert {k: a.meta[k] for k in keys} == {k: b.meta[k] for k in keys}


def spread(state, executors: int, partitions: int) -> list:
    """`state` (any executor count) cut by partition and merged onto `executors` (SSB states)."""
    after = Partitioning(partitions, executors)
    parts = split_partitions(state, after)
    return [merge_partitions([parts[p] for p in after.led_by(i).tolist()], after, i) for i in range(executors)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), windows=st.sampled_from([Tumbling(ms=50), Sliding(100, 25), Sliding(90, 30)]),
       fired=st.integers(-3, 5), executors=st.integers(1, 4), partitions=st.sampled_from([4, 16, 64]),
       uppar=st.booleans())
def test_a_window_state_split_by_partition_then_merged_is_the_state_again(seed, windows, fired, executors, partitions, uppar):
    whole = window_state(seed, windows, fired)
    ssb = spread(as_partitioned(whole), executors, partitions)  # one executor -> N (SSB leaders)
    led = Partitioning(partitions, executors)
    for i, state in enumerate(ssb):  # each holds exactly the keys of the partitions it leads
        for prefix in ("leader.slices", "leader.tails"):
            keys = state.arrays[f"{prefix}.keys"]
            assert (led.owner_of(keys) == i).all()
    if uppar:  # as UpPar owners' windows, and back
        parts = [as_partitioned(as_window(s), None, executors, i) for i, s in enumerate(ssb)]
    else:
        parts = ssb
    (back,) = spread_all(parts, partitions)
    same_window(as_window(back), whole)


def spread_all(states: list, partitions: int) -> list:
    """Every executor's state cut by partition, merged onto one executor."""
    after = Partitioning(partitions, 1)
    return [merge_partitions([part for s in states for part in split_partitions(s, after).values()], after, 0)]


# -- refusals -------------------------------------------------------------------------------------------------
def test_what_cannot_be_rescaled_is_refused_in_one_sentence(tmp_path, monkeypatch, capsys):
    records = job.records()[:5000]
    slashrt.run(job.flow(tmp_path / "out"), {"r": records}, checkpoint_dir=tmp_path / "chk", **RINGS)
    per_executor = PerExecutor(lambda i, n: records[i::n], deterministic=True)
    refused = (r"source 'rescale\.r' is a PerExecutor, whose stream make\(index, executors\) is another input on another "
               r"executor count .* resume it with executors=1, or give the input as an array")
    with pytest.raises(SlashError, match=refused):
        slashrt.run(job.flow(tmp_path / "out"), {"r": per_executor}, executors=2, checkpoint_dir=tmp_path / "chk",
                    resume_from="latest", partitions=16, **RINGS)
    # the command line: one line, exit 2, nothing run
    monkeypatch.setenv("SLASHRT_TEST_OUT", str(tmp_path / "out"))
    code = main(["run", f"{JOB}:per_executor_job", "--checkpoint-dir", str(tmp_path / "chk"), "--resume-from", "latest",
                 "--executors", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(refused, err), err
    # in the other mode on as many executors: the same path, the same refusals, the mode named
    slashrt.run(job.flow(tmp_path / "out2"), {"r": per_executor}, executors=2, mode="uppar",
                checkpoint_dir=tmp_path / "chk2", partitions=16, **RINGS)
    with pytest.raises(SlashError, match=r"^run\(\): checkpoint \d+ was taken in mode 'uppar' and cannot resume in mode "
                                         r"'slash': source 'rescale\.r' is a PerExecutor, .* resume it with "
                                         r"mode='uppar', or give the input as an array$"):
        slashrt.run(job.flow(tmp_path / "out2"), {"r": per_executor}, executors=2, mode="slash",
                    checkpoint_dir=tmp_path / "chk2", resume_from="latest", partitions=16, **RINGS)
    other = slashrt.Dataflow("rescale")
    other.source("r", job.SCHEMA, time="t").window(Tumbling(ms=10)).count(key="k").sink(slashrt.sinks.Collect())
    with pytest.raises(SlashError, match=r"holds state of step '[^']+', which this dataflow does not have: resume "
                                         "it with the dataflow that wrote it"):
        slashrt.run(other, {"r": records}, executors=2, checkpoint_dir=tmp_path / "chk", resume_from="latest", **RINGS)
