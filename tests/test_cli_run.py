"""`slashrt run` runs a user's job (tests/_cli_jobs.py) with every option on every path it claims
(real subprocesses: one executor, local clusters over shm and tcp in both modes, checkpoints and
resumes), and refuses every mistake in one line with exit status 2; `slashrt checkpoints` refuses
a directory or job that is not there the same way. (Stop with a savepoint and coordinator loss:
tests/snapshot/test_cli_resume.py.)"""

import json
import os
import signal
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slashrt.cli import main

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
JOBS = str(TESTS / "_cli_jobs.py")
sys.path.insert(0, str(TESTS))
import _cli_jobs  # noqa: E402

ROWS = _cli_jobs.expected_rows()


@pytest.fixture(autouse=True)
def _own_paths(monkeypatch):
    """`slashrt run FILE` puts the file's directory on the path (and PYTHONPATH): not beyond a test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def slashrt(*args: str, env=None) -> subprocess.CompletedProcess:
    """`slashrt ARGS` in a new process (killed if it outlives the timeout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "slashrt", *args], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, env=env)


def summary(*args: str, **kw) -> dict:
    done = slashrt("run", *args, "--json", **kw)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# -- the paths -------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [f"{JOBS}:counts", JOBS, f"{JOBS}:PAIR", "_cli_jobs:counts"],
                         ids=["function", "default-name", "object", "module"])
def test_a_job_runs_on_one_executor_in_every_form(target):
    result = summary(target, env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])})
    assert result["job"] == "counts" and result["executors"] == 1 and result["records"] == _cli_jobs.EVENTS
    assert result["outputs"] == {"counts.out": ROWS} and result["checkpoints"] == 0 and result["stopped"] is False


def test_the_human_summary_names_the_figures_and_the_outputs():
    done = slashrt("run", JOBS)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip() and not line.startswith("rows"))
    assert lines["job"].strip() == "counts" and lines["records"].strip() == f"{_cli_jobs.EVENTS:,}"
    assert re.search(rf"^rows counts\.out +{ROWS}$", done.stdout, re.M), done.stdout


@pytest.mark.parametrize(
    "options",
    [["--executors", "2", "--slots", "8", "--slot-size", "2048"], ["--executors", "2", "--transport", "tcp", "--mode", "uppar"],
     ["--transport", "shm", "--mode", "slash"]],
    ids=["2-shm-small-rings", "2-tcp-uppar", "1-shm-slash-cluster"],
)
def test_a_job_runs_on_a_local_cluster_with_the_same_result(options):
    result = summary(JOBS, *options)
    executors = int(options[options.index("--executors") + 1]) if "--executors" in options else 1
    assert result["executors"] == executors and result["outputs"] == {"counts.out": ROWS}


@pytest.mark.parametrize("options", [[], ["--executors", "2", "--mode", "slash"], ["--executors", "3", "--transport", "tcp",
                                     "--mode", "uppar"], ["--executors", "2"]], ids=["one", "2-slash", "3-tcp-uppar", "2-default"])
def test_a_window_behind_a_union_runs_in_either_mode_with_the_same_result(options):
    result = summary(f"{JOBS}:union_window_counts", *options)
    assert result["outputs"] == {"ucounts.out": _cli_jobs.expected_rows()}
    assert result["executors"] == (int(options[options.index("--executors") + 1]) if options else 1)


@pytest.mark.parametrize("executors", ["1", "2"])
def test_a_paced_job_reports_its_latency(executors):
    result = summary(f"{JOBS}:paced_counts", "--executors", executors)
    latency = result["latency"]["counts.out"]
    assert latency["rows"] == result["outputs"]["counts.out"] > 0 and result["seconds"] >= 0.2  # half a second of records
    assert 0 <= latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert "latency" not in summary(JOBS, "--executors", executors)  # no paced source: nothing measured


def test_small_rings_on_one_executor():
    assert summary(JOBS, "--slots", "4", "--slot-size", "512")["outputs"] == {"counts.out": ROWS}


def test_checkpoints_then_resume_from_a_number_and_from_latest(tmp_path):
    # the slow step makes the stream last about 1.7 s, so checkpoints every 1 ms land inside it
    # however loaded the machine (at full speed a loaded run took only its first, before any
    # record, and its final one)
    slow = f"{JOBS}:slow_counts"
    first = summary(slow, "--checkpoint-dir", str(tmp_path), "--checkpoint-interval", "1ms", "--slots", "4",
                    "--slot-size", "512")
    assert first["checkpoints"] >= 2 and first["outputs"] == {"slow-counts.out": ROWS}
    (job,) = json.loads(slashrt("checkpoints", str(tmp_path), "--json").stdout)["jobs"]
    assert job["job"] == "slow-counts" and job["checkpoints"][-1]["checkpoint"] == first["latest_checkpoint"]
    assert job["checkpoints"][-1]["kind"] == "final"
    # one taken in the middle of the stream: the resume reads what it had not fed plus what it
    # held in flight (replayed), and only that. Resumed first: a later run's checkpoints push the
    # kept ones out.
    fed = {c["checkpoint"]: sum(c["sources"].values()) for c in job["checkpoints"]}
    older = max(n for n, records in fed.items() if 0 < records < _cli_jobs.EVENTS)
    in_flight = {c["checkpoint"]: c["in_flight"] for c in job["checkpoints"]}[older]
    from_number = summary(slow, "--checkpoint-dir", str(tmp_path), "--resume-from", str(older))
    assert from_number["resumed_from"] == older, from_number
    assert from_number["records"] == _cli_jobs.EVENTS - fed[older] + in_flight, (from_number, fed, in_flight)
    assert 0 < from_number["outputs"]["slow-counts.out"] < ROWS  # the windows the first run had not fired
    # the newest is now that resume's final checkpoint, which covers the whole input
    (job,) = json.loads(slashrt("checkpoints", str(tmp_path), "--json").stdout)["jobs"]
    newest = job["checkpoints"][-1]
    assert newest["kind"] == "final" and newest["checkpoint"] == from_number["latest_checkpoint"] > first["latest_checkpoint"]
    again = summary(slow, "--checkpoint-dir", str(tmp_path), "--resume-from", "latest")
    assert again["resumed_from"] == newest["checkpoint"] and again["records"] == 0


@pytest.mark.parametrize("options", [("--executors", "2"), ("--transport", "tcp"), ("--executors", "2", "--mode", "uppar")],
                         ids=["2-shm-slash", "1-tcp", "2-shm-uppar"])
def test_checkpoints_on_a_local_cluster_then_resume(tmp_path, options):
    first = summary(JOBS, *options, "--checkpoint-dir", str(tmp_path), "--checkpoint-interval", "1ms", "--slots", "4",
                    "--slot-size", "512")
    assert first["checkpoints"] >= 1 and first["outputs"] == {"counts.out": ROWS}
    listed = json.loads(slashrt("checkpoints", str(tmp_path), "--json").stdout)
    (job,) = listed["jobs"]
    assert job["checkpoints"][-1]["checkpoint"] == first["latest_checkpoint"]
    # the final checkpoint covers the whole input: a resume from it has nothing left to do
    again = summary(JOBS, *options, "--checkpoint-dir", str(tmp_path), "--resume-from", "latest")
    assert again["resumed_from"] == first["latest_checkpoint"] and again["records"] == 0


@pytest.mark.parametrize("options", [(), ("--executors", "2")], ids=["one-executor", "2-shm"])
def test_alignment_timeout_is_honoured_on_every_path(tmp_path, options):
    """A slow step keeps the 4-slot rings full: taken unaligned at once, checkpoints hold the
    records in flight (the summary counts them; `slashrt checkpoints` shows the records of
    those it kept); always aligned, none does."""
    for timeout in ("0", "none"):
        directory = tmp_path / timeout
        done = summary(f"{JOBS}:slow_counts", *options, "--checkpoint-dir", str(directory), "--checkpoint-interval",
                       "20ms", "--alignment-timeout", timeout, "--slots", "4", "--slot-size", "512")
        assert done["outputs"] == {"slow-counts.out": ROWS} and done["checkpoints"] >= 10, done
        (job,) = json.loads(slashrt("checkpoints", str(directory), "--json").stdout)["jobs"]
        kept = [c["in_flight"] for c in job["checkpoints"]]
        if timeout == "0":  # (not all: one that finds the rings empty holds nothing in flight)
            assert done["unaligned_checkpoints"] >= 3, done
        else:
            assert done["unaligned_checkpoints"] == 0 and kept == [0] * len(kept), (done, kept)


@pytest.mark.parametrize("options", [(), ("--executors", "2", "--transport", "tcp")], ids=["one-executor", "2-tcp"])
def test_restart_none_is_honoured_on_every_path(tmp_path, options):
    done = summary(JOBS, *options, "--checkpoint-dir", str(tmp_path), "--restart", "none")
    assert done["recoveries"] == 0 and done["outputs"] == {"counts.out": ROWS}
    # how long the executors took to start: a cluster's (its zygote, forks, mesh), none in this process
    assert (done["startup_s"] is None) if not options else 0 < done["startup_s"] < 60, done


def test_restart_recovers_a_sigkilled_executor_on_a_local_cluster(tmp_path):
    from slashrt.bench.chaos import published

    (tmp_path / "marks").mkdir()
    env = {"CLI_JOBS_OUT": str(tmp_path / "out"), "SLASHRT_CHAOS_KILLS": "pre_commit:2",
           "SLASHRT_CHAOS_DIR": str(tmp_path / "marks")}
    done = summary(f"{JOBS}:csv_counts", "--executors", "2", "--checkpoint-dir", str(tmp_path / "chk"),
                   "--checkpoint-interval", "5ms", "--slots", "4", "--slot-size", "512",
                   "--restart", "fixed-delay:attempts=2,delay=10ms", env=env)
    assert done["recoveries"] == 1 and (tmp_path / "marks" / "kill-0").exists()
    rows = published(tmp_path / "out")
    assert max(rows.values()) == 1 and len(rows) == ROWS  # every row once: nothing lost, nothing twice


def test_restart_recovers_a_transactional_collect_on_a_local_cluster(tmp_path):
    (tmp_path / "marks").mkdir()
    env = {"SLASHRT_CHAOS_KILLS": "commit:1", "SLASHRT_CHAOS_DIR": str(tmp_path / "marks")}
    done = summary(f"{JOBS}:collect_counts", "--executors", "2", "--transport", "tcp", "--checkpoint-dir",
                   str(tmp_path / "chk"), "--checkpoint-interval", "5ms", "--slots", "4", "--slot-size", "512",
                   "--restart", "fixed-delay:attempts=2,delay=10ms", env=env)
    # killed after a commit, before its records reached the coordinator: every row once all the same
    assert done["recoveries"] == 1 and (tmp_path / "marks" / "kill-0").exists()
    assert done["outputs"] == {"collect-counts.out": ROWS}


@pytest.mark.parametrize(("failover", "restarted"), [("region", 1), ("job", 3)])
def test_failover_chooses_what_a_restart_restarts(tmp_path, failover, restarted):
    (tmp_path / "marks").mkdir()
    env = {"SLASHRT_CHAOS_KILLS": "pre_commit:2", "SLASHRT_CHAOS_DIR": str(tmp_path / "marks")}
    done = summary(f"{JOBS}:numbered", "--executors", "3", "--checkpoint-dir", str(tmp_path / "chk"),
                   "--checkpoint-interval", "20ms", "--slots", "4", "--slot-size", "512",
                   "--restart", "fixed-delay:attempts=2,delay=10ms", "--failover", failover, env=env)
    assert done["recoveries"] == 1 and (tmp_path / "marks" / "kill-0").exists()
    assert [len(r) for r in done["restarted"]] == [restarted], done
    assert done["outputs"] == {"numbered.out": _cli_jobs.EVENTS}  # every record once


def test_resume_from_latest_without_a_checkpoint_runs_from_the_start_and_says_so(tmp_path):
    done = slashrt("run", JOBS, "--checkpoint-dir", str(tmp_path), "--resume-from", "latest")
    assert done.returncode == 0, done.stderr
    assert "no complete checkpoint of job 'counts'" in done.stderr
    assert re.search(r"^resumed_from +None$", done.stdout, re.M), done.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_without_a_checkpoint_directory_a_signal_aborts_at_once(signum):
    proc = subprocess.Popen([sys.executable, "-m", "slashrt", "run", f"{JOBS}:paused"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline() == "at batch\n"
        proc.send_signal(signum)
        out, err = proc.communicate("\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == 130 and out == "" and one_error_line(err) == "slashrt: interrupted"


LATE_SIGNAL = """
import os, signal, sys
from slashrt import _cli_run
from slashrt.cli import main

figures = _cli_run.summary

def summary(*args):  # the job is over: the signal comes while its figures are printed
    out = figures(*args)
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return out

_cli_run.summary = summary
sys.exit(main(["run", *sys.argv[2:]]))
"""


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("options", [[], ["--executors", "2", "--checkpoint-dir", "{chk}"]], ids=["one", "cluster"])
def test_a_signal_after_the_job_ended_leaves_its_figures_and_exit_0(tmp_path, signum, options):
    options = [o.format(chk=tmp_path) for o in options]
    done = subprocess.run([sys.executable, "-c", LATE_SIGNAL, signum, JOBS, "--json", *options], capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["outputs"] == {"counts.out": ROWS}


def test_a_run_inside_a_program_gives_its_signal_handlers_back(capsys):
    """main() run in-process (a test, a notebook) ignores late signals only while it prints:
    after it, SIGINT and SIGTERM are as before (children started later would inherit an ignore,
    e.g. a server that a SIGTERM then no longer stops)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert main(["run", JOBS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == {"counts.out": ROWS}
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_failed_cluster_run_says_its_cause_once_without_the_other_executors_echoes(transport):
    """Executor 1's step fails; executors 0 and 2 lose their channels to it. The user reads the
    cause once, not the others' "channel lost" and "job failed: ChannelClosed" lines before it."""
    done = slashrt("run", f"{JOBS}:fails_on_one_executor", "--executors", "3", "--transport", transport,
                   "--slots", "8", "--slot-size", "4096")
    assert done.returncode == 2
    assert one_error_line(done.stderr) == ("slashrt: error: step 'counts.refuse': user function raised ValueError: "
                                           "a negative key (on executor 1)")


LINEAR = ("held_counts", "counts.out", _cli_jobs.HELD_WINDOW, "counts.events")
UNION = ("held_union_counts", "ucounts.out", _cli_jobs.HELD_UNION_WINDOW, "ucounts.events")


@pytest.mark.parametrize(
    "job, options",
    [(LINEAR, []), (LINEAR, ["--executors", "2", "--mode", "uppar", "--slots", "8"]),
     (LINEAR, ["--executors", "3", "--transport", "tcp", "--slots", "8", "--slot-size", "2048"]),
     (UNION, []), (UNION, ["--executors", "2", "--slots", "8"]),
     (UNION, ["--executors", "3", "--transport", "tcp", "--slots", "8", "--slot-size", "2048"])],
    ids=["linear-one-executor", "linear-2-shm-uppar", "linear-3-tcp", "union-one-executor", "union-2-shm", "union-3-tcp"],
)
def test_report_names_the_executor_holding_the_window_back_while_the_job_runs_and_after(tmp_path, job, options):
    """The job's waiting source goes on only once the report file names its executor as holding
    the window back (`_cli_jobs.held_counts`, and with a union before the count
    `held_union_counts`): the file was written while the job ran (every executor's view counts
    the waiting source's capability, the one executor holding it is named), and again at its end."""
    name, output, window, source = job
    report = tmp_path / "job.json"
    result = summary(f"{JOBS}:{name}", "--report", str(report), "--report-every", "20ms", *options,
                     env={"CLI_JOBS_REPORT": str(report)})
    assert result["outputs"] == {output: ROWS}
    executors, holder = result["executors"], min(1, result["executors"] - 1)
    stuck = json.loads(Path(f"{report}.stuck").read_text())
    (hold,) = stuck["holding"][window]
    assert stuck["state"] == "running" and hold["at"] == f"{source}.out0" and hold["held_by"] == [holder]
    shown = slashrt("frontiers", f"{report}.stuck")
    assert shown.returncode == 0 and f"flow {output.split('.')[0]}: running" in shown.stdout, shown.stderr
    assert f"held by capability of source {source} (its watermark) at {source}.out0 ({hold['time'][0]})" \
        in shown.stdout and f", held by executor {holder}" in shown.stdout, shown.stdout
    final = json.loads(report.read_text())
    assert final["state"] == "finished" and final["frontiers"][window] == [] and final["holding"] == {}
    assert all(f == [] for f in final["frontiers"].values()) and final["pointstamps"] == []
    assert len(final.get("executors", [None])) == executors


# -- mistakes: one line, exit 2 --------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("checkpointed")
    assert main(["run", JOBS, "--checkpoint-dir", str(directory)]) == 0
    (directory / "counts" / "chk-7").mkdir()  # a checkpoint whose run died before its manifest
    return directory


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "nowhere/job.py"], "job file nowhere/job.py does not exist"),
        (["run", "no_such_module_here:job"], "no module named 'no_such_module_here'"),
        (["run", f"{JOBS}:missing"], "has no 'missing' (its functions and classes: "),
        (["run", f"{JOBS}:not-a-name"], "is not a Python name"),
        (["run", f"{JOBS}:not_a_job"], "gave int; a job is (flow, inputs)"),
        (["run", f"{JOBS}:needs_an_argument"], "cannot be called without arguments (missing a required argument: 'n'): a job function takes none"),
        (["run", f"{JOBS}:broken"], "raised ValueError: no data today (" + JOBS),
        (["run", f"{JOBS}:records"], "gave ndarray; a job is (flow, inputs)"),
        (["run", JOBS, "--resume-from", "latest"], "--resume-from needs --checkpoint-dir"),
        (["run", JOBS, "--checkpoint-interval", "1s"], "--checkpoint-interval needs --checkpoint-dir"),
        (["run", JOBS, "--tolerable-checkpoint-failures", "2"], "--tolerable-checkpoint-failures needs --checkpoint-dir"),
        (["run", JOBS, "--alignment-timeout", "0"], "--alignment-timeout needs --checkpoint-dir"),
        (["run", JOBS, "--checkpoint-dir", "CHK", "--alignment-timeout", "10ms"],
         "--alignment-timeout applies to periodic checkpoints: give --checkpoint-interval too"),
        (["run", JOBS, "--checkpoint-dir", "CHK", "--resume-from", "99"], "checkpoint 99 does not exist in "),
        (["run", JOBS, "--checkpoint-dir", "CHK", "--resume-from", "7"], "checkpoint 7 has no manifest"),
        (["run", f"{JOBS}:other_dataflow", "--checkpoint-dir", "CHK", "--resume-from", "latest"],
         "written by another dataflow"),
        (["run", JOBS, "--slot-size", "8"], "slot_size=8"),
        (["run", JOBS, "--restart", "fixed-delay"], "--restart needs --checkpoint-dir"),
        (["run", JOBS, "--executors", "2", "--checkpoint-dir", "CHK", "--failover", "region"],
         "--failover chooses what --restart restarts: give --restart STRATEGY too"),
        (["run", JOBS, "--checkpoint-dir", "CHK", "--restart", "fixed-delay", "--failover", "region"],
         "--restart needs --executors N: a run on one executor lives in this process"),
        (["run", JOBS, "--checkpoint-dir", "CHK", "--restart", "fixed-delay:attempts=2"],
         "--restart needs --executors N: a run on one executor lives in this process"),
        (["run", JOBS, "--executors", "2", "--checkpoint-dir", "CHK", "--restart", "fixed-delay"],
         "sink 'counts.out' is a Collect without transactional=True, which would return again what a recovery replays"),
        (["bench", "chaos", "--executors", "1"], "--executors 1: a run on one executor cannot restart itself"),
        (["bench", "chaos", "--redis", "--executors", "1"], "--executors 1: a run on one executor cannot restart itself"),
        (["bench", "chaos", "--query", "nexmark", "--campaigns", "10"], "--campaigns applies to --query ysb"),
        (["bench", "chaos", "--redis", "--sink", "collect"], "--sink: the --redis trial writes to a transactional Redis"),
        (["run", JOBS, "--report-every", "1"], "--report-every needs --report"),
        (["run", JOBS, "--report", "nowhere/at/job.json"], "--report nowhere/at/job.json: directory nowhere/at does not exist"),
        (["run", JOBS, "--progress", "pointstamp"],
         "--progress was removed: every dataflow runs on pointstamp progress (one tracker over its graph); leave it out"),
        (["run", "--progress=watermark", f"{JOBS}:union_window_counts", "--executors", "2"], "--progress was removed: "),
        (["checkpoints", "nowhere/at/all"], "nowhere/at/all is not a directory"),
        (["checkpoints", "CHK", "--job", "orders"], "no checkpoints of job 'orders' in "),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(capsys, checkpointed, argv, message):
    argv = [a.replace("CHK", str(checkpointed)) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert line.startswith("slashrt: error: ") and message in line, line
    assert captured.out == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", JOBS, "--checkpoint-interval", "soon"], "must be a duration > 0"),
        (["run", JOBS, "--checkpoint-interval", "0"], "must be a duration > 0"),
        (["run", JOBS, "--alignment-timeout", "soon"], "the alignment timeout must be a duration >= 0"),
        (["run", JOBS, "--resume-from", "first"], "is neither 'latest' nor a checkpoint number"),
        (["run", JOBS, "--executors", "0"], "must be positive"),
        (["run", JOBS, "--mode", "fast"], "invalid choice"),
        (["run", JOBS, "--report", "r.json", "--report-every", "-1"], "the interval must be a duration > 0"),
        (["run", JOBS, "--restart", "sometimes"], "restart strategy must be one of none, fixed-delay, failure-rate"),
        (["run", JOBS, "--restart", "fixed-delay:attempts=-1"], "attempts must be a whole number >= 0"),
    ],
)
def test_a_bad_option_value_is_refused_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1] and "Traceback" not in err


def test_a_mistake_in_a_subprocess_is_one_line_too(tmp_path):
    done = slashrt("run", f"{JOBS}:broken")
    assert done.returncode == 2 and one_error_line(done.stderr).endswith(")") and done.stdout == ""
