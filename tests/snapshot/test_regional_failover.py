"""Regional failover (`failover="region"`): a job whose executors exchange nothing is a region
per executor (`cluster._execution_plan`), so a killed executor is restarted alone, from the
newest complete checkpoint, while the others run on; the output is exactly the failure-free
run's. A job with an exchange is one region: every executor restarts, and the recovery says so,
as it does with the default `failover="job"`."""

import collections
import os
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.bench import chaos
from slashrt.bench.chaos import ChaosCollect

from slashrt.transport._auth import generate_secret

from tests._cli_jobs import Numbered
from tests.snapshot._paced import Paced
from tests.snapshot.test_recovery import bounded

SCHEMA = Schema({"t": "i8", "k": "i8"})
OUT = {"t": "i8", "k": "i8", "seen": "i8"}


class RunningCount(Numbered):
    """Each record with how many records its executor had seen up to it (`Numbered`: state that
    a restart from a checkpoint must restore exactly). Every process that unpickles it leaves a
    file in `started` naming its parent: the agents' is the run's zygote, the zygote's the test."""

    def __init__(self, started):
        super().__init__()
        self.started = str(started)

    def __setstate__(self, state):
        self.__dict__.update(state)
        with open(os.path.join(self.started, f"process-{os.getpid()}"), "w") as f:
            f.write(str(os.getppid()))


def records(n: int) -> np.ndarray:
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n)
    out["k"] = np.arange(n) * 7 % 1001
    return out


def pipelines(sink, pace: Paced, started) -> Dataflow:
    flow = Dataflow("pipelines")
    flow.source("r", SCHEMA, time="t").filter(pace, name="paced").operator(RunningCount(started), schema=OUT).sink(
        sink, name="out")
    return flow


def windowed(sink, pace: Paced, started) -> Dataflow:
    flow = Dataflow("windowed")
    flow.source("r", SCHEMA, time="t").filter(pace, name="paced").operator(RunningCount(started), schema=OUT).window(
        Tumbling(ms=100)).count(key="k").sink(sink, name="out")
    return flow


def run(tmp_path, make_flow, executors: int, kills: str, monkeypatch, failover="region",
        restart="fixed-delay:attempts=3,delay=0"):
    """`make_flow` on `executors` with checkpoints, a restart strategy and `failover`; with `kills`, the chaos
    hooks fire them (`slashrt.bench.chaos`) and every batch is 10 ms slower until they did, in
    every process: the job cannot end first. Returns the result and the processes that ran."""
    marks, started = tmp_path / "marks", tmp_path / "started"
    marks.mkdir(parents=True)
    started.mkdir()
    if kills:
        monkeypatch.setenv(chaos.KILLS_ENV, kills)
        monkeypatch.setenv(chaos.MARKS_ENV, str(marks))
    pace = Paced(seconds=0.01 if kills else 0.0, until=(marks, len(kills.split(";"))) if kills else None)
    result = bounded(make_flow(ChaosCollect(transactional=True), pace, started), {"r": records(60_000)}, seconds=120,
                     executors=executors, checkpoint={"interval": 0.05, "keep": 2}, failover=failover,
                     checkpoint_dir=tmp_path / "chk", restart=restart, slots=8, slot_size=4096)
    return result, sum(p.read_text() != str(os.getpid()) for p in started.iterdir())  # (not the zygote)


def rows(result) -> collections.Counter:
    out = result.outputs["pipelines.out" if "pipelines.out" in result.outputs else "windowed.out"]
    return collections.Counter(map(tuple, out.tolist()))


@pytest.mark.parametrize(("executors", "kills"), [
    (8, "pre_commit:2"),  # a sink pre-committed, its checkpoint not complete
    (4, "async:3"),  # a state part written, its checkpoint not acknowledged
    (4, "pre_commit:2;pre_commit:2"),  # and the replacement killed in turn
])
def test_a_killed_executor_of_independent_pipelines_restarts_alone_and_the_output_is_exact(tmp_path, monkeypatch,
                                                                                          executors, kills):
    reference, processes = run(tmp_path / "reference", pipelines, executors, "", monkeypatch)
    assert reference.recoveries == [] and processes == executors
    assert sum(rows(reference).values()) == 60_000 and max(rows(reference).values()) == 1
    result, processes = run(tmp_path / "killed", pipelines, executors, kills, monkeypatch)
    assert len(result.recoveries) == len(kills.split(";")), result.recoveries
    for recovery in result.recoveries:
        assert "killed by signal 9 (SIGKILL)" in recovery["cause"] and len(recovery["restarted"]) == 1, recovery
        assert recovery["seconds"] >= recovery["restore_s"] > 0
    assert processes == executors + len(result.recoveries)  # each replacement once more, the others once
    assert rows(result) == rows(reference)  # each record once, with the count its executor had reached


class Supervised:
    """`slashrt executor` agents at fixed addresses, each restarted by this supervisor (a thread
    per agent) whenever its process ends, as systemd would; `starts[i]` counts agent i's
    processes. Stopped (and every process killed) on leaving."""

    def __init__(self, n: int, secret: bytes):
        self.env = {**os.environ, "SLASHRT_SECRET": secret.hex(), "PYTHONPATH": os.pathsep.join(sys.path)}
        self.ports = [_free_port() for _ in range(n)]
        self.starts = [0] * n
        self.procs: list = [None] * n
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._keep, args=(i,), daemon=True) for i in range(n)]

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    def _keep(self, i: int) -> None:
        while not self.stopping.is_set():
            self.starts[i] += 1
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", "slashrt", "executor", "--listen", self.addresses[i]], env=self.env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            self.procs[i].wait()

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        for port in self.ports:  # every agent listens before the job starts
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"no agent listening on port {port}"
                    time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.kill()
        for thread in self.threads:
            thread.join(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agents_at_addresses_under_a_supervisor_restart_a_killed_one_alone(tmp_path, monkeypatch):
    """An agent at an address that dies comes back at its address (its supervisor restarts it):
    only its region is reached again and restarts from the checkpoint, the others run on."""
    reference, _ = run(tmp_path / "reference", pipelines, 3, "", monkeypatch)
    marks, started = tmp_path / "marks", tmp_path / "started"
    marks.mkdir()
    started.mkdir()
    monkeypatch.setenv(chaos.KILLS_ENV, "pre_commit:2")
    monkeypatch.setenv(chaos.MARKS_ENV, str(marks))
    secret = generate_secret()
    with Supervised(3, secret) as agents:
        result = bounded(pipelines(ChaosCollect(transactional=True), Paced(seconds=0.01, until=(marks, 1)), started),
                         {"r": records(60_000)}, seconds=120, executors=agents.addresses, secret=secret,
                         checkpoint={"interval": 0.05, "keep": 2}, failover="region", checkpoint_dir=tmp_path / "chk",
                         restart="fixed-delay:attempts=3,delay=0", slots=8, slot_size=4096)
        starts = list(agents.starts)
    (recovery,) = result.recoveries
    assert len(recovery["restarted"]) == 1 and "lost its control connection" in recovery["cause"], recovery
    (killed,) = recovery["restarted"]
    assert starts[killed] == 2 and [n for i, n in enumerate(starts) if i != killed] == [1, 1], starts
    assert rows(result) == rows(reference)  # each record once, with the count its executor had reached


def test_a_killed_executor_of_an_exchanging_job_restarts_every_executor(tmp_path, monkeypatch):
    result, processes = run(tmp_path, windowed, 3, "pre_commit:2", monkeypatch)
    (recovery,) = result.recoveries
    assert recovery["restarted"] == [0, 1, 2] and processes == 6, recovery
    data, out = records(60_000), result.outputs["windowed.out"]
    expected = np.unique(np.column_stack([data["t"] // 100 * 100, data["k"]]), axis=0, return_counts=True)
    got = np.unique(np.column_stack([out["window_start"], out["k"]]), axis=0, return_counts=True)
    assert np.array_equal(got[0], expected[0]) and len(out) == len(expected[0])
    order = np.lexsort((out["k"], out["window_start"]))
    np.testing.assert_array_equal(out["count"][order], expected[1])


def test_the_default_failover_restarts_every_executor_of_independent_pipelines(tmp_path, monkeypatch):
    result, processes = run(tmp_path, pipelines, 3, "pre_commit:2", monkeypatch, failover="job")
    (recovery,) = result.recoveries
    assert recovery["restarted"] == [0, 1, 2] and processes == 6, recovery
    assert sum(rows(result).values()) == 60_000 and max(rows(result).values()) == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"failover": "pipelined"}, "failover='pipelined': choose one of 'job', 'region'"),
    ({"failover": "region"}, "failover='region' restarts a failed executor's region: give restart="),
    ({"failover": "region", "executors": 1, "restart": "fixed-delay"}, "restart= needs executors=N"),
])
def test_a_failover_the_run_cannot_honour_is_refused_in_one_sentence(tmp_path, options, message):
    options = {"executors": 2, **options}
    with pytest.raises(slashrt.DataflowError, match=re.escape(message)):
        slashrt.run(pipelines(ChaosCollect(transactional=True), Paced(), tmp_path), {"r": records(10)},
                    checkpoint_dir=tmp_path / "chk", **options)


REFERENCES: dict[int, collections.Counter] = {}  # executors -> the failure-free run's rows


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(executors=st.integers(2, 4), point=st.sampled_from(["pre_commit", "async"]), k=st.integers(1, 4))
def test_a_kill_at_a_random_point_restarts_one_executor_and_the_output_is_exact(tmp_path_factory, executors, point, k):
    with pytest.MonkeyPatch.context() as monkeypatch:
        if executors not in REFERENCES:
            reference, _ = run(tmp_path_factory.mktemp("reference"), pipelines, executors, "", monkeypatch)
            REFERENCES[executors] = rows(reference)
        result, processes = run(tmp_path_factory.mktemp("killed"), pipelines, executors, f"{point}:{k}", monkeypatch)
    assert [len(r["restarted"]) for r in result.recoveries] == [1], result.recoveries
    assert processes == executors + 1
    assert rows(result) == REFERENCES[executors]


def test_a_strategy_that_gives_up_on_a_regions_restart_says_so_once(tmp_path, monkeypatch):
    with pytest.raises(slashrt.SlashError) as failed:
        run(tmp_path, pipelines, 3, "pre_commit:2;pre_commit:2", monkeypatch, restart="fixed-delay:attempts=1,delay=0")
    assert re.fullmatch(r"gave up recovering \(FixedDelay\(attempts=1, delay=0(\.0)?\)\): .*; the last failure: executor \d "
                        r"was killed by signal 9 \(SIGKILL\)", str(failed.value)), str(failed.value)
