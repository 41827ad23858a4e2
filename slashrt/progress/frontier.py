"""Frontiers: the least event time any future update may still carry.

Law (checked in tests/progress/test_frontier.py): a frontier never moves backwards, and
`passed(t)` is True only once no source can still send an update with a time below t. A
window [s, e) of a partition may fire once `passed(e)`.
"""

from __future__ import annotations

import abc

__all__ = ["Frontier", "VectorClock", "NO_TIME"]

NO_TIME = -(2**63)


class Frontier(abc.ABC):
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


class VectorClock(Frontier):
    """Slash's vector clock: one low watermark per source (executor); the frontier is their
    minimum. Cost: O(1) to advance a source that is not the minimum, O(sources) otherwise."""

    def __init__(self, sources: int, start: int = NO_TIME):
        if sources < 1:
            raise ValueError("a vector clock needs at least one source")
        self.entries = [start] * sources
        self._low = start

    def advance(self, source: int, time: int) -> bool:
        current = self.entries[source]
        if time < current:
            raise ValueError(f"source {source} moved its watermark back from {current} to {time}")
        if time == current:
            return False
        self.entries[source] = time
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
