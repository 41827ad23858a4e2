"""Watching a job's "where is it stuck" reports until one shows what a test waits for: the
waiting source of the job goes on once `marker` exists, which the watcher touches when a report
`is_stuck` (so the run can only finish after a report saw it, no sleep decides)."""

import json
import time
from pathlib import Path

import trio

from slashrt.errors import unwrap_groups


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
    """Run `flow` on a cluster writing its report to `path` (`on_report=str(path)`), read while
    it runs; returns the result and the first report that `is_stuck`."""
    stuck = {}

    async def watch_file():
        while True:
            if path.exists() and is_stuck(report := json.loads(path.read_text())):
                stuck.update(report)
                marker.touch()
                return
            await trio.sleep(0.01)

    async def main():
        from slashrt.cluster import run_cluster_async

        async with unwrap_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(watch_file)
            result = await run_cluster_async(flow, inputs, on_report=str(path), **options)
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main), stuck
