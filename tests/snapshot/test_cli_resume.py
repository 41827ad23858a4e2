"""Coordinator loss and stop with a savepoint through `slashrt run` (real processes, real signals).

The job (`_cli_job.py`, the chaos job of `_checkpoint_child.py`) pauses at a chosen point of the
checkpoint protocol and says so; the test then acts on the `slashrt run` process there:

- coordinator loss: SIGKILL (on one executor the coordinator is the executor too) at chosen
  points and at seeded random ones, once or twice in a row; `slashrt run ... --resume-from latest`
  then finishes the job from the checkpoint directory, and the committed CSV output equals the
  failure-free run's exactly;
- SIGTERM, or SIGINT (Ctrl-C): the run stops with a final savepoint and reports it (exit 0);
  resuming from it continues exactly where it stopped; a second SIGINT aborts at once (exit
  130), and a resume from the latest checkpoint is still exactly once; on a cluster
  (`--executors N`) signalled by an operator of an agent, for a tree flow and a graph flow;
- `slashrt checkpoints` lists what the directory holds: the savepoint as such, an incomplete
  checkpoint and a corrupt one with why.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from slashrt.cli import main

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
JOB = str(HERE / "_cli_job.py")
OUTPUTS = ("out_a", "late_a", "out_bc")


@contextlib.contextmanager
def slashrt_run(directory: Path, *options: str, at: str = "", job: str = JOB, env: dict | None = None):
    """`slashrt run` of the job writing under `directory` (checkpoints in directory/chk), paused
    at `at`; killed when the block ends, however it ends, and after 120 s in any case (a cluster's
    coordinator reaps its agents when killed by a signal; agents exit when it is gone)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLASHRT_TEST_OUT": str(directory), "SLASHRT_TEST_AT": at, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slashrt", "run", job, "--checkpoint-dir", str(directory / "chk"),
         "--checkpoint-interval", "5ms", "--slots", "8", "--slot-size", "2048", *options],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def reach(proc, point: str) -> None:
    """Wait until the run paused at `point` (it then waits for a line on its standard input)."""
    line = proc.stdout.readline()
    assert line == f"at {point}\n", (line, proc.poll())


def go_on(proc) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()


def finish(proc) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def resume(directory: Path, frm: str = "latest") -> dict:
    with slashrt_run(directory, "--resume-from", frm, "--json") as proc:
        code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    return json.loads(out)


def published(directory: Path, outputs=OUTPUTS) -> dict[str, list[str]]:
    """Every sink's committed rows (what a reader of its directory sees), sorted."""
    return {name: sorted(line for part in (directory / name).glob("part-*.csv")
                         for line in part.read_text().splitlines()[1:]) for name in outputs}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("reference")
    with slashrt_run(directory, "--json") as proc:
        code, out, err = finish(proc)
    assert code == 0, err
    assert json.loads(out)["records"] == 380_000
    rows = published(directory)
    assert all(rows.values()) and len(rows["late_a"]) > 100
    return rows


# each point is passed more often than its k in every run (3 sinks pre-commit and 8 parts are
# written per checkpoint, and each run takes more than 5 checkpoints)
# (test_checkpoint_run.py kills the Python child at every point of the protocol; here the
# `slashrt run` process at the points that matter most for the resume, and at random ones)
RANDOM = np.random.default_rng(4)
KILLS = [
    pytest.param(["complete:3"], id="after-manifest-before-commit"),
    pytest.param(["write_part:5", "pre_commit:2"], id="twice-in-a-row"),
    *(pytest.param([f"{point}:{RANDOM.integers(1, top)}"], id=f"seeded-{point}")
      for point, top in [("pre_commit", 15), ("write_part", 30)]),
]


@pytest.mark.parametrize("kills", KILLS)
def test_coordinator_loss_then_resume_from_the_cli_is_exactly_once(tmp_path, reference, kills):
    for point in kills:
        with slashrt_run(tmp_path, "--resume-from", "latest", at=point) as proc:
            reach(proc, point)
            proc.send_signal(signal.SIGKILL)
            code, out, _ = finish(proc)
        assert code == -signal.SIGKILL and out == ""
    result = resume(tmp_path)
    assert result["stopped"] is False and (result["resumed_from"] is None or result["records"] < 380_000)
    assert published(tmp_path) == reference


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_with_a_savepoint_and_a_resume_continues_there(tmp_path, reference, signum, capsys):
    with slashrt_run(tmp_path, at="pre_commit:4") as proc:
        reach(proc, "pre_commit:4")
        proc.send_signal(signum)
        go_on(proc)
        code, out, err = finish(proc)
    assert code == 0, err
    assert f"{signal.Signals(signum).name}: stopping with a savepoint" in err
    savepoint = int(out.split("stopped with savepoint ")[1].split(":")[0])
    assert "--resume-from" in out and re.search(rf"^savepoint +{savepoint}$", out, re.M), out
    assert main(["checkpoints", str(tmp_path / "chk"), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    last = job["checkpoints"][-1]
    assert (last["checkpoint"], last["status"], last["kind"]) == (savepoint, "complete", "savepoint")
    assert 0 < sum(last["sources"].values()) < 380_000
    result = resume(tmp_path, str(savepoint))
    assert result["resumed_from"] == savepoint and result["records"] == 380_000 - sum(last["sources"].values())
    assert published(tmp_path) == reference


def test_a_second_ctrl_c_aborts_at_once_and_a_resume_is_still_exactly_once(tmp_path, reference):
    # the first Ctrl-C during checkpoint 1; the second while the next (the savepoint, or one
    # already under way) is pre-committed, before anything commits it
    with slashrt_run(tmp_path, at="pre_commit:3,pre_commit:6") as proc:
        reach(proc, "pre_commit:3")
        proc.send_signal(signal.SIGINT)
        go_on(proc)
        reach(proc, "pre_commit:6")
        proc.send_signal(signal.SIGINT)
        go_on(proc)
        code, out, err = finish(proc)
    assert code == 130 and out == "", (code, out, err)
    assert err.splitlines()[-1] == "slashrt: interrupted"
    resume(tmp_path)
    assert published(tmp_path) == reference


def test_checkpoints_lists_complete_incomplete_and_corrupt_ones(tmp_path, capsys):
    # 3 complete, then a later one half written (8 parts a checkpoint, up to 11 when it is taken
    # unaligned: its 3 sources' records in flight; the 34th comes after the 3rd manifest)
    with slashrt_run(tmp_path, at="complete:3,write_part:34") as proc:
        reach(proc, "complete:3")
        go_on(proc)
        reach(proc, "write_part:34")
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    chk = tmp_path / "chk"
    assert main(["checkpoints", str(chk), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    status = {c["checkpoint"]: c["status"] for c in job["checkpoints"]}
    complete = [n for n, s in status.items() if s == "complete"]
    assert complete and status[max(status)] == "incomplete", status
    newest = max(complete)
    part = sorted((chk / "chaos" / f"chk-{newest}").glob("*.state"))[0]
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    part.write_bytes(bytes(raw))
    assert main(["checkpoints", str(chk / "chaos")]) == 0  # a job's own directory works too
    text = capsys.readouterr().out
    assert text.startswith("job chaos (") and f"chk-{newest:<6} corrupt: snapshot {part} is corrupt" in text
    assert f"chk-{max(status):<6} incomplete: no manifest" in text
    for n in complete[:-1]:
        assert f"chk-{n:<6} complete  checkpoint " in text and "records fed: chaos.a " in text
    # listing changed nothing: every checkpoint directory is still there
    assert sorted(int(p.name[4:]) for p in (chk / "chaos").glob("chk-*")) == sorted(status)


# -- a cluster: `slashrt run --executors N`, signalled by an operator of one of its agents ----------
CLUSTER_JOB = f"{JOB}:cluster"


@pytest.fixture(scope="module")
def cluster_reference(tmp_path_factory) -> dict[str, list[str]]:
    """The cluster job's committed output, run uninterrupted on one executor in this process."""
    import importlib
    import slashrt

    directory = tmp_path_factory.mktemp("cluster-reference")
    sys.path.insert(0, str(HERE))
    try:
        os.environ["SLASHRT_TEST_OUT"] = str(directory)
        flow, inputs = importlib.import_module("_cli_job").cluster()
        slashrt.run(flow, inputs, checkpoint_dir=directory / "chk")
    finally:
        sys.path.remove(str(HERE))
        del os.environ["SLASHRT_TEST_OUT"]
    rows = published(directory, ("out", "late"))
    assert rows["out"] and len(rows["late"]) > 1000
    return rows


def cluster_checkpoints(directory: Path, capsys) -> list[dict]:
    assert main(["checkpoints", str(directory / "chk"), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    return job["checkpoints"]


def test_sigterm_stops_a_cluster_with_a_savepoint_and_a_resume_on_another_transport_continues(
    tmp_path, cluster_reference, capsys
):
    with slashrt_run(tmp_path, "--executors", "2", job=CLUSTER_JOB, env={"SLASHRT_TEST_SIGNAL": "10000:SIGTERM"}) as proc:
        code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "SIGTERM: stopping with a savepoint" in err and "Traceback" not in err, err
    assert "channel lost its" not in err, err  # no executor took the others' stop for a failure
    savepoint = int(out.split("stopped with savepoint ")[1].split(":")[0])
    last = cluster_checkpoints(tmp_path, capsys)[-1]
    assert (last["checkpoint"], last["status"], last["kind"], last["executors"]) == (savepoint, "complete", "savepoint", 2)
    assert 0 < sum(last["sources"].values()) < 100_000  # the stop came in the middle of the stream
    with slashrt_run(tmp_path, "--executors", "2", "--transport", "tcp", "--resume-from", "latest", "--json",
                     job=CLUSTER_JOB) as proc:
        code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert json.loads(out)["resumed_from"] == savepoint
    assert published(tmp_path, ("out", "late")) == cluster_reference


def test_a_second_signal_aborts_a_cluster_and_a_resume_is_still_exactly_once(tmp_path, cluster_reference):
    env = {"SLASHRT_TEST_SIGNAL": "10000:SIGTERM+SIGINT"}  # both at once: a stop, then an abort
    with slashrt_run(tmp_path, "--executors", "3", "--transport", "tcp", job=CLUSTER_JOB, env=env) as proc:
        code, out, err = finish(proc)
    assert code == 130 and out == "", (code, out, err[-3000:])
    assert err.splitlines()[-1] == "slashrt: interrupted"
    with slashrt_run(tmp_path, "--executors", "3", "--transport", "tcp", "--resume-from", "latest", "--json",
                     job=CLUSTER_JOB) as proc:
        code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert published(tmp_path, ("out", "late")) == cluster_reference


def test_sigterm_stops_a_graph_flow_on_a_cluster_and_a_resume_continues_exactly_once(tmp_path, capsys):
    """The acyclic graph flow (`_cli_job.graph`) on 2 executors over shm, rings of four 256-byte
    slots: an operator's SIGTERM stops it with a savepoint mid-job; the resume on 3 executors
    over tcp (the savepoint's windows and the user operator's keyed state cut by key) publishes,
    with what the stopped run committed, one uninterrupted run's output."""
    import slashrt
    from tests.snapshot import _graph_flow

    slashrt.run(_graph_flow.flow(tmp_path / "ref"), _graph_flow.inputs(), checkpoint_dir=tmp_path / "ref-chk")
    reference = published(tmp_path / "ref", _graph_flow.SINKS)
    options = ("--executors", "2", "--slots", "4", "--slot-size", "256")
    with slashrt_run(tmp_path, *options, job=f"{JOB}:graph", env={"SLASHRT_TEST_SIGNAL": "500:SIGTERM"}) as proc:
        code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "SIGTERM: stopping with a savepoint" in err and "Traceback" not in err, err
    savepoint = int(out.split("stopped with savepoint ")[1].split(":")[0])
    last = cluster_checkpoints(tmp_path, capsys)[-1]
    assert (last["checkpoint"], last["kind"], last["executors"]) == (savepoint, "savepoint", 2)
    assert sum(last["sources"].values()) < 2 * _graph_flow.N  # mid-job
    assert published(tmp_path, _graph_flow.SINKS) != reference
    rescaled = ("--executors", "3", "--transport", "tcp", "--slots", "4", "--slot-size", "256")
    with slashrt_run(tmp_path, *rescaled, "--resume-from", "latest", "--json", job=f"{JOB}:graph") as proc:
        code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert (json.loads(out)["resumed_from"], json.loads(out)["executors"]) == (savepoint, 3)
    assert published(tmp_path, _graph_flow.SINKS) == reference

