"""Kernels numpy cannot do fast, in C with a pure-numpy fallback.

* ``HashAgg``: hash aggregation over int64 keys (count, sum, min, max, mean). This is the
  partial state of grouped aggregations: every executor folds its batches into its own
  table and partials are joined later (``merge`` / ``merge_from`` are CRDT joins).
* ``ysb_baseline``: the Yahoo Streaming Benchmark query as one plain C loop, the yardstick
  the Python runtime is measured against.
* ``ring_post``, ``ring_poll_data``, ``ring_release``: footers of runs of ring slots, the flag
  stored with release and loaded with acquire ordering (what makes a ring shared between
  processes safe), one call per run of buffers instead of one per buffer.
* ``gather`` and ``minmax``: read a field of a strided record view (a 2-D view over several
  ring slots, or a field of a structured array) in one pass, without numpy's intermediate
  flattening copy.

Which implementation is in use:

* ``NATIVE`` is True when the C extension ``slashrt._native`` imported; then ``HashAgg`` is
  ``NativeHashAgg``. Otherwise ``HashAgg`` is ``NumpyHashAgg``, and ``NativeHashAgg`` and
  ``ysb_baseline`` are None.
* ``SLASHRT_NATIVE=0`` forces the numpy fallback (the extension is not even imported);
  ``SLASHRT_NATIVE=1`` makes a missing extension an ImportError instead of a fallback.

HashAgg semantics (identical in both implementations):

* ``update(keys, values)``: per row ``count += 1``; ``sum``/``mean``: ``val += v``;
  ``min``/``max``: ``val = fmin/fmax(val, v)``. ``mean`` keeps sum and count; divide
  ``vals / counts`` after ``export``. ``count`` ignores values entirely (pass None).
* Integer sums and counts wrap modulo 2**64 like numpy int64 arithmetic. A table made with
  ``HashAgg(kind, value_dtype, check_overflow=True)`` also sets the sticky ``overflowed`` flag
  when an integer sum (or mean) leaves the int64 range (cleared when the table is emptied:
  ``reset``, ``clear``, ``ship``; kept by compaction and pickling; settable, for a table
  restored from its exported arrays, which do not carry it); other tables run loops with no check at
  all. Natively the flag is set when a running sum leaves the range; the numpy fallback checks
  each batch's exact sum and each join, so both set it whenever a key's final sum does not fit
  (and may differ on sums that leave the range and come back). Entries of one key in several
  epochs (after ``mark``) are joined, and checked, when compaction folds them.
* NaN (skipped, as pandas does): ``update`` of a float sum or mean ignores NaN values (a key
  whose values are all NaN sums to 0.0), and a mean counts only non-NaN values (its count is
  then 0: the mean 0/0 is NaN); min/max ignore NaN unless every value of a key is NaN
  (np.fmin/np.fmax). ``merge`` joins partials as they are (a NaN partial, from inf + -inf,
  propagates). Float sums are order-dependent in the last bits, as always.
* ``export()`` returns fresh writable arrays ``(keys, counts, vals)``, one row per key, in no
  particular order (natively: order of first insertion); for ``count`` the vals are 0.
* Inputs are 1-D int64 keys (and values of ``value_dtype``), any stride; a field of a
  structured array (``batch["ad_id"]``) is read in place. ``update`` also takes 2-D views of
  the same shape (a field of the records of a run of ring slots, rows x records), read in
  place natively (flattened by the numpy fallback).
* ``update_within(keys, values, times, lo, hi) -> n``: ``update`` with the longest prefix of
  rows (row-major) whose int64 time lies in ``[lo, hi]``; returns its length. What a window
  slice does with a batch that should fall into it: natively the times are checked a segment
  at a time right before its keys are counted (no separate pass over the batch).
* Natively, ``update`` of an integer table whose keys in the call span fewer than
  ``DENSE_MAX`` values counts in a dense per-thread array first and folds one row per
  distinct key into the table (in order of first appearance, through the merge path): the
  same table, log and order as the row-by-row update, without hashing every row. A table is not thread-safe, but
  the native one releases the GIL on large batches so other tables can work in parallel.
* ``reset()`` empties the table and keeps its capacity (a window slice about to be refilled);
  ``clear()`` empties it and gives the memory back.

The epoch protocol of the Slash State Backend (an SSB fragment is a HashAgg):

* ``mark() -> int`` freezes the table at an epoch boundary and returns the log position of that
  boundary. After it, the first update of a key appends a *new* entry holding the zero value
  joined with the update (the old entry stays as it was), so every key changed since the mark
  has exactly one entry at a position >= the mark, holding exactly its change (a CRDT delta).
* ``delta(since) -> (keys, counts, vals)``: the entries from log position ``since`` (a value
  mark() returned) to the end: the change since that mark, contiguous natively. Merging the
  deltas of successive epochs (``merge(*delta)``) gives the table of everything. Positions are
  never reused; ``log_floor`` is the oldest one still valid (compaction and reset move it up;
  the latest mark, and right after ``mark()`` the previous one, stay valid). ``log_end`` is
  where the log ends now.
* ``ship() -> (keys, counts, vals)``: the whole content (as ``export()``), after which the
  table is empty and restarts from the zero value (a helper's fragment at the end of an
  epoch). Natively it keeps its capacity for the next epoch unless it was far too large.
* ``compact()`` folds the entries superseded before the latest mark (this also happens on its
  own when they make up most of the log); ``log_len`` counts entries, superseded ones included.
"""

from __future__ import annotations

import operator
import os

import numpy as np

__all__ = [
    "KINDS",
    "DENSE_MAX",
    "NATIVE",
    "HashAgg",
    "NumpyHashAgg",
    "NativeHashAgg",
    "ysb_baseline",
    "YSB_RECORD_SIZE",
    "gather",
    "minmax",
    "partition_of",
    "route",
    "copy_rows_max",
    "ring_post",
    "ring_poll_data",
    "ring_release",
]


KINDS = ("count", "sum", "min", "max", "mean")
# Natively, an update whose keys span fewer values than this counts densely (native/hashagg.h)
DENSE_MAX = 1 << 15
YSB_RECORD_SIZE = 78

# The CRDT join of the value per kind, as a numpy ufunc (None: no value is kept).
_JOIN = {"count": None, "sum": np.add, "mean": np.add, "min": np.fmin, "max": np.fmax}


def _value_dtype(value_dtype) -> str:
    dt = np.dtype(value_dtype)
    if dt == np.int64:
        return "i8"
    if dt == np.float64:
        return "f8"
    raise ValueError(f"HashAgg value_dtype must be int64 ('i8') or float64 ('f8'), got {dt}")


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"HashAgg kind must be one of {', '.join(KINDS)} (got {kind!r})")
    return kind


def _delta_position(since, floor: int, end: int) -> tuple[int, int]:
    """`since` as an int, checked to be a valid log position for delta(); and the log's end."""
    since = operator.index(since)
    if not floor <= since <= end:
        raise ValueError(
            f"delta(since={since}): not a valid log position, valid are {floor} "
            f"(log_floor: older marks were compacted or reset away) to {end} (log_end)"
        )
    return since, end


def _vec(x, dtype: np.dtype, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or a.dtype != dtype:
        raise TypeError(f"{name} must be a 1-D {dtype} array (got {a.dtype}, ndim {a.ndim})")
    return a


def _flat2d(keys, values, need_values: bool):
    """update() also takes 2-D views (a field of a run of ring slots): flattened here, with
    the shapes of keys and values checked against each other first."""
    k = np.asarray(keys)
    if k.ndim != 2:
        return keys, values
    if need_values and values is not None:
        v = np.asarray(values)
        if v.ndim == 2 and v.shape != k.shape:
            raise ValueError(f"values has shape {v.shape}, keys has {k.shape}")
        if v.ndim != 2:
            raise ValueError(f"values has shape {v.shape}, keys has {k.shape}")
        values = v.reshape(-1)
    return k.reshape(-1), values


def _sums_overflow(vals: np.ndarray, starts: np.ndarray) -> bool:
    """Whether the exact sum of some group of int64 `vals` (groups begin at `starts`) lies
    outside int64. Cheap when no group can overflow (the bound max|v| * n); otherwise exact,
    from the high and low 32-bit halves summed separately (neither sum can wrap)."""
    lo, hi = int(vals.min()), int(vals.max())
    if max(hi, -lo) * len(vals) < 2**63:
        return False
    high = np.add.reduceat(vals >> 32, starts)
    low = np.add.reduceat(vals & 0xFFFFFFFF, starts)
    top = high + (low >> 32)  # the sum is top * 2**32 + (low & 0xFFFFFFFF)
    return bool(np.any((top < -(2**31)) | (top >= 2**31)))


class NumpyHashAgg:
    """Pure-numpy HashAgg: sorted unique keys plus parallel count and value arrays.

    A batch is reduced by sorting (argsort + ufunc.reduceat, exact for int64) and joined
    into the state with searchsorted; new keys are spliced in with np.insert, so each
    batch costs O(state + batch log batch). Fine as a fallback, not for huge key spaces.

    The epoch protocol keeps the same log positions as the native table (each epoch appends
    one entry per key it changed) in three sorted partials: ``_keys``/``_counts``/``_vals``
    are the changes since the latest mark (all of the table when mark() was never called),
    ``_last`` the epoch before it, ``_base`` the join of everything older.
    """

    __slots__ = (
        "kind", "value_dtype", "_dt", "_join", "_keys", "_counts", "_vals",
        "_base", "_last", "_mark", "_prev", "_floor", "check_overflow", "overflowed",
    )

    def __init__(self, kind: str, value_dtype="i8", check_overflow: bool = False):
        self.kind = _check_kind(kind)
        self.value_dtype = _value_dtype(value_dtype)
        self.check_overflow = bool(check_overflow)
        self._dt = np.dtype(self.value_dtype)
        self._join = _JOIN[kind]
        self._mark = 0
        self._keys, self._counts, self._vals = self._empty()
        self.clear()

    def _empty(self):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, self._dt)

    def clear(self) -> None:
        end = self.log_end
        self._keys, self._counts, self._vals = self._empty()
        self._base = self._last = None
        self._mark = self._floor = end  # log positions go on: no old mark can be mistaken
        self._prev = None
        self.overflowed = False

    def reset(self) -> None:
        """Drop every key (the native table keeps its capacity; here there is none to keep)."""
        self.clear()

    def __len__(self) -> int:
        if self._base is None and self._last is None:
            return len(self._keys)
        return len(np.unique(np.concatenate([p[0] for p in self._parts()])))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for p in self._parts() for a in p)

    @property
    def log_len(self) -> int:
        return sum(len(p[0]) for p in self._parts())

    @property
    def log_end(self) -> int:
        return self._mark + len(self._keys)

    @property
    def log_floor(self) -> int:
        return self._floor

    def mark(self) -> int:
        end = self.log_end
        if self._last is not None:  # compaction of the previous prefix
            self._base = self._last if self._base is None else self._joined([self._base, self._last], compacting=True)
        self._last = (self._keys, self._counts, self._vals)
        self._keys, self._counts, self._vals = self._empty()
        self._prev, self._mark = self._mark, end
        self._floor = self._prev
        return end

    def delta(self, since: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        since, end = _delta_position(since, self._floor, self.log_end)
        if since == end:
            return self._empty()
        if since == self._mark:
            return self._keys.copy(), self._counts.copy(), self._vals.copy()
        if since == self._prev and self._last is not None:
            return tuple(np.concatenate([a, b]) for a, b in zip(self._last, (self._keys, self._counts, self._vals)))
        raise ValueError(f"delta(since={since}): the numpy HashAgg only knows the positions returned by mark()")

    def ship(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = self.export()
        self.reset()
        return out

    def compact(self) -> None:
        if self._last is not None:
            self._base = self._last if self._base is None else self._joined([self._base, self._last], compacting=True)
            self._last = None
            self._prev = None
            self._floor = self._mark

    def __repr__(self) -> str:
        return f"NumpyHashAgg({self.kind!r}, {self.value_dtype!r}, len={len(self)})"

    def update(self, keys, values=None) -> None:
        keys, values = _flat2d(keys, values, self._join is not None)
        keys = _vec(keys, np.dtype(np.int64), "keys")
        vals = self._values(values, len(keys), "values")
        self._fold(keys, None, vals)

    def update_within(self, keys, values, times, lo: int, hi: int) -> int:
        t = np.asarray(times)
        if t.dtype != np.int64 or t.ndim not in (1, 2):
            raise TypeError(f"times must be a 1-D or 2-D int64 array (got {t.dtype}, ndim {t.ndim})")
        if t.shape != np.shape(keys):
            raise ValueError(f"times has shape {t.shape}, keys has {np.shape(keys)}")
        if self._join is not None and values is not None and np.shape(values) != t.shape:
            raise ValueError(f"values has shape {np.shape(values)}, keys has {t.shape}")
        flat = t.reshape(-1)
        outside = (flat < operator.index(lo)) | (flat > operator.index(hi))
        n = int(np.argmax(outside)) if outside.any() else len(flat)
        keys, values = _flat2d(keys, values, self._join is not None)
        values = None if self._join is None or values is None else np.asarray(values)[:n]
        self.update(np.asarray(keys)[:n], values)
        return n

    def merge(self, keys, counts, vals=None) -> None:
        keys = _vec(keys, np.dtype(np.int64), "keys")
        counts = _vec(counts, np.dtype(np.int64), "counts")
        if len(counts) != len(keys):
            raise ValueError(f"counts has length {len(counts)}, keys has {len(keys)}")
        self._fold(keys, counts, self._values(vals, len(keys), "vals"))

    def merge_from(self, other) -> None:
        if other.kind != self.kind or other.value_dtype != self.value_dtype:
            raise ValueError(
                f"merge_from: cannot join HashAgg({other.kind}, {other.value_dtype}) into "
                f"HashAgg({self.kind}, {self.value_dtype})"
            )
        self.merge(*other.export())

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._base is None and self._last is None:
            return self._keys.copy(), self._counts.copy(), self._vals.copy()
        return self._joined(self._parts())

    # -- internals --

    def _parts(self):
        return [p for p in (self._base, self._last) if p is not None] + [(self._keys, self._counts, self._vals)]

    def _joined(self, parts, compacting: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The join of partials (in order, so float sums fold chronologically), sorted by key;
        `compacting`: the table keeps it (an overflow in it counts, as when C compacts)."""
        t = NumpyHashAgg(self.kind, self.value_dtype, self.check_overflow and compacting)
        t._fold(
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            None if self._join is None else np.concatenate([p[2] for p in parts]),
        )
        self.overflowed |= t.overflowed
        return t._keys, t._counts, t._vals

    def _values(self, values, n: int, name: str):
        if self._join is None:  # count keeps no value: values are ignored, like in C
            return None
        if values is None:
            raise TypeError(f"{name} are required for kind {self.kind!r}")
        v = _vec(values, self._dt, name)
        if len(v) != n:
            raise ValueError(f"{name} has length {len(v)}, keys has {n}")
        return v

    def _fold(self, keys: np.ndarray, counts: np.ndarray | None, vals: np.ndarray | None) -> None:
        if len(keys) == 0:
            return
        adds = self._join is np.add
        if counts is None and adds and self._dt.kind == "f":
            # records (not partials): NaN values are skipped, and a mean does not count them
            nan = np.isnan(vals)
            if nan.any():
                vals = np.where(nan, 0.0, vals)
                if self.kind == "mean":
                    counts = (~nan).astype(np.int64)
        # 1. reduce the batch to unique keys (stable sort keeps float sums deterministic)
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        uk = sk[starts]
        if counts is None:
            uc = np.diff(np.append(starts, len(sk))).astype(np.int64)
        else:
            uc = np.add.reduceat(counts[order], starts)
        if vals is None:
            uv = np.zeros(len(uk), self._dt)
        else:
            with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf is NaN, quietly as in C
                uv = self._join.reduceat(vals[order], starts)
            if self.check_overflow and adds and self._dt.kind == "i" and not self.overflowed:
                self.overflowed = _sums_overflow(vals[order], starts)
        # 2. join into the sorted state
        pos = np.searchsorted(self._keys, uk)
        hit = pos < len(self._keys)
        hit[hit] = self._keys[pos[hit]] == uk[hit]
        hp = pos[hit]
        self._counts[hp] += uc[hit]
        if vals is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                joined = self._join(self._vals[hp], uv[hit])
            if self.check_overflow and adds and self._dt.kind == "i" and not self.overflowed:
                # a wrapped sum has the sign of neither addend
                self.overflowed = bool(np.any((self._vals[hp] ^ joined) & (uv[hit] ^ joined) < 0))
            self._vals[hp] = joined
        new = ~hit
        if new.any():
            np_ = pos[new]
            self._keys = np.insert(self._keys, np_, uk[new])
            self._counts = np.insert(self._counts, np_, uc[new])
            self._vals = np.insert(self._vals, np_, uv[new])


_native = None
_mode = os.environ.get("SLASHRT_NATIVE", "").strip().lower()
if _mode in ("0", "false", "no", "off"):
    _why = "disabled by SLASHRT_NATIVE=0"
else:
    try:
        from slashrt import _native  # type: ignore[attr-defined]

        _why = "extension loaded"
    except ImportError as exc:
        if _mode in ("1", "true", "yes", "on"):
            raise ImportError(f"SLASHRT_NATIVE=1 but the C extension is unavailable: {exc}") from exc
        _why = f"extension unavailable ({exc})"

NATIVE: bool = _native is not None

if _native is not None:

    class NativeHashAgg(_native.HashAgg):
        """HashAgg in C (native/hashagg.c): a hash index (open addressing, linear probing,
        8-byte slots of tag + log position, murmur3-mixed int64 keys, batched hashing with
        software prefetch) over a log of 24-byte (key, count, val) entries in insertion order.

        update, merge, clear, reset, mark, compact, len, kind, value_dtype, nbytes, capacity,
        log_len, log_end and log_floor come straight from C (no Python frame per call);
        export, delta, ship and merge_from are thin wrappers.
        """

        __slots__ = ()

        def __init__(self, kind: str, value_dtype="i8", check_overflow: bool = False):
            super().__init__(_check_kind(kind), _value_dtype(value_dtype), bool(check_overflow))

        def _arrays(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            vdt = np.float64 if self.value_dtype == "f8" else np.int64
            return np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, vdt)

        def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            out = self._arrays(len(self))
            self._export_into(*out)
            return out

        def delta(self, since: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """The log entries from position `since` (a value mark() returned) to the end:
            one contiguous copy of the log's tail."""
            since, end = _delta_position(since, self.log_floor, self.log_end)
            out = self._arrays(end - since)
            self._delta_into(since, *out)
            return out

        def ship(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """export(), then empty the table for the next epoch (keeping its capacity)."""
            out = self._arrays(len(self))
            self._ship_into(*out)
            return out

        def merge_from(self, other) -> None:
            if isinstance(other, _native.HashAgg):
                super().merge_from(other)
                return
            if other.kind != self.kind or other.value_dtype != self.value_dtype:
                raise ValueError(
                    f"merge_from: cannot join HashAgg({other.kind}, {other.value_dtype}) into "
                    f"HashAgg({self.kind}, {self.value_dtype})"
                )
            self.merge(*other.export())

        def __reduce__(self):
            # pickles as its exported arrays (used by snapshots); rebuilt with one merge
            return (
                _rebuild_native,
                (type(self), self.kind, self.value_dtype, self.check_overflow, *self.export(), self.overflowed),
            )

        def __repr__(self) -> str:
            return f"NativeHashAgg({self.kind!r}, {self.value_dtype!r}, len={len(self)})"

    def _rebuild_native(cls, kind, value_dtype, check_overflow, keys, counts, vals, overflowed=False):
        t = cls(kind, value_dtype, check_overflow)
        t.merge(keys, counts, vals)
        t.overflowed = overflowed
        return t

    def ysb_baseline(
        records: np.ndarray, ad_to_campaign: np.ndarray, n_campaigns: int, window_ms: int = 10000
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Count YSB views per (10 s window, campaign) in one C pass over raw records.

        ``records``: C-contiguous array of 78-byte YSB records (structured or raw bytes);
        ``ad_to_campaign``: int64 campaign per ad_id. Returns ``(window_start_ms, campaign,
        count)`` int64 arrays for nonzero counts, sorted by window then campaign. Raises
        ValueError for an ad_id outside the mapping or a campaign outside [0, n_campaigns).
        """
        w, c, n = _native.ysb_baseline(records, ad_to_campaign, int(n_campaigns), int(window_ms))
        # bytearrays: frombuffer is zero-copy and the arrays stay writable
        return (
            np.frombuffer(w, np.int64),
            np.frombuffer(c, np.int64),
            np.frombuffer(n, np.int64),
        )

    HashAgg = NativeHashAgg
else:
    NativeHashAgg = None  # type: ignore[assignment,misc]
    ysb_baseline = None  # type: ignore[assignment]
    HashAgg = NumpyHashAgg  # type: ignore[assignment,misc]

# Why this implementation was chosen; logged by the runtime at the start of a run rather than
# here, at import time, before the application has configured logging.
SELECTED = {"impl": "native" if NATIVE else "numpy", "reason": _why}


def _numpy_gather(field: np.ndarray, sel: np.ndarray | None = None) -> np.ndarray:
    flat = field.reshape(-1)
    return flat.copy() if sel is None else flat[sel]


def _numpy_minmax(field: np.ndarray) -> tuple[int, int]:
    return int(field.min()), int(field.max())


if _native is not None:

    def gather(field: np.ndarray, sel: np.ndarray | None = None) -> np.ndarray:
        """Elements `sel` (flat, row-major; all if None) of a 1-D or 2-D field view, as a new
        contiguous 1-D array."""
        if sel is not None and (sel.dtype != np.int64 or not sel.flags.c_contiguous):
            sel = np.ascontiguousarray(sel, dtype=np.int64)
        out = np.empty(field.size if sel is None else len(sel), field.dtype)
        _native.gather(field, sel, out)
        return out

    def minmax(field: np.ndarray) -> tuple[int, int]:
        """(min, max) of an int64 field view of any stride, 1-D or 2-D, in one pass."""
        if field.dtype != np.int64:
            return _numpy_minmax(field)
        return _native.minmax_i64(field)

else:
    gather = _numpy_gather
    minmax = _numpy_minmax


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    """Each int64 key's partition in [0, partitions): the high 32 bits of its Fibonacci hash,
    scaled by a multiply and a shift (no division). `route` computes the same."""
    keys = np.asarray(keys)
    mixed = (keys.view(np.uint64) if keys.dtype == np.int64 else keys.astype(np.uint64)) * _GOLDEN
    mixed >>= np.uint64(32)
    mixed *= np.uint64(partitions)
    mixed >>= np.uint64(32)
    return mixed.view(np.int64)


def _numpy_route(keys, counts, vals, leaders):
    owners = leaders[partition_of(keys, len(leaders))]
    order = np.argsort(owners.astype(np.int16), kind="stable")  # a radix sort for small ints
    return owners[order], keys[order], counts[order], vals[order]


def route(keys: np.ndarray, counts: np.ndarray, vals: np.ndarray, leaders: np.ndarray, owners: int, out=None):
    """Rows (key, count, value) grouped by the executor leading each key's partition
    (`leaders[partition]`), stably: returns `offsets` (owner o's rows are
    ``offsets[o]:offsets[o + 1]``) and the regrouped keys, counts and values, written into
    `out` if given (three writable 1-D views of one stride, e.g. fields of structured rows:
    an epoch's delta rows filled in place). One counting sort natively; a radix argsort and
    gathers in numpy."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    vals = np.ascontiguousarray(vals)
    leaders = np.ascontiguousarray(leaders, dtype=np.int64)
    if vals.itemsize != 8 or len(counts) != len(keys) or len(vals) != len(keys):
        raise ValueError("route: keys, counts and 8-byte vals of one length")
    if out is None:
        out = np.empty_like(keys), np.empty_like(counts), np.empty_like(vals)
    elif len(out) != 3 or any(len(o) != len(keys) for o in out):
        raise ValueError("route: out must be three columns as long as keys")
    if _native is not None:
        offsets = np.empty(owners + 1, np.int64)
        _native.route(keys, counts, vals, leaders, *out, offsets)
        return (offsets, *out)
    if len(leaders) and (leaders.min() < 0 or leaders.max() >= owners):
        raise ValueError(f"route: leaders must be in [0, {owners})")
    grouped, *routed = _numpy_route(keys, counts, vals, leaders)
    for dst, src in zip(out, routed):
        dst[...] = src
    offsets = np.searchsorted(grouped, np.arange(owners + 1)).astype(np.int64)
    return (offsets, *out)


def _slot(ring: np.ndarray, slot_size: int, index: int) -> np.ndarray:
    return ring[index * slot_size : (index + 1) * slot_size]


def _numpy_ring_post(ring, slot_size, first, k, count, nbytes, seq0, epoch, kind) -> None:
    from slashrt._buffer import Kind, write_footer

    for i in range(k):
        write_footer(_slot(ring, slot_size, first + i), count=count, nbytes=nbytes, seq=seq0 + i, epoch=epoch, kind=Kind(kind))


def _numpy_ring_poll_data(ring, slot_size, first, max_k, expected_seq, record_size) -> tuple[int, int]:
    from slashrt._buffer import FULL, Kind, read_footer
    from slashrt.errors import MalformedBuffer

    count = 0
    for n in range(max_k):
        slot = _slot(ring, slot_size, first + n)
        if slot[-1] != FULL:
            return n, count
        try:
            footer = read_footer(slot, expected_seq=expected_seq + n, record_size=record_size)
        except MalformedBuffer:
            return n, count
        if footer.kind is not Kind.DATA or (n > 0 and footer.count != count):
            return n, count
        count = footer.count
    return max_k, count


def _numpy_ring_release(ring, slot_size, first, k) -> None:
    ring[(first + 1) * slot_size - 1 : (first + k + 1) * slot_size - 1 : slot_size] = 0


def _numpy_copy_rows_max(dst: np.ndarray, src: np.ndarray, row_bytes: int, record_size: int, field_offset: int) -> int:
    dst[:, :row_bytes] = np.asarray(src).reshape(dst.shape[0], row_bytes)
    if field_offset < 0:
        return -(2**63)
    rows = dst[:, :row_bytes].reshape(dst.shape[0], -1, record_size)
    return int(rows[:, :, field_offset : field_offset + 8].copy().view("<i8").max())


if _native is not None:
    copy_rows_max = _native.copy_rows_max
    ring_post = _native.ring_post
    ring_poll_data = _native.ring_poll_data
    ring_release = _native.ring_release
else:
    copy_rows_max = _numpy_copy_rows_max
    ring_post = _numpy_ring_post
    ring_poll_data = _numpy_ring_poll_data
    ring_release = _numpy_ring_release


# -- shared-memory control block (slashrt/transport/shm.py; native/shm.c) ------------------------
#
# ``shm_load_u64`` / ``shm_store_u64``: the credit word, acquire load and release store.
# ``shm_load_u8``: a slot flag, acquire load. ``shm_park(buf, off, want)`` / ``shm_unpark``: the
# parked word of one side (seq_cst). ``shm_wake(buf, parked_off, value, efd)``: after a
# publication, a full fence, then if the peer is parked for `value` (parked word nonzero and
# <= value) clear the word and write the eventfd; returns whether it wrote. A busy pair finds the
# word clear and makes no system call. ``shm_store_and_wake``: release store, then shm_wake.
#
# The numpy fallbacks are plain loads and stores, which are ordered as the protocol needs on x86
# (TSO: stores are not reordered with stores nor loads with loads), and take the one full fence
# the parking protocol needs (store then load, Dekker) from a lock's atomic read-modify-write.

import threading as _threading

_FENCE_LOCK = _threading.Lock()


def _numpy_shm_load_u64(buf: np.ndarray, off: int) -> int:
    return int(buf[off : off + 8].view("<u8")[0])


def _numpy_shm_store_u64(buf: np.ndarray, off: int, value: int) -> None:
    buf[off : off + 8].view("<u8")[0] = value


def _numpy_shm_load_u8(buf: np.ndarray, off: int) -> int:
    return int(buf[off])


def _numpy_shm_fence() -> None:
    with _FENCE_LOCK:
        pass


def _numpy_shm_park(buf: np.ndarray, off: int, want: int) -> int:
    if want == 0:
        raise ValueError("shm_park: want must be nonzero (0 means not parked)")
    old = _numpy_shm_load_u64(buf, off)
    _numpy_shm_store_u64(buf, off, want)
    _numpy_shm_fence()
    return old


def _numpy_shm_unpark(buf: np.ndarray, off: int) -> None:
    _numpy_shm_store_u64(buf, off, 0)


def _numpy_shm_wake(buf: np.ndarray, parked_off: int, value: int, efd: int) -> bool:
    _numpy_shm_fence()
    want = _numpy_shm_load_u64(buf, parked_off)
    if want == 0 or value < want:
        return False
    _numpy_shm_store_u64(buf, parked_off, 0)  # a racing second waker at worst writes once more
    try:
        os.eventfd_write(efd, 1)
    except BlockingIOError:  # counter at its maximum: the parker is awake anyway
        pass
    return True


def _numpy_shm_store_and_wake(buf: np.ndarray, off: int, value: int, parked_off: int, efd: int) -> bool:
    _numpy_shm_store_u64(buf, off, value)
    return _numpy_shm_wake(buf, parked_off, value, efd)


if _native is not None:
    shm_load_u64 = _native.shm_load_u64
    shm_store_u64 = _native.shm_store_u64
    shm_load_u8 = _native.shm_load_u8
    shm_park = _native.shm_park
    shm_unpark = _native.shm_unpark
    shm_fence = _native.shm_fence
    shm_wake = _native.shm_wake
    shm_store_and_wake = _native.shm_store_and_wake
else:
    shm_load_u64 = _numpy_shm_load_u64
    shm_store_u64 = _numpy_shm_store_u64
    shm_load_u8 = _numpy_shm_load_u8
    shm_park = _numpy_shm_park
    shm_unpark = _numpy_shm_unpark
    shm_fence = _numpy_shm_fence
    shm_wake = _numpy_shm_wake
    shm_store_and_wake = _numpy_shm_store_and_wake

__all__ += [
    "shm_load_u64",
    "shm_store_u64",
    "shm_load_u8",
    "shm_park",
    "shm_unpark",
    "shm_fence",
    "shm_wake",
    "shm_store_and_wake",
]
