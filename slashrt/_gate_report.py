"""Where is it stuck, for a tree flow on several executors: the gates where executors meet.

A tree flow on several executors tracks no pointstamps: where the executors' streams meet a
keyed window (an SSB window's leader state, an UpPar router's window) a `FrontierGate` fires it
on the least of every executor's watermark (a `VectorClock`, or under progress="pointstamp" a
`PointstampClock` over the same watermarks). `GateProgress` reads those gates only when a
report is asked for (nothing on the hot path counts for it) and gives the pointstamp report's
shape (`slashrt._frontier_report`), so `combine`, `ReportFile` and `slashrt frontiers` show it
as they show a graph flow's:

- "frontiers": per keyed window, its input ("step.in0") as this executor's gate sees it:
  [[low]], the least watermark of any executor, or [] once every executor's stream ended;
- "pointstamps": every executor's watermark at each gate whose stream has not ended there,
  "at": "executor J";
- "holding": per input not yet complete, the executors whose watermark is that least one
  ("at": "executor J", "time": [low], "what": the source, or window, whose watermark it is);
- "own_pointstamps": this executor's own watermark at each gate ("at": "executor I"), which
  `combine` matches to name the executor holding each pointstamp and hold ("held_by"), as
  it does for a graph flow's.
"""

from __future__ import annotations

from slashrt.ssb.window import SsbWindowAggregate
from slashrt.ops.uppar import RouteByOwner
from slashrt.progress import PointstampClock, Timestamp
from slashrt.progress.frontier import END_TIME

__all__ = ["GateProgress", "gate_progress"]


class GateProgress:
    """The gates of one executor's plan of a tree flow, read as a progress report."""

    def __init__(self, gates: list[tuple[str, object, str]], index: int):
        self.gates = gates  # (the window's input, the exchange holding its gate, whose watermark meets there)
        self.index = index  # this executor's

    def frontiers(self) -> dict[str, list[Timestamp]]:
        return {name: [] if x.gate.frontier.low == END_TIME else [Timestamp(x.gate.frontier.low)]
                for name, x, _ in self.gates}

    def report(self) -> dict:
        pointstamps, holding, own = [], {}, []
        for name, x, upstream in self.gates:
            frontier = x.gate.frontier  # (replaced by a restore: read it now)
            what = (f"capability of {upstream} (its watermark)" if isinstance(frontier, PointstampClock)
                    else f"watermark of {upstream}")
            entries = list(frontier.entries)
            mine = [{"at": f"executor {j}", "time": [t], "count": 1, "what": f"{what} at {name}"}
                    for j, t in enumerate(entries) if t != END_TIME]
            pointstamps += mine
            own += [p for p in mine if p["at"] == f"executor {self.index}"]
            low = frontier.low
            if low != END_TIME:
                holding[name] = [{"at": f"executor {j}", "time": [low], "what": what}
                                 for j, t in enumerate(entries) if t == low]
        return {
            "frontiers": {name: [[t.epoch] for t in ts] for name, ts in self.frontiers().items()},
            "pointstamps": sorted(pointstamps, key=lambda p: (p["at"], p["what"])),
            "holding": holding,
            "own_pointstamps": own,
        }


def gate_progress(plan, index: int) -> GateProgress | None:
    """The gates of `plan` (a tree flow's, built for executor `index` of several), each with
    what feeds it: its source's watermark, or the windows' of an exchange before it; None
    without any."""
    gates = []

    def walk(node, upstream: str) -> None:
        if isinstance(node, (SsbWindowAggregate, RouteByOwner)):
            gates.append((f"{node.spec.step_id}.in0", node, upstream))
            upstream = f"window {node.spec.step_id}"
        for child in node.children:
            walk(child, upstream)

    for step_id, root in plan.roots.items():
        walk(root, f"source {step_id}")
    return GateProgress(gates, index) if gates else None
