"""Lateness is a function of the input and its watermark policy, never of physical settings.

A record is late when its earliest window ends at or before its source's watermark before it
(the largest event time of the records before it in the input, minus `max_delay`); it updates
exactly the windows that end after that watermark. The same late-heavy input therefore gives
the same windows, late counts and late records with any slot size, ring size, coalescing or
watermark period, and on any number of executors sharing one input array; both are checked
against an independent numpy evaluation of the rule.
"""

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Sliding, Tumbling, sinks
from slashrt.errors import OperatorError

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
MAX_DELAY = 300
I64 = np.iinfo(np.int64)


def late_heavy(n: int, seed: int = 7) -> np.ndarray:
    """Times rising 1 ms per 4 records, most moved back by up to 2 s (far beyond max_delay),
    and a stretch fully shuffled: many records are late, for some windows or all."""
    rng = np.random.default_rng(seed)
    a = np.zeros(n, SCHEMA.dtype)
    t = np.arange(n, dtype=np.int64) // 4 - rng.integers(0, 2000, n) * (rng.random(n) < 0.6)
    mid = slice(n // 3, n // 3 + n // 5)
    t[mid] = rng.permutation(t[mid])
    a["t"] = t
    a["k"] = rng.integers(0, 5, n)
    a["v"] = rng.integers(-100, 100, n)
    return a


def reference(records: np.ndarray, size: int, slide: int, max_delay: int):
    """Per record i, W_i = max(t_0..t_(i-1)) - max_delay; i updates its windows ending after
    W_i and is late when its earliest window ends at or before W_i. Returns the rows
    (start, key, count, sum) sorted, and the late records sorted."""
    t = records["t"]
    before = np.concatenate(([np.iinfo(np.int64).min + max_delay], np.maximum.accumulate(t)[:-1]))
    return judged(records, before - max_delay, size, slide)


def judged(records: np.ndarray, watermark: np.ndarray, size: int, slide: int):
    """The rule with each record's watermark given: record i updates its windows ending after
    watermark[i] and is late when its earliest window ends at or before it. The rows (start,
    key, count, sum) sorted, and the late records sorted."""
    t, k, v = records["t"], records["k"], records["v"]
    first_start = (t - size) // slide * slide + slide  # earliest window start holding t
    late = first_start + size <= watermark
    rows = []
    for j in range(-(-size // slide)):
        start = first_start + j * slide
        member = (start <= t) & (start + size > watermark)
        rows.append(np.stack([start[member], k[member], v[member]], axis=1))
    rows = np.concatenate(rows)
    if not len(rows):
        return np.zeros((0, 4), np.int64), np.sort(records[late], order=["t", "k", "v"])
    keys, inverse = np.unique(rows[:, :2], axis=0, return_inverse=True)
    inverse = inverse.ravel()
    counts = np.bincount(inverse)
    sums = np.bincount(inverse, weights=rows[:, 2]).astype(np.int64)
    return np.column_stack([keys, counts, sums]), np.sort(records[late], order=["t", "k", "v"])


def run(records, assigner, **options):
    """Sum and count per window (the sum's window sends late records to a sink): the rows
    (start, key, count, sum) sorted, the late records sorted, the late counts per window."""
    flow = Dataflow("late")
    src = flow.source("events", SCHEMA, time="t", max_delay=MAX_DELAY)
    late, out, counts = sinks.Collect(), sinks.Collect(), sinks.Collect()
    src.window(assigner, late=late).sum("v", key="k", name="sums").sink(out, name="out")
    src.window(assigner).count(key="k", name="counts").sink(counts, name="counted")
    result = slashrt.run(flow, {"events": records}, **options)
    sums, cnts = np.sort(out.records, order=["window_start", "k"]), np.sort(counts.records, order=["window_start", "k"])
    assert np.array_equal(sums["window_end"], sums["window_start"] + assigner.size)
    if len(sums) == len(cnts) and np.array_equal(sums[["window_start", "k"]], cnts[["window_start", "k"]]):
        rows = np.column_stack([sums["window_start"], sums["k"], cnts["count"], sums["sum_v"]])
    else:
        rows = None  # the two windows disagree: no reference can match
    late_records = np.empty(0, SCHEMA.dtype) if late.records is None else late.records.astype(SCHEMA.dtype)
    return rows, np.sort(late_records, order=["t", "k", "v"]), result.late_records


SETTINGS = [
    dict(slot_size=256, slots=4, coalesce=1),
    dict(slot_size=256, slots=8, coalesce=4, watermark_every=1),
    dict(slot_size=4096, slots=96),
    dict(slot_size=65536, slots=3, coalesce=32),
]


@pytest.mark.parametrize("assigner", [Tumbling(100), Sliding(200, 50)], ids=["tumbling", "sliding"])
def test_late_records_and_windows_do_not_depend_on_buffers_or_rings(assigner):
    data = late_heavy(10_000)
    want_rows, want_late = reference(data, assigner.size, assigner.slide, MAX_DELAY)
    assert len(want_late) > len(data) // 10  # the input is late-heavy
    for options in SETTINGS:
        rows, late, counted = run(data, assigner, **options)
        assert len(late) == len(want_late), options
        assert np.array_equal(late, want_late), options
        assert counted == {"late.sums": len(want_late), "late.counts": len(want_late)}
        assert np.array_equal(rows, want_rows), options


@pytest.mark.parametrize(
    ("mode", "executors", "assigner"),
    [("slash", (2,), Tumbling(100)), ("slash", (3,), Sliding(200, 50)), ("uppar", (3,), Sliding(200, 50))],
    ids=["slash", "slash-sliding", "uppar-sliding"],
)
def test_executors_sharing_one_input_judge_lateness_by_its_order(mode, executors, assigner):
    # blocks of 4096 records round robin: every executor's share runs ahead of or behind the others'
    data = late_heavy(30_000, seed=11)
    want_rows, want_late = reference(data, assigner.size, assigner.slide, MAX_DELAY)
    for n in executors:
        rows, late, counted = run(data, assigner, executors=n, mode=mode, slot_size=4096, epoch_bytes=64 << 10)
        assert np.array_equal(late, want_late), n
        assert counted == {"late.sums": len(want_late), "late.counts": len(want_late)}
        assert np.array_equal(rows, want_rows), n


# -- event times near the int64 limits ----------------------------------------------------------


def one_record_run(t: int, max_delay: int, assigner):
    flow = Dataflow("edge")
    out = sinks.Collect()
    flow.source("e", SCHEMA, time="t", max_delay=max_delay).window(assigner).count(key="k").sink(out)
    data = np.zeros(2, SCHEMA.dtype)
    data["t"] = t
    slashrt.run(flow, {"e": data})
    return out.records


@pytest.mark.parametrize("assigner", [Tumbling(10), Sliding(30, 10)], ids=["tumbling", "sliding"])
def test_windows_near_the_int64_limits_hold_their_times_and_outside_is_a_clear_error(assigner):
    # a watermark below int64's minimum saturates instead of overflowing
    rows = one_record_run(I64.min + 5000, 10_000, assigner)
    assert (rows["window_start"] <= I64.min + 5000).all() and (rows["window_end"] > I64.min + 5000).all()
    assert (rows["window_start"] % 10 == 0).all() and (rows["count"] == 2).all()
    # the first and last valid times get the windows holding them, starts multiples of the slide
    for t in (I64.min + 50, I64.max - 50):
        rows = one_record_run(t, 0, assigner)
        assert len(rows) == assigner.size // assigner.slide
        assert ((rows["window_start"] <= t) & (t < rows["window_end"]) & (rows["window_start"] % 10 == 0)).all()
    # a time whose window would leave int64 is refused, naming the step, the column and the range
    for t in (I64.min + 5, I64.max - 3, I64.min, I64.max):
        with pytest.raises(OperatorError, match=r"count_window.*event time .* in column 't' is too close to the int64 limits"):
            one_record_run(t, 0, assigner)
