"""The CRDT laws of `crdt.join` for every aggregate kind, and HashAgg's merge agreeing with it."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt import _kernels as K
from slashrt.ssb.crdt import AggKind, empty_partial, finalize, join, records_as_partials, result_dtype

HYP = settings(max_examples=25, deadline=None)

I64 = np.iinfo(np.int64)
# few distinct keys so that partials overlap, plus the extremes and 0 (a special slot natively)
KEYS = st.sampled_from([0, 1, -1, 2, 7, -42, 10**12, I64.min, I64.max])
INT_VALS = st.integers(-(10**12), 10**12)
FLOAT_VALS = st.floats(-1e6, 1e6, allow_nan=False) | st.just(float("nan"))

IMPLS = [K.NumpyHashAgg] + ([K.NativeHashAgg] if K.NativeHashAgg is not None else [])


def test_both_hashagg_implementations_are_checked():
    if os.environ.get("SLASHRT_NATIVE", "").strip().lower() in ("0", "false", "no", "off"):
        assert IMPLS == [K.NumpyHashAgg]  # the native one was deliberately disabled
    else:
        assert K.NativeHashAgg in IMPLS, "the C extension is not built"


@st.composite
def partials(draw, kind: AggKind, value_dtype=np.int64):
    """A partial: unique keys (in any order), counts >= 1 and values of `value_dtype`."""
    keys = draw(st.lists(KEYS, unique=True, max_size=6))
    n = len(keys)
    counts = draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n))
    if kind is AggKind.COUNT:
        vals = [0] * n
    else:
        vals = draw(st.lists(FLOAT_VALS if value_dtype == np.float64 else INT_VALS, min_size=n, max_size=n))
    return np.array(keys, np.int64), np.array(counts, np.int64), np.array(vals, value_dtype)


def same(a, b):
    """Partials equal entry for entry (NaN equal to NaN)."""
    return all(np.array_equal(x, y, equal_nan=x.dtype.kind == "f") and x.dtype == y.dtype for x, y in zip(a, b))


def canonical(p):
    """The same partial sorted by key, as `join` returns it."""
    order = np.argsort(p[0], kind="stable")
    return tuple(x[order] for x in p)


KIND_AND_DTYPE = [(k, np.int64) for k in AggKind] + [(AggKind.MIN, np.float64), (AggKind.MAX, np.float64)]


def law(test):
    """Run `test(kind, dtype, data)` for every kind (and float MIN/MAX), `data` a hypothesis draw."""

    @pytest.mark.parametrize("kind, dtype", KIND_AND_DTYPE, ids=lambda x: getattr(x, "value", None) or np.dtype(x).str)
    @HYP
    @given(data=st.data())
    def wrapper(kind, dtype, data):
        test(kind, dtype, lambda: data.draw(partials(kind, dtype)))

    wrapper.__name__ = test.__name__
    return wrapper


@law
def test_join_is_associative(kind, dtype, draw):
    a, b, c = draw(), draw(), draw()
    assert same(join(kind, a, join(kind, b, c)), join(kind, join(kind, a, b), c))


@law
def test_join_is_commutative(kind, dtype, draw):
    a, b = draw(), draw()
    assert same(join(kind, a, b), join(kind, b, a))


@law
def test_the_empty_partial_is_the_identity(kind, dtype, draw):
    a = draw()
    zero = empty_partial(np.dtype(dtype))
    assert same(join(kind, a, zero), canonical(a))
    assert same(join(kind, zero, a), canonical(a))


@pytest.mark.parametrize("kind", [AggKind.MIN, AggKind.MAX])
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
@HYP
@given(data=st.data())
def test_min_and_max_values_are_idempotent(kind, dtype, data):
    a = data.draw(partials(kind, dtype))
    b = data.draw(partials(kind, dtype))
    aa = join(kind, a, a)
    assert np.array_equal(finalize(kind, aa[1], aa[2]), finalize(kind, *canonical(a)[1:]), equal_nan=dtype == np.float64)
    # merging a delta twice changes no value (counts are not idempotent, values are)
    ab, abb = join(kind, a, b), join(kind, join(kind, a, b), b)
    assert np.array_equal(ab[0], abb[0])
    assert np.array_equal(ab[2], abb[2], equal_nan=dtype == np.float64)


def test_min_and_max_ignore_nan_unless_every_value_is_nan():
    nan = float("nan")
    a = (np.array([1, 2]), np.array([1, 1]), np.array([nan, nan]))
    b = (np.array([1]), np.array([1]), np.array([3.0]))
    for kind in (AggKind.MIN, AggKind.MAX):
        keys, counts, vals = join(kind, a, b)
        assert list(keys) == [1, 2] and list(counts) == [2, 1]
        assert vals[0] == 3.0 and np.isnan(vals[1])


def test_finalize_per_kind():
    counts, vals = np.array([2, 4]), np.array([10, 6])
    assert list(finalize(AggKind.COUNT, counts, vals)) == [2, 4]
    assert list(finalize(AggKind.SUM, counts, vals)) == [10, 6]
    assert list(finalize(AggKind.MEAN, counts, vals)) == [5.0, 1.5]
    assert result_dtype(AggKind.MEAN, np.dtype("i8")) == np.dtype("<f8")
    assert result_dtype(AggKind.COUNT, np.dtype("f8")) == np.dtype("<i8")
    assert result_dtype(AggKind.MAX, np.dtype("f8")) == np.dtype("<f8")


def test_finalize_of_a_mean_with_no_values_is_nan_without_a_warning():
    with np.errstate(all="raise"):
        got = finalize(AggKind.MEAN, np.array([0, 2]), np.array([0.0, 3.0]))
    assert np.isnan(got[0]) and got[1] == 1.5


@pytest.mark.parametrize("kind", list(AggKind), ids=lambda k: k.value)
@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: i.__name__)
@HYP
@given(
    rows=st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.integers(-50, 50).map(float) | st.just(float("nan"))), max_size=40),
    cut=st.integers(0, 40),
)
def test_nan_records_split_over_executors_join_as_one_table_skipping_nan(kind, impl, rows, cut):
    """pandas' skipna, wherever records become partials: a table's update, or rows of single
    records (SSB direct routing) made partials by records_as_partials; joins of partials keep it."""
    keys = np.array([k for k, _ in rows], np.int64)
    vals = np.array([v for _, v in rows], np.float64)
    whole = impl(kind.value, "f8")
    whole.update(keys, vals)
    fragment = impl(kind.value, "f8")
    fragment.update(keys[:cut], vals[:cut])
    routed_counts, routed_vals = np.ones(len(keys) - min(cut, len(keys)), np.int64), vals[cut:].copy()
    records_as_partials(kind, routed_counts, routed_vals)
    joined = join(kind, fragment.export(), (keys[cut:], routed_counts, routed_vals))
    assert same(joined, canonical(whole.export()))
    want = {}
    for k in (1, 2, 3):
        v = vals[keys == k]
        if not len(v):
            continue
        skipped = v[~np.isnan(v)]
        want[k] = {
            AggKind.COUNT: len(v),
            AggKind.SUM: skipped.sum(),
            AggKind.MIN: skipped.min() if len(skipped) else np.nan,
            AggKind.MAX: skipped.max() if len(skipped) else np.nan,
            AggKind.MEAN: skipped.mean() if len(skipped) else np.nan,
        }[kind]
    got = dict(zip(joined[0].tolist(), finalize(kind, joined[1], joined[2]).tolist()))
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == want[k] or (np.isnan(got[k]) and np.isnan(want[k])), (k, got[k], want[k])


@law
def test_partials_of_any_split_join_to_the_partial_of_everything(kind, dtype, draw):
    # records as (key, value) rows; each partial counts one record per row (P2 in the small)
    a, b = draw(), draw()
    rows_k = np.concatenate([a[0], b[0]])
    rows_v = np.concatenate([a[2], b[2]])
    whole = K.NumpyHashAgg(kind.value, np.dtype(dtype).str[1:])
    whole.update(rows_k, None if kind is AggKind.COUNT else rows_v)
    parts = []
    for keys, vals in ((a[0], a[2]), (b[0], b[2])):
        h = K.NumpyHashAgg(kind.value, np.dtype(dtype).str[1:])
        h.update(keys, None if kind is AggKind.COUNT else vals)
        parts.append(h.export())
    assert same(join(kind, *parts), canonical(whole.export()))


# -- HashAgg agrees with join --------------------------------------------------------------------


@pytest.mark.parametrize("kind, dtype", KIND_AND_DTYPE, ids=lambda x: getattr(x, "value", None) or np.dtype(x).str)
@HYP
@given(data=st.data())
def test_hashagg_merge_agrees_with_join(kind, dtype, data):
    a, b, c = (data.draw(partials(kind, dtype)) for _ in range(3))
    code = np.dtype(dtype).str[1:]
    for impl in IMPLS:
        h = impl(kind.value, code)
        h.merge(*a)
        h.merge(*b)
        assert same(canonical(h.export()), join(kind, a, b)), impl.__name__
        # merge_from a table of either implementation is the same join
        for other_impl in IMPLS:
            g = other_impl(kind.value, code)
            g.merge(*c)
            h2 = impl(kind.value, code)
            h2.merge(*a)
            h2.merge_from(g)
            assert same(canonical(h2.export()), join(kind, a, c)), (impl.__name__, other_impl.__name__)
