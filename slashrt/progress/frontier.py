"""Frontiers: the least event time any future update may still carry.

Law (checked in tests/progress/test_frontier.py): a frontier never moves backwards, and
`passed(t)` is True only once no source can still send an update with a time below t. A
window [s, e) of a partition may fire once `passed(e)`.

Two implementations answer the same questions: `VectorClock` (Slash's vector of the sources'
watermarks) and `PointstampClock` (Naiad's: every source is an instance of one logical
operator holding a capability at its watermark; the frontier is what a `Tracker` derives from
those pointstamps by could-result-in). They agree on every sequence of updates (tested), so
the SSB's epoch protocol runs on either (`progress="watermark" | "pointstamp"`).
"""

from __future__ import annotations

import abc

from slashrt.progress.reachability import Builder, Location
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Tracker

__all__ = ["Frontier", "VectorClock", "PointstampClock", "NO_TIME", "END_TIME", "PROGRESS_MODES", "make_frontier"]

NO_TIME = -(2**63)
END_TIME = 2**63 - 1  # a source's watermark once its stream has ended
PROGRESS_MODES = ("watermark", "pointstamp")  # a run's `progress=`: VectorClock or PointstampClock at gates


class Frontier(abc.ABC):
    """`entries[source]` is the last watermark source `source` promised (NO_TIME: none yet)."""

    entries: list[int]

    @abc.abstractmethod
    def advance(self, source: int, time: int) -> bool:
        """Source `source` promises no more updates below `time`. Returns True if the
        frontier moved. A promise below an earlier one is a bug of the caller: ValueError."""

    @property
    @abc.abstractmethod
    def low(self) -> int:
        """No future update from any source has an event time below this."""

    def passed(self, time: int) -> bool:
        return self.low >= time

    def _move(self, source: int, time: int) -> int | None:
        """Set `entries[source]` to `time`; its previous watermark, or None if it was `time`."""
        current = self.entries[source]
        if time < current:
            raise ValueError(f"source {source} moved its watermark back from {current} to {time}")
        if time == current:
            return None
        self.entries[source] = time
        return current


class VectorClock(Frontier):
    """Slash's vector clock: one low watermark per source (executor); the frontier is their
    minimum. Cost: O(1) to advance a source that is not the minimum, O(sources) otherwise."""

    def __init__(self, sources: int, start: int = NO_TIME):
        if sources < 1:
            raise ValueError("a vector clock needs at least one source")
        self.entries = [start] * sources
        self._low = start

    def advance(self, source: int, time: int) -> bool:
        current = self._move(source, time)
        if current is None:
            return False
        if current != self._low:
            return False  # it was not (the only) minimum: the frontier cannot have moved
        low = min(self.entries)
        moved = low != self._low
        self._low = low
        return moved

    @property
    def low(self) -> int:
        return self._low

    def __repr__(self) -> str:
        return f"VectorClock(low={self._low}, entries={self.entries})"


class PointstampClock(Frontier):
    """The same frontier from pointstamps: the sources are instances of one logical operator
    (the projection of the distributed protocol), each holding a capability at its watermark
    on the operator's output; the frontier is the one a `Tracker` implies at the input it
    feeds. A source whose watermark reaches END_TIME gives its capability up; with none left
    the frontier is empty and `low` is END_TIME.

    Cost: a tracker update and propagation per move that changes a count (O(1) locations
    here; about 2.5 us per `advance`, the vector clock's 0.2 us); `low` is O(1)."""

    def __init__(self, sources: int, start: int = NO_TIME):
        if sources < 1:
            raise ValueError("a pointstamp clock needs at least one source")
        graph = Builder()
        source = graph.add_node("sources", inputs=0, outputs=1)
        gate = graph.add_node("gate", inputs=1, outputs=0)
        graph.connect(source, 0, gate, 0)
        self._at = Location.output(source)
        self._gate = Location.input(gate)
        self.tracker = Tracker(graph.build())
        self.entries = [start] * sources
        self.tracker.update(self._at, Timestamp.at(start), sources)
        self._low = start

    def advance(self, source: int, time: int) -> bool:
        current = self._move(source, time)
        if current is None:
            return False
        old = ((self._at, Timestamp.at(current)), -1)
        if time != END_TIME:  # the new capability before the old one goes
            self.tracker.update_iter((((self._at, Timestamp.at(time)), 1), old))
        else:
            self.tracker.update_iter((old,))
        gate = self._gate
        for location, _, _ in self.tracker.propagate():
            if location == gate:
                break
        else:
            return False  # the gate's frontier did not change
        frontier = self.tracker.frontier(gate)
        low = END_TIME if not frontier else min(t.epoch for t in frontier)
        moved, self._low = low != self._low, low
        return moved

    @property
    def low(self) -> int:
        return self._low

    def __repr__(self) -> str:
        return f"PointstampClock(low={self._low}, entries={self.entries})"


def make_frontier(mode: str, sources: int) -> Frontier:
    """The frontier a run's progress mode (`PROGRESS_MODES`) fires gates on: "watermark" (the
    vector clock of the sources' watermarks) or "pointstamp"."""
    if mode == "watermark":
        return VectorClock(sources)
    if mode == "pointstamp":
        return PointstampClock(sources)
    raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
