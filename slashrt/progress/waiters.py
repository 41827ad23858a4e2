"""Waiters: the times one executor waits to see complete, and whether a buffer of its own
updates unblocks one of them (then the buffer should be published now, not when it goes idle).

An executor in a multi-executor run buffers its pointstamp updates and records them on the
progress bus when it goes idle (netted: a busy stretch's capability moves are one update;
`slashrt.scheduler._bus_counts`).
Someone waits on that buffer when it drops a pointstamp that holds back a time a notification
or a window waits for: that drop is what the notification, on this executor and on the
others, needs to hear about. `Waits` says where pointstamps stand for someone waiting (an
operator's output: its notification requests; a window's output: the end of its next window)
and which inputs wait; `Waiters.update` counts this executor's own such pointstamps.

Law (tests/progress/test_waiters.py, random graphs with loops, random updates):

    unblocked_by(drops, adds)  ==  some waited-for (input, time) w has a drop that
                                   could-result-in w and no add that could-result-in w

where the waited-for pairs are (input, t) for every own pointstamp (output, t) with a positive
count, each input of its output's `Waits` entry (t - 1 in epochs for windows, which fire when
nothing before their end can arrive). `waited()` lists them; `unblocked_by` answers without
listing them: summaries never change an epoch, so (l, t) could-result-in (l', t') iff t.epoch
<= t'.epoch and it does with the epochs made equal (memoised per pair of locations and loop
counters), and outside loops a location's waited-for epochs are kept sorted, so the question
is whether one lies between the least epoch of a drop that reaches it and the least epoch of
an add that does (a bisection), however many times are waited for.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator

from slashrt.progress.reachability import Location, Reachability
from slashrt.progress.timestamp import Timestamp

__all__ = ["Waits", "Waiters"]

Waits = dict[Location, tuple[tuple[Location, ...], bool]]
"""Output location whose pointstamps stand for someone waiting -> (the input locations that
wait, True if they wait for the times before the pointstamp's (a window's end) rather than up
to and including it (a notification)). Waiting "before" is for locations outside loops only."""

_MEMO = 4096  # memoised reachability answers kept (inside loops, counters vary without bound)
_NONE = float("inf")


class Waiters:
    """The waited-for times of one executor (its own pointstamps at `waits` outputs)."""

    def __init__(self, graph: Reachability, waits: Waits):
        self.graph = graph
        self.waits = dict(waits)
        # (a port no edge feeds, an SSB window's fragments' second input, has no depth of its
        # own: it is where its node is, which the caller checks)
        outside = {output for output, (inputs, _) in self.waits.items()
                   if not any(graph.depths.get(x, 0) for x in (output, *inputs))}
        for output, (_, before) in self.waits.items():
            if before and output not in outside:
                raise ValueError(f"{graph.name(output)}: waiting before a time is for locations outside loops")
        self._counts: dict[Location, dict[Timestamp, int]] = {output: {} for output in self.waits}
        # outside loops (no counters): the epochs with a positive count, sorted
        self._epochs: dict[Location, list[int]] = {output: [] for output in outside}
        self._reach: dict[tuple, bool] = {}

    def update(self, location: Location, time: Timestamp, delta: int) -> None:
        """An own pointstamp at a `waits` output changed by `delta`."""
        counts = self._counts[location]
        before = counts.get(time, 0)
        after = before + delta
        if after:
            counts[time] = after
        else:
            counts.pop(time, None)
        epochs = self._epochs.get(location)
        if epochs is None or (before > 0) == (after > 0):
            return
        if after > 0:
            insort(epochs, time[0])
        else:
            del epochs[bisect_left(epochs, time[0])]

    def waited(self) -> Iterator[tuple[Location, Timestamp]]:
        """Every waited-for (input location, time)."""
        for output, (inputs, before) in self.waits.items():
            for time, count in self._counts[output].items():
                if count > 0:
                    at = Timestamp(time[0] - 1) if before else time
                    for location in inputs:
                        yield location, at

    def unblocked_by(self, drops: Iterable[tuple[Location, Timestamp]], adds: Iterable[tuple[Location, Timestamp]]) -> bool:
        """Does some drop could-result-in a waited-for time that no add could-result-in?"""
        drops, adds = list(drops), list(adds)
        if not drops:
            return False
        reaches = self.reaches
        for output, (inputs, before) in self.waits.items():
            epochs = self._epochs.get(output)
            if epochs is None:  # inside a loop: each waited-for time on its own
                times = [t for t, count in self._counts[output].items() if count > 0]
                for location in inputs:
                    for t in times:
                        w = (location, t)
                        if any(reaches(p, w) for p in drops) and not any(reaches(p, w) for p in adds):
                            return True
                continue
            if not epochs:
                continue
            shift = 1 if before else 0
            for location in inputs:
                least_drop = min((p[1][0] for p in drops if self._reaches_at(p, location)), default=_NONE)
                if least_drop is _NONE:
                    continue
                least_add = min((p[1][0] for p in adds if self._reaches_at(p, location)), default=_NONE)
                # the least waited-for epoch a drop reaches (a waiter at e waits at e - shift)
                i = bisect_left(epochs, least_drop + shift)
                if i < len(epochs) and epochs[i] - shift < least_add:
                    return True
        return False

    def reaches(self, p: tuple[Location, Timestamp], q: tuple[Location, Timestamp]) -> bool:
        """`graph.could_result_in(p, q)`, memoised on everything but the epochs."""
        (location, time), (target, target_time) = p, q
        if time[0] > target_time[0]:
            return False
        return self._memo(location, time[1], target, target_time[1])

    def _reaches_at(self, p: tuple[Location, Timestamp], target: Location) -> bool:
        """Could p result in some time at `target`, a location outside loops, of an epoch >= p's?"""
        return self._memo(p[0], p[1][1], target, ())

    def _memo(self, location: Location, counters: tuple, target: Location, target_counters: tuple) -> bool:
        key = (location, counters, target, target_counters)
        known = self._reach.get(key)
        if known is None:
            if len(self._reach) >= _MEMO:
                self._reach.clear()
            known = self._reach[key] = self.graph.could_result_in(
                location, Timestamp(0, counters), target, Timestamp(0, target_counters)
            )
        return known
