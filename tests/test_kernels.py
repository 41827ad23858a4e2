"""Tests of slashrt._kernels: HashAgg (native and numpy) against a plain-dict reference,
the CRDT laws of merge, and the C YSB baseline against a numpy reference.

The native extension must be built (``python setup.py build_ext --inplace`` or an install);
a missing extension fails these tests unless SLASHRT_NATIVE=0 asks for the fallback only.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slashrt import _kernels as K

I64_MIN = int(np.iinfo(np.int64).min)
I64_MAX = int(np.iinfo(np.int64).max)
NATIVE_DISABLED = os.environ.get("SLASHRT_NATIVE", "").strip().lower() in ("0", "false", "no", "off")

HYP = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _require_native():
    if NATIVE_DISABLED:
        pytest.skip("SLASHRT_NATIVE=0: native kernels deliberately disabled")
    if K.NativeHashAgg is None:
        pytest.fail("slashrt._native is not importable: build it with `python setup.py build_ext --inplace`")


@pytest.fixture(params=["native", "numpy"])
def impl(request):
    if request.param == "native":
        _require_native()
        return K.NativeHashAgg
    return K.NumpyHashAgg


def test_selection():
    if NATIVE_DISABLED:
        assert K.NATIVE is False and K.HashAgg is K.NumpyHashAgg
        return
    _require_native()
    assert K.NATIVE is True
    assert K.HashAgg is K.NativeHashAgg
    assert K.ysb_baseline is not None


def test_env_forces_fallback():
    root = Path(K.__file__).resolve().parent.parent
    env = dict(os.environ, SLASHRT_NATIVE="0")
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    code = (
        "import slashrt._kernels as K; "
        "print('RESULT', K.NATIVE, K.NativeHashAgg is None, K.ysb_baseline is None, "
        "K.HashAgg is K.NumpyHashAgg)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    assert line == "RESULT False True True True"


# ---- reference -------------------------------------------------------------------------


def _wrap(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


def reference(kind, dtype, rows):
    """rows: iterable of (key, count, value) partials, or (key, 1, value, True) records (as
    rows_of makes them), folded in order; returns {key: (count, val)}. A record's NaN value is
    skipped by sum and mean (pandas' skipna): it adds 0.0, and a mean does not count it."""
    isf = dtype == "f8"
    d: dict = {}
    for k, c, v, *record in rows:
        if record and isf and kind in ("sum", "mean") and math.isnan(v):
            v = 0.0
            c = 0 if kind == "mean" else c
        if k not in d:
            d[k] = [c, 0.0 if isf else 0] if kind == "count" else [c, v]
            continue
        e = d[k]
        e[0] += c
        if kind in ("sum", "mean"):
            e[1] = e[1] + v
        elif kind == "min":
            if isf:
                e[1] = v if (v < e[1] or math.isnan(e[1])) else e[1]
            else:
                e[1] = min(e[1], v)
        elif kind == "max":
            if isf:
                e[1] = v if (v > e[1] or math.isnan(e[1])) else e[1]
            else:
                e[1] = max(e[1], v)
    return {k: (_wrap(c), v if isf else _wrap(v)) for k, (c, v) in d.items()}


def rows_of(keys, vals):
    vals = [None] * len(keys) if vals is None else list(vals)
    return [(int(k), 1, (v if v is None else (float(v) if isinstance(v, float) else int(v))), True) for k, v in zip(keys, vals)]


def as_dict(table):
    keys, counts, vals = table.export()
    assert keys.dtype == np.int64 and counts.dtype == np.int64
    assert vals.dtype == np.dtype(table.value_dtype)
    assert len(keys) == len(counts) == len(vals) == len(table)
    assert len(set(keys.tolist())) == len(keys), "exported keys must be distinct"
    return {int(k): (int(c), v.item()) for k, c, v in zip(keys, counts, vals)}


def same(got: dict, want: dict) -> bool:
    if got.keys() != want.keys():
        return False
    for k in want:
        (gc, gv), (wc, wv) = got[k], want[k]
        if gc != wc:
            return False
        if isinstance(wv, float) and math.isnan(wv):
            if not math.isnan(gv):
                return False
        elif gv != wv:
            return False
    return True


def assert_same(got, want):
    assert same(got, want), f"\n got={got}\nwant={want}"


# ---- strategies ------------------------------------------------------------------------

EXTREME = [0, -1, 1, I64_MIN, I64_MAX, I64_MIN + 1, 1 << 32, 1 << 62]
key_st = st.one_of(st.integers(-40, 40), st.sampled_from(EXTREME), st.integers(I64_MIN, I64_MAX))
ival_st = st.one_of(st.integers(-1000, 1000), st.integers(I64_MIN, I64_MAX))
fval_st = st.one_of(st.integers(-1000, 1000).map(float), st.just(float("nan")))


@st.composite
def batches(draw, dtype, max_batches=4):
    out = []
    for _ in range(draw(st.integers(1, max_batches))):
        ks = draw(st.lists(key_st, max_size=120))
        vs = draw(st.lists(fval_st if dtype == "f8" else ival_st, min_size=len(ks), max_size=len(ks)))
        out.append((np.array(ks, np.int64), np.array(vs, np.float64 if dtype == "f8" else np.int64)))
    return out


LAYOUT = ["contiguous", "strided", "reversed"]


def layout(keys, vals, how):
    """Present keys/vals contiguous, as fields of packed 78-byte records, or reversed views."""
    if how == "contiguous":
        return keys, vals
    if how == "strided":
        rec = np.zeros(len(keys), np.dtype({"names": ["k", "v"], "formats": ["<i8", vals.dtype],
                                            "offsets": [8, 33], "itemsize": 78}))
        rec["k"], rec["v"] = keys, vals
        assert len(keys) < 2 or rec["k"].strides == (78,)
        return rec["k"], rec["v"]
    return keys[::-1].copy()[::-1], vals[::-1].copy()[::-1]


KIND_DTYPE = [(k, d) for k in K.KINDS for d in ("i8", "f8")]


# ---- HashAgg ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
@pytest.mark.parametrize("how", LAYOUT)
def test_update_matches_reference(impl, kind, dtype, how):
    @HYP
    @given(bs=batches(dtype))
    def check(bs):
        t = impl(kind, dtype)
        assert t.kind == kind and t.value_dtype == dtype
        rows = []
        for keys, vals in bs:
            k, v = layout(keys, vals, how)
            t.update(k, None if kind == "count" and len(rows) % 2 else v)
            rows += rows_of(keys, vals)
        assert_same(as_dict(t), reference(kind, dtype, rows))

    check()


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
def test_merge_laws(impl, kind, dtype):
    """Joining partials equals one table over all inputs; the join commutes and associates,
    including across implementations and through exported arrays."""
    other_impl = K.NumpyHashAgg if impl is not K.NumpyHashAgg else (K.NativeHashAgg or K.NumpyHashAgg)

    @HYP
    @given(a=batches(dtype), b=batches(dtype), c=batches(dtype))
    def check(a, b, c):
        def table(bs, cls=impl):
            t = cls(kind, dtype)
            for keys, vals in bs:
                t.update(keys, vals)
            return t

        whole = as_dict(table(a + b + c))
        # ((a ⊔ b) ⊔ c) via merge_from
        ab = table(a)
        ab.merge_from(table(b))
        ab.merge_from(table(c))
        assert_same(as_dict(ab), whole)
        # c ⊔ (b ⊔ a) via exported arrays, partial from the other implementation
        ba = table(b)
        ba.merge(*table(a, other_impl).export())
        cba = table(c)
        cba.merge(*ba.export())
        assert_same(as_dict(cba), whole)
        # cross-implementation merge_from
        x = table(c)
        x.merge_from(table(a + b, other_impl))
        assert_same(as_dict(x), whole)

    check()


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
def test_merge_with_counts_and_self(impl, kind, dtype):
    t = impl(kind, dtype)
    dt = np.dtype(dtype)
    keys = np.array([5, 0, -1, I64_MIN, 5], np.int64)
    counts = np.array([3, 1, 7, 2, 4], np.int64)
    vals = np.array([10, 20, 30, 40, -50], dt)
    t.merge(keys, counts, None if kind == "count" else vals)
    want = reference(kind, dtype, [(int(k), int(c), v.item()) for k, c, v in zip(keys, counts, vals)])
    assert_same(as_dict(t), want)
    # a ⊔ a: counts (and sums) double, min/max stay
    twice = impl(kind, dtype)
    twice.merge(*t.export())
    twice.merge(*t.export())
    t.merge_from(t)
    assert_same(as_dict(t), as_dict(twice))


def test_mean_exports_sum_and_count(impl):
    t = impl("mean", "f8")
    t.update(np.array([1, 1, 2], np.int64), np.array([1.0, 2.0, 5.0]))
    k, c, v = t.export()
    means = dict(zip(k.tolist(), (v / c).tolist()))
    assert means == {1: 1.5, 2: 5.0}


def test_integer_sum_wraps(impl):
    t = impl("sum")
    t.update(np.array([7, 7], np.int64), np.array([I64_MAX, 2], np.int64))
    assert as_dict(t) == {7: (2, I64_MIN + 1)}


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("n", [2, 1000])  # hashed, and counted densely (natively)
def test_integer_sum_overflow_sets_the_sticky_flag(impl, kind, n):
    keys = np.arange(n, dtype=np.int64) % 2
    unchecked = impl(kind, "i8")
    unchecked.update(keys, np.full(n, 2**62 - 1, np.int64))
    assert not unchecked.overflowed and not unchecked.check_overflow  # wraps, unchecked
    t = impl(kind, "i8", check_overflow=True)
    assert t.check_overflow
    t.update(keys, np.full(n, 2**62 - 1, np.int64))  # per key n/2 * (2**62 - 1): fits only for n = 2
    assert t.overflowed is (n > 2)
    t.update(np.array([0, 0], np.int64), np.array([I64_MIN, I64_MIN], np.int64))  # leaves the range
    assert t.overflowed
    t.update(np.array([5], np.int64), np.array([1], np.int64))
    assert t.overflowed  # sticky
    t.reset()
    assert not t.overflowed
    # a join of partials that each fit
    t.merge(np.array([3, 3], np.int64), np.array([1, 1], np.int64), np.array([I64_MAX, I64_MAX - 1], np.int64))
    assert t.overflowed
    t.mark()
    t.compact()
    assert t.overflowed
    t.ship()
    assert not t.overflowed
    # kept by pickling (snapshots), flag and all, and by clear()
    t.merge(np.array([3, 3], np.int64), np.array([1, 1], np.int64), np.array([I64_MAX, I64_MAX - 1], np.int64))
    assert pickle.loads(pickle.dumps(t)).overflowed
    t.clear()
    assert pickle.loads(pickle.dumps(t)).check_overflow
    # settable: a table restored from exported arrays (which do not carry it) takes it back
    t.overflowed = True
    assert t.overflowed


def test_integer_sums_of_several_epochs_are_checked_when_compaction_joins_them(impl):
    t = impl("sum", "i8", check_overflow=True)
    for _ in range(3):  # one entry of key 1 per epoch, each fits: their join does not
        t.mark()
        t.update(np.array([1], np.int64), np.array([2**62], np.int64))
    assert not t.overflowed
    t.mark()
    t.compact()
    assert t.overflowed


def test_integer_sum_at_the_edges_of_int64_does_not_set_the_flag(impl):
    t = impl("sum", "i8", check_overflow=True)
    t.update(np.array([1, 1, 2, 2], np.int64), np.array([I64_MAX - 1, 1, I64_MIN + 1, -1], np.int64))
    t.merge(np.array([1, 2], np.int64), np.array([1, 1], np.int64), np.array([I64_MIN, I64_MAX], np.int64))
    assert as_dict(t) == {1: (3, -1), 2: (3, -1)}
    assert not t.overflowed
    assert not impl("sum", "f8", check_overflow=True).overflowed and not impl("count", check_overflow=True).overflowed


@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_nan_records_are_skipped_but_nan_partials_propagate(impl, kind):
    nan, inf = float("nan"), float("inf")
    t = impl(kind, "f8")
    t.update(np.array([1, 1, 2, 3, 3], np.int64), np.array([nan, 2.0, nan, inf, -inf]))
    got = as_dict(t)
    # a mean counts only its non-NaN values; a sum's count is of records
    assert got[1] == ((2, 2.0) if kind == "sum" else (1, 2.0))
    assert got[2] == ((1, 0.0) if kind == "sum" else (0, 0.0))
    assert got[3][0] == 2 and math.isnan(got[3][1])  # inf + -inf: NaN, as in pandas
    t.merge(np.array([1], np.int64), np.array([1], np.int64), np.array([nan]))  # a NaN partial
    assert math.isnan(as_dict(t)[1][1])


@pytest.mark.parametrize("pattern", ["uniform", "sequential", "stride2_32", "negative"])
def test_growth_many_keys(impl, pattern):
    rng = np.random.default_rng(7)
    n = 60_000 if impl is K.NumpyHashAgg else 400_000
    if pattern == "uniform":
        keys = rng.integers(I64_MIN, I64_MAX, n // 2, dtype=np.int64, endpoint=True)
        keys = np.concatenate([keys, keys[: n // 4], rng.integers(0, 1000, n // 4)])
    elif pattern == "sequential":
        keys = np.arange(n, dtype=np.int64)
    elif pattern == "stride2_32":  # keys differing only in high bits defeat weak hashes
        keys = np.arange(n, dtype=np.int64) << 32
    else:
        keys = -np.arange(n, dtype=np.int64) - 1
    rng.shuffle(keys)
    vals = rng.integers(-(10**6), 10**6, len(keys))
    t = impl("sum")
    for i in range(0, len(keys), 4093):
        t.update(keys[i:i + 4093], vals[i:i + 4093])
    uk, inv = np.unique(keys, return_inverse=True)
    want_c = np.bincount(inv)
    want_s = np.zeros(len(uk), np.int64)
    np.add.at(want_s, inv, vals)
    k, c, v = t.export()
    o = np.argsort(k)
    assert len(t) == len(uk)
    np.testing.assert_array_equal(k[o], uk)
    np.testing.assert_array_equal(c[o], want_c)
    np.testing.assert_array_equal(v[o], want_s)


def test_clear_and_reuse(impl):
    t = impl("max", "f8")
    small = t.nbytes
    keys = np.arange(100_000, dtype=np.int64) - 50_000
    t.update(keys, keys.astype(np.float64))
    assert len(t) == 100_000 and t.nbytes > small
    t.clear()
    assert len(t) == 0 and t.nbytes <= max(small, 4096)
    assert [len(a) for a in t.export()] == [0, 0, 0]
    t.update(np.array([0, 0], np.int64), np.array([1.0, 3.0]))
    assert as_dict(t) == {0: (2, 3.0)}


def test_export_is_fresh(impl):
    t = impl("sum")
    t.update(np.array([1, 2], np.int64), np.array([10, 20], np.int64))
    k, c, v = t.export()
    assert k.flags.writeable and c.flags.writeable and v.flags.writeable
    c[:] = 0
    v[:] = 0
    assert as_dict(t) == {1: (1, 10), 2: (1, 20)}


@pytest.mark.parametrize("kind,dtype", [("sum", "i8"), ("min", "f8"), ("count", "i8")])
def test_pickle_roundtrip(impl, kind, dtype):
    import pickle

    t = impl(kind, dtype)
    keys = np.array([0, -1, I64_MIN, 3, 3], np.int64)
    t.update(keys, keys.astype(dtype))
    u = pickle.loads(pickle.dumps(t))
    assert type(u) is impl and u.kind == kind and u.value_dtype == dtype
    assert_same(as_dict(u), as_dict(t))


def test_empty_inputs(impl):
    t = impl("min", "i8")
    t.update(np.empty(0, np.int64), np.empty(0, np.int64))
    t.merge(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
    assert len(t) == 0


def test_bad_arguments(impl):
    with pytest.raises(ValueError):
        impl("median")
    with pytest.raises(ValueError):
        impl("sum", "f4")
    t = impl("sum", "i8")
    k = np.arange(3, dtype=np.int64)
    with pytest.raises(TypeError):
        t.update(k)  # values required
    with pytest.raises(TypeError):
        t.update(k.astype(np.int32), k)
    with pytest.raises(TypeError):
        t.update(k, k.astype(np.float64))
    with pytest.raises((TypeError, ValueError)):
        t.update(k.reshape(1, 1, 3), k.reshape(1, 1, 3))  # 1-D or 2-D only
    with pytest.raises(ValueError):
        t.update(k.reshape(1, 3), k)  # 2-D keys take 2-D values of the same shape
    with pytest.raises(ValueError):
        t.update(np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2))
    with pytest.raises(ValueError):
        t.update(k, k[:2])
    with pytest.raises(ValueError):
        t.merge(k, k[:2], k)
    with pytest.raises(ValueError):
        t.merge_from(impl("min", "i8"))
    with pytest.raises(ValueError):
        t.merge_from(impl("sum", "f8"))
    assert len(t) == 0
    c = impl("count")
    c.update(k)  # count needs no values
    c.merge(k, np.ones(3, np.int64))
    assert as_dict(c) == {0: (2, 0), 1: (2, 0), 2: (2, 0)}


def test_native_threads_release_gil():
    """Large batches run without the GIL; separate tables in threads stay correct."""
    _require_native()
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 50_000, 400_000, dtype=np.int64)
    tables = [K.NativeHashAgg("count") for _ in range(2)]

    def work(t):
        for i in range(0, len(keys), 50_000):
            t.update(keys[i:i + 50_000])

    threads = [threading.Thread(target=work, args=(t,)) for t in tables]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    want = np.bincount(keys)
    for t in tables:
        k, c, _ = t.export()
        np.testing.assert_array_equal(c[np.argsort(k)], want[want > 0])


# ---- ysb_baseline ----------------------------------------------------------------------

YSB_DTYPE = np.dtype({
    "names": ["event_time", "ad_id", "user_id", "page_id", "event_type", "ad_type", "ip", "filler"],
    "formats": ["<i8", "<i8", "<i8", "<i8", "u1", "u1", "<u4", "V40"],
    "offsets": [0, 8, 16, 24, 32, 33, 34, 38],
    "itemsize": 78,
})


def ysb_records(rng, n, n_ads, t0, spread, sorted_times=True):
    rec = np.zeros(n, YSB_DTYPE)
    t = t0 + rng.integers(0, spread, n)
    rec["event_time"] = np.sort(t) if sorted_times else t
    rec["ad_id"] = rng.integers(0, n_ads, n)
    rec["user_id"] = rng.integers(0, 1 << 40, n)
    rec["event_type"] = rng.integers(0, 3, n)
    rec["ip"] = rng.integers(0, 1 << 32, n)
    return rec


def ysb_reference(rec, mapping, window_ms):
    views = rec[rec["event_type"] == 0]
    camp = mapping[views["ad_id"]]
    win = np.floor_divide(views["event_time"], window_ms) * window_ms
    pairs = np.stack([win, camp], axis=1)
    if len(pairs) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    u, cnt = np.unique(pairs, axis=0, return_counts=True)  # lexicographic: window, campaign
    return u[:, 0], u[:, 1], cnt


@pytest.fixture
def ysb():
    _require_native()
    return K.ysb_baseline


@pytest.mark.parametrize("seed", range(6))
def test_ysb_baseline_matches_numpy(ysb, seed):
    rng = np.random.default_rng(seed)
    n_ads, n_camp = int(rng.integers(1, 200)), int(rng.integers(1, 30))
    window = int(rng.choice([1, 7, 1000, 10_000]))
    t0 = int(rng.choice([0, -5_000_000, 1_700_000_000_000]))
    rec = ysb_records(rng, int(rng.integers(0, 20_000)), n_ads, t0, int(rng.integers(1, 2_000_000)),
                      sorted_times=bool(seed % 2))
    mapping = rng.integers(0, n_camp, n_ads).astype(np.int64)
    got = ysb(rec, mapping, n_camp, window)
    want = ysb_reference(rec, mapping, window)
    for g, w in zip(got, want):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w)
    # raw bytes of the same records and a strided mapping give the same answer
    big_map = np.zeros(2 * n_ads, np.int64)
    big_map[::2] = mapping
    got2 = ysb(rec.view(np.uint8), big_map[::2], n_camp, window)
    for g, w in zip(got2, want):
        np.testing.assert_array_equal(g, w)


def test_ysb_default_window_and_empty(ysb):
    rng = np.random.default_rng(11)
    rec = ysb_records(rng, 5000, 10, 1_700_000_000_000, 60_000)
    mapping = np.arange(10, dtype=np.int64) % 3
    w, c, n = ysb(rec, mapping, 3)
    assert set((w % 10_000).tolist()) == {0}
    assert n.sum() == (rec["event_type"] == 0).sum()
    empty = ysb(np.zeros(0, YSB_DTYPE), mapping, 3)
    assert [len(a) for a in empty] == [0, 0, 0]


def test_ysb_errors(ysb):
    rng = np.random.default_rng(5)
    rec = ysb_records(rng, 100, 10, 0, 100_000)
    rec["event_type"] = 0
    mapping = np.arange(10, dtype=np.int64)
    for bad in (10, -1, I64_MAX):
        r = rec.copy()
        r["ad_id"][37] = bad
        with pytest.raises(ValueError, match="ad_id"):
            ysb(r, mapping, 10)
    # a bad ad_id on a click is not looked up
    r = rec.copy()
    r["ad_id"][3], r["event_type"][3] = 99, 1
    assert ysb(r, mapping, 10)[2].sum() == 99
    with pytest.raises(ValueError, match="campaign"):
        ysb(rec, mapping, 5)  # mapping yields campaigns 5..9
    with pytest.raises(ValueError):
        ysb(rec, mapping, 0)
    with pytest.raises(ValueError):
        ysb(rec, mapping, 10, 0)
    with pytest.raises(ValueError):
        ysb(np.zeros(10, np.dtype([("a", "<i8")])), mapping, 10)
    with pytest.raises(TypeError):
        ysb(rec, mapping.astype(np.int32), 10)
    r = rec.copy()
    r["event_time"][50] = 10**15  # 10^14 windows of 1 ms: too wide for a dense grid
    with pytest.raises(ValueError, match="span"):
        ysb(r, mapping, 10, 1)


# ---- the epoch protocol: mark / delta / ship / compact (SSB fragments) ---------------------


def dict_of(part, distinct=True):
    """{key: (count, val)} of a partial (keys, counts, vals); `distinct`: keys must not repeat."""
    keys, counts, vals = part
    assert keys.dtype == np.int64 and counts.dtype == np.int64
    assert len(keys) == len(counts) == len(vals)
    if distinct:
        assert len(set(keys.tolist())) == len(keys), "keys must be distinct"
    return {int(k): (int(c), v.item()) for k, c, v in zip(keys, counts, vals)}


@st.composite
def epoch_ops(draw, dtype):
    """Batches (as updates or as merges of partials with counts) with random epoch boundaries
    ("mark") and explicit compactions in between."""
    ops = []
    for keys, vals in draw(batches(dtype, max_batches=8)):
        if draw(st.booleans()):
            ops.append(("update", keys, None, vals))
        else:
            counts = np.array(draw(st.lists(st.integers(-3, 5) | st.integers(I64_MIN, I64_MAX),
                                            min_size=len(keys), max_size=len(keys))), np.int64)
            ops.append(("merge", keys, counts, vals))
        if draw(st.integers(0, 2)) == 0:
            ops.append(("mark",))
        if draw(st.integers(0, 5)) == 0:
            ops.append(("compact",))
    return ops


def other_impl_of(impl):
    return K.NumpyHashAgg if impl is not K.NumpyHashAgg else (K.NativeHashAgg or K.NumpyHashAgg)


def run_epochs(impl, kind, dtype, ops, mark_first):
    """Run `ops` on a fragment; at every mark, ship delta(previous mark) to a leader (of the other
    implementation). Checks each delta against the rows of its epoch; returns the marks."""
    t = impl(kind, dtype)
    leader = other_impl_of(impl)(kind, dtype)
    m = t.log_end
    assert m == 0 and t.log_floor == 0
    marks, rows, epoch = [], [], []
    for op in ops:
        if op[0] in ("update", "merge"):
            _, keys, counts, vals = op
            v = None if kind == "count" else vals
            if op[0] == "update":
                t.update(keys, v)
                new = rows_of(keys, vals)
            else:
                t.merge(keys, counts, v)
                new = [(int(k), int(c), r[2]) for k, c, r in zip(keys, counts, rows_of(keys, vals))]
            rows += new
            epoch += new
        elif op[0] == "compact":
            t.compact()
            assert t.log_floor <= m <= t.log_end  # the latest mark survives compaction
        else:
            if mark_first:  # "mark the tail read-only, then ship it"
                m2 = t.mark()
                d = t.delta(m)
                m = m2
            else:
                d = t.delta(m)
                m = t.mark()
            assert m == t.log_end
            marks.append(m)
            # the tail since the previous mark is exactly that epoch's change, once per key
            assert_same(dict_of(d), reference(kind, dtype, epoch))
            leader.merge(*d)
            epoch = []
    d = t.delta(m)
    assert_same(dict_of(d), reference(kind, dtype, epoch))
    leader.merge(*d)
    whole = reference(kind, dtype, rows)
    assert_same(as_dict(leader), whole)  # the join of all deltas is the table of everything
    assert_same(as_dict(t), whole)  # and marks never change the table's own content
    assert len(t) == len(whole) <= t.log_len
    return marks


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
@pytest.mark.parametrize("mark_first", [False, True], ids=["delta-then-mark", "mark-then-delta"])
def test_epoch_deltas_join_to_the_whole(impl, kind, dtype, mark_first):
    @HYP
    @given(ops=epoch_ops(dtype))
    def check(ops):
        run_epochs(impl, kind, dtype, ops, mark_first)

    check()


@pytest.mark.parametrize("kind,dtype", [("sum", "i8"), ("min", "f8"), ("count", "i8"), ("mean", "f8")])
def test_epoch_positions_agree_across_implementations(kind, dtype):
    """Both implementations hand out the same log positions for the same operations."""
    _require_native()

    @HYP
    @given(ops=epoch_ops(dtype))
    def check(ops):
        assert run_epochs(K.NativeHashAgg, kind, dtype, ops, False) == run_epochs(K.NumpyHashAgg, kind, dtype, ops, True)

    check()


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
def test_ship_per_epoch_joins_to_the_whole(impl, kind, dtype):
    """A helper ships its whole fragment at the end of every epoch and restarts from zero."""

    @HYP
    @given(ops=epoch_ops(dtype))
    def check(ops):
        t = impl(kind, dtype)
        leader = other_impl_of(impl)(kind, dtype)
        rows, epoch = [], []
        for op in ops:
            if op[0] == "update":
                t.update(op[1], None if kind == "count" else op[3])
                epoch += rows_of(op[1], op[3])
            elif op[0] == "merge":
                t.merge(op[1], op[2], None if kind == "count" else op[3])
                epoch += [(int(k), int(c), r[2]) for k, c, r in zip(op[1], op[2], rows_of(op[1], op[3]))]
            elif op[0] == "compact":
                t.mark()  # marks inside an epoch: ship still sends each key once
            else:
                end = t.log_end
                shipped = t.ship()
                assert_same(dict_of(shipped), reference(kind, dtype, epoch))
                assert len(t) == 0 and [len(a) for a in t.export()] == [0, 0, 0]
                assert t.log_end == t.log_floor == end  # positions go on, nothing before is valid
                leader.merge(*shipped)
                rows += epoch
                epoch = []
        leader.merge(*t.ship())
        assert_same(as_dict(leader), reference(kind, dtype, rows + epoch))

    check()


def test_delta_after_update_of_frozen_entries(impl):
    t = impl("sum")
    t.update(np.array([1, 2, 3], np.int64), np.array([10, 20, 30], np.int64))
    m = t.mark()
    assert m == 3 and t.delta(m)[0].size == 0
    t.update(np.array([2, 4, 2], np.int64), np.array([1, 2, 3], np.int64))
    assert dict_of(t.delta(m)) == {2: (2, 4), 4: (1, 2)}  # the change, not the full value
    assert as_dict(t) == {1: (1, 10), 2: (3, 24), 3: (1, 30), 4: (1, 2)}
    assert t.log_len == 5 and len(t) == 4
    assert dict_of(t.delta(0), distinct=False) == {1: (1, 10), 2: (2, 4), 3: (1, 30), 4: (1, 2)}
    m2 = t.mark()
    assert dict_of(t.delta(m)) == {2: (2, 4), 4: (1, 2)}  # the previous mark holds after mark()
    t.update(np.array([2], np.int64), np.array([100], np.int64))
    assert dict_of(t.delta(m2)) == {2: (1, 100)}
    assert as_dict(t)[2] == (4, 124)


def test_delta_argument_checks(impl):
    t = impl("max", "f8")
    t.update(np.array([1, 2], np.int64), np.array([1.0, 2.0]))
    m = t.mark()
    t.update(np.array([3], np.int64), np.array([3.0]))
    for bad in (-1, t.log_end + 1, 2**70):
        with pytest.raises(ValueError, match="log position"):
            t.delta(bad)
    with pytest.raises(TypeError):
        t.delta(1.5)
    assert dict_of(t.delta(np.int64(m))) == {3: (1, 3.0)}
    t.reset()
    with pytest.raises(ValueError, match="log position"):
        t.delta(m)  # reset away
    assert t.log_floor == t.log_end == m + 1
    assert [len(a) for a in t.delta(t.log_end)] == [0, 0, 0]


@pytest.mark.parametrize("compact", ["auto", "explicit"])
def test_compaction_keeps_content_and_bounds_the_log(impl, compact):
    """A long-lived leader fragment whose keys all change every epoch: the log tracks the live
    keys (superseded entries are folded), not the history, and nothing changes in content."""
    rng = np.random.default_rng(5)
    n = 3000
    keys = np.concatenate([np.arange(n, dtype=np.int64) * 7919 - 10**6, [0, -1, I64_MIN, I64_MAX]])
    t = impl("sum")
    want = np.zeros(len(keys), np.int64)
    m = t.mark()
    for epoch in range(30):
        vals = rng.integers(-100, 100, len(keys))
        order = rng.permutation(len(keys))
        t.update(keys[order], vals[order])
        want += vals
        d = dict_of(t.delta(m))
        assert len(d) == len(keys) and all(d[int(k)] == (1, int(v)) for k, v in zip(keys[:50], vals[:50]))
        m = t.mark()
        if compact == "explicit":
            t.compact()
            assert t.log_len == len(t)  # right after a mark the tail is empty
            assert t.log_floor == m
        assert t.log_len <= 3 * len(keys)
    got = as_dict(t)
    assert got == {int(k): (30, int(w)) for k, w in zip(keys, want)}
    assert t.log_floor <= m == t.log_end


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
def test_compact_preserves_content_and_tail(impl, kind, dtype):
    @HYP
    @given(ops=epoch_ops(dtype))
    def check(ops):
        t = impl(kind, dtype)
        for op in ops:
            if op[0] == "update":
                t.update(op[1], None if kind == "count" else op[3])
            elif op[0] == "merge":
                t.merge(op[1], op[2], None if kind == "count" else op[3])
            else:
                t.mark()
        m = t.mark()
        # an epoch that changes some old keys (their entries are frozen) and a new one
        keys = np.concatenate([ops[0][1][:20], np.array([7, I64_MIN], np.int64)])
        t.update(keys, None if kind == "count" else np.arange(len(keys)).astype(dtype))
        before, tail = as_dict(t), dict_of(t.delta(m))
        t.compact()
        assert_same(as_dict(t), before)
        assert_same(dict_of(t.delta(m)), tail)
        assert t.log_len <= len(t) + len(tail)  # only keys changed since the mark have 2 entries

    check()


def test_native_ship_keeps_capacity_then_shrinks():
    _require_native()
    keys = np.arange(100_000, dtype=np.int64)
    t = K.NativeHashAgg("sum")
    t.update(keys, keys)
    cap, nbytes = t.capacity, t.nbytes
    k, c, v = t.ship()
    assert len(k) == len(keys) and t.capacity == cap  # the next epoch of this size fits as is
    t.update(keys, keys)
    assert t.capacity == cap and t.nbytes == nbytes
    t.ship()
    t.update(keys[:10], keys[:10])
    t.ship()  # a far smaller epoch: give the memory back
    assert t.capacity <= 256 and t.nbytes < nbytes / 50
    t.update(keys[:10], keys[:10])
    assert as_dict(t) == {i: (1, i) for i in range(10)}
    t.clear()
    assert t.capacity == 64 and len(t) == 0


def test_native_merge_from_self_with_superseded_entries():
    _require_native()
    t = K.NativeHashAgg("sum")
    t.update(np.array([1, 2, 0], np.int64), np.array([1, 2, 3], np.int64))
    t.mark()
    t.update(np.array([2, 5], np.int64), np.array([10, 50], np.int64))
    assert t.log_len == 5
    t.merge_from(t)
    assert as_dict(t) == {1: (2, 2), 2: (4, 24), 0: (2, 6), 5: (2, 100)}


# Keys built by inverting the hash (murmur3's fmix64 is a bijection), so that many share both the
# home slot and the 32-bit tag of the native index: every probe among them meets slots whose tag
# matches and whose key does not.
_M64 = 2**64 - 1
_C1, _C2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _fmix64(k):
    k &= _M64
    k ^= k >> 33
    k = k * _C1 & _M64
    k ^= k >> 33
    k = k * _C2 & _M64
    return k ^ (k >> 33)


def _unfmix64(h):
    h ^= h >> 33
    h = h * pow(_C2, -1, 2**64) & _M64
    h ^= h >> 33
    h = h * pow(_C1, -1, 2**64) & _M64
    return h ^ (h >> 33)


def _signed(u):
    return u - 2**64 if u >= 2**63 else u


COLLIDING = [_signed(_unfmix64((0x9E3779B9 << 32) | (i << 18) | 0x2A)) for i in range(60)]


def test_colliding_keys(impl):
    assert all(_fmix64(k) >> 32 == 0x9E3779B9 and _fmix64(k) & 0x3FFFF == 0x2A for k in COLLIDING)
    keys = np.array(COLLIDING + EXTREME, np.int64)
    rng = np.random.default_rng(2)
    t = impl("min", "i8")
    rows = []
    m = t.mark()
    for epoch in range(6):
        ks = rng.choice(keys, 200)
        vs = rng.integers(-(10**9), 10**9, 200)
        t.update(ks, vs)
        rows_e = rows_of(ks, vs)
        assert_same(dict_of(t.delta(m)), reference("min", "i8", rows_e))
        rows += rows_e
        m = t.mark()
        if epoch % 2:
            t.compact()
    assert_same(as_dict(t), reference("min", "i8", rows))
    shipped = t.ship()
    assert_same(dict_of(shipped), reference("min", "i8", rows))
    t.update(keys[::-1], keys[::-1])
    assert_same(as_dict(t), reference("min", "i8", rows_of(keys[::-1], keys[::-1])))


def test_reset_of_a_sparse_table(impl):
    """reset() of a table far emptier than its capacity (natively: zeroes only the slots in use),
    also with superseded entries in its log."""
    big = np.arange(300_000, dtype=np.int64) - 150_000
    t = impl("count")
    t.update(big)
    cap = getattr(t, "capacity", None)
    t.reset()
    few = np.array(COLLIDING[:20] + EXTREME, np.int64)
    t.update(few)
    t.mark()
    t.update(few[::2])
    assert t.log_len == len(few) + len(few[::2])
    t.reset()
    assert len(t) == 0 and [len(a) for a in t.export()] == [0, 0, 0]
    assert getattr(t, "capacity", None) == cap  # reset keeps the capacity
    t.update(few[:5])
    t.update(big[:1000])
    want = reference("count", "i8", [(int(k), 1, 0) for k in np.concatenate([few[:5], big[:1000]])])
    assert_same(as_dict(t), want)


def test_growth_across_epochs(impl):
    """Key set growing while epochs are marked and compacted; the log grows and is folded."""
    rng = np.random.default_rng(9)
    n = 40_000 if impl is K.NumpyHashAgg else 250_000
    keys = rng.integers(I64_MIN, I64_MAX, n, dtype=np.int64, endpoint=True)
    keys = np.concatenate([keys, keys[: n // 3]])  # every third key comes back in a later epoch
    vals = rng.integers(-1000, 1000, len(keys))
    t = impl("sum")
    leader = impl("sum")
    m = t.mark()
    for i in range(0, len(keys), 7919):
        t.update(keys[i:i + 7919], vals[i:i + 7919])
        if (i // 7919) % 3 == 2:
            leader.merge(*t.delta(m))
            m = t.mark()
    leader.merge(*t.delta(m))
    uk, inv = np.unique(keys, return_inverse=True)
    want_s = np.zeros(len(uk), np.int64)
    np.add.at(want_s, inv, vals)
    for table in (t, leader):
        k, c, v = table.export()
        o = np.argsort(k)
        np.testing.assert_array_equal(k[o], uk)
        np.testing.assert_array_equal(c[o], np.bincount(inv))
        np.testing.assert_array_equal(v[o], want_s)
    assert t.log_len < 2 * len(uk)


def test_pickle_after_marks(impl):
    import pickle

    t = impl("sum", "f8")
    t.update(np.array([1, 2], np.int64), np.array([1.5, 2.5]))
    t.mark()
    t.update(np.array([2, 3], np.int64), np.array([1.0, -3.0]))
    u = pickle.loads(pickle.dumps(t))
    assert as_dict(u) == as_dict(t) == {1: (1, 1.5), 2: (2, 3.5), 3: (1, -3.0)}


# ---- update from 2-D views, and the native dense path ----------------------------------------


def _slot_run(keys, vals, per_row, pad=3):
    """keys/vals laid out like a field of a run of ring slots: a 2-D view (rows x per_row) of
    packed 16-byte records whose rows are `pad` records longer than their payload."""
    rows = len(keys) // per_row
    rec = np.zeros((rows, per_row + pad), np.dtype([("k", "<i8"), ("v", vals.dtype)]))
    rec["k"][:, :per_row] = keys[: rows * per_row].reshape(rows, per_row)
    rec["v"][:, :per_row] = vals[: rows * per_row].reshape(rows, per_row)
    kv, vv = rec["k"][:, :per_row], rec["v"][:, :per_row]
    assert kv.ndim == 2 and not kv.flags.c_contiguous
    return kv, vv


def _row_by_row(kind, dtype, keys, vals):
    """The native table fed in pieces too small for the dense path: the element-by-element
    hash update the dense path must be indistinguishable from."""
    t = K.NativeHashAgg(kind, dtype)
    for i in range(0, len(keys), 100):
        t.update(keys[i : i + 100], None if kind == "count" else vals[i : i + 100])
    return t


def _export_equal(a, b):
    for x, y in zip(a.export(), b.export()):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


SPANS = {
    "dense-small": (0, 1000),
    "negative": (-500, 500),
    "at-int64-min": (I64_MIN, I64_MIN + 700),
    "at-int64-max": (I64_MAX - 700, I64_MAX),
    "span-just-dense": (10**12, 10**12 + K.DENSE_MAX - 1),
    "span-just-too-wide": (10**12, 10**12 + K.DENSE_MAX),
    "huge": (I64_MIN, I64_MAX),
}


@pytest.mark.parametrize("kind,dtype", KIND_DTYPE)
@pytest.mark.parametrize("span", list(SPANS))
def test_update_2d_view_matches_reference(impl, kind, dtype, span):
    lo, hi = SPANS[span]
    rng = np.random.default_rng(hash(span) % 2**32)
    n = 6 * 1500
    keys = rng.integers(lo, hi, n, dtype=np.int64, endpoint=True)
    keys[0], keys[-1] = lo, hi  # the whole span is present
    vals = rng.integers(-(2**62), 2**62, n) if dtype == "i8" else rng.standard_normal(n)
    kv, vv = _slot_run(keys, vals, 1500)
    t = impl(kind, dtype)
    t.update(kv, vv)
    t.update(kv[:1], vv[:1])  # one row of a 2-D view
    rows = rows_of(keys, vals) + rows_of(keys[:1500], vals[:1500])
    want = reference(kind, dtype, rows)
    if dtype == "f8" and kind in ("sum", "mean"):
        got = as_dict(t)  # float sums: only the order of additions may differ
        assert got.keys() == want.keys()
        for k, (c, v) in want.items():
            assert got[k][0] == c and got[k][1] == pytest.approx(v, rel=1e-9, abs=1e-9)
    else:
        assert_same(as_dict(t), want)


@pytest.mark.parametrize("kind", K.KINDS)
@pytest.mark.parametrize("span", ["dense-small", "negative", "at-int64-min", "at-int64-max", "span-just-dense"])
def test_dense_update_is_the_row_by_row_update(kind, span):
    """Same keys in the same log order (export order), same deltas after marks, same log
    length: the dense path changes how, not what."""
    _require_native()
    lo, hi = SPANS[span]
    rng = np.random.default_rng(5)
    t = K.NativeHashAgg(kind, "i8")
    parts = []
    for step in range(4):
        n = 3000
        keys = rng.integers(lo, min(hi, lo + 200 + 400 * step), n, dtype=np.int64, endpoint=True)
        vals = rng.integers(-(2**63), 2**63 - 1, n, endpoint=True)
        parts.append((keys, vals))
        t.update(keys, None if kind == "count" else vals)
        if step == 1:
            m = t.mark()
    ref = K.NativeHashAgg(kind, "i8")
    for step, (keys, vals) in enumerate(parts):
        for i in range(0, len(keys), 100):
            ref.update(keys[i : i + 100], None if kind == "count" else vals[i : i + 100])
        if step == 1:
            assert ref.mark() == m
    assert t.log_len == ref.log_len and t.log_end == ref.log_end and len(t) == len(ref)
    _export_equal(t, ref)
    for a, b in zip(t.delta(m), ref.delta(m)):
        np.testing.assert_array_equal(a, b)
    # counts of a key that sits only before the mark stay in the frozen prefix
    assert int(t.delta(m)[1].sum()) == sum(len(k) for k, _ in parts[2:])


def test_dense_update_edge_cases(impl):
    t = impl("count")
    t.update(np.empty((0, 5), np.int64))  # empty 2-D view
    t.update(np.empty((3, 0), np.int64))
    assert len(t) == 0
    t.update(np.array([[7]], np.int64))  # one record
    assert as_dict(t) == {7: (1, 0)}
    # every record the same key: a span of one
    t.update(np.full((4, 1000), -3, np.int64))
    assert as_dict(t) == {7: (1, 0), -3: (4000, 0)}
    # the same call with the two extreme keys: not dense, still right
    t.update(np.array([I64_MIN, I64_MAX] * 500, np.int64))
    assert as_dict(t)[I64_MIN] == (500, 0) and as_dict(t)[I64_MAX] == (500, 0)


def test_dense_update_dtype_errors(impl):
    t = impl("sum", "i8")
    k = np.zeros((2, 300), np.int64)
    with pytest.raises(TypeError):
        t.update(k.astype(np.int32), k)  # keys must be int64
    with pytest.raises(TypeError):
        t.update(k, k.astype(np.float64))  # values must be the table's dtype
    with pytest.raises(TypeError):
        t.update(k)  # sum needs values
    assert len(t) == 0


def test_dense_update_integer_sums_wrap(impl):
    t = impl("sum", "i8")
    keys = np.tile(np.arange(10, dtype=np.int64), 100)
    t.update(keys.reshape(10, 100), np.full((10, 100), I64_MAX, np.int64))
    want = _wrap(100 * I64_MAX)
    assert as_dict(t) == {k: (100, want) for k in range(10)}


def test_dense_scratch_is_per_thread_and_left_clean():
    """Tables updated from several threads at once (the GIL released) each get the right
    counts: the dense scratch is per thread and every call leaves it zeroed."""
    _require_native()
    keys = np.random.default_rng(3).integers(0, 5000, 200_000, dtype=np.int64)
    want = np.bincount(keys, minlength=5000)
    tables = [K.NativeHashAgg("count") for _ in range(4)]

    def work(t):
        for i in range(5):
            t.update(keys.reshape(100, -1))

    threads = [threading.Thread(target=work, args=(t,)) for t in tables]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in tables:
        k, c, _ = t.export()
        got = np.zeros(5000, np.int64)
        got[k] = c
        np.testing.assert_array_equal(got, 5 * want)


def test_dense_max_matches_the_extension():
    _require_native()
    from slashrt import _native

    assert _native.DENSE_MAX == K.DENSE_MAX


@pytest.mark.parametrize("kind", ["count", "sum", "max"])
def test_dense_range_guess_missed_mid_call(kind):
    """A table remembers the key range of its last dense update; keys outside it in the middle
    of a later call (in the middle of a row of a 2-D view) fold what was counted so far and
    start over: content, log order and deltas stay those of the row-by-row update."""
    _require_native()
    rng = np.random.default_rng(11)
    calls = [
        rng.integers(0, 500, (3, 400)),  # sets the guess around [0, 500)
        np.concatenate([rng.integers(0, 500, 700), rng.integers(10**9, 10**9 + 50, 500)]).reshape(3, 400),
        np.concatenate([rng.integers(10**9, 10**9 + 50, 300), [I64_MIN, I64_MAX], rng.integers(0, 9, 898)]).reshape(4, 300),
        rng.integers(-(10**6), -(10**6) + 3, (2, 500)),  # everything outside the last guess
        rng.integers(0, 500, (3, 400)),
    ]
    t = K.NativeHashAgg(kind, "i8")
    ref = K.NativeHashAgg(kind, "i8")
    for i, keys in enumerate(calls):
        keys = keys.astype(np.int64)
        vals = rng.integers(-(2**40), 2**40, keys.shape)
        t.update(keys, None if kind == "count" else vals)
        flat_k, flat_v = keys.reshape(-1), vals.reshape(-1)
        for j in range(0, len(flat_k), 100):
            ref.update(flat_k[j : j + 100], None if kind == "count" else flat_v[j : j + 100])
        if i == 2:
            assert t.mark() == ref.mark()
        assert t.log_len == ref.log_len
        _export_equal(t, ref)


def _within_reference(kind, keys, vals, times, lo, hi):
    flat_t = times.reshape(-1)
    bad = np.flatnonzero((flat_t < lo) | (flat_t > hi))
    n = int(bad[0]) if len(bad) else len(flat_t)
    return n, reference(kind, "i8", rows_of(keys.reshape(-1)[:n], vals.reshape(-1)[:n]))


@pytest.mark.parametrize("kind", ["count", "sum", "min"])
@pytest.mark.parametrize("where", ["all", "none", "mid-row", "row-edge", "last", "late-one"])
def test_update_within_applies_the_prefix_in_range(impl, kind, where):
    rng = np.random.default_rng(hash(where) % 2**32)
    rows, per = 5, 1500
    keys = rng.integers(-50, 2000, rows * per).astype(np.int64)
    vals = rng.integers(-(10**9), 10**9, rows * per).astype(np.int64)
    times = rng.integers(1000, 1999, rows * per, endpoint=True).astype(np.int64)
    cut = {"all": None, "none": 0, "mid-row": 2 * per + 777, "row-edge": 3 * per, "last": rows * per - 1,
           "late-one": 1234}[where]
    if cut is not None:
        times[cut] = 999 if where == "late-one" else 2000  # just outside [1000, 1999]
        times[cut + 1 :: 7] = 5000  # more outside after it: only the first counts
    kv, vv = _slot_run(keys, vals, per)
    tv, _ = _slot_run(times, vals, per)
    t = impl(kind, "i8")
    n = t.update_within(kv, None if kind == "count" else vv, tv, 1000, 1999)
    want_n, want = _within_reference(kind, keys, vals, times, 1000, 1999)
    assert n == want_n == (rows * per if cut is None else cut)
    assert_same(as_dict(t), want)
    # 1-D views too
    t1 = impl(kind, "i8")
    assert t1.update_within(keys, vals, times, 1000, 1999) == want_n
    assert_same(as_dict(t1), want)


def test_update_within_edges_and_errors(impl):
    t = impl("count")
    assert t.update_within(np.empty(0, np.int64), None, np.empty(0, np.int64), 0, 0) == 0
    assert t.update_within(np.array([5], np.int64), None, np.array([I64_MAX], np.int64), I64_MIN, I64_MAX) == 1
    assert t.update_within(np.array([5], np.int64), None, np.array([I64_MIN], np.int64), I64_MIN + 1, I64_MAX) == 0
    assert as_dict(t) == {5: (1, 0)}
    # an empty range takes nothing (hi < lo), even with times at the extremes
    ones = np.ones((2, 300), np.int64)
    assert t.update_within(ones, None, np.full((2, 300), I64_MAX, np.int64), I64_MAX, I64_MIN) == 0
    assert t.update_within(ones, None, ones, 2, 1) == 0
    assert as_dict(t) == {5: (1, 0)}
    k = np.zeros((2, 300), np.int64)
    with pytest.raises(TypeError):
        t.update_within(k, None, k.astype(np.int32), 0, 1)  # times must be int64
    with pytest.raises(ValueError):
        t.update_within(k, None, k[:1], 0, 1)  # times of another shape
    s = impl("sum", "i8")
    with pytest.raises(TypeError):
        s.update_within(k, k.astype(np.float64), k, 0, 1)
    with pytest.raises(ValueError):
        s.update_within(k, k[:, :5], k, 0, 1)
    assert len(s) == 0


def test_update_within_keeps_the_log_order_and_deltas():
    """Dense, missed range guesses and marks through update_within give the very table the
    row-by-row update of the same prefix gives."""
    _require_native()
    rng = np.random.default_rng(2)
    t, ref = K.NativeHashAgg("sum", "i8"), K.NativeHashAgg("sum", "i8")
    for step in range(5):
        keys = np.concatenate([rng.integers(0, 300, 2000), rng.integers(10**15, 10**15 + 9, 1000)]).astype(np.int64)
        rng.shuffle(keys)
        vals = rng.integers(-5, 5, len(keys)).astype(np.int64)
        times = np.full(len(keys), 7, np.int64)
        times[2500 + step * 100 :] = 8
        n = t.update_within(keys.reshape(3, 1000), vals.reshape(3, 1000), times.reshape(3, 1000), 0, 7)
        assert n == 2500 + step * 100
        for j in range(0, n, 100):
            ref.update(keys[j : min(n, j + 100)], vals[j : min(n, j + 100)])
        if step == 2:
            assert t.mark() == ref.mark()
    _export_equal(t, ref)
    assert t.log_len == ref.log_len


# ---- column kernels: minmax and copy_rows_max ------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (3,), (4,), (5,), (7, 1), (3, 4094), (2, 13)])
@pytest.mark.parametrize("layout_", ["contiguous", "field16", "field78", "reversed"])
def test_minmax_matches_numpy(shape, layout_):
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    n = int(np.prod(shape))
    x = rng.integers(I64_MIN, I64_MAX, n, dtype=np.int64, endpoint=True)
    x[rng.integers(0, n)] = I64_MAX if n > 2 else x[0]
    if layout_ == "contiguous":
        v = x.reshape(shape)
    elif layout_ == "reversed":
        v = x[::-1].reshape(shape) if len(shape) == 1 else x.reshape(shape)[:, ::-1]
    else:
        size = 16 if layout_ == "field16" else 78
        rec = np.zeros(n, np.dtype({"names": ["t"], "formats": ["<i8"], "offsets": [size - 8 - (size % 8)], "itemsize": size}))
        rec["t"] = x
        v = rec.reshape(shape)["t"]
    want = (int(v.min()), int(v.max()))
    assert K.minmax(v) == want
    assert K._numpy_minmax(v) == want


def test_minmax_errors():
    if K.NATIVE:
        with pytest.raises(ValueError):
            K.minmax(np.empty((2, 0), np.int64))
    with pytest.raises(ValueError):
        K._numpy_minmax(np.empty(0, np.int64))
    assert K.minmax(np.array([3.5, -1.0])) == (-1, 3)  # other dtypes: numpy's min/max


@pytest.mark.parametrize("record_size,field_offset", [(16, 8), (16, 0), (8, 0), (32, 24), (24, 8), (78, 30), (16, -1)])
@pytest.mark.parametrize("rows,per_row", [(1, 1), (3, 5), (4, 4094), (2, 2048), (5, 3)])
def test_copy_rows_max_matches_numpy(record_size, field_offset, rows, per_row):
    rng = np.random.default_rng(record_size * 1000 + rows * 10 + per_row)
    row_bytes = per_row * record_size
    src = rng.integers(0, 256, rows * row_bytes, dtype=np.uint8)
    if field_offset >= 0:  # plant the extremes in the field of random records
        view = src.reshape(rows * per_row, record_size)
        f = view[:, field_offset : field_offset + 8]
        # small (negative) times among random bytes: the bytes around them read as int64 are
        # mostly far larger, so a kernel reading the wrong lanes gets a wrong max
        f[:] = rng.integers(-(10**6), -(10**3), len(f), dtype=np.int64).view(np.uint8).reshape(-1, 8)
        f[rng.integers(0, len(f))] = np.array([-7], "<i8").view(np.uint8)
    slot = row_bytes + 40  # rows of a ring: payload, then room the copy must not touch
    ring_native = np.full(rows * slot, 0xAB, np.uint8)
    ring_numpy = ring_native.copy()
    dst_n = np.lib.stride_tricks.as_strided(ring_native, (rows, slot), (slot, 1))
    dst_p = np.lib.stride_tricks.as_strided(ring_numpy, (rows, slot), (slot, 1))
    got = K.copy_rows_max(dst_n, src, row_bytes, record_size, field_offset)
    want = K._numpy_copy_rows_max(dst_p, src, row_bytes, record_size, field_offset)
    assert got == want
    np.testing.assert_array_equal(ring_native, ring_numpy)
    if field_offset >= 0:
        assert want == int(src.reshape(-1, record_size)[:, field_offset : field_offset + 8].copy().view("<i8").max())
    else:
        assert want == I64_MIN


def test_copy_rows_max_extremes():
    rec = np.zeros((2, 64), np.dtype([("k", "<i8"), ("t", "<i8")]))
    rec["k"] = I64_MAX
    rec["t"] = I64_MIN
    src = rec.view(np.uint8).reshape(-1)
    dst = np.zeros((2, 64 * 16 + 32), np.uint8)
    assert K.copy_rows_max(dst, src, 64 * 16, 16, 8) == I64_MIN
    rec["t"][1, 63] = I64_MAX
    assert K.copy_rows_max(dst, rec.view(np.uint8).reshape(-1), 64 * 16, 16, 8) == I64_MAX
    assert K.copy_rows_max(dst, src, 64 * 16, 16, 0) == I64_MAX


@pytest.mark.parametrize("bad_at", [700, 1500, 2999])
def test_update_within_switching_from_dense_to_hashing_mid_segment(bad_at):
    """Counting densely (the range guessed from the last call), a wide key mid-segment folds,
    finds the rest too wide and hashes it: the times of the rest are still checked."""
    _require_native()
    rng = np.random.default_rng(bad_at)
    t, ref = K.NativeHashAgg("sum", "i8"), K.NativeHashAgg("sum", "i8")
    warm = rng.integers(0, 300, 1000).astype(np.int64)
    t.update(warm, warm)
    ref.update(warm, warm)
    keys = np.concatenate([rng.integers(0, 300, 500), rng.choice([7, 10**15, -(10**15)], 2500)]).astype(np.int64)
    vals = rng.integers(-9, 9, len(keys)).astype(np.int64)
    times = np.zeros(len(keys), np.int64)
    times[bad_at] = 1
    n = t.update_within(keys.reshape(1, -1), vals.reshape(1, -1), times.reshape(1, -1), 0, 0)
    assert n == bad_at
    for j in range(0, n, 100):
        ref.update(keys[j : min(n, j + 100)], vals[j : min(n, j + 100)])
    _export_equal(t, ref)
    assert t.log_len == ref.log_len
