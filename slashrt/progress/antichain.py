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
elements after any sequence of updates, whatever the order of the updates.

`ChangeBatch`: (item, delta) updates accumulated per item. Law: `drain()` gives, for every
item, the sum of its deltas, never a zero, whatever the order the updates came in.
Cost: O(1) per update; compaction is free (a dict keeps the sums).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
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
        return any(e.less_equal(element) for e in self._elements)

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
    """Counts per element; the frontier is the minimal elements with a positive count."""

    __slots__ = ("_counts", "_frontier")

    def __init__(self) -> None:
        self._counts: dict = {}
        self._frontier = Antichain()

    @property
    def frontier(self) -> Antichain:
        return self._frontier

    def count(self, element) -> int:
        return self._counts.get(element, 0)

    def less_equal(self, element) -> bool:
        return self._frontier.less_equal(element)

    def is_empty(self) -> bool:
        return not self._frontier

    def update_iter(self, changes: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        """Apply (element, delta) changes; return the frontier's changes (element, +1 | -1)."""
        counts = self._counts
        frontier = self._frontier
        rebuild = False
        for element, delta in changes:
            if not delta:
                continue
            before = counts.get(element, 0)
            after = before + delta
            if after:
                counts[element] = after
            else:
                del counts[element]
            if (before > 0) == (after > 0):
                continue  # did not enter or leave the positive set
            if after > 0:  # entered: matters only if no frontier element is <= it
                rebuild = rebuild or not frontier.less_equal(element)
            else:  # left: matters only if it was a frontier element
                rebuild = rebuild or element in frontier
        if not rebuild:
            return []
        new = Antichain(sorted((e for e, c in counts.items() if c > 0), key=_sort_key))
        old = set(frontier)
        self._frontier = new
        fresh = set(new)
        return [(e, -1) for e in frontier if e not in fresh] + [(e, 1) for e in new if e not in old]

    def positive(self) -> Iterator[tuple[Any, int]]:
        return ((e, c) for e, c in self._counts.items() if c > 0)

    def __repr__(self) -> str:
        return f"MutableAntichain(frontier={self._frontier.elements!r}, counts={self._counts!r})"


def _sort_key(element):
    # a linear extension puts smaller elements first, so Antichain.insert never has to remove
    key = getattr(element, "sort_key", None)
    return key() if key is not None else 0


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
        for item, delta in updates:
            self.update(item, delta)

    def get(self, item: Hashable) -> int:
        return self._sums.get(item, 0)

    def is_empty(self) -> bool:
        return not self._sums

    def items(self) -> list[tuple[Hashable, int]]:
        return list(self._sums.items())

    def drain(self) -> list[tuple[Hashable, int]]:
        """The accumulated updates (no zeros); the batch is empty afterwards."""
        out = list(self._sums.items())
        self._sums.clear()
        return out

    def __len__(self) -> int:
        return len(self._sums)

    def __repr__(self) -> str:
        return f"ChangeBatch({self._sums!r})"
