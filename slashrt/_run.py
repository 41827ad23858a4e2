"""`slashrt.run`: run a dataflow to completion, on one executor in this process
(`slashrt._runtime.run_async`) or on a cluster (`slashrt.cluster.run_cluster_async`).

`prepare_run` makes every check of the options first and returns the run as an async function
(`slashrt run` runs it inside its own trio run, around it its signals). The cluster is
imported only when a run needs it (start-up time); this module sits above both.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import trio

from slashrt._buffer import DEFAULT_SLOT_SIZE, DEFAULT_SLOTS
from slashrt._dataflow import Dataflow
from slashrt._plan import check_cluster_flow
from slashrt._runtime import RunResult, run_async
from slashrt.errors import DataflowError, OptionError
from slashrt.scheduler import Executor
from slashrt.transport import RingSpec

if TYPE_CHECKING:
    from slashrt.snapshot.coordinator import CheckpointConfig
    from slashrt.snapshot.stop import StopHandle

__all__ = ["run", "prepare_run"]


def run(
    flow: Dataflow,
    inputs: Mapping[str, Any],
    *,
    executors: int | list[str] = 1,
    transport: str | None = None,
    mode: str | None = None,
    checkpoint: float | str | dict | CheckpointConfig | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume_from: int | str | None = None,
    stop: StopHandle | None = None,
    restart: str | object | None = None,
    failover: str | None = None,
    on_records: Callable[[int], None] | None = None,
    on_report: Callable[[dict], None] | str | os.PathLike | None = None,
    report_every: float = 0.5,
    slot_size: int = DEFAULT_SLOT_SIZE,
    slots: int = DEFAULT_SLOTS,
    watermark_every: int | None = None,
    yield_every: int = Executor.YIELD_EVERY,
    coalesce: int = Executor.COALESCE,
    partitions: int | None = None,
    epoch_bytes: int | None = None,
    ssb_routing: str | None = None,
    secret: bytes | None = None,
    on_ready: Callable[[dict], None] | None = None,
    heartbeat_interval: float | None = None,
    heartbeat_timeout: float | None = None,
    channel_budget: int | None = None,
    blob_store: str | os.PathLike | None = None,
    offload_min_bytes: int | None = None,
    session=None,
    **unknown,
) -> RunResult:
    """Run `flow` to completion over `inputs` (source name -> structured array, or a connector).

    With the defaults it runs on one executor in this process. `executors=N` (or a list of
    agents' "HOST:PORT" addresses), a `transport` ("shm", "tcp", "verbs") or a `mode` run it on a
    cluster instead (see `slashrt.cluster`): N executor processes over shared memory by default,
    every keyed window on the shared state backend (`mode="slash"`) or repartitioned
    (`mode="uppar"`); inputs may then also be `slashrt.cluster.PerExecutor` functions.

    Checkpoints (docs/guide.md "Fault tolerance"): with a `checkpoint_dir` (a directory or fsspec
    URL), barrier snapshots every `checkpoint` interval (seconds, a string like '500ms', a dict of
    `CheckpointConfig` options or one; None: only the final checkpoint); `resume_from` ("latest"
    or a checkpoint number) restores one first; `stop` (a `StopHandle`) stops the run with a
    savepoint; `restart` (clusters: "fixed-delay:attempts=3,delay=1s", "failure-rate:...",
    "none") recovers from an executor's death from the last complete checkpoint: every executor
    (`failover="job"`, the default), or with `failover="region"` only the executors of the dead
    one's region (executors that exchange nothing are a region each; any exchange joins them all
    in one), whose progress is then tracked per region (docs/guide.md "Fault tolerance").

    `on_records(n)` is called now and then with the records processed so far;
    `on_report(report)` gets the progress tracker's `report()` every `report_every` seconds
    (where each input's frontier stands and what holds it back); given a path
    instead, the report is kept in that JSON file, also after the run ended or failed
    (`slashrt frontiers PATH` shows it).

    Tuning: `slot_size` and `slots` shape each channel's ring; sources send a watermark every
    `watermark_every` buffers (default `slots - 1`); the executor yields to its pollers every
    `yield_every` pipeline calls and hands up to `coalesce` consecutive full buffers to a
    pipeline at once.

    Clusters only (None: the default): `partitions` of the key space (256), `epoch_bytes` of an
    SSB window's epoch (64 MiB) and its `ssb_routing` ("auto", "fragments" or "direct",
    `slashrt.ssb.graph_window`), the
    channels' `secret` (random by default), `on_ready({source: [IngestTarget]})` once every
    executor is ready (`Ingest` inputs need it), and the heartbeats between the coordinator
    and its agents: one every `heartbeat_interval` seconds, an executor silent for
    `heartbeat_timeout` seconds fails the job; `channel_budget`, the bytes of rings each
    executor's channels may hold (128 MiB): its sources' rings, and its exchanges' rings to
    every peer, which shrink as executors are added (`slashrt.cluster._ring_budget`);
    `blob_store`, a directory or fsspec URL every agent reads, where parts of the agents'
    messages of `offload_min_bytes` (1 MiB) or more are written once instead of sent to each
    (a flow capturing a large table; by default a temporary directory for local executors:
    `slashrt.cluster._blobs`); `session`, a `slashrt.cluster.Session` whose fork server the
    run's local executors are forked from (it outlives runs: they start in milliseconds).

    Anything else is refused in one sentence that lists these options."""
    given = {name: value for name, value in locals().items() if name in _RUN_DEFAULTS and not _is_default(name, value)}
    return trio.run(prepare_run(flow, inputs, executors=executors, transport=transport, mode=mode, **given, **unknown))


_RUN_DEFAULTS: dict = {}  # run's options but flow, inputs, executors, transport and mode -> their defaults (below)


def _is_default(name: str, value) -> bool:
    """Whether `run` got its default for option `name` (not passed on: the run's own default holds)."""
    default = _RUN_DEFAULTS[name]
    return value is default or (type(value) is type(default) and value == default)


_RUN_DEFAULTS.update({
    name: p.default for name, p in inspect.signature(run).parameters.items()
    if p.kind is p.KEYWORD_ONLY and name not in ("executors", "transport", "mode")
})


def prepare_run(
    flow: Dataflow,
    inputs: dict[str, np.ndarray],
    *,
    executors: int | list[str] = 1,
    transport: str | None = None,
    mode: str | None = None,
    **options,
):
    """`run`'s checks, made now; returns the run itself as an async function of no arguments,
    for a caller that runs it inside its own trio run (`slashrt run`, around it its signals)."""
    if not isinstance(flow, Dataflow):
        raise DataflowError(
            f"run() needs a Dataflow as its first argument, got {type(flow).__name__} {flow!r}: build one with "
            "flow = slashrt.Dataflow(name), flow.source(...), ... .sink(...), then run(flow, inputs)"
        )
    local = executors == 1 and transport is None and mode is None
    from slashrt.cluster import run_cluster_async

    if local and "restart" in options:
        _refuse_local_restart(options.pop("restart"))
    _check_options(options, local)
    _check_rings(flow, options)
    if not local:
        check_cluster_flow(flow)
    if local:
        return lambda: run_async(flow, inputs, **options)
    return lambda: run_cluster_async(
        flow, inputs, executors=executors, transport=transport or "shm", mode=mode or "slash", **options
    )


def _refuse_local_restart(restart) -> None:
    """A run on one executor lives in this process: a death (SIGKILL) takes its coordinator
    too, so nothing here could restart it. Refuse any strategy but 'none' in one sentence."""
    from slashrt.snapshot.restart import NoRestart, parse_restart

    if not isinstance(parse_restart(restart), NoRestart):
        raise DataflowError(
            "run(): restart= needs executors=N: a run on one executor lives in this process, which cannot restart "
            "itself after it dies; rerun it with resume_from='latest' (slashrt run --resume-from latest) from a supervisor"
        )


def _keywords(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


# options of earlier slashrt that no longer mean anything -> why (`slashrt`'s --OPTION too)
REMOVED_OPTIONS = {"progress": "every dataflow runs on pointstamp progress (one tracker over its graph)"}


def _check_options(options: dict, local: bool) -> None:
    """Refuse a keyword `run` does not know, listing those it does, before anything starts (its
    signature names them: a cluster run takes `run_async`'s too, each executor runs one)."""
    known = set(_RUN_DEFAULTS)
    cluster_only = known - _keywords(run_async) - {"restart"}
    for name in options:
        if name in REMOVED_OPTIONS:
            raise DataflowError(f"run(): {name}= was removed: {REMOVED_OPTIONS[name]}; leave it out")
        if local and name in cluster_only:
            raise DataflowError(f"run(): {name}= is an option of multi-executor runs; give executors=N as well")
        if name not in known:
            raise DataflowError(
                f"run() got an unknown option {name}=; the options are executors, transport, mode and "
                f"{', '.join(sorted(known))}"
            )


def _check_rings(flow: Dataflow, options: dict) -> None:
    """`slot_size` and `slots` must fit every source's records: one clear error before any
    executor starts (not one per executor process, deep in a channel)."""
    slot_size, slots = options.get("slot_size", DEFAULT_SLOT_SIZE), options.get("slots", DEFAULT_SLOTS)
    for spec in flow.sources():
        try:
            RingSpec(slots=slots, slot_size=slot_size, record_size=spec.schema.record_size)
        except ValueError as exc:
            raise OptionError(f"slot_size={slot_size}, slots={slots}: {exc} (source {spec.step_id!r})") from None
