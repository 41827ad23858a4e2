"""CRDT partial state of keyed aggregates.

A partial is three aligned arrays ``(keys, counts, vals)``: one entry per key, holding what one
executor (or one window slice) has seen. Partials of the same aggregate merge by a *join* that is
associative and commutative, so executors can update them eagerly and merge them lazily in any
order (Slash's idea 2). Laws, checked by property tests in tests/ssb/test_crdt.py:

- join(a, join(b, c)) == join(join(a, b), c)           (associative)
- join(a, b) == join(b, a)                              (commutative)
- finalize(join(a, a)) == finalize(a) for MIN and MAX  (idempotent values; count/sum/mean are not:
  they are replicated-counter style partials whose join adds, so each delta must be merged once,
  which the epoch protocol guarantees by sequence numbers)
- join(a, zero) == a                                    (the empty partial is the identity)

`HashAgg` in slashrt._kernels is the mutable, native form of the same join; this module is the
vectorised reference and the merge used on exported partials. A HashAgg is also an SSB fragment:
a hash index over a log-structured store, where ``mark()`` ends an epoch and ``delta(mark)`` is
the change since then as one contiguous tail of the log (each key once, holding the join of its
updates since the mark), and ``ship()`` hands a helper's whole fragment over and restarts it from
the zero value. Deltas of successive epochs join to the partial of everything.

NaN policy (pandas' skipna), applied where records become partials (`HashAgg.update`,
`records_as_partials`), so that joins of partials need no special case: a NaN value adds nothing
to a sum or mean and a mean does not count it (a MEAN partial's count is of non-NaN values);
MIN/MAX join with fmin/fmax, which ignore NaN. So a key whose values are all NaN finalizes to
0.0 (sum), NaN (mean: 0/0; min, max), and COUNT counts records, NaN or not.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["AggKind", "Partial", "join", "finalize", "empty_partial", "result_dtype", "records_as_partials"]


class AggKind(str, enum.Enum):
    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"  # kept as a float64 sum + count of non-NaN values, finalised by division

    @property
    def idempotent(self) -> bool:
        return self in (AggKind.MIN, AggKind.MAX)


Partial = tuple[np.ndarray, np.ndarray, np.ndarray]  # keys int64, counts int64, vals


def empty_partial(value_dtype: np.dtype = np.dtype("i8")) -> Partial:
    return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, value_dtype))


def join(kind: AggKind, a: Partial, b: Partial) -> Partial:
    """Merge two partials of the same aggregate; the result is sorted by key."""
    keys = np.concatenate([a[0], b[0]])
    counts = np.concatenate([a[1], b[1]])
    vals = np.concatenate([a[2], b[2]])
    ukeys, inverse = np.unique(keys, return_inverse=True)
    out_counts = np.zeros(len(ukeys), np.int64)
    np.add.at(out_counts, inverse, counts)
    if kind is AggKind.COUNT:
        out_vals = np.zeros(len(ukeys), vals.dtype)
    elif kind in (AggKind.SUM, AggKind.MEAN):
        out_vals = np.zeros(len(ukeys), vals.dtype)
        np.add.at(out_vals, inverse, vals)
    else:
        # fmin/fmax as HashAgg: a NaN is ignored unless every value of the key is NaN
        ufunc = np.fmin if kind is AggKind.MIN else np.fmax
        out_vals = np.empty(len(ukeys), vals.dtype)
        # seed every key with one of its own values, then fold the rest in
        out_vals[inverse] = vals
        ufunc.at(out_vals, inverse, vals)
    return ukeys, out_counts, out_vals


def records_as_partials(kind: AggKind, counts: np.ndarray, vals: np.ndarray) -> None:
    """Make rows holding one record each (count 1, the record's value) partials under the NaN
    policy, in place: a NaN value of a SUM or MEAN becomes 0.0, and a MEAN row's count 0."""
    if kind not in (AggKind.SUM, AggKind.MEAN) or vals.dtype.kind != "f":
        return
    nan = np.isnan(vals)
    if nan.any():
        vals[nan] = 0.0
        if kind is AggKind.MEAN:
            counts[nan] = 0


def result_dtype(kind: AggKind, value_dtype: np.dtype) -> np.dtype:
    if kind is AggKind.COUNT:
        return np.dtype("<i8")
    if kind is AggKind.MEAN:
        return np.dtype("<f8")
    return np.dtype(value_dtype).newbyteorder("<")


def finalize(kind: AggKind, counts: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """The user-visible value of each entry of a partial."""
    if kind is AggKind.COUNT:
        return counts
    if kind is AggKind.MEAN:
        # a key whose values were all NaN has count 0: its mean is NaN (0/0), no warning
        with np.errstate(invalid="ignore", divide="ignore"):
            return vals / counts
    return vals
