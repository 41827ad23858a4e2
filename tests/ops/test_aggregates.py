"""Aggregate values as pandas gives them, on one executor and on two (SSB with fragments or
direct routing, and UpPar): int64 means that do not wrap, sum's choice on int64 overflow, keys
that keep their type (uint64 at or above 2**63 included), and one NaN policy (skipna) for all
five aggregates, including where partials of several executors are joined."""

import numpy as np
import pandas as pd
import pytest

import slashrt
from slashrt import Dataflow, Sliding, Tumbling
from slashrt.bench._common import sort_rows
from slashrt.cluster import ClusterError, PerExecutor
from slashrt.errors import DataflowError, OperatorError
from slashrt.ops.sinks import Collect

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
KINDS = ("count", "sum", "min", "max", "mean")
WINDOW = 100
ONE = {}
SLASH = dict(executors=2, mode="slash", ssb_routing="fragments")
DIRECT = dict(executors=2, mode="slash", ssb_routing="direct")
UPPAR = dict(executors=2, mode="uppar")


def run_aggs(parts: list[np.ndarray], kinds=KINDS, run=ONE, **agg) -> dict[str, np.ndarray]:
    """Each aggregate of column "value" by "key" in windows of 100 ms over the records of
    `parts`: executor i reads parts[i] on a cluster, one executor reads them all."""
    flow = Dataflow("aggs")
    windowed = flow.source("r", parts[0].dtype, time="ts", max_delay=10_000).window(Tumbling(ms=WINDOW))
    sinks = {kind: Collect() for kind in kinds}
    for kind, sink in sinks.items():
        method = getattr(windowed, kind)
        out = method(key="key", output="out") if kind == "count" else method("value", key="key", output="out", **agg)
        out.sink(sink, name=f"out_{kind}")
    if run:
        assert run["executors"] == len(parts)
        inputs = {"r": PerExecutor(lambda index, executors: parts[index])}
    else:
        inputs = {"r": np.concatenate(parts)}
    slashrt.run(flow, inputs, **run)
    return {kind: sort_rows(sink.records, "window_start", "key") for kind, sink in sinks.items()}


def pandas_aggs(parts: list[np.ndarray], kind: str) -> pd.DataFrame:
    """What pandas gives: count counts records (size), the others skip NaN."""
    df = pd.DataFrame(np.concatenate(parts))
    df["window_start"] = df["ts"] // WINDOW * WINDOW
    grouped = df.groupby(["window_start", "key"], sort=True)["value"]
    return grouped.size() if kind == "count" else grouped.agg(kind)


def check_like_pandas(got: dict[str, np.ndarray], parts: list[np.ndarray]) -> None:
    key_dtype = parts[0].dtype["key"]
    for kind, rows in got.items():
        want = pandas_aggs(parts, kind)
        assert rows["key"].dtype == key_dtype, kind
        assert rows["key"].tolist() == want.index.get_level_values("key").tolist(), kind
        assert rows["window_start"].tolist() == want.index.get_level_values("window_start").tolist(), kind
        np.testing.assert_allclose(rows["out"], want.to_numpy(), rtol=1e-15, atol=0, err_msg=kind)
        if kind != "mean":
            np.testing.assert_array_equal(rows["out"], want.to_numpy(), err_msg=kind)


def records(ts, keys, values, key_dtype="<i8", value_dtype="<i8") -> np.ndarray:
    out = np.zeros(len(ts), [("ts", "<i8"), ("key", key_dtype), ("value", value_dtype)])
    out["ts"], out["key"], out["value"] = ts, np.array(keys, dtype=key_dtype), np.array(values, dtype=value_dtype)
    return out


# ---- mean of int64 values --------------------------------------------------------------


def big_int_parts() -> list[np.ndarray]:
    keys = [1, 1, 2, 2, 3, 3, 4]
    values = [2**62, 2**62, I64_MAX, I64_MAX, I64_MIN, I64_MIN, I64_MAX]
    a = records([1, 2, 3, 4, 5, 6, 7], keys, values)
    b = records([11, 12, 13, 14, 15, 16, 150], keys, values)
    return [a, b]


@pytest.mark.parametrize("run", [ONE, SLASH], ids=["one", "slash"])
def test_mean_of_large_int64_values_does_not_wrap(run):
    parts = big_int_parts()
    got = run_aggs(parts, kinds=("mean",), run=run)["mean"]
    assert got["out"].dtype == np.float64
    # (window 0) 2**62, int64 max and min (as float64: +-2**63); (window 100) int64 max
    np.testing.assert_array_equal(got["out"], [2.0**62, 2.0**63, -(2.0**63), 2.0**63, 2.0**63])
    check_like_pandas({"mean": got}, parts)


# ---- sum on int64 overflow ---------------------------------------------------------------


def test_sum_wraps_on_int64_overflow_by_default():
    got = run_aggs([records([1, 2, 3], [1, 1, 2], [I64_MAX, 1, I64_MAX])], kinds=("sum",))["sum"]
    assert got["out"].tolist() == [I64_MIN, I64_MAX]  # key 1 wrapped around, as numpy does


@pytest.mark.parametrize("n", [6, 3000])  # a few records (hashed) and many (counted densely)
def test_sum_overflow_error_names_the_step_and_window(n):
    data = records(np.arange(n) % 50 + 100, np.arange(n) % 3, np.full(n, 2**62))
    with pytest.raises(OperatorError, match=r"aggs\.sum_window.*int64 sum of column 'value' overflowed in window \[100, 200\)"):
        run_aggs([data], kinds=("sum",), overflow="error")


def test_sum_overflow_error_keeps_sums_that_fit():
    data = records([1, 2, 3, 4], [1, 1, 2, 2], [I64_MAX - 1, 1, I64_MIN + 1, -1])
    got = run_aggs([data], kinds=("sum",), overflow="error")["sum"]
    assert got["out"].tolist() == [I64_MAX, I64_MIN]


@pytest.mark.parametrize("run", [SLASH, UPPAR], ids=["slash", "uppar"])
def test_sum_overflow_error_on_two_executors(run):
    # every key overflows, on each executor alone: both fail, whichever reports first
    data = records(np.arange(64) % 50, np.arange(64) % 16, np.full(64, 2**62))
    with pytest.raises(ClusterError, match=r"step .aggs\.sum_window_1.: .*overflowed.*\(on executor \d\)"):
        run_aggs([data, data], kinds=("sum",), run=run, overflow="error")


def test_sum_overflow_error_in_records_judged_late_on_another_executor():
    # executor 1's watermark (260, no delay) has closed the windows [0, 200) and [50, 250) for
    # its records at 170 and 180 but not [100, 300): they reach the UpPar owner of key 7 as a
    # tail of their slice, whose overflowing sum fails the window it joins, naming the step
    # (an SSB helper already fails in its own slice, before shipping)
    flow = Dataflow("aggs")
    windowed = flow.source("r", records([], [], []).dtype, time="ts").window(Sliding(200, 50))
    windowed.sum("value", key="key", output="out", overflow="error").sink(Collect(), name="out")
    parts = [records([1, 2], [1, 2], [1, 1]), records([260, 170, 180], [9, 7, 7], [1, I64_MAX, I64_MAX])]
    inputs = {"r": PerExecutor(lambda index, executors: parts[index])}
    message = r"step 'aggs\.sum_window\w*': .*overflowed in window \[100, 300\).*\(on executor \d\)"
    with pytest.raises(ClusterError, match=message):
        slashrt.run(flow, inputs, **UPPAR)


def test_sum_overflow_must_be_wrap_or_error():
    flow = Dataflow("aggs")
    windowed = flow.source("r", records([], [], []).dtype, time="ts").window(Tumbling(ms=WINDOW))
    with pytest.raises(DataflowError, match="overflow must be one of wrap, error, got 'saturate'"):
        windowed.sum("value", key="key", overflow="saturate")


# ---- keys keep their type ------------------------------------------------------------------------


def uint64_parts() -> list[np.ndarray]:
    keys = [2**63, 2**64 - 1, 2**63 + 12345, 7, 2**63]
    a = records([1, 2, 3, 4, 5], keys, [1, 2, 3, 4, 5], key_dtype="<u8")
    b = records([6, 7, 8, 9, 110], keys, [10, 20, 30, 40, 50], key_dtype="<u8")
    return [a, b]


@pytest.mark.parametrize("run", [ONE, SLASH, DIRECT, UPPAR], ids=["one", "slash", "direct", "uppar"])
def test_uint64_keys_keep_their_type_and_value(run):
    parts = uint64_parts()
    got = run_aggs(parts, run=run)
    assert got["count"]["key"].tolist() == [7, 2**63, 2**63 + 12345, 2**64 - 1, 2**63]
    check_like_pandas(got, parts)


@pytest.mark.parametrize("key_dtype", ["<i4", "<u2"])
def test_narrow_keys_keep_their_type(key_dtype):
    parts = [records([1, 2, 3], [-1 if key_dtype == "<i4" else 65535, 3, 3], [1, 2, 3], key_dtype=key_dtype)]
    check_like_pandas(run_aggs(parts), parts)


def test_a_uint64_key_of_unknown_type_is_refused():
    flow = Dataflow("aggs")
    source = flow.source("r", records([], [], []).dtype, time="ts")
    keyed = source.with_column("big", lambda b: b["key"].astype(np.uint64))  # no dtype=: unknown when built
    keyed.window(Tumbling(ms=WINDOW)).count(key="big").sink(Collect())
    with pytest.raises(OperatorError, match=r"key column 'big' is uint64 .* give with_column a dtype="):
        slashrt.run(flow, {"r": records([1], [5], [1])})


@pytest.mark.parametrize("run", [ONE, UPPAR], ids=["one", "uppar"])
def test_uint64_values_int64_cannot_hold_are_refused(run):
    data = records([1, 2], [1, 1], [2**63, 1], value_dtype="<u8")
    error = ClusterError if run else OperatorError
    with pytest.raises(error, match=r"aggs\.max_window.*column 'value' holds uint64 values of 2\*\*63 or more"):
        run_aggs([data] * (2 if run else 1), kinds=("max",), run=run)
    small = records([1, 2], [1, 1], [2**63 - 1, 1], value_dtype="<u8")
    assert run_aggs([small], kinds=("max", "mean"))["max"]["out"].tolist() == [2**63 - 1]


# ---- NaN: skipped by every aggregate, wherever it is computed ----------------------------------------


def nan_parts() -> list[np.ndarray]:
    nan, inf = float("nan"), float("inf")
    # key 1: numbers and NaN on both executors; 2: NaN only; 3: NaN on one executor, numbers
    # on the other; 4: inf on one, -inf on the other (their sum is NaN, as in pandas)
    a = records([1, 2, 3, 4, 5, 6, 120], [1, 1, 2, 2, 3, 4, 2], [nan, 2.5, nan, nan, nan, inf, nan], value_dtype="<f8")
    b = records([7, 8, 9, 10, 11, 12, 130], [1, 1, 2, 3, 3, 4, 1], [-1.0, nan, nan, 4.0, 8.0, -inf, nan], value_dtype="<f8")
    return [a, b]


@pytest.mark.parametrize("run", [ONE, SLASH, DIRECT, UPPAR], ids=["one", "slash", "direct", "uppar"])
def test_nan_is_skipped_by_every_aggregate_as_in_pandas(run):
    parts = nan_parts()
    got = run_aggs(parts, run=run)
    check_like_pandas(got, parts)
    window0 = {kind: rows["out"][rows["window_start"] == 0].tolist() for kind, rows in got.items()}
    assert window0["count"] == [4, 3, 3, 2]
    assert window0["sum"][:3] == [1.5, 0.0, 12.0] and np.isnan(window0["sum"][3])
    assert np.isnan(window0["min"][1]) and np.isnan(window0["max"][1])  # key 2: NaN only
    assert window0["mean"][0] == 0.75 and np.isnan(window0["mean"][1]) and window0["mean"][2] == 6.0
