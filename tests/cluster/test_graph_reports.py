"""Where is it stuck, naming who holds it: the progress tracker's report
(`PointstampProgress.report`, `combine`) says which executor holds each pointstamp and hold
itself ("held_by"), where the views' global counts alone cannot (every executor's view has the
same pointstamps). A union behind a user step feeds a keyed tumbling count (on the state
backend, or routed by key in mode "uppar"); executor 1's source waits inside its stream, so the
window's input is held by that source's capability, which only executor 1 holds: the report
names it while the job runs, on one executor every holder is executor 0, and a run that fails
leaves its report with the failure and the holder.
While the sources stream, what an executor reports as its own is where it published it.

Executor 1's chunk stream (`PerExecutor`) makes its second chunk only once the file `marker`
exists, and the marker is touched by whoever reads the reports (the coordinator's process)
when one shows the hold: the run can only finish after a report saw it, no sleep decides.
The rings (four 256-byte slots) wrap many times over the run."""

import functools
import json
from pathlib import Path

import numpy as np
import pytest

import slashrt
import slashrt.cluster
from slashrt import Dataflow, Operator, Schema, Tumbling, sinks
from slashrt._frontier_report import describe
from slashrt.cluster import PerExecutor

from tests.cluster._reports import (
    capability, check_named, collecting, held_by_source, run_watching_file, shown_in_file, wait_until,
)

SCHEMA = Schema({"t": "i8", "k": "i8"})
CHUNK = 4_000  # records per chunk: 1000 ms of event time
RINGS = {"slot_size": 256, "slots": 4}
WINDOW = "g.counts.in0"
SOURCE = capability("g.a")


class Passing(Operator):
    """A user step in front of the union: every record as it came."""

    stateless = True

    async def on_batch(self, ctx, port, batch):
        await ctx.emit(batch.to_numpy(SCHEMA.dtype))


def flow() -> Dataflow:
    f = Dataflow("g")
    a, b = f.source("a", SCHEMA, time="t"), f.source("b", SCHEMA, time="t")
    a.operator(Passing(), name="step", schema=SCHEMA).union(b).window(Tumbling(ms=100)).count(
        key="k", name="counts").sink(sinks.Collect(), name="out")
    return f


def chunk(executor: int, i: int) -> np.ndarray:
    out = np.zeros(CHUNK, SCHEMA.dtype)
    out["t"] = (i * CHUNK + np.arange(CHUNK)) // 4
    out["k"] = np.random.default_rng([executor, i]).integers(0, 20, CHUNK)
    return out


def others() -> np.ndarray:
    """Source b's records (shared out between the executors)."""
    return np.concatenate([chunk(9, 0), chunk(9, 1)])


def waiting(marker: str, index: int, executors: int):
    """Two chunks (event times 0-999, then 1000-1999); executor 1 (0 when alone) makes its
    second chunk only once `marker` exists."""
    yield chunk(index, 0)
    if index == min(1, executors - 1):
        wait_until(Path(marker).exists, index)
    yield chunk(index, 1)


def expected(executors: int) -> int:
    """Rows of the count: one per (window, key) with records anywhere."""
    t = np.concatenate([chunk(e, i) for e in range(executors) for i in range(2)] + [others()])
    return len(np.unique(t["t"] // 100 * 20 + t["k"]))


def held(report: dict, holder: int) -> bool:
    """The window's input waits inside the first chunk, held by executor `holder`'s source alone."""
    return held_by_source(report, WINDOW, "g.a", holder)


def test_a_function_sees_the_window_held_by_the_executor_whose_source_waits(tmp_path):
    marker = tmp_path / "seen"
    reports, on_report = collecting(lambda report: held(report, 1), marker)
    result = slashrt.run(
        flow(), {"a": PerExecutor(functools.partial(waiting, str(marker))), "b": others()}, executors=2,
        transport="shm", on_report=on_report, report_every=0.02, **RINGS,
    )
    assert len(result.outputs["g.out"]) == expected(2)
    check_named(next(r for r in reports if held(r, 1)), WINDOW, "g.a", 2, 1)
    assert all(f == [] for f in result.frontiers.values())


def test_a_report_file_of_3_executors_over_tcp_names_the_holder_and_then_the_end(tmp_path):
    """Executor 1 of 3 waits (in mode "uppar": the window behind a route by key)."""
    path, marker = tmp_path / "job.json", tmp_path / "seen"
    result, stuck = run_watching_file(
        flow(), {"a": PerExecutor(functools.partial(waiting, str(marker))), "b": others()}, path, marker,
        lambda report: held(report, 1), executors=3, transport="tcp", mode="uppar", report_every=0.02, **RINGS,
    )
    assert len(result.outputs["g.out"]) == expected(3)
    check_named(stuck, WINDOW, "g.a", 3, 1)
    final = json.loads(path.read_text())
    assert final["state"] == "finished" and final["holding"] == {} and final["pointstamps"] == []
    assert all(e["own_pointstamps"] == [] for e in final["executors"])


def test_on_one_executor_every_pointstamp_is_held_by_executor_0(tmp_path):
    marker = tmp_path / "seen"
    reports, on_report = collecting(lambda report: held(report, 0), marker)
    result = slashrt.run(
        flow(), {"a": PerExecutor(functools.partial(waiting, str(marker))), "b": others()}, on_report=on_report,
        report_every=0.02,
    )
    assert len(result.outputs["g.out"]) == expected(1)
    stuck = next(r for r in reports if held(r, 0))
    # the tracker's counts are its own: every pointstamp and hold is executor 0's
    assert stuck["pointstamps"] and all(p["held_by"] == [0] for p in stuck["pointstamps"])
    assert all(h["held_by"] == [0] for holds in stuck["holding"].values() for h in holds)
    assert sorted((p["at"], p["time"], p["count"]) for p in stuck["own_pointstamps"]) == sorted(
        (p["at"], p["time"], p["count"]) for p in stuck["pointstamps"])
    assert ", held by executor 0" in describe({"flow": "g", "state": "running", **stuck})


def failing(report: str, index: int, executors: int):
    """Executor 1 fails once the report file shows the window waiting for it."""
    yield chunk(index, 0)
    if index == 1:
        wait_until(shown_in_file(report, lambda shown: held(shown, 1)))
        raise OSError("the disk with executor 1's second chunk is gone")
    yield chunk(index, 1)


def test_a_failed_run_leaves_the_report_with_the_failure_and_the_holder(tmp_path):
    path = tmp_path / "job.json"
    with pytest.raises(slashrt.cluster.ClusterError, match="disk with executor 1's second chunk is gone"):
        slashrt.run(flow(), {"a": PerExecutor(functools.partial(failing, str(path))), "b": others()}, executors=2,
                    transport="shm", on_report=path, report_every=0.02, **RINGS)
    final = json.loads(path.read_text())
    assert final["state"] == "failed" and "second chunk is gone" in final["error"]
    assert [e["state"] for e in final["executors"]][1] == "failed"
    # the executors' last views: the user step's input waits for executor 1's source (and, in a
    # view that had not heard of executor 0's latest moves, which wait in its buffer until
    # someone needs them, for executor 0's source where that view last had it); the window's
    # may wait for records executor 0 shipped to executor 1 too (in its queue, or on the channel
    # to the failed executor), else for those sources as well
    step = final["holding"]["g.step.in0"]
    assert step and all(h["what"] == SOURCE and len(h["held_by"]) == 1 for h in step), step
    (by_1,) = [h for h in step if h["held_by"] == [1]]
    window = final["holding"][WINDOW]
    assert window and all(h["held_by"] in ([0], [1]) if h["what"] == SOURCE else "on their way" in h["what"]
                          for h in window), window
    assert f"held by {SOURCE} at g.a.out0 ({by_1['time'][0]}) (seen by executors " \
           f"{', '.join(map(str, by_1['executors']))}), held by executor 1" in describe(final)


def test_an_executor_reports_as_its_own_only_what_every_view_can_have_from_it():
    """While the executors are busy, a source's capability moves wait in the executor's buffer
    (`BusCounts`): its own pointstamps are where it published them, so each is in its own view
    (which has every update it published, at once) at the same moment. Records on their way
    are the exception: the sender's own are its queued rows, whose count it may not have
    published yet."""
    reports = []
    n = 150_000
    big = {name: np.zeros(n, SCHEMA.dtype) for name in "ab"}
    for name, data in big.items():
        data["t"], data["k"] = np.arange(n) // 40, np.random.default_rng(7).integers(0, 50, n)
    result = slashrt.run(flow(), big, executors=2, transport="shm", on_report=reports.append, report_every=0.005,
                         **RINGS)
    assert len(result.outputs["g.out"]) == len(np.unique(big["a"]["t"] // 100 * 50 + big["a"]["k"]))
    seen = [e for r in reports for e in r["executors"] if e["state"] == "running"]
    moved = [e for e in seen if any(p["at"] == "g.a.out0" and p["time"][0] > 0 for p in e["own_pointstamps"])]
    assert len(moved) >= 5, len(moved)  # reports taken while the sources streamed
    for e in seen:
        counts = {(p["at"], tuple(p["time"])): p["count"] for p in e["pointstamps"]}
        for p in e["own_pointstamps"]:
            if "on their way" not in p["what"]:
                assert counts.get((p["at"], tuple(p["time"])), 0) >= p["count"], (e["executor"], p, e["pointstamps"])
