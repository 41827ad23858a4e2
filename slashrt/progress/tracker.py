"""The tracker: occurrence counts of pointstamps, and the frontier they imply at every location.

A pointstamp is (location, timestamp). Its occurrence count is what is outstanding there:
records in flight on the edges into an input (+1 when sent, -1 when received) and capabilities
an operator holds at an output (+1 when it may still send at that time, -1 when it gives that
up). A producer adds its +1 before it gives up the -1 that allowed it, so counts never dip.

The implied frontier at a location b is the antichain of least s(t) over every pointstamp
(a, t) with a positive count and every least summary s of a -> b: timestamp t' is complete at
b (no more records or capabilities at or below t' can appear there) iff no frontier element is
<= t'. This replaces the seed's precursor counts as timely dataflow does: a pointstamp's
precursor count is zero exactly when no other active pointstamp could-result-in it
(`precursor_count` computes it, for tests and diagnostics).

Only frontier changes travel: when the least timestamps at a location change, their images
under its summaries change the implied counts downstream (sound because summaries are
monotone: a timestamp above the frontier maps above a frontier element's image).

Laws (tests/progress/test_tracker.py), after any updates:
- `is_complete(b, t)` iff no pointstamp (a, ta) with a positive count could-result-in (b, t);
- the frontier changes `propagate()` reports, applied in order to the empty frontiers, give the
  current frontiers;
- the result does not depend on how updates are split into batches or ordered within one.

Cost: O(changed frontier elements * reachable locations * summaries) per propagate; records
are never counted one by one, only batches (a delta per pointstamp). The targets of each
location and their summaries are looked up once, when the tracker is built; a location
outside loops keeps a one-element frontier (its timestamps are totally ordered), and a target
reached by the identity alone takes the changes as they are (`fast_paths=False` turns both off;
tested equal). About 0.7 us per location whose frontier moves (a count update and its two
changes reported), 2 us per propagate besides (`python -m slashrt.bench.progress_ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from slashrt.progress.antichain import Antichain, MutableAntichain
from slashrt.progress.reachability import Location, Reachability
from slashrt.progress.summary import IDENTITY
from slashrt.progress.timestamp import Timestamp

__all__ = ["Tracker", "Pointstamp", "move_capability"]

Pointstamp = tuple[Location, Timestamp]
MAX_PENDING = 4096  # updates held before they are applied unasked (they are usually a handful)


def move_capability(location: Location, old: Timestamp, new: Timestamp) -> list[tuple[Pointstamp, int]]:
    """The updates that move a capability at `location` from `old` to `new` (a source whose
    watermark advances: `Timestamp.at(watermark)`): +1 at new before -1 at old. Moving back
    is a bug of the caller: ValueError."""
    if not old.less_equal(new):
        raise ValueError(f"a capability at {location} cannot move from {old} back to {new}")
    return [((location, new), 1), ((location, old), -1)]


class Tracker:
    """Pointstamp counts over a `Reachability`, and the frontier implied at every location."""

    def __init__(self, graph: Reachability, fast_paths: bool = True):
        """`fast_paths=False` forces the general path everywhere (for tests proving the fast
        paths change nothing): no one-element frontiers at locations outside loops, and the
        identity summary applied like any other."""
        self.graph = graph
        # updates not yet applied, as they came: the counts consolidate them when applied
        self._pending: list[tuple[Pointstamp, int]] = []
        outside_loops = {loc for loc, depth in graph.depths.items() if depth == 0} if fast_paths else set()
        self._occurrences: dict[Location, MutableAntichain] = {
            loc: MutableAntichain(total=loc in outside_loops) for loc in graph.locations
        }
        self._implied: dict[Location, MutableAntichain] = {
            loc: MutableAntichain(total=loc in outside_loops) for loc in graph.locations
        }
        # the implied frontiers' changes since the last `propagate`, per location as they came
        self._changes: list[tuple[Location, list[tuple[Timestamp, int]]]] = []
        self._occurrence_updates = {loc: counts.updater() for loc, counts in self._occurrences.items()}
        # where a frontier change at a location goes, computed once: (target, the update of the
        # target's implied counts, the least summaries, or None for the identity alone)
        self._targets: dict[Location, tuple[tuple[Location, Callable, tuple | None], ...]] = {
            loc: tuple(
                (target, self._implied[target].updater(), None if fast_paths and summaries.elements == (IDENTITY,) else summaries.elements)
                for target, summaries in graph.reachable_from(loc).items()
            )
            for loc in graph.locations
        }

    # --- updates -------------------------------------------------------------------------
    def update(self, location: Location, time: Timestamp, delta: int) -> None:
        self._pending.append(((location, time), delta))
        if len(self._pending) > MAX_PENDING:
            self._apply()

    def update_iter(self, updates: Iterable[tuple[Pointstamp, int]]) -> None:
        self._pending.extend(updates)
        if len(self._pending) > MAX_PENDING:
            self._apply()

    def propagate(self) -> list[tuple[Location, Timestamp, int]]:
        """Apply the pending updates; return the implied frontiers' changes since the last call
        as (location, timestamp, +1 | -1)."""
        self._apply()
        changes, self._changes = self._changes, []
        return [(location, time, delta) for location, moved in changes for time, delta in moved]

    def _apply(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        per_location: dict[Location, list[tuple[Timestamp, int]]] = {}
        for (location, time), delta in pending:
            changes = per_location.get(location)
            if changes is None:
                per_location[location] = [(time, delta)]
            else:
                changes.append((time, delta))
        occurrence_updates, targets, out = self._occurrence_updates, self._targets, self._changes
        moves = []
        for location, changes in per_location.items():
            moved = occurrence_updates[location](changes)
            if moved:
                moves.append((location, moved))
        if len(moves) == 1:  # the usual case: each target's counts change once, at once
            location, moved = moves[0]
            for target, update, summaries in targets[location]:
                if changed := update(moved if summaries is None else _images(moved, summaries)):
                    out.append((target, changed))
            return
        implied: dict[Location, tuple[Callable, list]] = {}
        for location, moved in moves:
            for target, update, summaries in targets[location]:
                images = moved if summaries is None else _images(moved, summaries)
                known = implied.get(target)
                implied[target] = (update, images) if known is None else (update, known[1] + images)
        for target, (update, images) in implied.items():
            if changed := update(images):
                out.append((target, changed))

    # --- queries (they see every update made so far) --------------------------------------
    def frontier(self, location: Location) -> Antichain:
        self._apply()
        return self._implied[location].frontier

    def is_complete(self, location: Location, time: Timestamp) -> bool:
        """No pointstamp could still result in (location, t') with t' <= time: a notification
        at `time` may be delivered there."""
        self._apply()
        return not self._implied[location].less_equal(time)

    def count(self, location: Location, time: Timestamp) -> int:
        self._apply()
        return self._occurrences[location].count(time)

    def pointstamps(self) -> Iterator[tuple[Pointstamp, int]]:
        """Every pointstamp with a positive count, and its count."""
        self._apply()
        for location, counts in self._occurrences.items():
            for time, count in counts.positive():
                yield (location, time), count

    def is_idle(self) -> bool:
        """Nothing outstanding anywhere: every frontier is empty."""
        self._apply()
        return all(counts.is_empty() for counts in self._occurrences.values())

    def precursor_count(self, location: Location, time: Timestamp) -> int:
        """The seed's PC: how many other active pointstamps could-result-in this one."""
        return sum(
            1
            for (other, t), _ in self.pointstamps()
            if (other, t) != (location, time) and self.graph.could_result_in(other, t, location, time)
        )


def _images(moved: list[tuple[Timestamp, int]], summaries: tuple) -> list[tuple[Timestamp, int]]:
    """The (timestamp, delta) changes `moved` as they arrive through each of `summaries`."""
    images = []
    for time, delta in moved:
        for summary in summaries:
            result = summary.apply(time)
            if result is not None:
                images.append((result, delta))
    return images
