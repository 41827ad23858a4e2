"""Running a dataflow on one executor: channels from in-memory sources into the trio executor.

`run_async` runs one inside an existing trio run (for tests with pytest-trio and for users
composing slashrt with other trio code); `slashrt.run`, the blocking entry point that runs a
flow on one executor or on a cluster, is `slashrt._run`, above this module and the cluster's.
"""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import structlog
import trio

from slashrt import _kernels as kernels
from slashrt._buffer import DEFAULT_SLOT_SIZE, DEFAULT_SLOTS
from slashrt._dataflow import Dataflow
from slashrt._frontier_report import ReportFile
from slashrt._inputs import Ingest, PerExecutor
from slashrt._latency import LatencyHistogram, measuring_sinks
from slashrt._plan import build_plan, per_source
from slashrt.errors import DataflowError, SlashError, unwrap_groups
from slashrt.ops.event_time import Share
from slashrt.ops.sources import feed_array, validate_input
from slashrt.scheduler import Executor, ExecutorStats, Input
from slashrt.scheduler._pointstamp import PointstampProgress
from slashrt.transport import Receiver, RingSpec, open_inproc_channel

if TYPE_CHECKING:
    from slashrt.snapshot.coordinator import CheckpointConfig
    from slashrt.snapshot.stop import StopHandle

__all__ = ["run_async", "run_receivers", "execute", "RunResult", "ChannelFailed"]

log = structlog.get_logger("slashrt.run")


class ChannelFailed(SlashError):
    """Input channels were closed after bad input; the rest of the dataflow finished.

    `result` holds what the healthy channels produced.
    """

    def __init__(self, failed: dict[str, BaseException], result: RunResult):
        lines = "; ".join(f"{name}: {err}" for name, err in failed.items())
        super().__init__(f"{len(failed)} input channel(s) failed: {lines}")
        self.failed = failed
        self.result = result


class _CollectedOutputs(collections.abc.Mapping):
    """Collect sink step id -> its records, joined into one array when first asked for (the
    join of a large result is the caller's cost, not the run's)."""

    def __init__(self, sinks: dict):
        self._sinks = sinks

    def __getitem__(self, step_id: str):
        return self._sinks[step_id].records

    def __iter__(self):
        return iter(self._sinks)

    def __len__(self) -> int:
        return len(self._sinks)

    def __reduce__(self):  # pickles (to a coordinator) as the plain dict of arrays
        return (dict, (dict(self),))

    def __repr__(self) -> str:
        return f"outputs({sorted(self._sinks)})"


@attrs.define
class RunResult:
    seconds: float
    stats: list[ExecutorStats]
    late_records: dict[str, int]  # window step id -> records that arrived after their window fired
    outputs: collections.abc.Mapping  # Collect sink step id -> collected records (see Collect.records)
    # multi-executor runs: SSB window step id -> per executor, the EpochStats of each epoch
    epochs: dict[str, list] = attrs.field(factory=dict)
    # every step input ("step.in0") -> its frontier at the end (Timestamps)
    frontiers: dict[str, list] = attrs.field(factory=dict)
    # checkpoint_dir= given: per checkpoint its status, seconds, bytes, alignment / sync / async seconds
    checkpoints: list[dict] = attrs.field(factory=list)
    # checkpoint_dir= given: the checkpoint the run resumed from, and the savepoint it stopped with (stop=)
    resumed_from: int | None = None
    savepoint: int | None = None
    # multi-executor runs with restart=: per recovery its cause (the failure's sentence), the
    # executors it restarted (`restarted`: all, or a region of its own where executors exchange
    # nothing), the seconds from the failure to processing again, of them restore_s (agents
    # reading the state back), and the checkpoint resumed from
    recoveries: list[dict] = attrs.field(factory=list)
    # multi-executor runs: seconds from the call until every executor was told to process (spawning,
    # handshakes, jobs delivered, channels connected, inputs opened); of the first attempt
    startup_s: float | None = None
    # sinks fed only from `Paced` sources: sink step id -> its rows' latency (`slashrt._latency`:
    # p50_ms, p99_ms, max_ms, mean_ms, rows, quantile(q); every executor's rows)
    latency: dict[str, LatencyHistogram] = attrs.field(factory=dict)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.stats)

    @property
    def channel_bytes_per_executor(self) -> int:
        """Multi-executor runs: the most bytes of rings one executor's channels held."""
        return max((s.channel_bytes for s in self.stats), default=0)

    def __getitem__(self, sink_step_id: str) -> np.ndarray | None:
        return self.outputs[sink_step_id]


async def _report_records(executor: Executor, on_records) -> None:
    while True:
        await trio.sleep(0.1)
        on_records(executor.stats.records)


async def _report_progress(progress, on_report, every: float) -> None:
    """`on_report(progress.report())` every `every` seconds (a `PointstampProgress`'s)."""
    while True:
        await trio.sleep(every)
        on_report(progress.report())


async def run_async(
    flow: Dataflow,
    inputs: Mapping[str, Any],
    *,
    slot_size: int = DEFAULT_SLOT_SIZE,
    slots: int = DEFAULT_SLOTS,
    watermark_every: int | None = None,
    yield_every: int = Executor.YIELD_EVERY,
    coalesce: int = Executor.COALESCE,
    on_records: Callable[[int], None] | None = None,
    on_report: Callable[[dict], None] | str | os.PathLike | None = None,
    report_every: float = 0.5,
    checkpoint: float | str | dict | CheckpointConfig | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume_from: int | str | None = None,
    stop: StopHandle | None = None,
) -> RunResult:
    """Run `flow` inside the current trio run; see `run`.

    Tuning: `slot_size` and `slots` shape each channel's ring; sources send a watermark every
    `watermark_every` buffers (default `slots - 1`, so data and watermark fill the ring exactly
    and runs of buffers stay aligned with it); the executor yields to its pollers every `yield_every` pipeline
    calls and hands up to `coalesce` consecutive full buffers to a pipeline at once.
    `on_records`, if given, is called now and then with the number of records processed.

    Checkpoints (`slashrt.snapshot.runtime`, docs/guide.md "Fault tolerance"): with a
    `checkpoint_dir` (a directory or fsspec URL), barrier snapshots every `checkpoint` interval
    (seconds, a string like '500ms', a dict of `CheckpointConfig` options or one; None: only the
    final checkpoint); `resume_from` ("latest" or a checkpoint number) restores one first.
    `stop` (a `slashrt.StopHandle`): its `request()` stops the run with a final savepoint; the
    run returns then, with `savepoint` set, and a resume from it continues where it stopped.
    """
    plan = build_plan(flow)
    log.debug("kernels selected", **kernels.SELECTED)
    checkpoints = _checkpointing(flow, plan, inputs, checkpoint, checkpoint_dir, resume_from, stop)
    if checkpoints is not None and checkpoints.shares:  # a rescaled resume: what is left of each array
        inputs = {**inputs, **{name: parts[0] for name, parts in checkpoints.shares.items()}}
    executor_inputs, sources = local_inputs(
        plan, inputs, slot_size=slot_size, slots=slots, watermark_every=watermark_every, checkpoints=checkpoints
    )
    return await execute(
        flow, plan, executor_inputs, start=sources, yield_every=yield_every, coalesce=coalesce,
        on_records=on_records, on_report=on_report, report_every=report_every, checkpoints=checkpoints,
    )


def _checkpointing(flow: Dataflow, plan, inputs: dict, checkpoint, checkpoint_dir, resume_from, stop=None):
    """The run's `Checkpointing`, or None without a `checkpoint_dir`; refuses, in one sentence,
    what cannot be checkpointed (a source that cannot rewind, a user operator whose state it
    cannot take)."""
    from slashrt.snapshot import SnapshotStore, runtime
    from slashrt.snapshot.stop import check_checkpoint_options

    from slashrt.snapshot.published import check_run

    check_checkpoint_options(checkpoint_dir, checkpoint, resume_from, stop)
    if checkpoint_dir is None:
        check_run(plan, None, None, None)  # a transactional sink needs checkpoints
        return None
    config, keep = runtime.checkpoint_config(checkpoint)
    config = runtime.aligned_for_moved_positions(config, plan, inputs)
    refuse_uncheckpointable(flow, plan, inputs)
    store = SnapshotStore(checkpoint_dir, job=flow.name, keep=keep)
    restored = runtime.load_restored(store, resume_from, executor=None)  # (one executor's: its parts are all)
    first = check_run(plan, store, resume_from, restored)  # nothing published is published again
    checkpoints = runtime.Checkpointing(plan, config, store, restored, stop=stop, first=first)
    checkpoints.shares = {}
    if restored is not None:
        from slashrt.snapshot.rescale import graph_in_flight, reassigned, rescale, resumed_inputs
        from slashrt.ssb.partitions import DEFAULT_PARTITIONS

        if restored.meta.get("executors", 1) != 1:  # taken on several: reassigned to one
            checkpoints.shares, checkpoints.reshared = rescale(flow, plan, plan, inputs, restored, 1)
            checkpoints.rescaled = reassigned(restored, plan, 0, 1, DEFAULT_PARTITIONS)
            checkpoints.adopted = graph_in_flight(restored, plan, 0, 1, DEFAULT_PARTITIONS)
        else:  # a rescaled run's checkpoint: the same shares again
            checkpoints.shares, checkpoints.reshared = resumed_inputs(plan, inputs, restored.meta.get("reshared", []), 1)
    for step_id in plan.sources:  # a checkpoint of another dataflow: refused before any sink opens
        checkpoints.position(step_id)
    return checkpoints


def refuse_uncheckpointable(flow: Dataflow, plan, inputs: dict) -> None:
    """Refuse, in one sentence, a flow whose state checkpoints cannot take (a user operator that
    keeps state and declares none) or a source that cannot rewind to a checkpoint."""
    from slashrt.ops.operator import undeclared_state

    for step_id, spec in flow.steps.items():
        why = undeclared_state(spec.op) if type(spec).__name__ == "OperatorSpec" else None
        if why is not None:
            raise DataflowError(
                f"run(): checkpoints cannot take the state of step {step_id!r}: operator {type(spec.op).__name__} {why}"
            )
    check_rewindable(plan, inputs)


CHECKPOINT_OPTIONS = ("checkpoint", "checkpoint_dir", "resume_from", "stop")


def check_rewindable(plan, inputs: dict, options: dict | None = None) -> None:
    """Refuse, in one sentence naming it, a source whose input cannot rewind to a checkpoint's
    position: a checkpointed run needs every source to (docs/guide.md "Fault tolerance").
    Given a run's `options`, only when they ask for checkpoints. `plan` may be the Dataflow to
    build it from, then."""
    if options is not None and all(options.get(name) is None for name in CHECKPOINT_OPTIONS):
        return
    if isinstance(plan, Dataflow):
        plan = build_plan(plan)
    for step_id, _spec, value in per_source(plan, inputs, "input"):
        if isinstance(value, (np.ndarray, Share)) or getattr(value, "rewinds", False):
            continue  # arrays, and connectors that record their position (slashrt.connectors)
        if isinstance(value, PerExecutor):
            if value.deterministic:
                continue  # made again on resume, fed from the checkpoint's position on
            kind = type(value).__name__  # a PerExecutor or a Paced
            why = (f"a {kind} function not declared deterministic, which cannot rewind to a checkpoint: declare "
                   f"{kind}(make, ..., deterministic=True) if make returns the same records on every call")
        elif isinstance(value, (Ingest, Receiver)):
            why = (f"a channel ({type(value).__name__}), which cannot rewind to a checkpoint: its producer (Spark "
                   "ingestion, say) does not replay what it sent before one, as ingestion is exactly once within a "
                   "run, not across a resume")
        else:
            why = (f"{type(value).__name__}, which cannot rewind to a checkpoint (arrays, deterministic PerExecutor "
                   "functions, FileSource and RedisStream can)")
        raise DataflowError(f"run(): source {step_id!r} reads from {why}; or run it without checkpoint_dir=")


def local_inputs(
    plan, inputs: dict[str, np.ndarray], *, slot_size: int, slots: int, watermark_every: int | None, checkpoints=None
):
    """Executor inputs fed from in-memory arrays: an in-process channel per source, and a
    `start(nursery)` that starts a task streaming each array into its channel. A source whose
    input is already a channel `Receiver` (an ingest endpoint's, say) reads from it directly;
    one whose input has an async `feed(sender, spec, *, watermark_every, resume, barriers)` (a
    connector, see `slashrt.connectors`) gets the channel and fills it itself; a `PerExecutor`
    function makes its array here (or its chunks, fed as the run goes: `slashrt.ops.chunks`). With `checkpoints`, every source resumes from its
    checkpointed position and carries the checkpoints' barriers."""
    feeds = []
    executor_inputs = []
    paced = set()
    for step_id, spec, records in per_source(plan, inputs, "input"):
        if isinstance(records, Receiver):
            plan.roots[step_id].follow_channel()  # its producer sends the watermark
            executor_inputs.append(Input(step_id, records, plan.roots[step_id], spec.schema.dtype))
            continue
        if isinstance(records, PerExecutor):  # one executor: it makes the whole stream (a resume: again)
            records = records.open(step_id, 0, 1)
        if getattr(records, "paced", False):
            paced.add(step_id)
        if isinstance(records, Share):  # an executor's share of an array: it keeps the input's order
            plan.roots[step_id].carry(records)
            records = records.records
        if not callable(getattr(records, "feed", None)):  # else a connector: it fills its channel
            records = validate_input(step_id, spec.schema, records)
        ring = RingSpec(slots=slots, slot_size=slot_size, record_size=spec.schema.record_size)
        sender, receiver = open_inproc_channel(ring)
        feeds.append((sender, records, spec))
        executor_inputs.append(Input(step_id, receiver, plan.roots[step_id], spec.schema.dtype))

    if watermark_every is None:
        watermark_every = max(1, slots - 1)
    measured = measuring_sinks(plan.flow, paced)
    for node in plan.sinks:
        if node.step_id in measured:
            node.measure_latency(plan.flow.steps[node.step_id].time, measured[node.step_id])

    async def sources(nursery) -> None:
        for sender, records, spec in feeds:
            rewind = {} if checkpoints is None else {  # a source's position per checkpoint, and where it resumes
                "resume": checkpoints.position(spec.step_id), "barriers": checkpoints.sources[spec.step_id]
            }
            if isinstance(records, np.ndarray):
                feed = functools.partial(feed_array, sender, records, time=spec.time, max_delay=spec.max_delay,
                                         watermark_every=watermark_every, **rewind)
            else:
                feed = functools.partial(records.feed, sender, spec, watermark_every=watermark_every, **rewind)
            nursery.start_soon(feed, name=f"source:{spec.step_id}")

    return executor_inputs, sources


async def run_receivers(flow: Dataflow, receivers: dict, **options) -> RunResult:
    """Run `flow` on one executor whose sources are already-connected channel receivers
    (source name -> Receiver), e.g. channels from producers in other processes or hosts.
    Channels cannot rewind: checkpoint options are refused (`check_rewindable`)."""
    plan = build_plan(flow)
    check_rewindable(plan, receivers, options)
    executor_inputs = []
    for step_id, spec, receiver in per_source(plan, receivers, "channel"):
        plan.roots[step_id].follow_channel()  # its producer sends the watermark
        executor_inputs.append(Input(step_id, receiver, plan.roots[step_id], spec.schema.dtype))
    return await execute(flow, plan, executor_inputs, **options)


async def execute(
    flow: Dataflow,
    plan,
    executor_inputs: list[Input],
    *,
    start=None,
    index: int = 0,
    yield_every: int = Executor.YIELD_EVERY,
    coalesce: int = Executor.COALESCE,
    on_records=None,
    on_report=None,
    report_every: float = 0.5,
    progress_bus=None,
    checkpoints=None,
) -> RunResult:
    """Run one executor over `executor_inputs` to the end of every input; `start(nursery)`
    starts whatever feeds them (sources) beside it. Opens and closes the plan's sinks.
    `progress_bus`: this executor's `ProgressBus` when it runs with others.
    `checkpoints` (`slashrt.snapshot.runtime.Checkpointing`) restores and checkpoints the run."""
    tracker = PointstampProgress(plan, progress_bus)
    if isinstance(on_report, (str, os.PathLike)):
        on_report = ReportFile(on_report, flow.name)
    if not report_every > 0:
        raise DataflowError(f"run(): report_every must be a positive number of seconds, got {report_every!r}")
    executor = Executor(
        executor_inputs, index=index, yield_every=yield_every, coalesce=coalesce, progress=tracker,
        checkpoints=checkpoints,
    )
    for sink in plan.sinks:  # (a broker's sink from its worker thread: an agent's heartbeats go on)
        await sink.aopen()
    started = time.perf_counter()
    try:
        async with unwrap_groups(), trio.open_nursery() as nursery:
            if checkpoints is not None:  # the sinks are open, no source has fed anything yet
                await checkpoints.restore(tracker)
                await checkpoints.replay()  # loops: their back edges' log, before any new input
            if start is not None:
                await start(nursery)
            if on_records is not None:
                nursery.start_soon(_report_records, executor, on_records)
            if on_report is not None:
                nursery.start_soon(_report_progress, tracker, on_report, report_every)
            async with checkpoints.running() if checkpoints is not None else contextlib.nullcontext():
                await executor.run()
            if on_records is not None:
                on_records(executor.stats.records)
            # a failed channel's sender may still wait for credits that never come
            nursery.cancel_scope.cancel()
    except BaseException as exc:
        if getattr(on_report, "reports_end", False):
            on_report(tracker.report(), "failed", str(exc) or type(exc).__name__)
        raise
    else:
        if getattr(on_report, "reports_end", False):
            on_report(tracker.report(), "failed" if executor.failed else "finished")
    finally:
        for sink in plan.sinks:
            sink.close()
    seconds = time.perf_counter() - started
    outputs = _CollectedOutputs({s.step_id: s.sink for s in plan.sinks if hasattr(s.sink, "records")})
    epochs = {w.step_id: [w.epochs] for w in plan.windows() if hasattr(w, "epochs")}
    frontiers = tracker.frontiers()
    result = RunResult(
        seconds, [executor.stats], {w.step_id: w.late_records for w in plan.windows()}, outputs, epochs, frontiers,
        [] if checkpoints is None else checkpoints.report(),
        None if checkpoints is None or checkpoints.restored is None else checkpoints.restored.number,
        None if checkpoints is None else checkpoints.savepoint,
        latency={s.step_id: s.latency for s in plan.sinks if s.latency is not None},
    )
    log.info("run finished", flow=flow.name, seconds=round(seconds, 6), records=result.records)
    if executor.failed:
        raise ChannelFailed(executor.failed, result)
    return result
