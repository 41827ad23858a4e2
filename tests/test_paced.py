"""Paced sources and end-to-end latency (`slashrt.Paced`, `slashrt._latency`).

- the schedule: record j of a stream of r records/s from start s is due at s + j * 1000 / r ms,
  in the source's time unit;
- a paced run releases no record before it is due, stamps each with its due time (outputs exact
  against a numpy reference of the schedule, on 1 and 2 executors), and its sinks' latency counts
  every row; a wait behind a slow operator shows in it (a lower bound: load only adds to it);
- only sinks fed from paced sources alone measure; bad rates, starts and a source without an
  event-time column are refused in one sentence;
- a checkpointed paced run stopped with a savepoint and resumed keeps its schedule: both runs'
  output together is exactly one run's;
- the histogram's quantiles are within its resolution of the exact ones, and merging equals
  recording everything in one.
"""

import time

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, LatencyHistogram, Paced, Schema, StopHandle, Tumbling, sinks
from slashrt.errors import DataflowError
from slashrt.ops.paced import schedule

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})


def records(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = -1  # overwritten by the schedule
    out["k"] = rng.integers(0, 9, n)
    out["v"] = rng.integers(0, 100, n)
    return out


def chunked(n: int, seed: int = 0, size: int = 700):
    """`make` for a Paced input: executor i's records in chunks."""
    def make(index, executors):
        data = records(n, seed + index)
        return [data[i : i + size] for i in range(0, n, size)]
    return make


def reference(data: np.ndarray, window: int) -> np.ndarray:
    """(window_start, window_end, k, sum_v) rows of the stamped records, sorted."""
    starts = data["t"] // window * window
    keys, inverse = np.unique(np.stack([starts, data["k"]], 1), axis=0, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=data["v"], minlength=len(keys)).astype(np.int64)
    return np.sort(np.array(
        [(s, s + window, k, v) for (s, k), v in zip(keys, sums)],
        dtype=[("window_start", "<i8"), ("window_end", "<i8"), ("k", "<i8"), ("sum_v", "<i8")],
    ))


def stamped(data: np.ndarray, *, rate: float, start_ms: int) -> np.ndarray:
    out = data.copy()
    out["t"] = schedule(0, len(data), rate=rate, start_ms=start_ms)
    return out


def test_the_schedule():
    assert schedule(0, 4, rate=1000, start_ms=5000).tolist() == [5000, 5001, 5002, 5003]
    assert schedule(2, 3, rate=3, start_ms=5000).tolist() == [5666, 6000, 6333]
    assert schedule(0, 3, rate=2.5, start_ms=0).tolist() == [0, 400, 800]
    assert schedule(0, 3, rate=2, start_ms=5000, unit="s").tolist() == [5, 5, 6]
    assert schedule(1, 1, rate=4, start_ms=5, unit="us").tolist() == [5000 + 250_000]


def test_a_paced_run_releases_records_when_due_and_is_exact():
    n, rate, window = 3000, 10_000, 20
    arrivals = []

    def arrived(batch):
        arrivals.append((batch["t"].copy(), time.time_ns() / 1e6))

    flow = Dataflow("paced")
    src = flow.source("s", SCHEMA, time="t")
    src.window(Tumbling(ms=window)).sum("v", key="k").sink(sinks.Collect(), name="sums")
    src.sink(sinks.Callback(arrived), name="raw")
    start_ms = time.time_ns() // 1_000_000 + 100
    began = time.perf_counter()
    result = slashrt.run(flow, {"s": Paced(chunked(n), rate=rate, start_ms=start_ms)})
    took = time.perf_counter() - began
    assert np.array_equal(np.sort(result["paced.sums"]), reference(stamped(records(n), rate=rate, start_ms=start_ms), window))
    assert took >= (n - 1) / rate  # the last record is due (n - 1) / rate seconds after the first
    assert sum(len(t) for t, _ in arrivals) == n
    assert all(t.max() <= at for t, at in arrivals)  # none reached the sink before it was due
    raw, sums = result.latency["paced.raw"], result.latency["paced.sums"]
    assert raw.rows == n and sums.rows == len(result["paced.sums"])
    assert 0 <= raw.p50_ms <= raw.p99_ms <= raw.max_ms
    assert set(raw.summary()) == {"rows", "p50_ms", "p99_ms", "max_ms", "mean_ms"}


def test_latency_counts_the_wait_behind_a_slow_operator():
    async def slow(batch):
        await trio.sleep(0.03)
        return batch

    flow = Dataflow("slow")
    flow.source("s", SCHEMA, time="t").apply(slow).sink(sinks.Collect(), name="out")
    result = slashrt.run(flow, {"s": Paced(chunked(300), rate=3000)})
    latency = result.latency["slow.out"]
    assert latency.rows == 300 and latency.p50_ms >= 30  # every batch waited 30 ms at least


def test_two_executors_share_the_rate_and_one_schedule():
    n, rate, window = 2000, 8000, 25
    flow = Dataflow("paced2")
    flow.source("s", SCHEMA, time="t").window(Tumbling(ms=window)).sum("v", key="k").sink(sinks.Collect(), name="sums")
    start_ms = time.time_ns() // 1_000_000 + 300
    result = slashrt.run(flow, {"s": Paced(chunked(n, seed=5), rate=rate, start_ms=start_ms)}, executors=2)
    # each executor feeds its own stream at half the rate, on the same schedule
    both = np.concatenate([stamped(records(n, 5 + i), rate=rate / 2, start_ms=start_ms) for i in range(2)])
    assert np.array_equal(np.sort(result["paced2.sums"]), reference(both, window))
    assert result.latency["paced2.sums"].rows == len(result["paced2.sums"])


def test_only_sinks_fed_from_paced_sources_alone_measure():
    flow = Dataflow("mixed")
    paced = flow.source("p", SCHEMA, time="t")
    fixed = flow.source("a", SCHEMA, time="t")
    paced.sink(sinks.Collect(), name="paced_only")
    paced.union(fixed).sink(sinks.Collect(), name="both")
    fixed.sink(sinks.Collect(), name="fixed_only")
    data = records(100)
    data["t"] = np.arange(100)
    result = slashrt.run(flow, {"p": Paced(chunked(100), rate=20_000), "a": data})
    assert set(result.latency) == {"mixed.paced_only"} and result.latency["mixed.paced_only"].rows == 100
    flow = Dataflow("unpaced")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect(), name="out")
    assert slashrt.run(flow, {"a": data}).latency == {}


@pytest.mark.parametrize("rate", [0, -1.5, float("inf"), "fast", True])
def test_a_bad_rate_is_refused(rate):
    with pytest.raises(DataflowError, match="rate must be a positive number"):
        Paced(chunked(10), rate=rate)


def test_a_bad_start_and_a_source_without_event_time_are_refused():
    with pytest.raises(DataflowError, match="start_ms must be whole milliseconds"):
        Paced(chunked(10), rate=10, start_ms=1.5)
    flow = Dataflow("untimed")
    flow.source("s", SCHEMA).sink(sinks.Collect())
    with pytest.raises(DataflowError, match="source 's' is Paced, which stamps each record's event time: declare"):
        slashrt.run(flow, {"s": Paced(chunked(10), rate=1000)})


def test_a_stopped_and_resumed_paced_run_keeps_its_schedule(tmp_path):
    n, rate, window = 4000, 20_000, 10
    stop = StopHandle()

    def job(seen=None, **options):
        flow = Dataflow("resumed")
        src = flow.source("s", SCHEMA, time="t")
        if seen is not None:
            src = src.filter(seen, name="watch")
        src.window(Tumbling(ms=window)).sum("v", key="k").sink(sinks.Collect(transactional=True), name="sums")
        src.sink(sinks.Collect(transactional=True), name="raw")
        paced = Paced(chunked(n, seed=3), rate=rate, deterministic=True)  # no start: the first run's feed fixes it
        return slashrt.run(flow, {"s": paced}, checkpoint_dir=tmp_path, checkpoint=0.01, **options)

    count = [0]

    def seen(batch):
        count[0] += len(batch)
        if count[0] >= n // 3:
            stop.request()
        return np.ones(len(batch), bool)

    first = job(seen, stop=stop)
    assert first.savepoint is not None and 0 < len(first["resumed.raw"]) < n
    second = job(resume_from="latest")
    raw = np.concatenate([first["resumed.raw"], second["resumed.raw"]])
    start_ms = int(raw["t"].min())  # record 0's due time: the schedule's start
    expected = stamped(records(n, 3), rate=rate, start_ms=start_ms)
    assert np.array_equal(np.sort(raw, order=["t", "k", "v"]), np.sort(expected, order=["t", "k", "v"]))
    sums = np.sort(np.concatenate([first["resumed.sums"], second["resumed.sums"]]))
    assert np.array_equal(sums, reference(expected, window))
    assert second.latency["resumed.raw"].rows == len(second["resumed.raw"])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5000), st.floats(-2, 9), st.integers(0, 2**31))
def test_histogram_quantiles_are_within_its_resolution(n, log_scale, seed):
    values = np.random.default_rng(seed).lognormal(log_scale, 1.5, n)  # ms: from microseconds to minutes
    histogram = LatencyHistogram()
    histogram.record(values)
    assert histogram.rows == n and histogram.max_ms == values.max()
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        exact = np.quantile(values, q, method="inverted_cdf")
        assert abs(histogram.quantile(q) - exact) <= 0.02 * exact + 0.001


def test_merging_equals_recording_everything_in_one():
    values = np.random.default_rng(1).exponential(5.0, 10_000)
    whole, a, b = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    whole.record(values)
    a.record(values[:3000])
    b.record(values[3000:])
    merged = a.merge(b)
    assert np.array_equal(merged.counts, whole.counts) and merged.rows == whole.rows and merged.max_ms == whole.max_ms
    assert merged.p99_ms == whole.p99_ms and LatencyHistogram().p50_ms is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        whole.quantile(1.5)


# -- slashrt bench latency -------------------------------------------------------------------------
def bench_latency(capsys, *args: str) -> dict:
    import json

    from slashrt.cli import main

    assert main(["bench", "latency", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_latency_on_one_and_two_executors(capsys):
    out = bench_latency(capsys, "--rate", "60000", "--seconds", "0.5", "--window-ms", "100")
    assert out["correct"] and out["events"] == 30_000 and out["window_ms"] == 100
    for k in (1, 2):
        at = out[f"at_{k}"]
        assert at["executors"] == k and at["correct"] and at["rows"] > 0
        assert at["span_s"] >= 0.5 and 0 <= at["latency_p50_ms"] <= at["latency_p99_ms"] <= at["latency_max_ms"]


def test_bench_latency_over_tcp_on_three_executors(capsys):
    out = bench_latency(capsys, "--rate", "30000", "--seconds", "0.3", "--executors", "3", "--transport", "tcp")
    assert out["correct"] and out["transport"] == "tcp" and set(out) >= {"at_3"} and "at_1" not in out


@pytest.mark.parametrize("args, message", [
    (["--executors", "1", "--transport", "tcp"], "--transport does not apply with --executors 1"),
    (["--rate", "0"], "'0' must be positive"),
    (["--executors", "1,x"], "'x' is not a whole number"),
    (["--executors", ","], "names no executor count"),
    (["--window-ms", "-5"], "'-5' must be positive"),
])
def test_bench_latency_refuses_bad_options_in_one_line(capsys, args, message):
    from slashrt.cli import main

    try:
        code = main(["bench", "latency", *args])
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
