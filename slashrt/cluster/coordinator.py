"""The coordinator: deploys a dataflow on N executor agents, wires them, collects the result.

::

    coordinator                           agent i (one process, one executor)
      spawn agents (local) or take          listen for the control connection
      their addresses (multi-host)
      connect, prove the secret      ───>   prove it back
      "job" (flow, share of input)   ───>   build the plan, open its channel port
                                     <───   "addresses" (its port's)
      "peers" (every executor's port) ───>  connect to peers, accept peers, make input
                                     <───   "ready" ({source: IngestTarget} of its
      on_ready(targets), if given           `Ingest` inputs' endpoints; usually empty)
      "start"  (the clock starts)    ───>   run the executor
                                     <───   "finished" (the clock stops), then
                                            "done" (RunResult) or "failed" (why)
      (checkpoints, and a stop with a savepoint, in between: `slashrt.snapshot.cluster`)

`Ingest` inputs are fed from outside while the job runs: `on_ready` receives
{source: [IngestTarget of executor 0, 1, ...]} before "start", and the caller ingests into
them (e.g. `slashrt.spark.ingest` from another thread); each executor's source ends when its
endpoint's stream is ended.

Both sides send heartbeats on the control connection (`_liveness.Link`). Any executor that
fails, disconnects, exits or stops answering before "done" fails the whole job with a
`ClusterError` naming it and saying how it died (`executor_death`); the coordinator then
closes every control connection (agents stop their jobs) and kills and reaps the processes it
spawned, as it does on Ctrl-C or a cancellation. Results are never partial: a job either
returns every executor's output or raises. With a restart strategy (`restart=`) and a
checkpoint directory, a death is recovered instead: the job is deployed again and resumes
from its last complete checkpoint (`run_cluster_async`, docs/architecture.md "The recovery loop").
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import time

import numpy as np
import structlog
import trio

from slashrt._buffer import DEFAULT_SLOT_SIZE, DEFAULT_SLOTS
from slashrt._frontier_report import lower_envelope
from slashrt._plan import MODES, check_cluster_flow
from slashrt._runtime import RunResult
from slashrt._inputs import Ingest, PerExecutor, split_input
from slashrt.cluster._blobs import OFFLOAD_MIN_BYTES, RunBlobs
from slashrt.cluster._execution_plan import ExecutionPlan
from slashrt.cluster._job import JobMessages, port_table
from slashrt.cluster._reports import cluster_reports
from slashrt.cluster._ring_budget import DEFAULT_CHANNEL_BUDGET, exchange_slots
from slashrt.cluster._zygote import Session, Zygote, open_zygote
from slashrt.cluster._liveness import (
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT, Link, OwnStalls, PeerSilent, PeerStalled, PeersUnreachable,
    check_heartbeat,
)
from slashrt.errors import ChannelClosed, ClusterError, DataflowError, RetryableError, retryable_report, unwrap_groups
from slashrt.ops.sinks import Callback, Collect
from slashrt.ops.sources import validate_input
from slashrt.ssb.epochs import DEFAULT_EPOCH_BYTES, check_routing
from slashrt.snapshot.cluster import cluster_checkpoints
from slashrt.snapshot.collected import COMMITTED, Committed
from slashrt.snapshot.restart import GiveUp, NoRestart, parse_restart
from slashrt.ssb.partitions import DEFAULT_PARTITIONS
from slashrt.transport._auth import HANDSHAKE_TIMEOUT, HandshakeTimeout, client_handshake, generate_secret, load_secret
from slashrt.transport._registry import NETWORK_TRANSPORTS

__all__ = ["run_cluster_async", "ClusterError", "START_TIMEOUT"]

log = structlog.get_logger("slashrt.cluster")

START_TIMEOUT = 180.0  # spawning, connecting and wiring every executor
# a spawned agent imports slashrt before it listens (seconds on a loaded machine): it says
# where it listens within this, or the heartbeat timeout if that is longer; one that uses no
# CPU for the heartbeat timeout meanwhile (stopped, frozen) fails sooner (`_spawn_agent`)
LISTEN_TIMEOUT = 30.0


def _parse_address(text: str) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise DataflowError(f"executor address {text!r} must be HOST:PORT")
    return host, int(port)


def _secret(secret: bytes | None) -> bytes:
    if secret is not None:
        return secret
    if os.environ.get("SLASHRT_SECRET") or os.environ.get("SLASHRT_SECRET_FILE"):
        return load_secret()
    return generate_secret()


def _agent_argv() -> list[str]:
    """A local agent's arguments (it logs at this process's level, set by configure_logging or
    $SLASHRT_LOG_LEVEL)."""
    from slashrt._logging import level_name

    return ["--listen", "127.0.0.1:0", "--once", "--with-parent", "--log-level", level_name()]


def _cpu_ticks(pid: int) -> int | None:
    """The CPU time a process has used (user + system, in clock ticks), or None where /proc
    does not say: an agent that has not listened yet cannot answer a heartbeat, but while it
    imports it uses the CPU; a stopped or frozen one does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


@trio.lowlevel.enable_ki_protection  # a Ctrl-C waits for the next checkpoint, after procs[index] is set
async def _spawn_agent(secret: bytes, index: int, procs: list, silent_s: float, relay: trio.Nursery,
                       zygote: Zygote, frozen_s: float | None = None) -> tuple[str, int]:
    """Start a local agent process (forked by `zygote`: `_zygote`), tracked in
    procs[index] from the moment it exists (so it is reaped on every path, a cancellation or
    Ctrl-C during the spawn too), and read the address it listens on (within `silent_s`; and,
    with `frozen_s`, the heartbeat timeout, failing as soon as its process used no CPU for that
    long: stopped or frozen before it could listen). Its standard error is relayed to ours by a
    task of `relay`, the run's nursery: what agents log while the job runs reaches the user, and
    what survivors log about their peers' channels once the run has ended (failed, cancelled,
    interrupted) does not."""
    # the agent imports what this process can (the job's functions are pickled by reference
    # when they live in importable modules, e.g. a test module or the user's package)
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    proc = None
    with trio.move_on_after(silent_s):
        try:
            proc = procs[index] = await zygote.spawn(_agent_argv(), env)
        except OSError as exc:
            raise ClusterError(f"cannot start executor {index}: {exc}") from None
    if proc is None:
        raise ClusterError(f"cannot start executor {index}: the executors' fork server did not answer within "
                           f"{silent_s:g} s")
    relay.start_soon(_relay_stderr, proc.stderr, name=f"stderr:executor {index}")
    line = b""
    frozen = False
    with trio.move_on_after(silent_s):
        async with trio.open_nursery() as nursery:
            if frozen_s is not None:

                async def watch_cpu() -> None:
                    nonlocal frozen
                    used, since = _cpu_ticks(proc.pid), trio.current_time()
                    while trio.current_time() - since < frozen_s:
                        await trio.sleep(min(frozen_s / 5, 0.5))
                        now = _cpu_ticks(proc.pid)
                        if now is None or now != used:
                            used, since = now, trio.current_time()
                    frozen = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_cpu)
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(256)
                if not chunk:
                    code = await proc.wait()
                    raise ClusterError(f"{executor_death(index, code=code)} before listening", retryable=True)
                line += chunk
            nursery.cancel_scope.cancel()
    if frozen:
        raise ClusterError(f"{executor_death(index, silent_s=frozen_s)} before listening (its process used no CPU: "
                           "stopped or frozen)", retryable=True)
    if not line.endswith(b"\n"):
        raise ClusterError(f"{executor_death(index, silent_s=silent_s)} before listening", retryable=True)
    words = line.decode(errors="replace").split()
    if words[:2] != ["slashrt-agent", "listening"] or len(words) != 4:
        raise ClusterError(f"executor {index} said {line!r} instead of its address")
    return words[2], int(words[3])


async def _relay_stderr(stream: trio.abc.ReceiveStream) -> None:
    """Copy an agent's standard error to ours, whole lines at a time (lines of several agents
    never interleave), until it closes or the run ends."""
    pending = b""
    while chunk := await stream.receive_some(65536):
        pending += chunk
        lines, _, pending = pending.rpartition(b"\n")
        if lines:
            sys.stderr.write((lines + b"\n").decode(errors="replace"))
            sys.stderr.flush()
    if pending:
        sys.stderr.write(pending.decode(errors="replace") + "\n")
        sys.stderr.flush()


def executor_death(i: int, *, code: int | None = None, silent_s: float | None = None, reason: str = "") -> str:
    """How executor i died, in the words of every failure message: stopped answering, killed
    by a signal, exited with a code, or (an agent whose exit is not known here) lost."""
    if silent_s is not None:
        return f"executor {i} stopped answering for {silent_s:g} s"
    if code is not None and code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return f"executor {i} was killed by signal {-code}{name}"
    if code:
        return f"executor {i} exited with code {code}"
    return f"executor {i} lost its control connection: {reason}"


async def _unreachable(i: int, procs: list, message: str, recovering: bool = False) -> ClusterError:
    """The error for an executor the driver could not reach or authenticate: for an agent
    spawned here that died meanwhile (killed as it started listening), how it died, since
    that is the cause; otherwise `message`. Retryable when the agent was ours, or when this
    attempt is a recovery (an agent at an address, up before, may be back at the next one)."""
    proc = procs[i]
    if proc is not None:
        with trio.move_on_after(_Agents.LAST_WORDS_S):
            await proc.wait()
        if proc.returncode is not None:
            return ClusterError(f"{executor_death(i, code=proc.returncode)} before the driver reached it", retryable=True)
    return ClusterError(message, retryable=proc is not None or recovering)


def _retryable_report(report: str) -> bool:
    """An executor's report of its failure that a restart may recover from: a RetryableError
    (an operator's, a broker's: `errors.retryable_report`), or a partition between two executors
    (`PeersUnreachable`)."""
    return retryable_report(report) or PeersUnreachable.PHRASE in report


def _broken_channel(report: str) -> bool:
    """A failure that is only the consequence of another's: a channel its peer aborted
    (ChannelFailed) or closed (ChannelClosed) when that peer failed."""
    return "ChannelFailed" in report or report.startswith("ChannelClosed")


class _Agents:
    """The control links of a run and one task per agent reading its messages into that
    agent's FIFO (each agent's messages are consumed in the order it sent them); one more per
    spawned agent notes how its process ended."""

    # a crashed agent's last words (its "failed" message), or its exit status after its
    # connection broke, are worth a moment's wait
    LAST_WORDS_S = 0.5
    CAUSE_WAIT_S = 5.0  # at most this long for the cause of a broken channel (`_fail`)

    def __init__(self, links: list[Link], procs: list[trio.Process | None], handlers: dict | None = None,
                 stalls: OwnStalls | None = None):
        # async fn(executor, how it died) -> True if it restarted that executor's region alone
        # (`_run_attempt`'s regional failover): its death then fails nothing
        self.on_death = None
        self._nursery = None
        self.links = links
        self.procs = procs
        self.stalls = stalls  # the coordinator's own stalls: a long one is the cause of what follows
        self.handlers = handlers or {}  # message kind -> async fn(executor, payload), handled as it comes
        self._fifos = [collections.deque() for _ in links]
        self._arrived = trio.Event()
        self._ended = [trio.Event() for _ in links]  # set when a spawned agent's process ended
        self._heard_all = [trio.Event() for _ in links]  # set when an agent's link said its last
        self._reports: dict[int, str] = {}  # agent -> its report of its own failure ("failed")
        self.ended_at: list[float] = []  # when agents' processes ended (time.monotonic), as they did

    def start(self, nursery) -> None:
        self._nursery = nursery
        for i in range(len(self.links)):
            self._watch(i)

    def _watch(self, i: int) -> None:
        self._nursery.start_soon(self._read, i, self.links[i])
        if self.procs[i] is not None:
            self._nursery.start_soon(self._exit, i, self.procs[i])

    def replace(self, i: int, link: Link) -> None:
        """Executor i is a new agent (`procs[i]` its process, `link` its control link): what
        the old one left queued is dropped, and the new one's messages are read from now."""
        self.links[i] = link
        self._fifos[i] = collections.deque()
        self._ended[i], self._heard_all[i] = trio.Event(), trio.Event()
        self._reports.pop(i, None)
        self._watch(i)

    def _put(self, i: int, kind: str, payload) -> None:
        self._fifos[i].append((kind, payload))
        self._arrived.set()

    async def _read(self, i: int, link: Link) -> None:
        try:
            while True:
                try:
                    kind, payload = await link.receive()
                except PeerSilent as exc:  # (or PeerStalled: the call that runs too long, named)
                    if self.links[i] is link:  # (not an agent replaced meanwhile: `replace`)
                        self._put(i, "silent", exc)
                    return
                except ChannelClosed as exc:
                    if self.links[i] is link:
                        self._put(i, "lost", str(exc))
                    return
                if kind in self.handlers:
                    await self.handlers[kind](i, payload)
                    continue
                if kind == "failed":
                    self._reports[i] = payload
                self._put(i, kind, payload)
                if kind in ("done", "failed"):
                    return
        finally:
            self._heard_all[i].set()

    async def _last_words(self, i: int):
        """An agent whose connection or process ended may have said why just before (its
        "failed" message: a send to it can break before its reader got that far). Its words,
        or None."""
        with trio.move_on_after(self.LAST_WORDS_S):
            await self._heard_all[i].wait()
        return self._reports.get(i)

    async def _exit(self, i: int, proc: trio.Process) -> None:
        code = await proc.wait()
        self.ended_at.append(time.monotonic())
        if self.procs[i] is not proc:  # an agent replaced meanwhile (`replace`): its end is known
            return
        self._ended[i].set()
        if code != 0:  # a clean exit follows "done"; a lost connection reports the rest
            await trio.sleep(self.LAST_WORDS_S)
            if self.procs[i] is proc:
                self._put(i, "exited", code)

    async def send_all(self, kind: str, payloads, executors=None) -> None:
        """Send to every agent (of `executors`, default all: a payload each). One that cannot
        take it (gone, or silent) is queued as failed, and the task waiting on the agents
        (`settle`, `gather`) raises the job's failure: not here, where the sender may be an
        agent's reader running a handler (a commit after an ack), which would keep that
        agent's own report of why it failed from being read."""
        executors = range(len(self.links)) if executors is None else executors
        for i, payload in zip(executors, payloads):
            link = self.links[i]
            try:
                await link.send(kind, payload)
            except PeerSilent as exc:
                self._put(i, "silent", exc)
            except ChannelClosed as exc:
                self._put(i, "lost", str(exc))

    def _describe(self, i: int, what: str, payload, kind: str) -> str:
        if what == "failed":
            return str(payload)
        if what in ("lost", "exited", "silent"):
            proc = self.procs[i]
            code = proc.returncode if proc is not None else None
            if isinstance(payload, PeerStalled):
                return f"executor {i} is alive but stuck: {payload}"
            silent_s = payload.seconds if what == "silent" else None
            return executor_death(i, code=code, silent_s=silent_s, reason=payload)
        return f"executor {i} sent {what!r} where {kind!r} was due"

    def _cause_known(self, i: int) -> bool:
        """Whether an executor other than i reported a failure that is not a broken channel,
        or died."""
        return any(j != i and not _broken_channel(str(p)) for j, p in self._reports.items()) or any(
            w in ("exited", "lost", "silent") for j, fifo in enumerate(self._fifos) if j != i for w, _ in fifo)

    async def _fail(self, i: int, what: str, payload, kind: str):
        """Raise the job's failure, naming the root cause: an executor that died makes its
        peers fail too (their channels from it break), so look for a death first; and a peer
        whose own failure aborted the channel that broke (ChannelFailed) is the cause too.
        A lost connection waits a moment for its process's exit status (how it died), unless
        the agent's own report of its failure came first. A death `on_death` recovers (its
        region restarted alone) returns instead."""
        if what in ("lost", "exited") and (words := await self._last_words(i)) is not None:
            what, payload = "failed", words
        if what == "lost" and self.procs[i] is not None:
            with trio.move_on_after(self.LAST_WORDS_S):
                await self._ended[i].wait()
        message = self._describe(i, what, payload, kind)
        if what in ("lost", "exited", "silent") and self.on_death is not None and await self.on_death(i, message):
            return
        retryable = what in ("lost", "exited", "silent") or _retryable_report(str(payload))
        if what == "failed":
            await trio.sleep(2 * self.LAST_WORDS_S)
            # a channel that broke is the consequence of another executor's failure: on a loaded
            # machine that one's own report (or its death) may take longer to arrive
            waited = trio.current_time() + self.CAUSE_WAIT_S
            while _broken_channel(message) and not self._cause_known(i) and trio.current_time() < waited:
                await trio.sleep(self.LAST_WORDS_S / 10)
            # an executor that reported its own failure and then exited did not die
            deaths = [
                self._describe(j, w, p, kind)
                for j, fifo in enumerate(self._fifos) if j != i and j not in self._reports
                for w, p in fifo if w in ("exited", "lost", "silent")
            ]
            causes = [str(p) for j, p in sorted(self._reports.items()) if j != i and not _broken_channel(str(p))]
            if deaths:
                message = f"{deaths[0]} (then {message})"
                retryable = True
            elif causes and _broken_channel(message):
                message = causes[0]  # the same sentence whichever executor's report came first
                retryable = _retryable_report(message)
            partitions = [c for c in causes if PeersUnreachable.PHRASE in c]
            if not deaths and partitions and PeersUnreachable.PHRASE not in message:
                # a partition breaks the other executors' channels and handshakes too
                message, retryable = partitions[0], True
        if self.stalls is not None and (stall := self.stalls.explain()) is not None:
            message, retryable = f"{stall} (then {message})", True  # the executors were fine
        raise ClusterError(message, retryable)

    def poke(self) -> None:
        """Wake `settle`: what it waits for may have changed."""
        self._arrived.set()

    async def settle(self, done) -> None:
        """Wait until `done()` (re-checked whenever a handler `poke`s); any message queued
        meanwhile (an agent failed, died or said something out of turn) raises."""
        while not done():
            for i, fifo in enumerate(self._fifos):
                if fifo:
                    what, payload = fifo.popleft()
                    await self._fail(i, what, payload, "ack")
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def gather(self, kind: str, executors=None) -> list:
        """The next message of every agent (of `executors`, default all), which must be `kind`;
        any failure raises."""
        executors = range(len(self.links)) if executors is None else executors
        got: dict[int, object] = {}
        while len(got) < len(executors):
            for i in executors:
                fifo = self._fifos[i]
                if i in got or not fifo:
                    continue
                what, payload = fifo.popleft()
                if what == kind:
                    got[i] = payload
                else:
                    await self._fail(i, what, payload, kind)
            if len(got) < len(executors):
                self._arrived = trio.Event()
                if not any(self._fifos[i] for i in executors if i not in got):
                    await self._arrived.wait()
        return [got[i] for i in executors]


def _split(step_id: str, spec, value, executors: int) -> list | None:
    """Each executor's part of a source's input, or None where every executor gets the same
    (`ExecutionPlan.input_parts`)."""
    name = step_id.split(".", 1)[1]
    if callable(getattr(value, "feed", None)):  # a connector source (slashrt.connectors): its readers
        if not callable(getattr(value, "for_executor", None)):
            raise DataflowError(f"source {name!r}: {value!r} feeds one executor only; run with executors=1")
        return [value.for_executor(i, executors) for i in range(executors)]
    if isinstance(value, (PerExecutor, Ingest)):  # each executor makes (or opens) its own
        return None
    return split_input(validate_input(step_id, spec.schema, value), spec.time, executors)


def _combine(plan, results: list[RunResult], seconds: float, checkpoints=(), committed: Committed | None = None) -> RunResult:
    """The run's result out of every executor's; the records of in-memory sinks per executor
    from its "done" message, or in a checkpointed run, of transactional ones, as committed."""
    outputs = {}
    for node in plan.sinks:
        if not isinstance(node.sink, (Collect, Callback)):
            continue
        parts = [r.outputs.get(node.step_id) for r in results]
        if committed is not None and getattr(node.sink, "transactional", True):  # a Callback: collected so
            parts = committed.parts(node.step_id, len(results))
        if isinstance(node.sink, Collect):  # the user's own Collect: fill it as a local run would
            node.sink.open()
            for part in parts:
                if part is not None:  # a transactional one's: committed
                    (node.sink.publish if node.sink.transactional else node.sink.write)(part)
            node.sink.close()
            outputs[node.step_id] = node.sink.records
        elif isinstance(node.sink, Callback):  # it collected on each executor (for_executor)
            node.sink.deliver(node.step_id, parts)
    late = {}
    for r in results:
        for step, n in r.late_records.items():
            late[step] = late.get(step, 0) + n
    epochs = {}
    for r in results:
        for step, per_executor in r.epochs.items():
            epochs.setdefault(step, []).extend(per_executor)
    frontiers = lower_envelope([r.frontiers for r in results])
    latency = {}
    for r in results:
        for step, histogram in r.latency.items():
            latency[step] = latency[step].merge(histogram) if step in latency else histogram
    return RunResult(seconds, [s for r in results for s in r.stats], late, outputs, epochs, frontiers, list(checkpoints),
                     latency=latency)


FAILOVERS = ("job", "region")


async def run_cluster_async(flow, inputs: dict, *, restart=None, failover: str = "job",
                            blob_store: str | os.PathLike | None = None, offload_min_bytes: int = OFFLOAD_MIN_BYTES,
                            session: Session | None = None, **options) -> RunResult:
    """Run `flow` on N executors (`_run_attempt` says how) and, with a `restart` strategy
    (`slashrt.snapshot.restart.parse_restart`: "fixed-delay:attempts=3,delay=1s",
    "failure-rate:...", "none" or a strategy object) and a `checkpoint_dir`, recover from what
    `ClusterError.retryable` says can be recovered: wait the strategy's delay, spawn the agents
    again and resume from the last complete checkpoint (`docs/architecture.md`, "The recovery
    loop"). A failure in the job itself fails at once; a strategy that gives up fails with one
    sentence naming it and the last failure. `RunResult.recoveries` lists each recovery. Local
    agents, every attempt's, are forked from one zygote (`_zygote`), started here and stopped
    with the run: an executor costs a fork, not an interpreter importing slashrt.
    `RunResult.startup_s` is how long the first attempt took from this call to processing.
    With a `session` (`_zygote.Session`) they are forked from its zygote, which outlives the
    run and has imported everything already: they start in milliseconds.
    With `failover="region"`, a region (`ExecutionPlan.regions`) has a progress tracker of its
    own and a death restarts only its region (`_run_attempt`: "regional failover"); a run
    of one region restarts every executor either way.
    Parts of the agents' messages of `offload_min_bytes` or more are written once to a blob
    store the agents read (`_blobs`): `blob_store` (a directory or fsspec URL they all reach),
    by default a temporary directory for local agents; agents at addresses without one get
    every part inline. The run's blobs are removed when it ends."""
    called_at = time.monotonic()
    strategy = parse_restart(restart)
    if failover not in FAILOVERS:
        raise DataflowError(f"run(): failover={failover!r}: choose one of {', '.join(map(repr, FAILOVERS))}")
    if failover == "region" and isinstance(strategy, NoRestart):
        raise DataflowError("run(): failover='region' restarts a failed executor's region: give restart= (and "
                            "checkpoint_dir=) as well")
    if not isinstance(strategy, NoRestart):
        _check_restartable(flow, options)
    options["regions"] = failover == "region"  # progress per region, and a region restarted alone
    async with contextlib.AsyncExitStack() as stack:
        local = isinstance(options.get("executors", 2), int)
        if session is not None and not local:
            raise DataflowError("run(): session= forks local executors: give executors=N, not agents' addresses")
        blobs = RunBlobs(blob_store, offload_min_bytes) if local or blob_store is not None else None
        if blobs is not None:
            stack.callback(blobs.remove)
        options["blobs"] = blobs
        zygote = None
        if local:
            # (it imports the job's modules too: the flow's and its inputs' makers, not arrays)
            makers = {name: v for name, v in inputs.items() if not isinstance(v, np.ndarray)}
            zygote = await stack.enter_async_context(open_zygote(preload=(flow, makers), session=session))
        return await _recovery_loop(flow, inputs, strategy, zygote, options, called_at)


async def _recovery_loop(flow, inputs: dict, strategy, zygote: Zygote | None, options: dict,
                         called_at: float) -> RunResult:
    """The attempts of `run_cluster_async`, until one returns or the failure is not recovered."""
    startup_s = None  # the first attempt's, from the call to processing
    recoveries: list[dict] = []
    committed = Committed()  # what in-memory sinks committed, kept across attempts
    while True:
        # (a recovery attempt that cannot reach an agent at an address is retried: the agent may be back soon)
        marks: dict = {"fail_grace": 1.0 if isinstance(strategy, NoRestart) else 0.2, "recovery": bool(recoveries)}
        if not isinstance(strategy, NoRestart):  # (an attempt may restart an executor's region alone)
            marks.update(strategy=strategy, recoveries=recoveries)
        recovering = recoveries[-1] if recoveries else None  # the recovery this attempt makes
        try:
            result = await _run_attempt(flow, inputs, marks=marks, committed=committed, zygote=zygote, **dict(options))
        except ClusterError as exc:
            failed_at = time.monotonic()
            if isinstance(strategy, NoRestart) or not exc.retryable and "started" not in marks:
                raise  # (a job that cannot start is not a failure to restart from)
            if not exc.retryable:
                raise ClusterError(f"{exc}: a failure in the job itself, which a restart would repeat; not restarted") from None
            # (a region's restart asked the strategy already about this death, which gave up)
            decision = marks.get("given_up") or strategy.on_failure(failed_at)
            if isinstance(decision, GiveUp):
                raise ClusterError(f"gave up recovering ({strategy!r}): {decision.reason}; the last failure: {exc}") from None
            log.warning("restarting the job from its last complete checkpoint", flow=flow.name, cause=str(exc),
                        delay=decision.delay, attempt=len(recoveries) + 1)
            died_at = min(marks.get("ended_at") or [failed_at])  # the first agent to end: the death, if seen
            recoveries.append({"cause": str(exc), "restarted": list(range(marks.get("executors", 0))),
                               "failed_at": failed_at, "died_at": died_at, "detect_s": failed_at - died_at})
            await trio.sleep(decision.delay)
            options["resume_from"] = "latest"
            continue
        finally:
            if startup_s is None and "started" in marks:
                startup_s = marks["started"] - called_at
            if recovering is not None and "started" in marks:  # processing again: how long it took
                recovering.update(seconds=marks["started"] - recovering["died_at"],
                                  respawn_s=marks["job_sent"] - recovering["failed_at"],
                                  restore_s=marks["ready"] - marks["job_sent"], checkpoint=marks["restore"])
        result.recoveries, result.startup_s = recoveries, startup_s
        return result


def _check_restartable(flow, options: dict) -> None:
    """Refuse, in one sentence before anything starts, a restart strategy a run cannot honour."""
    if options.get("checkpoint_dir") is None:
        raise DataflowError("run(): restart= restarts from the last complete checkpoint: give checkpoint_dir= as well")
    for step_id, step in flow.steps.items():
        sink = getattr(step, "sink", None)
        if isinstance(sink, Collect) and not sink.transactional:
            raise DataflowError(
                f"run(): restart=: sink {step_id!r} is a Collect without transactional=True, which would return again "
                "what a recovery replays: make it Collect(transactional=True)"
            )


async def _run_attempt(
    flow,
    inputs: dict,
    *,
    executors: int | list[str] = 2,
    transport: str = "shm",
    mode: str = "slash",
    partitions: int = DEFAULT_PARTITIONS,
    epoch_bytes: int = DEFAULT_EPOCH_BYTES,
    secret: bytes | None = None,
    on_ready=None,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    channel_budget: int = DEFAULT_CHANNEL_BUDGET,
    marks: dict | None = None,
    committed: Committed | None = None,
    zygote: Zygote | None = None,
    blobs: RunBlobs | None = None,
    **options,
) -> RunResult:
    """Run `flow` on N executors once: `executors` is a count (local processes, forked by
    `zygote`) or a list of agents' "HOST:PORT" addresses (agents started with `slashrt executor`).
    `on_ready({source: [IngestTarget per executor]})` is called once every executor is ready,
    before the run starts; `Ingest` inputs need it (it is how their producers find them).
    The coordinator and every agent send each other a heartbeat every `heartbeat_interval`
    seconds; an executor silent for `heartbeat_timeout` seconds fails the job (and an agent
    whose coordinator is silent that long stops its job). `committed` keeps what in-memory
    sinks committed (across the attempts of a recovery loop)."""
    check_cluster_flow(flow)
    if mode not in MODES:
        raise DataflowError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
    if transport not in NETWORK_TRANSPORTS:
        raise DataflowError(f"unknown transport {transport!r}; choose one of {sorted(NETWORK_TRANSPORTS)}")
    if partitions < 1 or epoch_bytes < 1:
        raise DataflowError(f"partitions and epoch_bytes must be positive, got {partitions} and {epoch_bytes}")
    check_routing(options.get("ssb_routing", "auto"))
    check_heartbeat(heartbeat_interval, heartbeat_timeout)
    options.pop("on_records", None)  # records processed are reported by each executor's log, not here
    local = isinstance(executors, int)
    addresses = None if local else [_parse_address(a) for a in executors]
    n = executors if local else len(addresses)
    if n < 1:
        raise DataflowError(f"need at least one executor, got {n}")
    if not local and transport == "shm" and any(not h.startswith("127.") and h != "localhost" for h, _ in addresses):
        raise DataflowError("shm joins processes of one machine: use transport='tcp' or 'verbs' across hosts")
    xplan = ExecutionPlan(flow, n, mode=mode, partitions=partitions, epoch_bytes=epoch_bytes,
                          ssb_routing=options.get("ssb_routing", "auto"))
    plan, executor_plan = xplan.logical, xplan.executor
    reports = cluster_reports(options, flow, n)  # run(..., on_report=): gathered here
    common, shares = xplan.input_parts(inputs, _split)
    if "exchange_slots" not in options:  # (tests set the rings' size themselves)
        slot_size = options.get("slot_size", DEFAULT_SLOT_SIZE)
        shape = exchange_slots(
            channel_budget, executors=n, exchanges=len(executor_plan.exchanges()), slot_size=slot_size,
            source_bytes=len(plan.sources) * options.get("slots", DEFAULT_SLOTS) * slot_size, transport=transport)
        options["exchange_slots"] = shape.exclusive
        if shape.floating:  # the exchanges' channels into each executor share a slot pool there
            options["exchange_floating"] = (shape.floating, shape.max_lent)
    try:
        checkpoints = cluster_checkpoints(flow, plan, executor_plan, inputs, n, options)
    except RetryableError as exc:  # (a broker a sink asks what it published is away: an attempt's failure)
        raise ClusterError(f"{type(exc).__name__}: {exc}", retryable=True) from None
    if checkpoints is not None:  # what was committed after the checkpoint resumed from is produced again
        committed = Committed() if committed is None else committed
        committed.restored(checkpoints.job["restore"])
    for name, parts in ({} if checkpoints is None else checkpoints.shares).items():  # a rescaled resume's
        for i in range(n):
            shares[i][name] = parts[i]
    if on_ready is None and any(isinstance(v, Ingest) for v in [*common.values(), *shares[0].values()]):
        raise DataflowError("Ingest inputs need on_ready: it hands their endpoints' targets to the producers")
    secret = _secret(secret)
    procs: list[trio.Process | None] = [None] * n
    controls: list[trio.SocketStream] = []
    results = failure = agents = None
    stalls = OwnStalls(heartbeat_interval, heartbeat_timeout)  # the driver's own, not the agents' silence
    marks = {} if marks is None else marks  # the recovery loop's notes: when each phase began, agents' ends
    marks["executors"] = n
    bound = log.bind(flow=flow.name, executors=n, transport=transport, mode=mode)
    try:
        async with unwrap_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(stalls.run)
            with trio.fail_after(START_TIMEOUT):
                # each executor is started (local), reached and authenticated by a task of its
                # own: n of them take about as long as one
                addresses = [None] * n if local else addresses
                links: list[Link | None] = [None] * n

                async def reach(i: int) -> None:
                    if local:
                        addresses[i] = await _spawn_agent(secret, i, procs, max(LISTEN_TIMEOUT, heartbeat_timeout),
                                                          nursery, zygote, frozen_s=heartbeat_timeout)
                    host, port = addresses[i]
                    try:  # (an agent spawned here that fails now died)
                        stream = await trio.open_tcp_stream(host, port)
                    except OSError as exc:
                        raise await _unreachable(i, procs, f"cannot reach executor {i} at {host}:{port}: {exc}",
                                                 marks.get("recovery", False)) from None
                    controls.append(stream)
                    try:  # (an agent silent for the heartbeat timeout is frozen here too)
                        await client_handshake(stream, secret, timeout=min(HANDSHAKE_TIMEOUT, heartbeat_timeout))
                    except HandshakeTimeout as exc:
                        raise ClusterError(f"{executor_death(i, silent_s=exc.timeout)} during the handshake",
                                           retryable=local or marks.get("recovery", False)) from None
                    except ChannelClosed as exc:
                        raise await _unreachable(i, procs, f"cannot authenticate executor {i} at {host}:{port}: {exc}",
                                                 marks.get("recovery", False)) from None
                    links[i] = Link(stream, interval=heartbeat_interval, timeout=heartbeat_timeout, stalls=stalls)
                    links[i].start(nursery)

                async with trio.open_nursery() as reaching:
                    for i in range(n):
                        reaching.start_soon(reach, i)
                handlers = {} if checkpoints is None else {**checkpoints.handlers(), COMMITTED: committed.receive}
                if reports is not None:  # executors' progress reports, handled as they come, never queued
                    handlers["report"] = reports.receive
                    nursery.start_soon(reports.run)
                agents = _Agents(links, procs, handlers, stalls)
                agents.start(nursery)

                def job_messages(checkpoint: dict | None) -> JobMessages:
                    """What every executor's job shares, pickled once (`checkpoint`: the
                    checkpoint job, `checkpoints.job` or a restarting region's)."""
                    return JobMessages(
                        heartbeat_interval, heartbeat_timeout, flow=flow, executors=n, transport=transport, mode=mode,
                        partitions=partitions, epoch_bytes=epoch_bytes, options=options, common_inputs=common,
                        checkpoint=checkpoint, blobs=blobs)

                messages = job_messages(None if checkpoints is None else checkpoints.job)
                jobs = (messages.message(i, shares[i], addresses[i][0]) for i in range(n))
                marks["job_sent"] = time.monotonic()
                await agents.send_all("job", jobs)
                # every executor's port (`transport._port`): N addresses, the same table for all
                ports = await agents.gather("addresses")
                table = port_table(ports, blobs)
                await agents.send_all("peers", [table] * n)
                if options.get("regions") and checkpoints is not None and "strategy" in marks and \
                        xplan.regions > 1 and not any(isinstance(v, Ingest) for v in common.values()):
                    restarting: set[int] = set()

                    async def reach_again(j: int) -> None:
                        """Reach a replacement: a local agent spawned anew; an agent at an address
                        once it is back there (its supervisor restarts it), within the heartbeat
                        timeout, else the run's recovery restarts everything."""
                        deadline = trio.current_time() + heartbeat_timeout
                        while True:
                            try:
                                return await reach(j)
                            except ClusterError as exc:
                                if local or trio.current_time() >= deadline:
                                    raise ClusterError(str(exc), retryable=True) from None
                            await trio.sleep(_Agents.LAST_WORDS_S / 5)

                    async def restart_alone(i: int, cause: str) -> bool:
                        """Regional failover: restart only executor i's region (`ExecutionPlan.
                        restart_set`), from the newest complete checkpoint its parts verify in,
                        while the other executors run on; False where the run cannot (it is
                        finishing or stopping, its region is every executor, or one of it died
                        while it restarted): the recovery loop then restarts them all."""
                        region = xplan.restart_set([i]).tolist()
                        if len(region) == n or restarting or not checkpoints.can_restart_alone():
                            return False
                        failed_at = time.monotonic()
                        died_at = agents.ended_at[-1] if procs[i] is not None and procs[i].returncode is not None and \
                            agents.ended_at else failed_at
                        decision = marks["strategy"].on_failure(failed_at)
                        if isinstance(decision, GiveUp):  # the death fails the attempt; the loop gives up
                            marks["given_up"] = decision
                            return False
                        restarting.update(region)
                        try:
                            bound.warning("restarting an executor's region alone from its last complete checkpoint",
                                          cause=cause, executors=region, delay=decision.delay)
                            restore = await checkpoints.lose(region, f"executor {i} died")
                            committed.restored(restore, executors=region)
                            await trio.sleep(decision.delay)
                            for j in region:  # (a frozen one is still there)
                                links[j].end(f"executor {j} is replaced")
                                if procs[j] is not None:
                                    if procs[j].returncode is None:
                                        procs[j].kill()
                                    await procs[j].wait()
                            async with trio.open_nursery() as reaching:
                                for j in region:
                                    reaching.start_soon(reach_again, j)
                            for j in region:
                                agents.replace(j, links[j])
                            job_sent = time.monotonic()
                            alone = job_messages({**checkpoints.job, "restore": restore, "rescale": False})
                            await agents.send_all("job", [alone.message(j, shares[j], addresses[j][0]) for j in region],
                                                  region)
                            for j, address in zip(region, await agents.gather("addresses", region)):
                                ports[j] = address
                            await agents.send_all("peers", [port_table(ports, blobs)] * len(region), region)
                            await agents.gather("ready", region)
                            ready = time.monotonic()
                            checkpoints.rejoined()
                            await agents.send_all("start", [None] * len(region), region)
                        finally:
                            restarting.difference_update(region)
                        agents.ended_at.clear()  # (accounted for: a later failure's death is another's)
                        marks["recoveries"].append({
                            "cause": cause, "restarted": region, "failed_at": failed_at, "died_at": died_at,
                            "detect_s": failed_at - died_at, "seconds": time.monotonic() - died_at,
                            "respawn_s": job_sent - failed_at, "restore_s": ready - job_sent, "checkpoint": restore})
                        return True

                    agents.on_death = restart_alone
                readies = await agents.gather("ready")
                marks["ready"] = time.monotonic()
                marks["restore"] = None if checkpoints is None else checkpoints.job["restore"]
            bound.info("cluster ready")
            if on_ready is not None:
                on_ready({name: [(r or {})[name] for r in readies] for name in (readies[0] or {})})
            started = time.perf_counter()
            await agents.send_all("start", [None] * n)
            marks["started"] = time.monotonic()
            if checkpoints is not None:  # periodic checkpoints until every executor drained (or a stop's savepoint)
                await checkpoints.drive(agents)
            # the run ends when every executor has finished; collecting results is delivery
            await agents.gather("finished")
            seconds = time.perf_counter() - started
            if checkpoints is not None and checkpoints.stopped:  # every executor stopped: they may close channels now
                await agents.send_all("release", [None] * n)
            results = await agents.gather("done")
            nursery.cancel_scope.cancel()
    except trio.TooSlowError:
        failure = ClusterError(f"the executors were not ready within {START_TIMEOUT:.0f} s")
        raise failure from None
    except BaseException as exc:
        failure = exc
        raise
    finally:
        if reports is not None:
            reports.finish(None if results is not None else failure)
        with trio.CancelScope(shield=True):  # a cancelled run cleans up too
            for control in controls:
                with contextlib.suppress(Exception):
                    await control.aclose()
            # (a failed run's agents stop on their own within a moment; one about to be restarted
            # needs nothing from them: its checkpoint holds their state)
            await _reap(procs, grace=5.0 if results is not None else marks.get("fail_grace", 1.0))
            if agents is not None:
                marks["ended_at"] = agents.ended_at
    result = _combine(plan, results, seconds, [] if checkpoints is None else checkpoints.report(),
                      None if checkpoints is None else committed)
    if checkpoints is not None:
        result.resumed_from, result.savepoint = checkpoints.job["restore"], checkpoints.savepoint
    bound.info("cluster run finished", seconds=round(seconds, 6))
    return result


run_cluster_async.attempt = _run_attempt


@trio.lowlevel.enable_ki_protection  # a second Ctrl-C does not leave agents behind
async def _reap(procs, grace: float) -> None:
    """Let spawned agents exit on their own for `grace` seconds (they finish after "done",
    and stop their job when their control connection closes), then kill the rest (a stopped
    process too) and wait for every one, so none is left running or unreaped."""
    with trio.move_on_after(grace):
        for proc in procs:
            if proc is not None:
                await proc.wait()
    for proc in procs:
        if proc is not None:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.stdout.aclose()
