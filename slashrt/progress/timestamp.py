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

A `Timestamp` is a tuple (epoch, counters) underneath, so hashing and equality (every count
of the tracker does both) run in C; it equals the plain tuple of its parts.

Event time maps onto the epoch: a source whose watermark is w holds a capability at
`Timestamp.at(w)`; advancing the watermark advances the capability.
"""

from __future__ import annotations

from operator import itemgetter

__all__ = ["Timestamp", "MIN_EPOCH", "MAX_EPOCH"]

MIN_EPOCH = -(2**63)  # the event time of "no time yet" (slashrt.ops.event_time.NO_TIME)
MAX_EPOCH = 2**63 - 1


class Timestamp(tuple):
    """An immutable (epoch, counters) pair; hashable, compared by the partial order above.

    It is a tuple underneath so that hashing and equality, which every count of the tracker
    does, run in C: a `Timestamp` equals the plain tuple (epoch, counters)."""

    __slots__ = ()

    def __new__(cls, epoch: int, counters: tuple[int, ...] = ()):
        if counters and min(counters) < 0:
            raise ValueError(f"loop counters are never negative: {counters}")
        return tuple.__new__(cls, (epoch, counters))

    epoch = property(itemgetter(0), doc="The epoch (event time).")
    counters = property(itemgetter(1), doc="The loop counters, innermost last.")

    @classmethod
    def at(cls, event_time: int) -> Timestamp:
        """The timestamp of event time (watermark) `event_time` outside every loop."""
        if not MIN_EPOCH <= event_time <= MAX_EPOCH:
            raise ValueError(f"event time {event_time} is outside int64")
        return tuple.__new__(cls, (event_time, ()))

    @property
    def depth(self) -> int:
        return len(self[1])

    def less_equal(self, other: Timestamp) -> bool:
        counters, others = self[1], other[1]
        return self[0] <= other[0] and len(counters) == len(others) and counters <= others

    def less_than(self, other: Timestamp) -> bool:
        return self.less_equal(other) and self != other

    def sort_key(self) -> tuple[int, tuple[int, ...]]:
        return (self[0], self[1])

    __le__ = less_equal
    __lt__ = less_than

    def __ge__(self, other: Timestamp) -> bool:
        return other.less_equal(self)

    def __gt__(self, other: Timestamp) -> bool:
        return other.less_than(self)

    __eq__ = tuple.__eq__  # defined here, beside the order, so hashing stays tuple's
    __ne__ = tuple.__ne__
    __hash__ = tuple.__hash__

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        epoch, counters = self
        if not counters:
            return f"({epoch})"
        return f"({epoch}, <{', '.join(map(str, counters))}>)"
