"""The pointstamp counts of an executor in a multi-executor run: its own updates go to the
progress bus, its frontiers come from the bus's view of the global counts.

Every executor runs every step of the flow, and its steps are the flow's steps in the flow's
order, so a `Location` (step index, port) already is the logical location the protocol counts
(the projection is the identity). `BusCounts` stands where `PointstampProgress` keeps its
`Tracker` on one executor: `update` only buffers; `propagate` records what was buffered on
the bus (`ProgressExchange` decides what to broadcast and applies it to the view) and returns
the view's frontier changes, its own and those that other executors' messages made, in the
order they happened. The view never runs ahead of the global counts, so a frontier read here
never lets a notification or a sink's end through early on any executor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from slashrt.progress import Location, Timestamp
from slashrt.progress.antichain import Antichain
from slashrt.progress.timestamp import MIN_EPOCH
from slashrt.progress.tracker import Pointstamp

__all__ = ["BusCounts", "initial_capabilities"]


def initial_capabilities(sources: Iterable[int], executors: int) -> list[tuple[Pointstamp, int]]:
    """Every source instance's first capability (one per executor at the least time), known
    to all executors without a message: `ProgressExchange(initial=...)`."""
    return [((Location.output(i, 0), Timestamp(MIN_EPOCH)), executors) for i in sources]


class BusCounts:
    """The `Tracker` calls `PointstampProgress` makes, answered by a `ProgressBus`."""

    def __init__(self, bus, on_news: Callable[[], None]):
        self.bus = bus
        self.view = bus.exchange.view
        self.graph = self.view.graph
        self._pending: list[tuple[Pointstamp, int]] = []
        self._changes: list[tuple[Location, Timestamp, int]] = []
        self._on_news = on_news

        def changed(changes) -> None:  # from record/flush here, or a peer's message
            self._changes.extend(changes)
            on_news()

        bus.on_frontier_change = changed

    def update(self, location: Location, time: Timestamp, delta: int) -> None:
        self._pending.append(((location, time), delta))

    def update_iter(self, updates: Iterable[tuple[Pointstamp, int]]) -> None:
        self._pending.extend(updates)

    def propagate(self) -> list[tuple[Location, Timestamp, int]]:
        self._record()
        self._changes.extend(self.view.propagate())  # the initial capabilities, the first time
        changes, self._changes = self._changes, []
        return changes

    def flush(self) -> None:
        """The executor goes idle: what the exchange holds back goes out now (the frontier
        changes wait for the next `propagate`)."""
        self._record()
        self.bus.flush()

    def _record(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self.bus.record(pending)

    def frontier(self, location: Location) -> Antichain:
        return self.view.frontier(location)

    def pointstamps(self) -> Iterator[tuple[Pointstamp, int]]:
        return self.view.pointstamps()

    def is_idle(self) -> bool:
        """Nothing outstanding on any executor (as far as this view knows)."""
        return not self._pending and self.view.is_idle()
