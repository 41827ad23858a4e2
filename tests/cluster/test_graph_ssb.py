"""The Slash State Backend in graph flows (`slashrt.ssb.graph_window`): a union, with a user
operator in front of it, feeding a keyed tumbling count on several executors in real
processes, over shm and tcp, with rings of four 256-byte slots that every channel wraps many
times. The windows equal one executor's; every executor folds its records into fragments and
ships one partial row per key and window, not a row per record (`RunResult.epochs` names the
window); the same flow routed by key (`mode="uppar"`) ships every record another executor owns.
A checkpoint resumes only in the mode that took it (one sentence otherwise)."""

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, Schema, Tumbling, sinks
from slashrt.errors import SlashError

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
N = 20_000  # per source: ~1,900 slots of 256 bytes through each source's ring of 4
KEYS = 50
RINGS = {"slot_size": 256, "slots": 4}


class Doubled(Operator):
    """A user step in front of the union: every record twice (its state: how many it saw)."""

    stateless = True

    async def on_batch(self, ctx, port, batch):
        rows = batch.to_numpy(SCHEMA.dtype)
        await ctx.emit(np.concatenate([rows, rows]))


def union_count(size: int = 100, sink=None) -> Dataflow:
    flow = Dataflow("uc")
    a = flow.source("a", SCHEMA, time="t")
    b = flow.source("b", SCHEMA, time="t")
    doubled = a.operator(Doubled(), name="doubled", schema=SCHEMA)
    doubled.union(b).window(Tumbling(size)).count(key="k", name="counts").sink(sink or sinks.Collect(), name="out")
    return flow


def inputs(keys=None) -> dict:
    """Each source's N records, 10 a ms, of KEYS keys drawn at random (`keys(rng)`: others)."""
    rng = np.random.default_rng(3)
    out = {}
    for name in "ab":
        data = np.zeros(N, SCHEMA.dtype)
        data["t"] = np.arange(N) // 10
        data["k"] = rng.integers(0, KEYS, N) if keys is None else keys(rng)
        out[name] = data
    return out


def expected(size: int = 100, data: dict | None = None) -> np.ndarray:
    """numpy's count per window of `size` ms and key of `data` (by default `inputs()`)."""
    data = inputs() if data is None else data
    rows = np.concatenate([data["a"], data["a"], data["b"]])
    keys, counts = np.unique(np.stack([rows["t"] // size * size, rows["k"]], axis=1), axis=0, return_counts=True)
    return np.column_stack([keys, counts])


def windows(result) -> np.ndarray:
    out = np.sort(result.outputs["uc.out"], order=["window_start", "k"])
    return np.column_stack([out["window_start"], out["k"], out["count"]])


@pytest.mark.parametrize(("executors", "transport"), [(2, "shm"), (3, "tcp")])
def test_a_union_behind_a_user_step_counts_on_the_state_backend_and_ships_partials_not_records(executors, transport):
    np.testing.assert_array_equal(windows(slashrt.run(union_count(), inputs(), **RINGS)), expected())
    slash = slashrt.run(union_count(), inputs(), executors=executors, transport=transport, mode="slash", **RINGS)
    uppar = slashrt.run(union_count(), inputs(), executors=executors, transport=transport, mode="uppar", **RINGS)
    np.testing.assert_array_equal(windows(slash), expected())
    np.testing.assert_array_equal(windows(uppar), expected())
    assert list(slash.epochs) == ["uc.counts"] and len(slash.epochs["uc.counts"]) == executors
    shipments = [e for per_executor in slash.epochs["uc.counts"] for e in per_executor]
    assert sum(e.records for e in shipments) == 3 * N  # every record folded once, where it was read
    windows_seen = 3 * N // 1000 + 1  # (windows of 100 ms, 10 records a ms per source)
    assert sum(e.keys_touched for e in shipments) <= executors * KEYS * windows_seen  # a row per key and window
    shipped = sum(s.shipped_bytes for s in slash.stats)
    routed = sum(s.shipped_bytes for s in uppar.stats)
    assert 0 < shipped == sum(e.shipped_bytes for e in shipments)
    assert shipped * 10 < routed  # partial states, not records


def test_one_executor_and_a_slash_cluster_report_no_shipment_where_nothing_crosses():
    one = slashrt.run(union_count(), inputs(), executors=1, mode="slash", **RINGS)
    np.testing.assert_array_equal(windows(one), expected())
    assert sum(s.shipped_bytes for s in one.stats) == 0


def test_a_checkpoint_resumes_only_in_the_mode_that_took_it(tmp_path):
    """A window's state is partial states and fragments in mode "slash", the routed records'
    windows in mode "uppar": a resume in the other mode is refused in one sentence."""
    for taken, other in (("uppar", "slash"), ("slash", "uppar")):
        slashrt.run(union_count(), inputs(), executors=2, mode=taken, checkpoint_dir=tmp_path / taken, **RINGS)
        with pytest.raises(SlashError, match=rf"step 'uc.counts': the checkpoint was taken with mode='{taken}', this "
                                             rf"run has mode='{other}': resume it with mode='{taken}'"):
            slashrt.run(union_count(), inputs(), executors=2, mode=other, checkpoint_dir=tmp_path / taken,
                        resume_from="latest", **RINGS)
