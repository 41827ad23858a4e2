"""Where is it stuck: a pointstamp run's report kept in a JSON file, and read back for people.

`run(..., progress="pointstamp", on_report="job.json")` replaces the file atomically (a
temporary file renamed over it) every `report_every` seconds while the job runs, and once more
when it ends (`"state"`: "running", "finished" or "failed" with the error's sentence);
`slashrt frontiers job.json [--json]` shows it: every input's frontier and, for each one not
yet empty, the pointstamps holding it back and what they are.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from slashrt.errors import SlashError

__all__ = ["ReportFile", "read_report", "describe"]

KEYS = ("flow", "state", "frontiers", "pointstamps", "holding")


class ReportFile:
    """An `on_report` callable writing each report to `path` (atomically)."""

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
        raise SlashError(f"{path}: no such report (write one with run(..., on_report={str(path)!r}))") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SlashError(f"{path}: not a progress report ({type(exc).__name__}: {exc})") from None
    if not isinstance(report, dict) or any(k not in report for k in KEYS):
        raise SlashError(f"{path}: not a progress report (it needs the keys {', '.join(KEYS)})")
    return report


def _time(t: list[int]) -> str:
    return f"({t[0]})" if len(t) == 1 else f"({t[0]}, <{', '.join(map(str, t[1:]))}>)"


def describe(report: dict) -> str:
    """Lines for people: the job's state, then every input with its frontier and what holds it."""
    lines = [f"flow {report['flow']}: {report['state']}" + (f" ({report['error']})" if report.get("error") else "")]
    width = max((len(name) for name in report["frontiers"]), default=0)
    for name, frontier in sorted(report["frontiers"].items()):
        shown = "complete" if not frontier else "frontier " + ", ".join(_time(t) for t in frontier)
        lines.append(f"  {name:<{width}}  {shown}")
        for hold in report["holding"].get(name, []):
            lines.append(f"  {'':<{width}}    held by {hold['what']} at {hold['at']} {_time(hold['time'])}")
    return "\n".join(lines)
