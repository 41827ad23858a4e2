"""Where is it stuck, on several executors: every executor's pointstamp report reaches the
coordinator while the job runs and when it ends or fails (`run(..., on_report=fn | PATH)`),
`RunResult.frontiers` covers every input, `slashrt frontiers PATH` reads a cluster's report,
and at debug level an executor that parks logs what holds each of its open frontiers.

An executor holds its job still (inside an operator, its loop free) until the report shows
it held: the run can only finish once a report saw it stuck, so no sleep decides anything."""

import ast
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

import slashrt
from slashrt import Dataflow, Operator, sinks
from slashrt.cluster import ClusterError, PerExecutor
from slashrt.errors import unwrap_groups
from tests.test_graph import NotifyEach

REC = np.dtype([("v", "<i8"), ("t", "<i8")])
N = 6_000
WAIT_S = 60  # a report that never shows the hold fails the test instead of hanging it


def data() -> np.ndarray:
    a = np.zeros(N, REC)
    a["v"], a["t"] = np.arange(N), np.arange(N) // 50
    return a


class Stall(Operator):
    """On the batch holding the last record, waits until the file `marker` exists (the
    frontier after it held meanwhile); or raises (`poison`), or kills its process (`kill`)."""

    def __init__(self, marker: str, poison: bool = False, kill: bool = False):
        self.marker, self.poison, self.kill = marker, poison, kill

    async def on_batch(self, ctx, port, batch):
        if (batch["v"] == N - 1).any():
            if self.poison:
                raise ValueError("record N - 1 is poisoned")
            with trio.fail_after(WAIT_S):
                while not Path(self.marker).exists():
                    await trio.sleep(0.01)
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
        await ctx.emit(batch)


def stalled_flow(marker, poison=False, kill=False) -> Dataflow:
    flow = Dataflow("st")
    a = flow.source("a", REC, time="t")
    a.union(a.filter(lambda b: b["v"] % 2 == 0)).operator(Stall(str(marker), poison, kill), name="stall").sink(
        sinks.Collect(), name="out"
    )
    return flow


def held(report: dict) -> bool:
    """The sink's input waits for something some executor's view names."""
    return bool(report["frontiers"]["st.out.in0"]) and any(h["executors"] for h in report["holding"]["st.out.in0"])


def test_a_function_gets_every_executors_view_while_a_cluster_runs(tmp_path):
    marker = tmp_path / "seen"
    reports = []

    def on_report(report):
        reports.append(report)
        if held(report):
            marker.touch()

    result = slashrt.run(
        stalled_flow(marker), {"a": data()}, executors=2, transport="shm", slot_size=256, slots=4,
        on_report=on_report, report_every=0.02,
    )
    assert len(result.outputs["st.out"]) == N + N // 2
    stuck = next(r for r in reports if held(r))
    json.dumps(stuck)
    assert [e["executor"] for e in stuck["executors"]] == [0, 1]
    assert {p["executor"] for p in stuck["pointstamps"]} <= {0, 1} and stuck["pointstamps"]
    whats = {h["what"] for h in stuck["holding"]["st.out.in0"]}
    assert whats & {"capability of source st.a (its watermark)", "capability of step st.stall"}, whats
    # every input's frontier at the end, as far back as any executor saw it: all complete
    assert result.frontiers == {name: [] for name in stuck["frontiers"]}
    assert set(result.frontiers) == {"st.union_2.in0", "st.union_2.in1", "st.filter_1.in0", "st.stall.in0", "st.out.in0"}


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slashrt.cli", *args], capture_output=True, text=True, timeout=60)


def run_watching(flow, path: Path, marker: Path, **options):
    """Run `flow` on a cluster keeping its report in `path`; a task of this process (the
    coordinator's) touches `marker` once the file shows the job held."""

    async def watch_file():
        while True:
            if path.exists() and held(json.loads(path.read_text())):
                marker.touch()
                return
            await trio.sleep(0.01)

    async def main():
        from slashrt.cluster import run_cluster_async

        async with unwrap_groups(), trio.open_nursery() as nursery:  # the run's own error, not a group
            nursery.start_soon(watch_file)
            result = await run_cluster_async(
                flow, {"a": data()}, slot_size=256, slots=4, on_report=str(path), report_every=0.02, **options
            )
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main)


def test_a_report_file_of_a_cluster_run_is_kept_and_shown_by_the_cli(tmp_path):
    path = tmp_path / "job.json"
    marker = tmp_path / "seen"

    result = run_watching(stalled_flow(marker), path, marker, executors=3, transport="tcp")
    assert len(result.outputs["st.out"]) == N + N // 2
    final = json.loads(path.read_text())
    assert final["state"] == "finished" and [e["state"] for e in final["executors"]] == ["finished"] * 3
    assert all(f == [] for f in final["frontiers"].values())
    shown = _cli("frontiers", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "flow st: finished" in shown.stdout and "executors: 0 finished, 1 finished, 2 finished" in shown.stdout
    assert "st.out.in0" in shown.stdout and "complete" in shown.stdout
    assert json.loads(_cli("frontiers", str(path), "--json").stdout) == final


def test_a_failed_cluster_run_leaves_its_report_with_the_failure(tmp_path):
    path = tmp_path / "job.json"
    with pytest.raises(ClusterError, match=r"st\.stall.*poisoned \(on executor [01]\)"):
        slashrt.run(
            stalled_flow(tmp_path / "never", poison=True), {"a": data()}, executors=2, slot_size=256, slots=4,
            on_report=path,
        )
    report = json.loads(path.read_text())
    assert report["state"] == "failed" and "poisoned (on executor" in report["error"]
    assert "failed" in [e["state"] for e in report["executors"]]
    shown = _cli("frontiers", str(path))
    assert shown.returncode == 0 and "flow st: failed (" in shown.stdout


def test_an_executor_killed_mid_run_leaves_the_report_with_its_death(tmp_path):
    path, marker = tmp_path / "job.json", tmp_path / "seen"
    with pytest.raises(ClusterError, match=r"executor [0-2] was killed by signal 9"):
        run_watching(stalled_flow(marker, kill=True), path, marker, executors=3, transport="tcp")
    report = json.loads(path.read_text())
    assert report["state"] == "failed" and "was killed by signal 9" in report["error"]
    # what the executors reported before the kill is kept: the job held behind the killed one
    assert len(report["executors"]) == 3 and held(report)


def _second_executor_only(index: int, executors: int) -> np.ndarray:
    return data() if index == 1 else data()[:0]


def _idle_lines(err: str) -> list[tuple[int, dict]]:
    """The "idle, frontiers held" debug lines the executor processes printed: (executor, inputs)."""
    found = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", err).splitlines():
        if (m := re.search(r"\[debug\s*\] idle, frontiers held\s+executor=(\d+) inputs=(\{.*\})$", line)):
            found.append((int(m[1]), ast.literal_eval(m[2])))
    return found


def test_idle_executors_log_what_holds_each_open_frontier_at_debug_level(capfd):
    """Executor 0 has no input: it can only finish once executor 1's progress reaches it, and
    waits for that parked, so it logs (at least once) what holds its view's frontiers."""
    flow = Dataflow("idle2")
    flow.source("a", REC, time="t").operator(NotifyEach(), name="note").sink(sinks.Collect(), name="out")
    slashrt.configure_logging("debug")  # the executor processes get the level of this one
    try:
        result = slashrt.run(flow, {"a": PerExecutor(_second_executor_only)}, executors=2, slot_size=256, slots=4)
    finally:
        slashrt.configure_logging("warning")
    assert len(result.outputs["idle2.out"]) == N
    lines = _idle_lines(capfd.readouterr().err)
    assert any(executor == 0 for executor, _ in lines), "executor 0 never logged why it waited"
    whats = {"capability of source idle2.a (its watermark)", "notification requested by idle2.note"}
    for executor, inputs in lines:
        assert executor in (0, 1) and inputs and set(inputs) <= {"idle2.note.in0", "idle2.out.in0"}
        for stuck in inputs.values():
            assert stuck["frontier"] and stuck["held_by"]  # open, and what holds it named
            assert {h["what"] for h in stuck["held_by"]} <= whats
            assert {h["at"] for h in stuck["held_by"]} <= {"idle2.a.out0", "idle2.note.out0"}
