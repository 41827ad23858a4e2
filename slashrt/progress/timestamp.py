"""Logical timestamps: (epoch, loop counters), as in Naiad.

A `Timestamp` is an epoch (the input round; for us the event time, an int64 watermark) and a
tuple of loop counters, one per loop context the location sits in (innermost last).

Order (Naiad's, the seed's choice, not timely dataflow's product order for nested scopes):

    t1 <= t2  iff  t1.epoch <= t2.epoch  and  t1.counters <= t2.counters lexicographically

and only timestamps of the same depth (number of counters) are comparable: a location has one
depth, so timestamps at one location always are. This is the product of two total orders, so
it is a partial order:

- reflexive:      t <= t
- antisymmetric:  t1 <= t2 and t2 <= t1  =>  t1 == t2
- transitive:     t1 <= t2 and t2 <= t3  =>  t1 <= t3

The comparison operators (`<=`, `<`, `>=`, `>`) are this partial order, as for Python sets;
`sort_key` is a linear extension of it (t1 <= t2 implies sort_key(t1) <= sort_key(t2)) for
deterministic sorting. Within one epoch, timestamps of one depth are totally ordered.

Event time maps onto the epoch: a source whose watermark is w holds a capability at
`Timestamp.at(w)`; advancing the watermark advances the capability.
"""

from __future__ import annotations

__all__ = ["Timestamp", "MIN_EPOCH", "MAX_EPOCH"]

MIN_EPOCH = -(2**63)  # the event time of "no time yet" (slashrt.progress.frontier.NO_TIME)
MAX_EPOCH = 2**63 - 1


class Timestamp:
    """An immutable (epoch, counters) pair; hashable, compared by the partial order above."""

    __slots__ = ("epoch", "counters", "_hash")

    def __init__(self, epoch: int, counters: tuple[int, ...] = ()):
        if counters and min(counters) < 0:
            raise ValueError(f"loop counters are never negative: {counters}")
        self.epoch = epoch
        self.counters = counters
        self._hash = hash((epoch, counters))

    @classmethod
    def at(cls, event_time: int) -> Timestamp:
        """The timestamp of event time (watermark) `event_time` outside every loop."""
        if not MIN_EPOCH <= event_time <= MAX_EPOCH:
            raise ValueError(f"event time {event_time} is outside int64")
        return cls(event_time)

    @property
    def depth(self) -> int:
        return len(self.counters)

    def less_equal(self, other: Timestamp) -> bool:
        return (
            self.epoch <= other.epoch
            and len(self.counters) == len(other.counters)
            and self.counters <= other.counters
        )

    def less_than(self, other: Timestamp) -> bool:
        return self.less_equal(other) and self != other

    def sort_key(self) -> tuple[int, tuple[int, ...]]:
        return (self.epoch, self.counters)

    __le__ = less_equal
    __lt__ = less_than

    def __ge__(self, other: Timestamp) -> bool:
        return other.less_equal(self)

    def __gt__(self, other: Timestamp) -> bool:
        return other.less_than(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timestamp):
            return NotImplemented
        return self.epoch == other.epoch and self.counters == other.counters

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if not self.counters:
            return f"({self.epoch})"
        return f"({self.epoch}, <{', '.join(map(str, self.counters))}>)"
