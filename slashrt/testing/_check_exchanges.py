"""Conformance of a medium under the cluster runtime: every exchange mode, over rings that the
job must wrap many times.

``await check_exchanges(transport, mode, executors=2)`` runs one job on a cluster whose exchange
channels are rings of `SLOTS` slots of `SLOT_SIZE` bytes, over an input large enough that every
exchange channel (executor i to executor j) carries at least `WRAPS` rings' worth of rows
before the end of its stream, and compares the result with a single-executor run, exactly,
within a deadline. A medium whose bytes stop moving once a ring is full (a drive nobody runs,
credits nobody reads) fails with trio.TooSlowError instead of hanging; a lost or duplicated
row fails the comparison. Modes (`EXCHANGE_MODES`): ``fragments`` and ``direct`` (the SSB, by
its routing) and ``uppar`` (repartitioning by key).

Small rings keep the check fast while the data is still a hundred times what a ring holds; a
test whose data fits in its rings cannot tell a medium that moves bytes only when a stream ends
from one that moves them all the time.
"""

from __future__ import annotations

import time

import numpy as np
import trio

from slashrt._dataflow import Dataflow
from slashrt._runtime import run_async
from slashrt._schema import Schema
from slashrt.ops.sinks import Collect
from slashrt.ops.window import Tumbling
from slashrt.ssb.partitions import Partitioning

__all__ = ["EXCHANGE_MODES", "SLOTS", "SLOT_SIZE", "WRAPS", "check_exchanges", "wrapping_input"]

EXCHANGE_MODES = {
    "fragments": {"mode": "slash", "ssb_routing": "fragments"},
    "direct": {"mode": "slash", "ssb_routing": "direct"},
    "uppar": {"mode": "uppar"},
}
SLOTS, SLOT_SIZE = 4, 4096  # every exchange channel's ring: 16 KiB
WRAPS = 100  # rings' worth of rows each exchange channel carries, at least
PARTITIONS = 16
SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
ROW_BYTES = 24  # the smallest row an exchange carries here: UpPar's (ts, key, value); SSB deltas are 40


def _flow(sink) -> Dataflow:
    f = Dataflow("wrap")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=100)).sum("value", key="key", output="total").sink(sink)
    return f


def wrapping_input(executors: int, *, wraps: int = WRAPS, seed: int = 0) -> np.ndarray:
    """Records of distinct keys (so SSB deltas do not shrink: one row per record), enough for
    every exchange channel among `executors` executors to carry `wraps` rings of UpPar rows."""
    # a channel carries the records of one executor's share owned by one other: ~n / executors**2
    n = int(1.25 * wraps * SLOTS * SLOT_SIZE * executors**2 / ROW_BYTES)
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["ts"] = np.arange(n) // 50
    out["key"] = rng.permutation(n) * 7 - n
    out["value"] = rng.integers(-100, 100, n)
    return out


def _channel_rows(data: np.ndarray, executors: int) -> np.ndarray:
    """rows[i, j]: the rows executor i sends executor j (records of i's share owned by j)."""
    from slashrt.cluster import share

    owner = Partitioning(PARTITIONS, executors).owner_of
    return np.stack([np.bincount(owner(share(data, i, executors)["key"]), minlength=executors) for i in range(executors)])


def _sorted(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort((rows["key"], rows["window_start"]))]


async def check_exchanges(transport: str, mode: str, *, executors=2, deadline: float = 120.0, **options) -> dict:
    """Run the wrapping job in exchange mode `mode` over `transport` on `executors` (a count of
    local processes, or agents' "HOST:PORT" addresses); raise AssertionError if its result is
    not the single-executor one, trio.TooSlowError if it does not finish within `deadline`
    seconds. Returns {"seconds", "rings"}: rings = the fewest rings' worth any channel carried."""
    from slashrt.cluster import run_cluster_async

    n = executors if isinstance(executors, int) else len(executors)
    data = wrapping_input(n)
    rows = _channel_rows(data, n)
    rings = int(rows[~np.eye(n, dtype=bool)].min()) * ROW_BYTES / (SLOTS * SLOT_SIZE)
    assert rings >= WRAPS, f"the input wraps a channel's ring only {rings:.0f} times"
    expected = Collect()
    await run_async(_flow(expected), {"r": data})
    got = Collect()
    started = time.perf_counter()
    with trio.fail_after(deadline):
        await run_cluster_async(
            _flow(got), {"r": data}, executors=executors, transport=transport, partitions=PARTITIONS,
            slot_size=SLOT_SIZE, exchange_slots=SLOTS, **EXCHANGE_MODES[mode], **options,
        )
    seconds = time.perf_counter() - started
    assert got.records is not None and len(got.records) == len(expected.records), (
        f"{mode} over {transport}: {0 if got.records is None else len(got.records)} result rows, "
        f"{len(expected.records)} on one executor"
    )
    np.testing.assert_array_equal(_sorted(got.records), _sorted(expected.records), err_msg=f"{mode} over {transport}")
    return {"seconds": seconds, "rings": rings}
