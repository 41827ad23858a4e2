"""Where is it stuck, for a tree flow on several executors (`slashrt._gate_report`): a keyed
window's gate fires on every executor's watermark, so a report taken while one executor's source
is held back shows the window input's frontier at that executor's watermark and names it as the
holder; at the end every frontier is complete, in `RunResult.frontiers` and in the report file;
a run that fails leaves its report with the failure. A tree flow without a gate to report is
refused in one sentence, and gate moves are logged at debug level.

Executor 1's chunk stream (`PerExecutor`) makes its second chunk only once the file `marker`
exists, and the marker is touched by whoever reads the reports (the coordinator's process) when
one shows the hold: the run can only finish after a report saw it stuck, no sleep decides."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import slashrt
import slashrt.cluster
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt._frontier_report import describe
from slashrt.cluster import PerExecutor
from slashrt.errors import DataflowError

from tests.cluster._reports import collecting, run_watching_file, shown_in_file, wait_until
from slashrt.progress.frontier import NO_TIME

SCHEMA = Schema({"t": "i8", "k": "i8"})
CHUNK = 4_000  # records per chunk: 1000 ms of event time, 64 slots of the 4-slot rings below
RING = {"slots": 4, "slot_size": 1024}
WINDOW = "st.count_window_1.in0"


def chunk(executor: int, i: int) -> np.ndarray:
    out = np.zeros(CHUNK, SCHEMA.dtype)
    out["t"] = (i * CHUNK + np.arange(CHUNK)) // 4
    out["k"] = np.random.default_rng([executor, i]).integers(0, 20, CHUNK)
    return out


def stream(marker: str, index: int, executors: int, wait_at: int = 1):
    """Two chunks (event times 0-999, then 1000-1999); executor 1 makes chunk `wait_at` only
    once `marker` exists."""
    for i in range(2):
        if index == 1 and i == wait_at:
            wait_until(Path(marker).exists)
        yield chunk(index, i)


def counted_flow() -> Dataflow:
    flow = Dataflow("st")
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=100)).count(key="k").sink(sinks.Collect(), name="out")
    return flow


def expected(executors: int) -> int:
    """Rows of the count: one per (window, key) with records on any executor."""
    t = np.concatenate([chunk(e, i) for e in range(executors) for i in range(2)])
    return len(np.unique(t["t"] // 100 * 20 + t["k"]))


def held(report: dict, low: int = 0, high: int = 999) -> bool:
    """The window waits for executor 1 alone, at a watermark in [low, high] (by default inside
    its first chunk), and executor 1's own report names it as the holder (once it reported)."""
    frontier, holds = report["frontiers"].get(WINDOW), report["holding"].get(WINDOW, [])
    return (
        bool(frontier) and low <= frontier[0][0] <= high and bool(holds)
        and {h["at"] for h in holds} == {"executor 1"} and all(h["time"] == frontier[0] for h in holds)
        and all(h.get("held_by") == [1] for h in holds)
    )


def check_stuck(stuck: dict, executors: int, what: str) -> None:
    (hold,) = stuck["holding"][WINDOW]
    assert hold["what"] == what and hold["executors"]  # named by the views of the executors holding it
    at = stuck["frontiers"][WINDOW][0][0]
    # every view has executor 1's watermark at the frontier, every other one's above it (or ended)
    assert any(p["at"] == "executor 1" for p in stuck["pointstamps"])
    assert all(p["time"][0] == at if p["at"] == "executor 1" else p["time"][0] > at for p in stuck["pointstamps"])
    assert [e["executor"] for e in stuck["executors"]] == list(range(executors))
    json.dumps(stuck)


@pytest.mark.parametrize("wait_at, low, high", [(1, 0, 999), (0, NO_TIME, NO_TIME)],
                         ids=["inside-the-stream", "before-any-record"])
def test_a_function_sees_the_window_held_by_the_executor_whose_source_waits(tmp_path, wait_at, low, high):
    marker = tmp_path / "seen"
    reports, on_report = collecting(lambda report: held(report, low, high), marker)
    result = slashrt.run(
        counted_flow(), {"a": PerExecutor(functools.partial(stream, str(marker), wait_at=wait_at))}, executors=2,
        transport="shm", on_report=on_report, report_every=0.02, **RING,
    )
    assert len(result.outputs["st.out"]) == expected(2)
    stuck = next(r for r in reports if held(r, low, high))
    check_stuck(stuck, 2, "watermark of source st.a")
    shown = "(-inf)" if low == NO_TIME else f"({stuck['frontiers'][WINDOW][0][0]})"
    text = describe({"flow": "st", "state": "running", **stuck})
    assert f"held by watermark of source st.a at executor 1 {shown}" in text and ", held by executor 1" in text
    assert result.frontiers == {WINDOW: []}


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slashrt.cli", *args], capture_output=True, text=True, timeout=60)


def test_a_report_file_of_3_executors_over_tcp_shows_the_holder_and_then_the_end(tmp_path):
    """UpPar (a router's gate) on pointstamp progress: the capability of executor 1's source."""
    path, marker, stuck_path = tmp_path / "job.json", tmp_path / "seen", tmp_path / "stuck.json"
    result, stuck = run_watching_file(
        counted_flow(), {"a": PerExecutor(functools.partial(stream, str(marker)))}, path, marker, held, executors=3,
        transport="tcp", mode="uppar", progress="pointstamp", report_every=0.02, **RING,
    )
    stuck_path.write_text(json.dumps(stuck))
    assert len(result.outputs["st.out"]) == expected(3)
    assert result.frontiers == {WINDOW: []}
    check_stuck(stuck, 3, "capability of source st.a (its watermark)")
    at = stuck["frontiers"][WINDOW][0][0]
    shown = _cli("frontiers", str(stuck_path))
    assert shown.returncode == 0, shown.stderr
    assert f"{WINDOW}  frontier ({at})" in shown.stdout
    assert f"held by capability of source st.a (its watermark) at executor 1 ({at}) (seen by executors" in shown.stdout
    final = json.loads(path.read_text())
    assert final["state"] == "finished" and final["frontiers"] == {WINDOW: []} and final["holding"] == {}
    assert [e["state"] for e in final["executors"]] == ["finished"] * 3
    assert "complete" in _cli("frontiers", str(path)).stdout


def failing_stream(report: str, index: int, executors: int):
    """Executor 1 fails once the report file shows the window waiting for it."""
    yield chunk(index, 0)
    if index == 1:
        wait_until(shown_in_file(report, held))
        raise OSError("the disk with executor 1's second chunk is gone")
    yield chunk(index, 1)


def test_a_failed_run_leaves_the_report_with_the_failure_and_the_holder(tmp_path):
    path = tmp_path / "job.json"
    with pytest.raises(slashrt.cluster.ClusterError, match="disk with executor 1's second chunk is gone"):
        slashrt.run(counted_flow(), {"a": PerExecutor(functools.partial(failing_stream, str(path)))}, executors=2,
                    transport="shm", on_report=path, report_every=0.02, **RING)
    final = json.loads(path.read_text())
    assert final["state"] == "failed" and "second chunk is gone" in final["error"]
    assert [e["state"] for e in final["executors"]][1] == "failed"
    assert held(final)  # what the executors saw before the failure: the window waited for executor 1


@pytest.mark.parametrize("build, executors, why", [
    (lambda f: f.source("a", SCHEMA, time="t").sink(sinks.Collect()), 2,
     r"on 2 executor\(s\) it has none \(it has no keyed window\)"),
    (lambda f: f.source("a", SCHEMA, time="t").window(Tumbling(ms=100)).count(key="k").sink(sinks.Collect()), 1,
     r"on 1 executor\(s\) it has none: "),
])
def test_a_tree_flow_without_gates_to_report_is_refused_in_one_sentence(build, executors, why):
    flow = Dataflow("tree")
    build(flow)
    with pytest.raises(DataflowError, match=r"on_report= on tree flow 'tree' reports the gates .*" + why):
        slashrt.run(flow, {"a": chunk(0, 0)}, executors=executors, transport="shm", on_report=print)


def test_gate_frontier_moves_are_logged_at_debug_level(capsys):
    slashrt.configure_logging("debug")  # executors log at this process's level; their lines are relayed here
    try:
        slashrt.run(counted_flow(), {"a": chunk(0, 0)}, executors=2, transport="shm", **RING)
    finally:
        slashrt.configure_logging("warning")
    moves = [line for line in capsys.readouterr().err.splitlines() if "gate frontier moved" in line]
    assert moves and all("st.count_window_1" in line and "lowest=" in line for line in moves), moves[:3]


@pytest.mark.parametrize("mode, progress, word", [("slash", "watermark", "watermark of"),
                                                  ("uppar", "pointstamp", "capability of")])
def test_the_gates_report_is_the_least_watermark_and_every_executor_at_it(mode, progress, word):
    """Read from a plan's gates (no run): chained windows, ties, no watermark yet, ended streams."""
    from slashrt._gate_report import gate_progress
    from slashrt._plan import ClusterRole, build_plan
    from slashrt.progress.frontier import END_TIME
    from slashrt.ssb.partitions import Partitioning

    flow = Dataflow("st")
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=100)).count(key="k").window(Tumbling(ms=1000)).count(
        key="k").sink(sinks.Collect(), name="out")
    gates = gate_progress(build_plan(flow, ClusterRole(1, Partitioning(8, 3), mode, progress=progress)), 1)
    first, second = (x.gate.frontier for _, x, _ in gates.gates)
    for j, t in enumerate([300, 200, 200]):
        first.advance(j, t)
    second.advance(0, END_TIME)
    second.advance(2, 0)  # executor 1: no watermark yet there
    report = gates.report()
    json.dumps(report)
    assert report["frontiers"] == {WINDOW: [[200]], "st.count_window_2.in0": [[NO_TIME]]}
    assert report["holding"] == {
        WINDOW: [{"at": f"executor {j}", "time": [200], "what": f"{word} source st.a"
                  + (" (its watermark)" if progress == "pointstamp" else "")} for j in (1, 2)],
        "st.count_window_2.in0": [{"at": "executor 1", "time": [NO_TIME], "what": f"{word} window st.count_window_1"
                                   + (" (its watermark)" if progress == "pointstamp" else "")}],
    }
    assert sorted((p["at"], p["time"][0]) for p in report["pointstamps"]) == [
        ("executor 0", 300), ("executor 1", NO_TIME), ("executor 1", 200), ("executor 2", 0), ("executor 2", 200)]
    # executor 1's own watermarks, which `combine` matches to name it as their holder
    assert sorted((p["at"], p["time"][0]) for p in report["own_pointstamps"]) == [
        ("executor 1", NO_TIME), ("executor 1", 200)]
    for j in range(3):
        first.advance(j, END_TIME)
        second.advance(j, END_TIME)
    assert gates.report()["frontiers"] == {WINDOW: [], "st.count_window_2.in0": []}
    assert gates.report()["holding"] == {} and gates.report()["pointstamps"] == []
    assert gates.report()["own_pointstamps"] == []
    assert gates.frontiers() == {WINDOW: [], "st.count_window_2.in0": []}
