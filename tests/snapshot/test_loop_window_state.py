"""The state of a window inside a loop (`LoopWindow`, kind "loop_window"): restore equals the
state snapshotted over seeded random states (one and two loops deep, tables and tails per
iteration, fired-until, late counts, the frontier), the snapshot shares nothing with the live
tables, the tracker counts a restored window's capabilities per iteration, its iterations judge
lateness on a clock it is told after the restore (an SSB window's fragments), and a state of
another loop depth, grid or kind is refused in one sentence naming the step, and a run of
windows in nested loops checkpointed by barriers or stop-the-world gives the numpy reference.
(Killed and resumed runs: tests/snapshot/test_checkpoint_loops.py.)"""

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt import Dataflow, Schema, Sliding, Timestamp, Tumbling, sinks
from slashrt._plan import build_plan
from slashrt.errors import SnapshotError
from slashrt.ops.loop_window import LoopWindow
from slashrt.progress import Location
from slashrt.ops.event_time import NO_TIME
from slashrt.scheduler._pointstamp import PointstampProgress

from tests.snapshot.test_operator_state import canonical, through_the_format
from tests.test_loop_windows import REC, halving

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})


def window_spec(depth: int, window=Tumbling(ms=10), kind: str = "sum"):
    """The spec of a window `depth` loops deep."""
    flow = Dataflow("lw")
    x = flow.source("src", SCHEMA, time="t")
    with contextlib.ExitStack() as stack:
        scope = flow
        for d in range(depth):
            scope = stack.enter_context(scope.loop(f"l{d}"))
            x = scope.enter(x)
        getattr(x.window(window), kind)(*(() if kind == "count" else ("v",)), key="k", name="win")
    return flow.steps["lw.win"]


def random_state(node: LoopWindow, rng: np.random.Generator) -> LoopWindow:
    """`node` holding a random state: iterations with slices and tails, next_start (or None),
    fired_until, late counts, the frontier last told (or none)."""
    vdt = node.value_dtype = node.value_dtype or np.dtype("<i8")
    size, slide = node.size, node.slide
    for _ in range(rng.integers(0, 6)):
        counters = tuple(int(c) for c in rng.integers(0, 4, node.depth))
        window = node.windows.get(counters) or node._window(counters)
        for table_id in rng.integers(-5, 40, rng.integers(0, 4)).tolist():
            n = int(rng.integers(0, 30))
            keys = rng.choice(1 << 40, n, replace=False).astype(np.int64) - (1 << 39)
            vals = rng.integers(-1000, 1000, n).astype(vdt)
            tail = rng.random() < 0.3
            table = window._table()
            table.merge(keys, rng.integers(1, 50, n).astype(np.int64), vals)
            table.overflowed = bool(rng.random() < 0.2)
            if tail:
                window.tails[(table_id, int(rng.integers(-100, 400)))] = table
            else:
                window.slices[table_id] = table
        window.fired_until = NO_TIME if rng.random() < 0.3 else int(rng.integers(-10, 40)) * slide
        window.next_start = None if rng.random() < 0.3 else int(rng.integers(-10, 40)) * slide - size
        window.late_records = int(rng.integers(0, 1000))
    if rng.random() < 0.8:
        epochs = rng.integers(-(2**40), 2**40, rng.integers(0, 4)).tolist()
        node.frontier = {Timestamp(e, tuple(int(c) for c in rng.integers(0, 5, node.depth))) for e in epochs}
    node._forgotten_late = int(rng.integers(0, 100))
    return node


def tables(node: LoopWindow) -> dict:
    """Every iteration's tables as sorted rows (what the live node holds)."""
    out = {}
    for counters, window in node.windows.items():
        for name, group in (("slice", window.slices), ("tail", window.tails)):
            for table_id, table in group.items():
                keys, counts, vals = table.export()
                order = np.argsort(keys)
                out[(counters, name, table_id)] = (keys[order].tolist(), counts[order].tolist(), vals[order].tolist(),
                                                   table.overflowed)
    return out


def per_iteration(node: LoopWindow) -> dict:
    return {c: (w.next_start, w.fired_until, w.late_records, w.value_dtype) for c, w in node.windows.items()}


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), depth=st.sampled_from([1, 2]),
    window=st.sampled_from([Tumbling(ms=10), Sliding(30, 10)]), kind=st.sampled_from(["sum", "count", "mean", "max"]),
)
def test_restore_equals_the_state_snapshotted(seed, depth, window, kind):
    spec = window_spec(depth, window, kind)
    node = random_state(LoopWindow(spec), np.random.default_rng(seed))
    taken = node.snapshot()
    before = canonical(taken)
    for w in node.windows.values():  # the live tables go on changing: the snapshot holds copies
        for table in [*w.slices.values(), *w.tails.values()]:
            table.merge(np.array([7], np.int64), np.array([1], np.int64), np.array([1], node.value_dtype))
    assert canonical(taken) == before
    node = random_state(LoopWindow(spec), np.random.default_rng(seed))  # as it was at the snapshot
    again = LoopWindow(spec)
    again.restore(through_the_format({"s": taken})["s"])
    assert canonical(again.snapshot()) == before
    assert tables(again) == tables(node) and per_iteration(again) == per_iteration(node)
    assert (again.frontier is None) == (node.frontier is None) and set(again.frontier or ()) == set(node.frontier or ())
    assert again.holds() == node.holds() and again.late_records == node.late_records
    assert again.value_dtype == node.value_dtype and again.state_bytes == node.state_bytes
    for counters, window in again.windows.items():  # each iteration's window emits where the original did
        assert window.counters == counters and window.children is again.children and window.clock is again.clock


@pytest.mark.parametrize("nested", [False, True])
def test_the_tracker_counts_a_restored_windows_capabilities_per_iteration(nested):
    def plan_and_window():
        flow = Dataflow("cap")
        halving(flow.source("src", REC, time="t"), nested=nested).sink(sinks.Collect())
        plan = build_plan(flow)
        (window,) = plan.windows()
        return plan, window

    for seed in range(100):  # the first seeded state holding capabilities at several iterations
        _, original = plan_and_window()
        held = random_state(original, np.random.default_rng(seed)).holds()
        if len({t.counters for t in held}) >= 2:
            break
    assert len({t.counters for t in held}) >= 2
    plan, window = plan_and_window()
    window.restore(original.snapshot())
    progress = PointstampProgress(plan)
    progress.recount()
    at = Location.output(progress.index[id(window)], 0)
    assert {t: progress.tracker.count(at, t) for t in held} == dict.fromkeys(held, 1)
    assert progress.held[progress.index[id(window)]] == held


def test_a_state_of_another_depth_grid_kind_or_operator_is_refused_naming_the_step():
    taken = random_state(LoopWindow(window_spec(1)), np.random.default_rng(1)).snapshot()
    with pytest.raises(SnapshotError, match=r"step 'lw\.win': the state is of a window 1 loops deep, this step runs in 2"):
        LoopWindow(window_spec(2)).restore(taken)
    with pytest.raises(SnapshotError, match=r"step 'lw\.win': the state is of a sum over windows of 10 every 10, this step is a sum over windows of 30 every 10"):
        LoopWindow(window_spec(1, Sliding(30, 10))).restore(taken)
    with pytest.raises(SnapshotError, match=r"step 'lw\.win': the state is of a sum .* this step is a max"):
        LoopWindow(window_spec(1, kind="max")).restore(taken)
    from slashrt.ops.window import WindowAggregate

    outside = WindowAggregate(window_spec(1)).snapshot()
    with pytest.raises(SnapshotError, match=r"step 'lw\.win' is a loop_window operator and cannot restore the state of a window operator"):
        LoopWindow(window_spec(1)).restore(outside)
    refused = LoopWindow(window_spec(1, Sliding(30, 10)))
    assert not refused.windows and refused.frontier is None  # refused before anything changed


@pytest.mark.parametrize("mode", ["abs", "sync"])
def test_a_checkpointed_run_of_windows_in_nested_loops_gives_the_reference(tmp_path, mode):
    """Snapshots taken by barriers or with the world stopped change nothing a run computes."""
    import slashrt
    from slashrt.snapshot import SnapshotStore
    from tests.test_loop_windows import as_rows, input_records, reference_nested

    from tests.snapshot._paced import Paced

    flow, out = Dataflow("cw"), sinks.Collect(transactional=True)
    # each batch 4 ms slower until 3 checkpoints completed: the run cannot end before them
    pace = Paced(seconds=0.004, until=(tmp_path / "cw" / "chk-*" / "_manifest.json", 3))
    halving(flow.source("src", REC, time="t").filter(pace, name="paced"), nested=True).sink(out)
    data = input_records(5, 2000)
    result = slashrt.run(flow, {"src": data}, checkpoint={"interval": 0.002, "mode": mode, "keep": 100},
                         checkpoint_dir=tmp_path, slots=4, slot_size=1024)
    assert as_rows(out.records) == as_rows(np.concatenate(list(reference_nested(data).values())))
    assert sum(c["status"] == "completed" for c in result.checkpoints) >= 2
    store = SnapshotStore(tmp_path, job="cw", keep=100)
    iterations = [len(s.arrays["iterations"]) for n in store.checkpoints() for s in store.load(n).states.values()
                  if s.meta["kind"] == "loop_window"]
    assert max(iterations) >= 2  # some checkpoint held several iterations' windows


async def test_a_restored_loop_windows_iterations_judge_lateness_on_the_clock_it_is_told_later():
    """An SSB window's fragments (a `LoopWindow` outside the plan) are told their clock at their
    first batch, after a restore made their iterations' windows: those judge a batch by its
    time then, as a new iteration's window does (late for the windows ending by its epoch)."""
    from slashrt import Batch
    from tests.snapshot.test_operator_state import Recorder

    flow = Dataflow("lw")
    with flow.loop("l") as loop:
        loop.leave(loop.enter(flow.source("src", SCHEMA, time="t")).window(Sliding(30, 10)).sum(
            "v", key="k", name="win")).sink(sinks.Collect())
    late = Recorder()
    progress = PointstampProgress(build_plan(flow))
    taken = LoopWindow(flow.steps["lw.win"], late)
    taken.clock = progress
    progress.now = Timestamp(0, (0,))
    await taken.push(Batch(np.array([(5, 1, 1)], SCHEMA.dtype)))  # iteration 0's window, before the snapshot
    fragments = LoopWindow(flow.steps["lw.win"], late)
    fragments.restore(through_the_format({"s": taken.snapshot()})["s"])
    fragments.clock = progress  # (`SsbLoopWindow.fold`, at the first batch after the restore)
    progress.now = Timestamp(40, (0,))  # closes the windows ending by 40 of iteration 0
    await fragments.push(Batch(np.array([(6, 1, 1), (25, 1, 1)], SCHEMA.dtype)))
    # 6 in no window after 40, 25 still in the one ending 50 (a tail of its slice, closed at 40)
    assert fragments.late_records == 2 and late.rows()["t"].tolist() == [6, 25]
    assert list(fragments.windows[(0,)].tails) == [(2, 40)]
