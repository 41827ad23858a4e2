"""What checkpoints cost a run: throughput without checkpoints, with barrier snapshots (ABS) and
with the stop-the-world baseline (mode "sync": every executor's sources halt at each checkpoint
until it is written and committed), on the same records; each run checked against the query's
numpy reference.

    slashrt bench checkpoint [--query ysb|nexmark] [--interval S] [--events N] [--executors N] [--json]
    slashrt bench checkpoint --slow-step-ms MS [--slow-after source|exchange|graph] [--alignment-timeout S|auto|none]
                             [--interval S] [--json]
        (the cadence under backpressure instead: `slashrt.bench.checkpoint_cadence`)

On a cluster each executor makes its events chunk by chunk as the run goes (`long_stream`), so
`--events` may be 1e9 or more (runs of many checkpoint intervals) in bounded memory; so does one
executor past `GENERATED_MAX` events. Without `--events` the run is sized from the interval
(`default_events`: `PERIODS` intervals at `RATE` events a second per executor), so that it takes
several periodic checkpoints; a run that completed fewer than `MIN_PERIODIC` says so in `warning`
(ABS/none then measures little but the final checkpoint).

Reports records_per_s_none / _abs / _sync (the best of `repeat` runs each, the modes taking turns) and seconds_none /
_abs / _sync (that run's length), their ratios, checkpoints_abs / _sync (the periodic checkpoints that run completed;
max_sync_s_* over the last 100 of them), the mean bytes a periodic checkpoint wrote (`snapshot_bytes`) against the mean bytes of the operator
state it holds (`state_bytes`: its arrays in memory; no records in flight), checkpoints taken, and `correct`.
"""

from __future__ import annotations

import statistics
import tempfile

import numpy as np
import structlog

import slashrt
from slashrt.bench import long_stream
from slashrt.bench._common import best_interleaved
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore

__all__ = ["bench"]

MODES = ("none", "abs", "sync")
KEEP = 10_000  # every checkpoint of the measured run stays, to read its state's size
PERIODS = 10  # checkpoint intervals a default run lasts at RATE
RATE = 30_000_000  # events a second one executor runs YSB at here, chunked (quiet 2-core machine: 23-48 M/s)
MIN_PERIODIC = 3  # periodic checkpoints a measured ABS run needs to say what they cost
GENERATED_MAX = 20_000_000  # one executor's events generated whole before the run; more are made chunk by chunk


def default_events(interval: float, executors: int = 1) -> int:
    """Events of a run lasting about `PERIODS` checkpoint intervals (at least 5 M)."""
    return max(5_000_000, int(PERIODS * interval * RATE * executors))


def _query(query: str, events: int, executors: int, campaigns: int = 1000, chunked: bool = True):
    """(records by source, flow builder for a sink, result of collected records, reference). On
    a cluster, each executor makes its share chunk by chunk while the run goes
    (`slashrt.bench.long_stream`: nothing shipped, memory bounded whatever `events`), and the
    reference is computed from the chunks' bases, exactly; or, not `chunked`, each executor
    draws random chunks (`long_stream.RandomStream`: keys and campaigns vary more than tiled
    chunks', and a resume seeks to its checkpoint's chunk instead of making the input again)."""
    if executors > 1 or events > GENERATED_MAX:
        import functools

        from slashrt.bench.scaling import QUERIES
        from slashrt.cluster import PerExecutor

        q, params = QUERIES[query], {"campaigns": campaigns} if query == "ysb" else {}
        each = -(-events // executors)
        if not chunked:
            make = PerExecutor(functools.partial(long_stream.make_random, query, each, params), deterministic=True)
            records = lambda: np.concatenate([c for i in range(executors) for c in make.make(i, executors)])  # noqa: E731
            return ({q.source: make}, functools.partial(q.flow, **params), q.to_result,
                    lambda: q.reference(records(), **params))
        make = PerExecutor(functools.partial(long_stream.make, query, each, params), deterministic=True)
        return ({q.source: make}, functools.partial(q.flow, **params), q.to_result,
                lambda: long_stream.reference(query, each, executors, params))
    if query == "ysb":
        from slashrt.bench import ysb

        records, mapping = ysb.generate(events), ysb.campaign_map(1000)
        return {"events": records}, lambda sink: ysb.dataflow(mapping, sink), ysb.to_result, lambda: ysb.reference(records, mapping)
    from slashrt.bench import nexmark

    records = nexmark.generate(events)
    return {"bids": records}, nexmark.dataflow, nexmark.to_result, lambda: nexmark.reference(records)


def _run(mode: str, inputs, make_flow, interval: float, directory: str, options: dict):
    sink = Collect(transactional=mode != "none")
    flow = make_flow(sink)
    checkpoints = {} if mode == "none" else {
        "checkpoint": {"interval": interval, "mode": mode, "keep": KEEP}, "checkpoint_dir": directory,
    }
    result = slashrt.run(flow, inputs, **options, **checkpoints)
    return result, sink.records, flow.name


def bench(
    *, query: str = "ysb", events: int | None = None, interval: float = 1.0, repeat: int = 3, executors: int = 1,
    slow_step_ms: float | None = None, alignment_timeout="auto", slow_after: str = "source", **options
) -> dict:
    if slow_step_ms is not None:  # the cadence under backpressure instead (`checkpoint_cadence`)
        from slashrt.bench import checkpoint_cadence

        return checkpoint_cadence.bench(slow_step_ms=slow_step_ms, interval=interval, events=events, query=query,
                                        executors=executors, alignment_timeout=alignment_timeout,
                                        slow_after=slow_after, **options)
    if events is None:
        events = default_events(interval, executors)
    inputs, make_flow, to_result, reference = _query(query, events, executors)
    expected = reference()
    chunked = executors > 1 or events > GENERATED_MAX
    n = -(-events // executors) * executors if chunked else sum(len(r) for r in inputs.values())
    fields: dict = {"query": query, "events": n, "interval_s": interval, "executors": executors}
    if executors > 1:
        options["executors"] = executors
    if chunked:
        fields["chunk_records"] = long_stream.CHUNK
    correct = True
    with tempfile.TemporaryDirectory(prefix="slashrt-checkpoint-") as directory:
        where: dict = {}  # run -> (its checkpoint directory, job name)

        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}  # every run's, round by round

        def run_once(mode: str):
            nonlocal correct
            run_dir = f"{directory}/{mode}-{len(where)}"  # each run its own: the best one's checkpoints are read
            result, records, job = _run(mode, inputs, make_flow, interval, run_dir, options)
            correct &= bool(np.array_equal(to_result(records), expected))
            where[id(result)] = run_dir, job
            seconds[mode].append(result.seconds)
            return result

        # the modes take turns, so the machine's load weighs on each alike
        runs = best_interleaved(repeat, run_once, MODES)
        for mode, best in runs.items():
            fields[f"records_per_s_{mode}"] = round(n / best.seconds)
            fields[f"seconds_{mode}"] = round(best.seconds, 3)
            periodic = [c for c in best.checkpoints if c["status"] == "completed" and not c["savepoint"]]
            if mode != "none":
                # the run's report keeps the last 100 checkpoints; the store keeps every one (KEEP)
                run_dir, job = where[id(best)]
                store = SnapshotStore(run_dir, job=job, keep=KEEP)
                fields[f"checkpoints_{mode}"] = len(store.checkpoints()) - 1  # (the final one is not periodic)
                fields[f"max_sync_s_{mode}"] = max((c["max_sync_s"] for c in periodic), default=0.0)
            if mode == "abs":
                fields["snapshot_bytes"] = round(statistics.mean(c["bytes"] for c in periodic)) if periodic else 0
                fields["max_alignment_s"] = max((c["max_alignment_s"] for c in periodic), default=0.0)
                fields["max_async_s"] = max((c["max_async_s"] for c in periodic), default=0.0)
                state = [sum(a.nbytes for s in store.load(c["checkpoint"]).states.values() for a in s.arrays.values())
                         for c in periodic]
                fields["state_bytes"] = round(statistics.mean(state)) if state else 0
    fields["abs_over_none"] = round(fields["records_per_s_abs"] / fields["records_per_s_none"], 3)
    fields["sync_over_none"] = round(fields["records_per_s_sync"] / fields["records_per_s_none"], 3)
    # the same ratios round by round (each mode's run next to the others'), and their median: on
    # a machine whose speed drifts between runs, steadier than the ratio of two best runs
    for mode in ("abs", "sync"):
        rounds = [round(none / other, 3) for none, other in zip(seconds["none"], seconds[mode])]
        fields[f"{mode}_over_none_rounds"] = rounds
        fields[f"{mode}_over_none_median"] = round(statistics.median(rounds), 3)
    fields["correct"] = correct
    if fields["checkpoints_abs"] < MIN_PERIODIC:
        fields["warning"] = (
            f"the ABS run completed {fields['checkpoints_abs']} periodic checkpoints (of one every {interval:g} s in "
            f"{fields['seconds_abs']:g} s): abs_over_none measures little; give --events more than {n:,}"
        )
        structlog.get_logger("slashrt.bench").warning("bench checkpoint: too short", reason=fields["warning"])
    return fields
