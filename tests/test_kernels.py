"""Tests of slashrt._kernels: HashAgg (native and numpy) against a plain-dict reference,
the CRDT laws of merge, and the C YSB baseline against a numpy reference.

The native extension must be built (``python setup.py build_ext --inplace`` or an install);
a missing extension fails these tests unless SLASHRT_NATIVE=0 asks for the fallback only.
"""

from __future__ import annotations

import math
import os
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
    """rows: iterable of (key, count, value) folded in order; returns {key: (count, val)}."""
    isf = dtype == "f8"
    d: dict = {}
    for k, c, v in rows:
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
    return [(int(k), 1, (v if v is None else (float(v) if isinstance(v, float) else int(v)))) for k, v in zip(keys, vals)]


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
    with pytest.raises(TypeError):
        t.update(k.reshape(1, 3), k.reshape(1, 3))
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
