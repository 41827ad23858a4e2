"""Path summaries: how a timestamp changes along a path of the dataflow graph.

Only three kinds of node change a timestamp (the seed's table): an ingress into a loop appends
a counter 0, an egress out of it drops the last counter, a feedback adds k >= 1 to the last
counter; everything else keeps it (the identity). Any path is a sequence of these, and every
such sequence reduces to one normal form, which is what `PathSummary` stores:

    drop the last `pop` counters, add `advance` to the (new) last one, append the `push` counters

Laws (checked in tests/progress/test_summary.py), for timestamps t1, t2 the summaries apply to:

- monotone:     t1 <= t2  =>  s(t1) <= s(t2)
- composition:  s.followed_by(r)(t) == r(s(t))        (and followed_by is associative)
- identity:     IDENTITY(t) == t;  IDENTITY.followed_by(s) == s == s.followed_by(IDENTITY)
- order:        s1 <= s2  iff  s1(t) <= s2(t) for every t both apply to (sound and complete)
- a summary with `advances` (a cycle through a feedback of its own loop) has s(t) > t.

Summary order: s1 <= s2 iff s1(t) <= s2(t) for every t both apply to (loop counters are never
negative: only ingress (0) and feedback (+k) make them). In normal form: both must change the
depth alike; with equal `pop`, compare (advance, push) lexicographically; if s1 drops more
counters, its advance must be 0 and its push <= the least of s2's results there (zeros, then
s2's advance, then s2's push); if s2 drops more, s2's advance must be positive. The least
summaries between two locations are an `Antichain` under this order.

`apply` returns None when the summary does not apply (the timestamp has too few counters) or a
counter would overflow int64: then no timestamp results (as timely's `results_in`).
"""

from __future__ import annotations

from slashrt.progress.timestamp import MAX_EPOCH, Timestamp

__all__ = ["PathSummary", "IDENTITY", "INGRESS", "EGRESS", "feedback"]

_timestamp = tuple.__new__  # _timestamp(Timestamp, (epoch, counters)): a Timestamp of checked parts


class PathSummary:
    """The normal form (pop, advance, push) of a path's effect on timestamps; immutable."""

    __slots__ = ("pop", "advance", "push", "_hash", "_identity")

    def __init__(self, pop: int = 0, advance: int = 0, push: tuple[int, ...] = ()):
        if pop < 0 or advance < 0 or any(c < 0 for c in push):
            raise ValueError(f"a path summary has no negative parts: pop={pop} advance={advance} push={push}")
        self.pop = pop
        self.advance = advance
        self.push = push
        self._hash = hash((pop, advance, push))
        self._identity = not pop and not advance and not push

    # --- meaning -------------------------------------------------------------------------
    def applies_at(self, depth: int) -> bool:
        """Does the summary apply to timestamps with `depth` loop counters?"""
        return depth >= self.pop + (1 if self.advance else 0)

    def depth_after(self, depth: int) -> int:
        return depth - self.pop + len(self.push)

    def apply(self, t: Timestamp) -> Timestamp | None:
        if self._identity:
            return t
        epoch, counters = t
        depth, pop, advance = len(counters), self.pop, self.advance
        if depth < pop + (1 if advance else 0):
            return None  # does not apply (`applies_at`)
        base = counters[: depth - pop] if pop else counters
        if advance:
            last = base[-1] + advance
            if last > MAX_EPOCH:
                return None
            base = base[:-1] + (last,)
        # counters stay non-negative (ours are, and every part of a summary is): no check
        return _timestamp(Timestamp, (epoch, base + self.push))

    __call__ = apply

    @property
    def advances(self) -> bool:
        """True if s(t) > t for every t it applies to (a cycle through its own feedback)."""
        return self.advance > 0 and self.pop == len(self.push)

    # --- composition ---------------------------------------------------------------------
    def followed_by(self, other: PathSummary) -> PathSummary:
        """The summary of a path along self, then along other."""
        pop, advance, push = self.pop, self.advance, self.push
        if other.pop <= len(push):
            push = push[: len(push) - other.pop]
        else:  # other drops every counter self pushed, and more, with self's advance
            pop, advance, push = pop + other.pop - len(push), 0, ()
        if other.advance:
            if push:
                push = push[:-1] + (push[-1] + other.advance,)
            else:
                advance += other.advance
        return PathSummary(pop, advance, push + other.push)

    # --- order ---------------------------------------------------------------------------
    def less_equal(self, other: PathSummary) -> bool:
        """s(t) <= other(t) for every timestamp t both apply to (see the module docstring)."""
        if self.pop - len(self.push) != other.pop - len(other.push):
            return False  # results of different depths never compare
        if self.pop == other.pop:
            return (self.advance, self.push) <= (other.advance, other.push)
        if self.pop > other.pop:
            # at the deepest counter self keeps, other copies it; after it, self is constant
            # and other is least when the counters it copies are zeros
            gap = self.pop - other.pop
            least = (0,) * (gap - 1) + (other.advance,) + other.push
            return not self.advance and self.push <= least
        # other drops more: other's advance decides at the deepest counter other keeps; without
        # it, self copies counters that may be arbitrarily large where other is constant
        return other.advance > 0

    def less_than(self, other: PathSummary) -> bool:
        return self.less_equal(other) and self != other

    __le__ = less_equal
    __lt__ = less_than

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PathSummary):
            return NotImplemented
        return self.pop == other.pop and self.advance == other.advance and self.push == other.push

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        for name, known in (("IDENTITY", IDENTITY), ("INGRESS", INGRESS), ("EGRESS", EGRESS)):
            if self == known:
                return name
        if not self.pop and not self.push:
            return f"feedback({self.advance})"
        return f"PathSummary(pop={self.pop}, advance={self.advance}, push={self.push})"


IDENTITY = PathSummary()
INGRESS = PathSummary(push=(0,))
EGRESS = PathSummary(pop=1)


def feedback(step: int = 1) -> PathSummary:
    """The summary of a feedback node: the innermost loop counter grows by `step` >= 1."""
    if step < 1:
        raise ValueError(f"a feedback must advance the loop counter by at least 1, not {step}")
    return PathSummary(advance=step)
