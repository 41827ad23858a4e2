"""Where is it stuck, on several executors: every executor's pointstamp report, gathered by
the coordinator into one (`run(..., executors=N, on_report=fn | PATH)`).

::

    agent i: execute(on_report=AgentReporter) ── every report_every s, and at the end ──┐
        "report" (report, state, error) on the control link, before "finished"/"failed" │
    coordinator: _Agents reads it ─> ClusterReports.receive(i, ...)  <──────────────────┘
        every report_every s (if news): on_report(combine(latest of every executor))
        at the end: a PATH gets the last one with "finished", or "failed" and the error

The user's function or path stays in the coordinator's process; agents get a marker
(`AGENT_MARKER`) in place of it.
"""

from __future__ import annotations

import os

import trio

from slashrt._frontier_report import ReportFile, combine
from slashrt.errors import DataflowError

__all__ = ["AgentReporter", "ClusterReports", "cluster_reports", "AGENT_MARKER"]

AGENT_MARKER = "report to the coordinator"


class AgentReporter:
    """An agent's `on_report`: keeps the latest (report, state, error) and hands it to the
    control link's sender task (`send_to`)."""

    reports_end = True

    def __init__(self):
        self.latest: tuple[dict, str, str | None] | None = None
        self._lot = trio.lowlevel.ParkingLot()

    def __call__(self, report: dict, state: str = "running", error: str | None = None) -> None:
        self.latest = (report, state, error)
        self._lot.unpark_all()

    async def send_to(self, control) -> None:
        """Send each report as it comes (the latest one, if several came meanwhile)."""
        while True:
            await self._lot.park()
            with trio.CancelScope(shield=True):  # never cut a message in half (the link ends it if the peer goes)
                await control.send("report", self.latest)


class ClusterReports:
    """The coordinator's side: each executor's latest report, and the user's `on_report`."""

    def __init__(self, on_report, flow: str, executors: int, every: float):
        if isinstance(on_report, (str, os.PathLike)):
            on_report = ReportFile(on_report, flow)
        self.on_report = on_report
        self.every = every
        self.latest: list[tuple | None] = [None] * executors
        self._news = False

    async def receive(self, index: int, message) -> None:
        self.latest[index] = tuple(message)
        self._news = True

    async def run(self) -> None:
        while True:
            await trio.sleep(self.every)
            if self._news:
                self._news = False
                self.on_report(combine(self.latest))

    def finish(self, error: BaseException | None) -> None:
        """The run ended: a report file gets the last word (a function got its reports)."""
        if getattr(self.on_report, "reports_end", False):
            if error is None:
                self.on_report(combine(self.latest), "finished")
            else:
                self.on_report(combine(self.latest), "failed", str(error) or type(error).__name__)


def cluster_reports(options: dict, flow, executors: int) -> ClusterReports | None:
    """Take `on_report` out of the options that travel to the agents (a marker goes instead)."""
    on_report = options.pop("on_report", None)
    if on_report is None:
        return None
    every = options.get("report_every", 0.5)
    if not (isinstance(every, (int, float)) and every > 0):
        raise DataflowError(f"run(): report_every must be a positive number of seconds, got {every!r}")
    options["on_report"] = AGENT_MARKER
    return ClusterReports(on_report, flow.name, executors, every)
