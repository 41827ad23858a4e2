"""Where is it stuck, for a linear flow (no fan-in: a source into a keyed tumbling count into a
sink, or a source straight into a sink) on the progress tracker's report
(`PointstampProgress.report`, `combine`), as every flow has it: executor 1's source waits,
inside its stream or before its first record (its capability at -inf, no watermark yet), and
the report names executor 1 as holding the window back, where the window is on the state
backend (`SsbRoute`) or routed by key (`WindowRoute`). A flow without a keyed window, on one
executor or several, gets reports too, whose frontiers end complete. (A union before the
window, the failure's report and what an executor reports as its own: test_graph_reports.py.)

Executor 1's chunk stream (`PerExecutor`; executor 0's on one executor) makes its chunk only
once the file `marker` exists, and the marker is touched by whoever reads the reports (the
coordinator's process) when one shows the hold: the run can only finish after a report saw it,
no sleep decides. The rings (four 1 KiB slots of 64 records) wrap many times over a run."""

import functools
import json
from pathlib import Path

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt.cluster import PerExecutor
from slashrt.progress.timestamp import MIN_EPOCH

from tests.cluster._reports import check_named, collecting, held_by_source, run_watching_file, wait_until

SCHEMA = Schema({"t": "i8", "k": "i8"})
CHUNK = 4_000  # records per chunk: 1000 ms of event time, 62 slots of the 4-slot rings below
RING = {"slots": 4, "slot_size": 1024}
WINDOW = "st.count_window_1.in0"


def chunk(executor: int, i: int) -> np.ndarray:
    out = np.zeros(CHUNK, SCHEMA.dtype)
    out["t"] = (i * CHUNK + np.arange(CHUNK)) // 4
    out["k"] = np.random.default_rng([executor, i]).integers(0, 20, CHUNK)
    return out


def stream(marker: str, index: int, executors: int, wait_at: int = 1):
    """Two chunks (event times 0-999, then 1000-1999); executor 1 (0 when alone) makes chunk
    `wait_at` only once `marker` exists."""
    for i in range(2):
        if index == min(1, executors - 1) and i == wait_at:
            wait_until(Path(marker).exists, index)
        yield chunk(index, i)


def counted_flow() -> Dataflow:
    flow = Dataflow("st")
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=100)).count(key="k").sink(sinks.Collect(), name="out")
    return flow


def expected(executors: int) -> int:
    """Rows of the count: one per (window, key) with records on any executor."""
    t = np.concatenate([chunk(e, i) for e in range(executors) for i in range(2)])
    return len(np.unique(t["t"] // 100 * 20 + t["k"]))


@pytest.mark.parametrize(
    "wait_at, low, high, executors, transport, mode",
    [(1, 0, 999, 2, "shm", "slash"), (0, MIN_EPOCH, MIN_EPOCH, 2, "shm", "slash"),
     (1, 0, 999, 3, "tcp", "uppar"), (0, MIN_EPOCH, MIN_EPOCH, 3, "tcp", "uppar")],
    ids=["inside-the-stream-2-shm-slash", "before-any-record-2-shm-slash", "inside-the-stream-3-tcp-uppar",
         "before-any-record-3-tcp-uppar"],
)
def test_a_function_sees_the_window_held_by_the_executor_whose_source_waits(
        tmp_path, wait_at, low, high, executors, transport, mode):
    marker = tmp_path / "seen"
    is_stuck = functools.partial(held_by_source, name=WINDOW, source="st.a", holder=1, low=low, high=high)
    reports, on_report = collecting(is_stuck, marker)
    result = slashrt.run(
        counted_flow(), {"a": PerExecutor(functools.partial(stream, str(marker), wait_at=wait_at))},
        executors=executors, transport=transport, mode=mode, on_report=on_report, report_every=0.02, **RING,
    )
    assert len(result.outputs["st.out"]) == expected(executors)
    # (describe's text shows "(-inf)" before any record)
    check_named(next(r for r in reports if is_stuck(r)), WINDOW, "st.a", executors, 1)
    assert all(frontier == [] for frontier in result.frontiers.values()) and WINDOW in result.frontiers


def plain_flow() -> Dataflow:
    """No keyed window: each executor's records go straight from the source to the sink."""
    flow = Dataflow("lin")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect(), name="out")
    return flow


@pytest.mark.parametrize("executors, transport", [(1, None), (2, "shm"), (3, "tcp")], ids=["one", "2-shm", "3-tcp"])
def test_a_flow_without_a_keyed_window_reports_its_sink_held_by_the_waiting_source_then_complete(
        tmp_path, executors, transport):
    """Inside the first chunk on one executor (its tracker has every move at once); on a cluster
    up to its end: the views learn a source's moves that no one waits for (none, without a
    window) with its next news, which may come only after it waited (then its capability stays
    at -inf where the views know it)."""
    path, marker = tmp_path / "job.json", tmp_path / "seen"
    holder = min(1, executors - 1)
    is_stuck = functools.partial(held_by_source, name="lin.out.in0", source="lin.a", holder=holder,
                                 low=0 if executors == 1 else MIN_EPOCH)
    cluster = {} if transport is None else {"executors": executors, "transport": transport, **RING}
    result, stuck = run_watching_file(
        plain_flow(), {"a": PerExecutor(functools.partial(stream, str(marker)))}, path, marker, is_stuck,
        report_every=0.02, **cluster,
    )
    assert len(result.outputs["lin.out"]) == 2 * CHUNK * executors
    assert stuck["state"] == "running"
    if executors > 1:
        check_named(stuck, "lin.out.in0", "lin.a", executors, holder)
    else:  # this process's tracker: every pointstamp is executor 0's
        assert all(p["held_by"] == [0] for p in stuck["pointstamps"]) and stuck["pointstamps"]
    final = json.loads(path.read_text())
    assert final["state"] == "finished" and final["frontiers"] == {"lin.out.in0": []}
    assert final["holding"] == {} and final["pointstamps"] == []
    assert [e["state"] for e in final.get("executors", [])] == ["finished"] * (executors if executors > 1 else 0)
    assert result.frontiers == {"lin.out.in0": []}
