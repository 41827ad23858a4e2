"""Checkpoints of a graph flow's SSB window shipping in epochs of bytes (`epoch_bytes=`, and
`ssb_routing="direct"`), on 2 executors in real agent processes over shm and tcp: the union,
exchange and slow step of tests/snapshot/test_graph_cluster_unaligned.py in front of one count
window over the whole stream, so that every shipment before the end is an epoch's (1 KiB:
~40 records), never a due one. A checkpoint taken in the middle holds fragments that shipped
early and still hold their capability (`kept`), owners' windows joined from such deltas, and,
unaligned, partial rows on their way (`gcount.counts.to<j>` / `.from<j>`); resumed from it, on
2 executors or on 3 (each row in flight to its key's new owner), every record counts once, also
from its partial rows on their way written in the layout of checkpoints before rows lost their
`closed` column (48 bytes: slice, key, count, value, closed and the time)."""

import numpy as np
import pytest

import slashrt
from slashrt.ops.event_time import NO_TIME
from slashrt.ops.window import earliest_end
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.channel_state import CHANNEL_KIND
from slashrt.ssb.graph_window import is_partial

from tests.snapshot.test_graph_cluster_unaligned import (
    INPUTS, N, RINGS, SlowCalls, chained, counts, reference_rows, window_rows,
)

STEP = "gcount.counts"
WHOLE = 10**9  # ms: one window over the whole stream


def fed(checkpoint) -> int:
    return sum(p["fed"] for per_executor in checkpoint.meta["sources"].values() for p in per_executor.values())


def partial_rows_in_flight(checkpoint, way: str = "") -> int:
    """Partial rows of the window on their way at the cut: queued to ship (`way` "to"), or on a
    peer's channel ("from")."""
    return sum(len(state.arrays["records"]) for (step, _), state in checkpoint.states.items()
               if state.meta.get("kind") == CHANNEL_KIND and step.startswith(f"{STEP}.{way}")
               and "slice" in (state.arrays["records"].dtype.names or ()))


def with_closed_column(store: SnapshotStore, checkpoint) -> int:
    """Rewrite `checkpoint`'s partial rows on their way in the old layout, each with its `closed`
    (the end of the windows of its slice it must not join, NO_TIME: none) as that layout's
    writer set it: the window end before the one its time (end - 1) was held for, if that is
    not its slice's first. Returns how many rows it rewrote."""
    rewritten, rows_moved = set(), 0
    for (step, executor), state in checkpoint.states.items():
        records = state.arrays.get("records")
        if state.meta.get("kind") != CHANNEL_KIND or not step.startswith(f"{STEP}.") or not is_partial(records):
            continue
        names = list(records.dtype.names)
        at = names.index("value") + 1
        old = np.empty(len(records), [*[(n, records.dtype[n]) for n in names[:at]], ("closed", "<i8"),
                                      *[(n, records.dtype[n]) for n in names[at:]]])
        for n in names:
            old[n] = records[n]
        end = records["__epoch"] + 1
        old["closed"] = np.where(end == earliest_end(records["slice"], WHOLE, WHOLE, WHOLE), NO_TIME, end - WHOLE)
        store.write_part(checkpoint.number, step, executor, {**state.arrays, "records": old}, state.meta)
        rewritten.add((step, executor))
        rows_moved += len(old)
    store.complete(checkpoint.number, checkpoint.meta,
                   parts=[p for p in checkpoint.parts if (p.step, p.executor) not in rewritten])
    return rows_moved


def joined(checkpoint) -> int:
    """Partial states the owners' windows hold (their tables' rows, none fired yet)."""
    return sum(len(state.arrays["slices.keys"]) for (step, _), state in checkpoint.states.items() if step == STEP)


def kept(checkpoint) -> int:
    """Fragments that shipped at an epoch's end and still hold their capability."""
    return sum(len(state.meta["kept"]) for (step, _), state in checkpoint.states.items() if step == STEP)


@pytest.mark.parametrize(("transport", "routing", "unaligned"),
                         [("shm", "fragments", False), ("tcp", "fragments", True), ("shm", "direct", True)])
def test_a_checkpoint_taken_while_epochs_ship_resumes_exactly(tmp_path, transport, routing, unaligned):
    expected = np.bincount(np.concatenate([INPUTS["a"]["v"], INPUTS["b"]["v"]]), minlength=300)
    options = dict(executors=2, transport=transport, mode="slash", epoch_bytes=1024, ssb_routing=routing,
                   checkpoint_dir=tmp_path, **RINGS)
    job, out = chained(SlowCalls(60e-6, 0.004), WHOLE)
    result = slashrt.run(job, INPUTS, **options,
                         checkpoint={"interval": 0.02, "keep": 1000, "alignment_timeout": 0 if unaligned else None})
    assert np.array_equal(counts(out), expected)
    assert all(len(epochs) > 50 for epochs in result.epochs[STEP])  # (~25 KiB of input an executor)
    store = SnapshotStore(tmp_path, job="gcount", keep=1000)
    checkpoints = {n: store.load(n) for n in store.checkpoints()}
    # in the middle of the stream, the owners holding deltas that arrived, the fragments that
    # shipped them holding their capabilities (folded: direct routing keeps no fragment)
    mid = [n for n, c in checkpoints.items() if fed(c) < 2 * N and joined(c) and (routing == "direct" or kept(c))]
    assert mid, {n: (fed(c), joined(c), kept(c)) for n, c in checkpoints.items()}
    if unaligned:  # ... and partial rows on their way
        mid = [n for n in mid if partial_rows_in_flight(checkpoints[n])]
        assert mid
    else:
        assert not any(c.meta.get("unaligned") or partial_rows_in_flight(c) for c in checkpoints.values())
    n = mid[len(mid) // 2]
    layouts = ("now", "with closed") if unaligned else ("now",)
    for layout in layouts:
        if layout == "with closed":  # one holding rows queued to ship (shipped again), and on a channel if any
            n = max(mid, key=lambda m: [min(partial_rows_in_flight(checkpoints[m], way) for way in ("to", "from")) > 0,
                                        partial_rows_in_flight(checkpoints[m], "to")])
            assert partial_rows_in_flight(checkpoints[n], "to") > 0
            assert with_closed_column(store, store.load(n)) == partial_rows_in_flight(checkpoints[n])
            assert all(state.arrays["records"].dtype.itemsize == 48 for (step, _), state in store.load(n).states.items()
                       if state.meta.get("kind") == CHANNEL_KIND and step.startswith(f"{STEP}."))
        for executors in (2, 3) if unaligned else (2,):
            job, out = chained(SlowCalls(0, 0), WHOLE)
            again = slashrt.run(job, INPUTS, **{**options, "executors": executors}, checkpoint={"keep": 1000},
                                resume_from=n)
            assert again.resumed_from == n
            np.testing.assert_array_equal(window_rows(out), reference_rows(WHOLE),
                                          err_msg=f"checkpoint {n} ({layout}) on {executors} executors")
