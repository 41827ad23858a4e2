"""Progress tracking: when can a window fire? (Slash's property P1.)

Naiad-style pointstamp tracking, one pure concept per module (no I/O, no trio), each with its
laws in its docstring and a property test per law in tests/progress/:

- `timestamp`:    `Timestamp` (epoch, loop counters) and its partial order; event time is the epoch
- `summary`:      `PathSummary` (ingress, egress, feedback, identity), applied and composed
- `antichain`:    `Antichain`, `MutableAntichain` (counted frontier), `ChangeBatch`
- `reachability`: graph `Builder` -> `Reachability`: least summaries, `could_result_in`
- `tracker`:      `Tracker`: pointstamp occurrence counts -> the frontier at every location
- `exchange`:     `ProgressExchange`: the distributed protocol's per-executor state machine
- `wire`:         `ProgressCodec`: its messages as compact, validated bytes
"""

from slashrt.progress.antichain import Antichain, ChangeBatch, MutableAntichain
from slashrt.progress.exchange import ProgressExchange, project
from slashrt.progress.reachability import Builder, Location, Reachability
from slashrt.progress.summary import EGRESS, IDENTITY, INGRESS, PathSummary, feedback
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Tracker, move_capability
from slashrt.progress.wire import ProgressCodec

__all__ = [
    "Antichain",
    "Builder",
    "ChangeBatch",
    "EGRESS",
    "IDENTITY",
    "INGRESS",
    "Location",
    "MutableAntichain",
    "PathSummary",
    "ProgressCodec",
    "ProgressExchange",
    "Reachability",
    "Timestamp",
    "Tracker",
    "feedback",
    "move_capability",
    "project",
]
