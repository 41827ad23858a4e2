"""Antichains (frontiers of partially ordered elements) and compacting change batches.

Elements are anything with `less_equal(other)` that is hashable (`Timestamp`, `PathSummary`,
pointstamps in the tracker).

`Antichain`: a set of mutually incomparable elements, the minimal ones of everything inserted.
Laws (tests/progress/test_antichain.py):
- after any inserts, no element is less_equal another, and `less_equal(t)` is True iff some
  inserted element is <= t (the antichain is the set of minimal inserted elements);
- insertion order does not matter (the result is the same set);
- `a.dominates(b)` iff every element of b is >= some element of a (a is not ahead of b).

`MutableAntichain`: a count per element (counts may go negative transiently); its frontier is
the antichain of minimal elements with a positive count. `update_iter(changes)` applies
(element, delta) changes and returns the frontier's changes as (element, +1 | -1): applying
those to the old frontier gives the new one, and the frontier equals the minimal positive
elements after any sequence of updates, whatever the order of the updates. With `total=True`
(every two elements comparable: timestamps outside loops) the frontier is at most one element
and the same as without it. Cost: O(changes * frontier elements) per update, except when a
frontier element's count drops to zero: then the frontier is recomputed from the n counted
elements, O(n) with `total`, O(n log n + n * frontier elements) without.

`ChangeBatch`: (item, delta) updates accumulated per item. Law: `drain()` gives, for every
item, the sum of its deltas, never a zero, whatever the order the updates came in.
Cost: O(1) per update; compaction is free (a dict keeps the sums).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

__all__ = ["Antichain", "MutableAntichain", "ChangeBatch"]


class Antichain:
    """The minimal elements of what was inserted. Cost: O(size) per insert or query; frontiers
    in slashrt are a handful of elements."""

    __slots__ = ("_elements",)

    def __init__(self, elements: Iterable[Any] = ()):
        self._elements: list = []
        for element in elements:
            self.insert(element)

    @classmethod
    def _of(cls, minimal: Iterable[Any]) -> Antichain:
        """An antichain of elements already known to be mutually incomparable."""
        chain = cls.__new__(cls)
        chain._elements = list(minimal)
        return chain

    def insert(self, element) -> bool:
        """Add `element` unless some element is <= it; drop the elements it is <= of. Returns
        True if the antichain changed."""
        elements = self._elements
        for existing in elements:
            if existing.less_equal(element):
                return False
        self._elements = [e for e in elements if not element.less_equal(e)]
        self._elements.append(element)
        return True

    def less_equal(self, element) -> bool:
        """Is some element <= `element`? (Then `element` is not yet complete.)"""
        for e in self._elements:
            if e.less_equal(element):
                return True
        return False

    def less_than(self, element) -> bool:
        return any(e.less_equal(element) and e != element for e in self._elements)

    def dominates(self, other: Iterable) -> bool:
        """Is every element of `other` >= some element of self?"""
        return all(self.less_equal(element) for element in other)

    @property
    def elements(self) -> tuple:
        return tuple(self._elements)

    def __iter__(self) -> Iterator:
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __bool__(self) -> bool:
        return bool(self._elements)

    def __contains__(self, element) -> bool:
        return element in self._elements

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Antichain):
            return NotImplemented
        return set(self._elements) == set(other._elements)

    def __repr__(self) -> str:
        return f"Antichain({self._elements!r})"


class MutableAntichain:
    """Counts per element; the frontier is the minimal elements with a positive count. A
    frontier handed out is never changed afterwards (a new one replaces it): a caller may keep
    it and compare it with a later one.

    `total=True` is the caller's promise that every two elements it will ever hold are
    comparable (timestamps outside every loop): the frontier then has at most one element,
    kept without building antichains. The result is the same as without it (tested)."""

    __slots__ = ("_counts", "_least", "_frontier", "_total")

    def __init__(self, total: bool = False) -> None:
        self._counts: dict = {}
        self._least: list = []  # the frontier's elements; replaced, never changed in place
        self._frontier: Antichain | None = None  # `frontier`, built when asked for
        self._total = total

    @property
    def frontier(self) -> Antichain:
        frontier = self._frontier
        if frontier is None:
            frontier = self._frontier = Antichain._of(self._least)
        return frontier

    def count(self, element) -> int:
        return self._counts.get(element, 0)

    def less_equal(self, element) -> bool:
        """Is some frontier element <= `element`?"""
        for least in self._least:
            if least.less_equal(element):
                return True
        return False

    def is_empty(self) -> bool:
        return not self._least

    def updater(self) -> Callable[[Iterable[tuple[Any, int]]], list[tuple[Any, int]]]:
        """`update_iter` bound to the path this antichain takes (for a caller that keeps it and
        calls it often: one dispatch fewer per call)."""
        return self._update_total if self._total else self._update_general

    def update_iter(self, changes: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        """Apply (element, delta) changes; return the frontier's changes (element, +1 | -1),
        removals first.

        The frontier is recomputed from the counts only when one of its elements stopped being
        positive; elements that became positive are otherwise merged into it (anything else
        positive is above an old frontier element that is still there)."""
        if self._total:
            return self._update_total(changes)
        return self._update_general(changes)

    def _update_general(self, changes: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        counts = self._counts
        least = self._least
        left = False  # a frontier element stopped being positive
        entered = None  # elements that became positive
        for element, delta in changes:
            if not delta:
                continue
            before = counts.get(element, 0)
            after = before + delta
            if after:
                counts[element] = after
            else:
                del counts[element]
            if after > 0:
                if before <= 0:
                    if entered is None:
                        entered = [element]
                    else:
                        entered.append(element)
            elif before > 0 and not left and element in least:
                left = True
        if left:
            new = self._rebuilt()
        elif entered is not None:
            new = self._merged([e for e in entered if counts.get(e, 0) > 0])
            if new is None:
                return []
        else:
            return []
        out = [(e, -1) for e in least if e not in new] + [(e, 1) for e in new if e not in least]
        if out:
            self._least = new
            self._frontier = None
        return out

    def _update_total(self, changes: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        """`update_iter` when every two elements compare: the least positive element is kept
        after each change, and looked for among the counts only when it stops being positive."""
        counts = self._counts
        least = self._least
        old = low = least[0] if least else None
        lost = False  # the least element stopped being positive: find the new one at the end
        for element, delta in changes:
            if not delta:
                continue
            before = counts.get(element, 0)
            after = before + delta
            if after:
                counts[element] = after
            else:
                del counts[element]
            if after > 0:
                if before <= 0 and not lost and (low is None or not low.less_equal(element)):
                    low = element
            elif before > 0 and not lost and (element is low or element == low):
                lost = True
        if lost:
            low = None
            for element, count in counts.items():
                if count > 0 and (low is None or not low.less_equal(element)):
                    low = element
        if low is old or low == old:
            return []
        self._least = [] if low is None else [low]
        self._frontier = None
        if old is None:
            return [(low, 1)]
        return [(old, -1)] if low is None else [(old, -1), (low, 1)]

    def _rebuilt(self) -> list:
        """The frontier from scratch: the minimal elements with a positive count."""
        positive = [e for e, c in self._counts.items() if c > 0]
        if len(positive) < 3:  # no sorting for the usual one or two
            if len(positive) == 2:
                a, b = positive
                if a.less_equal(b):
                    return [a]
                if b.less_equal(a):
                    return [b]
            return positive
        sort_key = getattr(type(positive[0]), "sort_key", None)
        if sort_key is None:  # no linear extension known: inserts may have to drop elements
            return Antichain(positive)._elements
        # a linear extension puts smaller elements first, so no kept element is ever removed
        positive.sort(key=sort_key)
        least: list = []
        for element in positive:
            for kept in least:
                if kept.less_equal(element):
                    break
            else:
                least.append(element)
        return least

    def _merged(self, entered: list) -> list | None:
        """The frontier with the elements that became positive merged in, or None if it stays."""
        new = self._least
        for element in entered:
            if any(e.less_equal(element) for e in new):
                continue
            new = [e for e in new if not element.less_equal(e)]
            new.append(element)
        return None if new is self._least else new

    def positive(self) -> Iterator[tuple[Any, int]]:
        return ((e, c) for e, c in self._counts.items() if c > 0)

    def __repr__(self) -> str:
        return f"MutableAntichain(frontier={tuple(self._least)!r}, counts={self._counts!r})"


class ChangeBatch:
    """Accumulated (item, delta) updates; zero sums vanish."""

    __slots__ = ("_sums",)

    def __init__(self, updates: Iterable[tuple[Hashable, int]] = ()):
        self._sums: dict = {}
        self.extend(updates)

    def update(self, item: Hashable, delta: int) -> None:
        total = self._sums.get(item, 0) + delta
        if total:
            self._sums[item] = total
        else:
            self._sums.pop(item, None)

    def extend(self, updates: Iterable[tuple[Hashable, int]]) -> None:
        sums = self._sums
        for item, delta in updates:  # `update`, inlined: this is every tracker update's path
            total = sums.get(item, 0) + delta
            if total:
                sums[item] = total
            else:
                sums.pop(item, None)

    def get(self, item: Hashable) -> int:
        return self._sums.get(item, 0)

    def is_empty(self) -> bool:
        return not self._sums

    def items(self) -> list[tuple[Hashable, int]]:
        return list(self._sums.items())

    def split(self) -> tuple[list[Hashable], list[Hashable]]:
        """The items with a negative sum, and those with a positive one."""
        negative, positive = [], []
        for item, total in self._sums.items():
            (negative if total < 0 else positive).append(item)
        return negative, positive

    def drain(self) -> list[tuple[Hashable, int]]:
        """The accumulated updates (no zeros); the batch is empty afterwards."""
        out = list(self._sums.items())
        self._sums.clear()
        return out

    def __len__(self) -> int:
        return len(self._sums)

    def __repr__(self) -> str:
        return f"ChangeBatch({self._sums!r})"
