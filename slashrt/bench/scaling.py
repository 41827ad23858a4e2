"""The benchmark queries on N executors (`slashrt bench Q --executors N --mode slash|uppar`).

Weak scaling, as in the Slash paper: every executor reads `events` records of its own stream
(generated in its process before the clock starts, each with its own seed, all over the same
event-time range), so N executors process N times the input. Throughput is the total over the
wall time from "start" to the last executor's result. The result is checked against the numpy
reference over the union of all streams. State shipped per epoch (SSB) is reported beside the
input per epoch: it follows the distinct keys an epoch touched, not its input.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np

from slashrt.bench import cm, nexmark, ro, ysb
from slashrt.bench._common import cpu_fields, lazy
from slashrt.cluster import PerExecutor
from slashrt.ops.sinks import Collect

__all__ = ["QUERIES", "bench", "bench_with_result"]


@attrs.frozen
class Query:
    source: str
    generate: object  # (events, *, zipf, seed, **params) -> records
    flow: object  # (sink, **params) -> Dataflow
    reference: object  # (records, **params) -> result rows
    to_result: object
    matches: object = np.array_equal
    seed: int = 0


def _ysb_generate(events, *, zipf, seed, campaigns, disorder_ms=0, **_):
    return ysb.generate(events, campaigns, zipf=zipf, seed=seed, disorder_ms=disorder_ms)


def _ysb_mapping(campaigns, ads):
    """`ads` (an --ads mapping) if given, else the default ten ads per campaign."""
    return ysb.campaign_map(campaigns) if ads is None else ads


def _ysb_flow(sink, *, campaigns, ads=None, disorder_ms=0, **_):
    return ysb.dataflow(_ysb_mapping(campaigns, ads), sink, max_delay=disorder_ms)


def _ysb_reference(records, *, campaigns, ads=None, **_):
    return ysb.reference(records, _ysb_mapping(campaigns, ads))


QUERIES = {
    "ysb": Query("events", _ysb_generate, _ysb_flow, _ysb_reference, ysb.to_result, seed=42),
    "ro": Query(
        "records",
        lambda events, *, zipf, seed, key_range, **_: ro.generate(events, key_range, zipf=zipf, seed=seed),
        lambda sink, *, window_ms, **_: ro.dataflow(sink, window_ms=window_ms),
        lambda records, *, window_ms, **_: ro.reference(records, window_ms),
        ro.to_result,
        seed=7,
    ),
    "cm": Query(
        "usage",
        lambda events, *, zipf, seed, jobs, **_: cm.generate(events, jobs, zipf=zipf, seed=seed),
        lambda sink, **_: cm.dataflow(sink),
        lambda records, **_: cm.reference(records),
        cm.to_result,
        cm.matches,
        seed=11,
    ),
    "nexmark": Query(
        "bids",
        lambda events, *, zipf, seed, **_: nexmark.generate(events, zipf=zipf, seed=seed),
        lambda sink, **_: nexmark.dataflow(sink),
        lambda records, **_: nexmark.reference(records),
        nexmark.to_result,
        seed=13,
    ),
}


def _make(query: str, events: int, zipf: float, params: dict, index: int, executors: int) -> np.ndarray:
    q = QUERIES[query]
    return q.generate(events, zipf=zipf, seed=q.seed + 1000 * index, **params)


def _epoch_fields(result) -> dict:
    epochs = [e for per_executor in result.epochs.values() for ex in per_executor for e in ex if e.input_bytes]
    if not epochs:
        return {"epochs": 0}
    shipped = np.array([e.shipped_bytes for e in epochs], np.float64)
    return {
        "epochs": len(epochs),
        "input_bytes_per_epoch": round(float(np.mean([e.input_bytes for e in epochs])), 1),
        "keys_touched_per_epoch": round(float(np.mean([e.keys_touched for e in epochs])), 1),
        "state_bytes_shipped_per_epoch": round(float(shipped.mean()), 1),
        "state_bytes_shipped_per_epoch_max": int(shipped.max()),
        "state_bytes_shipped": int(shipped.sum()),
        "direct_epochs": sum(e.direct for e in epochs),
        "ship_queue_peak_bytes": max(e.queued_peak for e in epochs),
    }


def bench(query: str, **kwargs) -> dict:
    """Run `query` on N executors (see `bench_with_result`) and return its report."""
    return bench_with_result(query, **kwargs)[0]


def bench_with_result(
    query: str,
    *,
    events: int,
    executors: int,
    mode: str = "slash",
    transport: str = "shm",
    zipf: float = 0.0,
    repeat: int = 1,
    epoch_bytes: int | None = None,
    partitions: int | None = None,
    ssb_routing: str | None = None,
    channel_budget: int | None = None,
    params: dict | None = None,
    records: np.ndarray | None = None,
    **options,
) -> dict:
    """Run `query` on `executors` executors, `events` records each; best of `repeat` checked runs.
    Given `records` (a file's input), the executors share them out instead of generating
    (`events` is then ignored). Returns the report and the last run's result rows."""
    import slashrt

    q = QUERIES[query]
    params = dict(params or {})
    if records is not None:
        source = records  # the coordinator splits it into disjoint streams, one per executor
        events = -(-len(records) // executors)
        expected = lazy(lambda: q.reference(records, **params))
    else:
        source = make = PerExecutor(functools.partial(_make, query, events, zipf, params))
        expected = lazy(lambda: q.reference(np.concatenate([make.make(i, executors) for i in range(executors)]), **params))
    extra = {
        k: v
        for k, v in (("epoch_bytes", epoch_bytes), ("partitions", partitions), ("ssb_routing", ssb_routing),
                     ("channel_budget", channel_budget))
        if v is not None
    }
    best, correct, got, startup = None, True, None, []
    for _ in range(repeat):
        sink = Collect()
        result = slashrt.run(
            q.flow(sink, **params), {q.source: source}, executors=executors, mode=mode, transport=transport, **extra, **options
        )
        got = q.to_result(sink.records)
        startup.append(result.startup_s)
        correct = correct and bool(q.matches(got, expected()))
        if best is None or result.seconds < best.seconds:
            best = result
    total = events * executors if records is None else len(records)
    report = {
        "query": query,
        "events": total,
        "events_per_executor": events,
        "executors": executors,
        "mode": mode,
        "transport": transport,
        "zipf": zipf,
        "seconds": round(best.seconds, 6),
        "records_per_s": round(total / best.seconds, 1),
        **cpu_fields(total, best),
        "correct": correct,
        "result_rows": len(got),
        "late_records": sum(best.late_records.values()),
        # from the call until every executor processes: the slowest run's (None: one executor, in this process)
        "startup_s": None if None in startup else round(max(startup), 3),
        # the most bytes of rings one executor's channels held (`channel_budget`)
        "channel_bytes_per_executor": best.channel_bytes_per_executor,
        # the most floating slots one executor's pools lent at once (`transport._pool`)
        "floating_peak": max((s.floating_peak for s in best.stats), default=0),
        **_epoch_fields(best),
        **{k: v for k, v in params.items() if np.isscalar(v)},  # not an --ads array
        **extra,
        "repeat": repeat,
    }
    return report, got
