"""Each executor's channel memory within `channel_budget` whatever the executor count
(`slashrt.cluster._ring_budget`): the exchanges' slots shrink as peers are added, never below
their least (over shm and tcp a slot pool per exchange: half exclusive, the rest floating, so a
busy channel still borrows up to a full ring), a budget too small is refused in one sentence
before anything starts, and a run on small rings (data many times their size) is exact, each
executor holding what the budget says and lending floating slots to its backlogged channels,
over shm and tcp, in both modes, on one executor and several; `bench ysb --channel-budget`."""

import json

import attrs
import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.cli import main
from slashrt.cluster._progress import PROGRESS_RING
from slashrt.cluster._ring_budget import (
    DEFAULT_CHANNEL_BUDGET, EXCHANGE_SLOTS, MIN_EXCHANGE_SLOTS, ExchangeSlots, exchange_slots, ring_ends,
)
from slashrt.errors import OptionError
from slashrt.ops.sinks import Collect

from tests.test_cli_options import one_error_line

SCHEMA = Schema({"t": "i8", "k": "i8"})
SLOT = 4096
SOURCE_SLOTS = 8


def held(executors: int, exchanges: int, slots: int, transport: str, slot: int = SLOT) -> int:
    """The bytes of rings an executor of one source holds (what the agents count from their channel ends)."""
    peers, ends = executors - 1, ring_ends(transport)
    return SOURCE_SLOTS * slot + peers * ends * (PROGRESS_RING.ring_bytes + exchanges * slots * slot)


@pytest.mark.parametrize("transport", ["shm", "tcp", "verbs"])
def test_exchange_slots_shrink_as_executors_are_added_and_stay_within_the_budget(transport):
    slot, sizes = 16384, (2, 16, 64, 128, 256)
    shapes = [exchange_slots(DEFAULT_CHANNEL_BUDGET, executors=n, exchanges=2, source_bytes=SOURCE_SLOTS * slot,
                             slot_size=slot, transport=transport) for n in sizes]
    exclusive = [s.exclusive for s in shapes]
    assert exclusive == sorted(exclusive, reverse=True) and min(exclusive) >= MIN_EXCHANGE_SLOTS
    for n, shape in zip(sizes, shapes):
        peers, ends = n - 1, ring_ends(transport)
        fixed = SOURCE_SLOTS * slot + peers * ends * PROGRESS_RING.ring_bytes
        assert fixed + shape.bytes(peers=peers, exchanges=2, ends=ends, slot_size=slot) <= DEFAULT_CHANNEL_BUDGET
        assert shape.exclusive + shape.max_lent <= EXCHANGE_SLOTS and shape.max_lent <= shape.floating
    # a pool: half a ring's exclusive, and a backlogged channel borrows up to a ring's worth
    assert exclusive[-1] < EXCHANGE_SLOTS // 2
    assert shapes[0] == ExchangeSlots(EXCHANGE_SLOTS // 2, EXCHANGE_SLOTS // 2, EXCHANGE_SLOTS // 2)
    assert all(s.floating > 0 and s.exclusive + s.max_lent == EXCHANGE_SLOTS for s in shapes)
    # where the budget is short, the pool has fewer floating slots than all channels could borrow
    assert shapes[-1].floating < (sizes[-1] - 1) * shapes[-1].max_lent
    # and it takes what the exclusive slots leave: one slot more for every channel would not fit
    peers, ends = sizes[-1] - 1, ring_ends(transport)
    fixed = SOURCE_SLOTS * slot + peers * ends * PROGRESS_RING.ring_bytes
    more = attrs.evolve(shapes[-1], floating=shapes[-1].floating + peers)
    assert fixed + more.bytes(peers=peers, exchanges=2, ends=ends, slot_size=slot) > DEFAULT_CHANNEL_BUDGET


def test_a_budget_below_the_least_rings_is_refused_in_one_sentence():
    with pytest.raises(OptionError) as caught:
        exchange_slots(1 << 20, executors=300, exchanges=1, source_bytes=0, slot_size=SLOT, transport="tcp")
    text = str(caught.value)
    assert text.startswith("channel_budget=1048576 bytes cannot hold an executor's rings on 300 executors over tcp")
    assert f"{MIN_EXCHANGE_SLOTS} slots of {SLOT} bytes" in text and "\n" not in text
    with pytest.raises(OptionError, match="its sources' rings"):  # the sources alone do not fit
        exchange_slots(1000, executors=1, exchanges=0, source_bytes=4096, slot_size=SLOT, transport="shm")


def counting():
    out = Collect()
    flow = Dataflow("budget")
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=10)).count(key="k", name="counts").sink(out, name="out")
    return flow, out


def keyed_records(n: int) -> np.ndarray:
    """n records of 20,000 keys, 200 a millisecond."""
    records = np.zeros(n, SCHEMA.dtype)
    records["t"] = np.arange(n) // 200
    records["k"] = np.random.default_rng(5).integers(0, 20_000, n)
    return records


def budget_for(executors: int, slots: int, transport: str) -> int:
    """A budget with room for `slots` slots in every exchange ring of `counting`, not one more."""
    return held(executors, 1, slots, transport) + SLOT // 2


def assert_counted(out: Collect, records: np.ndarray) -> None:
    """`counting`'s rows are numpy's counts per 10 ms window and key of `records`."""
    expected, counts = np.unique(np.column_stack([records["t"] // 10, records["k"]]), axis=0, return_counts=True)
    rows = out.records[np.lexsort((out.records["k"], out.records["window_start"]))]
    assert np.array_equal(rows["window_start"] // 10, expected[:, 0]) and np.array_equal(rows["k"], expected[:, 1])
    assert np.array_equal(rows["count"], counts)


@pytest.mark.parametrize(("executors", "transport", "mode"), [(3, "shm", "uppar"), (3, "tcp", "slash"), (2, "tcp", "uppar"),
                                                                (1, "shm", "uppar")])
def test_a_run_on_rings_the_budget_shrank_is_exact_and_holds_what_the_budget_says(executors, transport, mode):
    # 4.8 MB of records per executor: hundreds of times an exchange ring of 5 slots of 4 KiB
    records, slots = keyed_records(300_000 * executors), 5
    budget = budget_for(executors, slots, transport)
    flow, out = counting()
    result = slashrt.run(flow, {"a": records}, executors=executors, transport=transport, mode=mode, slot_size=SLOT,
                         slots=SOURCE_SLOTS, channel_budget=budget)
    assert_counted(out, records)
    assert [s.channel_bytes for s in result.stats] == [held(executors, 1, slots, transport)] * executors
    assert result.channel_bytes_per_executor <= budget
    if executors > 1:  # the rows shipped were many times the rings they went through
        assert min(s.shipped_bytes for s in result.stats) > 20 * (executors - 1) * slots * SLOT
        # 4 exclusive slots a channel, and the fifth of each as a floating one, lent where a backlog was
        assert max(s.floating_peak for s in result.stats) > 0


def test_a_budget_on_one_executor_in_this_process_is_refused():
    flow, _ = counting()
    with pytest.raises(slashrt.DataflowError, match="channel_budget= is an option of multi-executor runs"):
        slashrt.run(flow, {"a": np.zeros(10, SCHEMA.dtype)}, channel_budget=1 << 20)


@pytest.mark.parametrize("executors", ["1", "3"])
def test_bench_ysb_channel_budget_bounds_what_each_executor_holds(capsys, executors):
    budget = 3 << 20
    assert main(["bench", "ysb", "--events", "200000", "--campaigns", "10", "--executors", executors, "--slot-size",
                 "16384", "--channel-budget", str(budget), "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["channel_budget"] == budget
    assert 0 < result["channel_bytes_per_executor"] <= budget


def test_bench_ysb_refuses_a_channel_budget_too_small_in_one_line(capsys):
    assert main(["bench", "ysb", "--events", "1000", "--executors", "3", "--channel-budget", "1000", "--json"]) == 2
    captured = capsys.readouterr()
    assert one_error_line(captured.err).startswith("slashrt: error: channel_budget=1000 bytes cannot hold")
    assert captured.out == ""
