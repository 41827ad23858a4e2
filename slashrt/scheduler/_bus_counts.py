"""The pointstamp counts of an executor in a multi-executor run: its own updates go to the
progress bus, its frontiers come from the bus's view of the global counts.

Every executor runs every step of the flow, and its steps are the flow's steps in the flow's
order, so a `Location` (step index, port) already is the logical location the protocol counts
(the projection is the identity). `BusCounts` stands where `PointstampProgress` keeps its
`Tracker` on one executor: `update` only buffers; the buffer is recorded on the bus
(`ProgressExchange` decides what to broadcast and applies it to the view) and what the exchange
held is sent when someone waits for it (below), or when the executor goes idle (`idle`,
`flush`); `propagate` returns the view's frontier changes, its own and those that other
executors' messages made, in the order they happened. The view moves only when the buffer is
recorded or a peer's message arrives (`must_settle`).

Why record only then: a source feeding operators moves its capability at every watermark
change (once per millisecond of event time on YSB), and each move retires a pointstamp the
peers know, which the exchange must send at once; recording the executor's busy stretch as one
batch nets those moves to one (+1 at the last, -1 at the first) and the batches' +1s against
their -1s. It is safe: everything buffered is covered by a pointstamp the view holds (the
published capability it came from), whose -1 is buffered too, so the view only stays behind (a
notification waits, never comes early). `RECORD_EVERY` buffered updates are recorded anyway, so
a busy executor's memory stays bounded. The view never runs ahead of the global counts, so a
frontier read here never lets a notification or a sink's end through early on any executor.

Except when someone waits for it: if the buffer drops a pointstamp that could-result-in a
time this executor waits for (its operators' notification requests, its windows' ends:
`slashrt.progress.waiters`) and nothing the buffer adds could-result-in that time, the buffer is
recorded and the exchange flushed at once, in the middle of the busy stretch. That is the
update the notification waits for, here and on the other executors (which run the same
operators); the moves between two waited-for times (a source's millisecond watermarks inside
a 10 s window) still net to one.

A time only another executor waits for (a window it holds that this one has no key in, a
notification only it requested) is published when this executor goes idle: at once when its
inputs ended or its flow has loops (the run's end, a loop's rounds: `PointstampProgress.quiet`), and while they
still stream once it has been idle for `GRACE_S`, and at least every `STALE_S` while it has
something to publish. An update at a location from which no waiting input (nor a sink passing
watermarks on) is reachable, e.g. a fired window's capability above a plain sink, gets no grace
(`silent`): it goes with the next news, or once stale. An executor between two
buffers of a stream is idle for microseconds: publishing at every such moment was one message
to every peer, and one settle on each, per buffer. The peers' messages that arrived while this
executor was busy are applied at every `propagate` (`ProgressBus.poll`), not only when it next
yields to the bus's receive tasks; after an urgent flush the executor yields once (`published`),
so channels whose bytes a task reads (tcp) take in what peers sent meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import trio

from slashrt.progress import Location, Timestamp
from slashrt.progress.antichain import Antichain, ChangeBatch
from slashrt.progress.timestamp import MIN_EPOCH
from slashrt.progress.tracker import Pointstamp
from slashrt.progress.waiters import Waiters, Waits

__all__ = ["BusCounts", "initial_capabilities", "RECORD_EVERY", "GRACE_S", "STALE_S"]

RECORD_EVERY = 4096
GRACE_S = 0.001  # an idle executor waits this long for more work before it publishes what no one here waits for
STALE_S = 0.02  # and publishes it at least this often while it has any (busy or idle)


def initial_capabilities(sources: Iterable[int], executors: int) -> list[tuple[Pointstamp, int]]:
    """Every source instance's first capability (one per executor at the least time), known
    to all executors without a message: `ProgressExchange(initial=...)`."""
    return [((Location.output(i, 0), Timestamp(MIN_EPOCH)), executors) for i in sources]


class BusCounts:
    """The `Tracker` calls `PointstampProgress` makes, answered by a `ProgressBus`."""

    def __init__(
        self, bus, on_news: Callable[[], None], waits: Waits | None = None, silent: frozenset[Location] = frozenset()
    ):
        """`silent`: locations whose updates no one waits for (`idle`)."""
        self.bus = bus
        self._silent = silent
        self.view = bus.exchange.view
        self.graph = self.view.graph
        self._pending = ChangeBatch()  # a busy stretch's updates, netted
        self._changes: list[tuple[Location, Timestamp, int]] = []
        self._on_news = on_news
        self._waiters = Waiters(self.graph, waits or {})
        # `_urgent` looks again only after a -1 or a change of what is waited for (a +1
        # elsewhere only holds more back)
        self._recheck = False
        self.published = False  # an urgent flush happened (the executor yields once: `settle`)
        # trio time of the first look at the buffer after the last flush (None: not looked yet)
        self._flushed_at: float | None = None

        def changed(changes) -> None:  # from record/flush here, or a peer's message
            self._changes.extend(changes)
            on_news()

        bus.on_frontier_change = changed

    def update(self, location: Location, time: Timestamp, delta: int) -> None:
        self._pending.update((location, time), delta)
        if location in self._waiters.waits:
            self._waiters.update(location, time, delta)
            self._recheck = True
        elif delta < 0:
            self._recheck = True

    def update_iter(self, updates: Iterable[tuple[Pointstamp, int]]) -> None:
        updates = updates if isinstance(updates, list) else list(updates)
        self._pending.extend(updates)
        waiters, waits = self._waiters, self._waiters.waits
        for (location, time), delta in updates:  # (`update`, inlined: every capability move comes here)
            if location in waits:
                waiters.update(location, time, delta)
                self._recheck = True
            elif delta < 0:
                self._recheck = True

    def must_settle(self) -> bool:
        """Would `propagate` record the buffer now? Only then can a frontier move (a peer's
        message wakes the executor by itself). Looked at without the windows' holds counted:
        the holds only add pointstamps, which can make the buffer less urgent, never more."""
        if len(self._pending) > RECORD_EVERY or self._stale():
            return True
        if self._recheck and self._urgent():
            self._recheck = True  # (`propagate` looks again, with the holds counted)
            return True
        return False

    def propagate(self) -> list[tuple[Location, Timestamp, int]]:
        self.bus.poll()  # peers' news that arrived while this executor was busy
        if len(self._pending) > RECORD_EVERY:
            self._record()
        elif self._recheck and self._urgent():
            self.flush()
            self.published = True
        elif self._stale():
            self.flush()
        self._changes.extend(self.view.propagate())  # the initial capabilities, the first time
        changes, self._changes = self._changes, []
        return changes

    def idle(self) -> float | None:
        """The executor has nothing to do: how long it waits for more work before it calls
        `flush` (None: nothing to publish, or published now because it was stale)."""
        if self._pending.is_empty() and self.bus.exchange.holds_nothing():
            return None
        if self._stale():
            self.flush()
            return None
        if self.bus.exchange.holds_nothing() and all(location in self._silent for (location, _), _ in self._pending.items()):
            return None  # (e.g. a fired window's capability: goes with the next news, or when stale)
        return GRACE_S

    def flush(self) -> None:
        """What the exchange holds back goes out now (the frontier changes wait for the next
        `propagate`)."""
        self._record()
        self.bus.flush()
        self._flushed_at = None

    def _stale(self) -> bool:
        """Something is buffered, and nothing was published for `STALE_S` (trio's clock: a
        test's mock clock too)."""
        if self._pending.is_empty():
            return False
        now = trio.current_time()
        if self._flushed_at is None:  # (the first look since a flush counts as the flush)
            self._flushed_at = now
        return now - self._flushed_at > STALE_S

    def _record(self) -> None:
        if not self._pending.is_empty():
            self.bus.record(self._pending.drain())

    def _urgent(self) -> bool:
        """Does the buffer drop a pointstamp that holds back a waited-for time, without adding
        one that holds it back too?"""
        self._recheck = False
        drops, adds = self._pending.split()
        return bool(drops) and self._waiters.unblocked_by(drops, adds)

    def frontier(self, location: Location) -> Antichain:
        return self.view.frontier(location)

    def pointstamps(self) -> Iterator[tuple[Pointstamp, int]]:
        return self.view.pointstamps()

    def unpublished(self) -> list[tuple[Pointstamp, int]]:
        """This executor's updates no other executor's view has yet: the buffer, and what the
        exchange holds back (a report's `own` pointstamps stay where the views have them)."""
        return self._pending.items() + self.bus.exchange.buffered

    def is_idle(self) -> bool:
        """Nothing outstanding on any executor (as far as this view knows)."""
        return self._pending.is_empty() and self.view.is_idle()
