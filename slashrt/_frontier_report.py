"""Where is it stuck: a run's progress report kept in a JSON file, and read back for people.

`run(..., on_report="job.json")` replaces the file atomically (a
temporary file renamed over it) every `report_every` seconds while the job runs, and once more
when it ends (`"state"`: "running", "finished" or "failed" with the error's sentence);
`slashrt frontiers job.json [--json]` shows it: every input's frontier and, for each one not
yet empty, the pointstamps holding it back and what they are.

On several executors every executor reports its own view of the global counts to the
coordinator (`slashrt.cluster._reports`), which keeps one report of the same shape
(`combine`): each input's frontier as far back as any executor sees it (the minimal elements
of all their frontiers), every executor's pointstamps and holds, each naming the executors
whose view has it (its "executors"), and per executor its own report and state under the
report's "executors". Every view counts the whole cluster's pointstamps, so to say who holds one each
executor also reports those it holds itself ("own_pointstamps": its sources' capabilities,
its windows', its operators' requests...), and `combine` names in every pointstamp's and
hold's "held_by" the executors whose own list has its (at, time); on one executor the
tracker's report has "held_by": [0] throughout. None: records on a channel between executors
(only their receiver takes them off), or a retirement not every view has heard of yet.
A time of no watermark yet (MIN_EPOCH) shows as -inf.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from slashrt.errors import SlashError
from slashrt.progress import Timestamp
from slashrt.progress.timestamp import MIN_EPOCH
from slashrt.progress.antichain import Antichain

__all__ = ["ReportFile", "read_report", "describe", "combine", "lower_envelope"]

KEYS = ("flow", "state", "frontiers", "pointstamps", "holding")


class ReportFile:
    """An `on_report` callable writing each report to `path` (atomically)."""

    reports_end = True  # called once more when the run ends: (report, "finished" | "failed", error)

    def __init__(self, path: str | os.PathLike, flow: str):
        self.path = Path(path)
        self.flow = flow
        if not self.path.parent.is_dir():
            raise SlashError(f"on_report={str(path)!r}: directory {str(self.path.parent)!r} does not exist")

    def __call__(self, report: dict, state: str = "running", error: str | None = None) -> None:
        body = {"flow": self.flow, "state": state, "written": time.time(), **report}
        if error is not None:
            body["error"] = error
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)


def read_report(path: str | os.PathLike) -> dict:
    """The report in `path`, checked; a missing, unreadable or foreign file is one SlashError."""
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SlashError(
            f"{path}: no such report (write one with run(..., on_report={str(path)!r}) or slashrt run --report {path})"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SlashError(f"{path}: not a progress report ({type(exc).__name__}: {exc})") from None
    if not isinstance(report, dict) or any(k not in report for k in KEYS):
        raise SlashError(f"{path}: not a progress report (it needs the keys {', '.join(KEYS)})")
    return report


def lower_envelope(frontiers: list[dict]) -> dict[str, list[Timestamp]]:
    """Per input, the minimal elements of the frontiers several executors see there (the
    cluster's frontier as far back as any executor's view has it), in time order."""
    names = {name for f in frontiers for name in f}
    return {
        name: sorted(Antichain(Timestamp(*t) for f in frontiers for t in f.get(name, ())), key=Timestamp.sort_key)
        for name in sorted(names)
    }


def combine(reports: list[tuple[dict, str, str | None] | None]) -> dict:
    """One report of a cluster run from each executor's latest (report, state, error), None
    for an executor that has not reported yet."""
    def plain(time) -> list[int]:
        return [time[0], *time[1]]

    got = [(i, r) for i, r in enumerate(reports) if r is not None]
    frontiers = lower_envelope([{n: [_timestamp(t) for t in ts] for n, ts in r[0]["frontiers"].items()} for _, r in got])
    owners: dict[tuple[str, tuple[int, ...]], list[int]] = {}  # (at, time) -> the executors holding it
    for i, (report, _, _) in got:
        for own in report.get("own_pointstamps", ()):
            owners.setdefault((own["at"], tuple(own["time"])), []).append(i)

    def held_by(entry: dict) -> list[int]:
        return owners.get((entry["at"], tuple(entry["time"])), [])

    holding: dict[str, dict] = {}
    for i, (report, _, _) in got:
        for name, holds in report["holding"].items():
            if not frontiers.get(name):
                continue
            for hold in holds:
                key = (hold["at"], tuple(hold["time"]), hold["what"])
                holding.setdefault(name, {}).setdefault(
                    key, {**hold, "executors": [], "held_by": held_by(hold)}
                )["executors"].append(i)
    return {
        "frontiers": {name: [plain(t) for t in ts] for name, ts in frontiers.items()},
        "pointstamps": [
            {**p, "executor": i, "held_by": held_by(p)} for i, (report, _, _) in got for p in report["pointstamps"]
        ],
        "holding": {name: list(holds.values()) for name, holds in holding.items()},
        "queued_batches": sum(report.get("queued_batches", 0) for _, (report, _, _) in got),
        "executors": [
            {"executor": i, "state": "not reported yet"} if r is None
            else {"executor": i, "state": r[1], **({"error": r[2]} if r[2] else {}), **r[0]}
            for i, r in enumerate(reports)
        ],
    }


def _timestamp(t: list[int]) -> Timestamp:
    return Timestamp(t[0], tuple(t[1:]))


def _time(t: list[int]) -> str:
    epoch = "-inf" if t[0] == MIN_EPOCH else t[0]  # no watermark yet
    return f"({epoch})" if len(t) == 1 else f"({epoch}, <{', '.join(map(str, t[1:]))}>)"


def _holders(hold: dict) -> str:
    """Which executor holds it itself (a report without "held_by", from before it: nothing)."""
    if "held_by" not in hold:
        return ""
    if not hold["held_by"]:
        return ", held by no executor now (on its way between them)"
    many = len(hold["held_by"]) > 1
    return f", held by executor{'s' if many else ''} {', '.join(map(str, hold['held_by']))}"


def describe(report: dict) -> str:
    """Lines for people: the job's state, then every input with its frontier and what holds it."""
    lines = [f"flow {report['flow']}: {report['state']}" + (f" ({report['error']})" if report.get("error") else "")]
    if "executors" in report:  # a cluster run: each executor's state
        lines.append("  executors: " + ", ".join(f"{e['executor']} {e['state']}" for e in report["executors"]))
    width = max((len(name) for name in report["frontiers"]), default=0)
    for name, frontier in sorted(report["frontiers"].items()):
        shown = "complete" if not frontier else "frontier " + ", ".join(_time(t) for t in frontier)
        lines.append(f"  {name:<{width}}  {shown}")
        for hold in report["holding"].get(name, []):
            seen = f" (seen by executors {', '.join(map(str, hold['executors']))})" if "executors" in hold else ""
            lines.append(f"  {'':<{width}}    held by {hold['what']} at {hold['at']} {_time(hold['time'])}{seen}"
                         + _holders(hold))
    return "\n".join(lines)
