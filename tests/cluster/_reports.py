"""Watching a job's "where is it stuck" reports until one shows what a test waits for: the
waiting source of the job goes on once `marker` exists, which the watcher touches when a report
`is_stuck` (so the run can only finish after a report saw it, no sleep decides); what the tests
wait for (`held_by_source`: an input held back by the waiting executor's source) and what they
check of that report (`check_named`)."""

import json
import time
from pathlib import Path

import trio

from slashrt._frontier_report import describe
from slashrt.errors import unwrap_groups
from slashrt.progress.timestamp import MIN_EPOCH


WAIT_S = 60  # a report that never shows it fails the test instead of hanging it


def wait_until(ready, index: int = 1) -> None:
    """Until `ready()` (a report showed the hold): executor `index`'s chunk stream waits here,
    in its agent's process, before it goes on or fails."""
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no report showed executor {index} holding the window back")
        time.sleep(0.01)


def shown_in_file(path: str, is_stuck):
    """`ready` for `wait_until`: the report file at `path` shows what `is_stuck` waits for."""
    return lambda: Path(path).exists() and is_stuck(json.loads(Path(path).read_text()))


def collecting(is_stuck, marker: Path):
    """(reports, on_report): an `on_report` callback keeping every report, touching `marker`
    at the first that `is_stuck`."""
    reports = []

    def on_report(report):
        reports.append(report)
        if is_stuck(report):
            marker.touch()

    return reports, on_report


def run_watching_file(flow, inputs, path: Path, marker: Path, is_stuck, **options):
    """Run `flow` (`slashrt.run`'s options: in this process, or on a cluster) writing its report
    to `path` (`on_report=str(path)`), read while it runs; returns the result and the first
    report that `is_stuck`."""
    stuck = {}

    async def watch_file():
        while True:
            if path.exists() and is_stuck(report := json.loads(path.read_text())):
                stuck.update(report)
                marker.touch()
                return
            await trio.sleep(0.01)

    async def main():
        from slashrt._run import prepare_run

        async with unwrap_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(watch_file)
            result = await prepare_run(flow, inputs, on_report=str(path), **options)()
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main), stuck


def capability(source: str) -> str:
    """What a report calls the capability of `source` ("flow.name")."""
    return f"capability of source {source} (its watermark)"


def held_by_source(report: dict, name: str, source: str, holder: int, low: int = 0, high: int = 999) -> bool:
    """Input `name`'s frontier is at a time in [low, high] (by default inside the first chunk),
    held back by `source`'s capability alone, and the report names executor `holder` as its
    holder, in every executor's view (a cluster's report before an executor's first one has
    its view "not reported yet")."""
    frontier, holds = report["frontiers"].get(name), report["holding"].get(name, [])
    return (
        bool(frontier) and low <= frontier[0][0] <= high and bool(holds)
        and all(h["what"] == capability(source) and h.get("held_by") == [holder] for h in holds)
        and all(e["state"] != "not reported yet" for e in report.get("executors", []))
    )


def check_named(stuck: dict, name: str, source: str, executors: int, holder: int) -> None:
    """A cluster's report of input `name` held back by `source`'s capability (`held_by_source`):
    every executor's view counts it, only the holder's own report has it, and `describe` names
    the holder."""
    json.dumps(stuck)
    port = f"{source}.out0"
    (hold,) = stuck["holding"][name]
    at = stuck["frontiers"][name][0]
    assert hold["at"] == port and hold["time"] == at and hold["held_by"] == [holder]
    # every view counts the source's capability there; only the holder's own report has it
    counted = [p for p in stuck["pointstamps"] if p["at"] == port and p["time"] == at]
    assert {p["executor"] for p in counted} == set(range(executors)) and all(p["held_by"] == [holder] for p in counted)
    for e in stuck["executors"]:
        owns = any(p["at"] == port and p["time"] == at for p in e["own_pointstamps"])
        assert owns == (e["executor"] == holder), e["own_pointstamps"]
    text = describe({"flow": source.split(".")[0], "state": "running", **stuck})
    shown = "-inf" if at[0] == MIN_EPOCH else at[0]  # no watermark yet
    assert f"held by {capability(source)} at {port} ({shown}) (seen by executors " \
           f"{', '.join(map(str, hold['executors']))}), held by executor {holder}" in text, text
