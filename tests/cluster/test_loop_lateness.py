"""Lateness inside loops is a function of the input and the loop body, never of physical
settings: a record is late for its windows at its iteration that end at or before the epoch of
the batch carrying it (a source's watermark when it was read, the end of the window whose row
a step fed back), as outside loops. A late-heavy input into a loop whose windows' rows go
round once more, spread behind and ahead of their window's end, gives the same windows per
iteration, late counts and late records on one executor with several slot sizes, on two over
shm and on three over tcp with rings of four 256-byte slots, equal to a numpy evaluation of
the rule (tests/test_lateness.py's, given each record's watermark)."""

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Sliding, Tumbling, sinks
from tests.cluster.test_loop_windows_cluster import Tag, tagged
from tests.test_lateness import MAX_DELAY, SCHEMA, judged, late_heavy, reference

FAN = 8  # records fed back per window row


def fed_back(start, k, total, size: int) -> np.ndarray:
    """Window rows (start, key, sum) -> the records of the next iteration: FAN per row, keys
    moved on (other owners), event times spread over [start, start + 2 size): about half lie
    behind the row's window end (its time's epoch), late for the windows ending there."""
    j = np.tile(np.arange(FAN), len(start))
    start, k, total = (np.repeat(np.asarray(a, np.int64), FAN) for a in (start, k, total))
    out = np.zeros(len(j), SCHEMA.dtype)
    out["t"] = start + (total + 37 * j) % (2 * size)
    out["k"] = (k + j) % 5
    out["v"] = (total + j) % 97
    return out


def loop_reference(data: np.ndarray, size: int, slide: int):
    """Iteration 0 judged by the source's watermarks, iteration 1 (the sums' rows fed back at
    their window's end) by that end: per iteration the rows (start, key, count, sum) sorted,
    and all late records sorted."""
    rows0, late0 = reference(data, size, slide, MAX_DELAY)
    back = fed_back(rows0[:, 0], rows0[:, 1], rows0[:, 3], size)
    rows1, late1 = judged(back, np.repeat(rows0[:, 0] + size, FAN), size, slide)
    return {0: rows0, 1: rows1}, np.sort(np.concatenate([late0, late1]), order=["t", "k", "v"])


def run_loop(data: np.ndarray, assigner, **options):
    """The loop (a sum window with a late sink and a count window, the sums' rows of
    iteration 0 fed back): per iteration the rows (start, key, count, sum) sorted, the late
    records sorted, the late counts."""
    flow = Dataflow("ll")
    src = flow.source("events", SCHEMA, time="t", max_delay=MAX_DELAY)
    late, sums_out, counts_out = sinks.Collect(), sinks.Collect(), sinks.Collect()
    size = assigner.size

    def again(batch):
        rows = batch.to_numpy()
        return fed_back(rows["window_start"], rows["k"], rows["sum_v"], size)

    with flow.loop("l", max_iterations=1) as loop:
        x = loop.enter(src)
        sums = x.window(assigner, late=late).sum("v", key="k", name="sums")
        sums = sums.operator(Tag(1, "sum_v"), name="tag_sums", schema=tagged(1, "sum_v"))
        counts = x.window(assigner).count(key="k", name="counts")
        counts = counts.operator(Tag(1, "count"), name="tag_counts", schema=tagged(1, "count"))
        first = sums.filter(lambda b: b["c0"] == 0)
        loop.feed_back(first.apply(again, schema={n: "i8" for n in SCHEMA.dtype.names}), into=x)
        loop.leave(sums).sink(sums_out)
        loop.leave(counts).sink(counts_out)
    result = slashrt.run(flow, {"events": data}, **options)
    got = {}
    s, c = (np.sort(o.records, order=["c0", "window_start", "k"]) for o in (sums_out, counts_out))
    assert np.array_equal(s[["c0", "window_start", "k"]], c[["c0", "window_start", "k"]])
    for i in np.unique(s["c0"]).tolist():
        at = s["c0"] == i
        got[i] = np.column_stack([s["window_start"][at], s["k"][at], c["count"][at], s["sum_v"][at]])
    late_records = np.sort(late.records.astype(SCHEMA.dtype), order=["t", "k", "v"])
    return got, late_records, result.late_records


@pytest.mark.parametrize("assigner", [Tumbling(100), Sliding(200, 50)], ids=["tumbling", "sliding"])
def test_a_late_heavy_loop_gives_the_rules_windows_and_late_records_on_any_executors_and_slots(assigner):
    data = late_heavy(6000)
    want, want_late = loop_reference(data, assigner.size, assigner.slide)
    assert len(want_late) > len(data) // 10 and len(want[1]) > 50  # late-heavy, and iteration 1 has rows
    late_at_1 = len(want_late) - len(reference(data, assigner.size, assigner.slide, MAX_DELAY)[1])
    assert late_at_1 > 100  # iteration 1 judges many records too
    for options in (
        dict(slot_size=256, slots=4),
        dict(slot_size=4096, slots=16),
        dict(slot_size=65536, slots=3),
        dict(executors=2, transport="shm", slot_size=256, slots=4),
        dict(executors=3, transport="tcp", slot_size=256, slots=4),
    ):
        got, late, counted = run_loop(data, assigner, **options)
        assert sorted(got) == [0, 1], options
        for i in (0, 1):
            assert np.array_equal(got[i], want[i]), (options, i)
        assert np.array_equal(late, want_late), options
        assert counted == {"ll.sums": len(want_late), "ll.counts": len(want_late)}, options
