"""An executor agent: one process that runs its share of a job for a coordinator.

    python -m slashrt.cluster.agent --listen HOST:PORT [--once]     (or `slashrt executor`)

The agent listens for the coordinator's control connection (cluster secret from
$SLASHRT_SECRET or $SLASHRT_SECRET_FILE), prints ``slashrt-agent listening HOST PORT`` once
it listens, and for each job:

1. builds its plan: every keyed window is an exchange (`SsbRoute` or `WindowRoute`, and every
   `exchange(key=)` step: see `slashrt._plan`), and opens the progress bus to its peers;
2. opens its channel port (`slashrt.transport._port`: one listening socket, whose channels a
   peer names when it connects), reports its address, gets every executor's back;
3. connects a channel to every peer per exchange and accepts every peer's, then makes its
   own input (its share of arrays, or a `PerExecutor`'s array or chunks) and reports ready; an
   `Ingest` input opens an ingest endpoint instead (slashrt.spark), whose `IngestTarget` the
   "ready" message carries ({source: target}; empty without such inputs);
4. on "start", runs one executor over its sources and the peers' channels of each exchange,
   the exchanges' ship queues drained beside it; sends the `RunResult` back, or the failure.

The control connection carries heartbeats both ways (`slashrt.cluster._liveness`): if the
coordinator goes away mid-job, or stops answering for the job's heartbeat timeout, the agent
stops the job. Outgoing channels of a job that fails are aborted, never ended, so no peer
mistakes a partial stream for a complete one.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import sys
import time
import traceback

import structlog
import trio

from slashrt._buffer import DEFAULT_SLOT_SIZE, DEFAULT_SLOTS
from slashrt._logging import fault_level, peer_losses_are_echoes
from slashrt._plan import ClusterRole, build_plan
from slashrt._runtime import execute, local_inputs
from slashrt.cluster._control import receive_message, send_message
from slashrt.cluster._progress import open_progress_bus
from slashrt.cluster._ring_budget import EXCHANGE_SLOTS, ring_ends
from slashrt.cluster._reports import AGENT_MARKER, AgentReporter
from slashrt._inputs import Ingest, PerExecutor
from slashrt.cluster._job import MESSAGE_FIELDS, Job, job_of, ports_of
from slashrt.cluster._liveness import HEARTBEAT, Link, PeerSilent, PeersUnreachable
from slashrt.cluster._stall import stall_watch
from slashrt.errors import ChannelClosed, OperatorError, unwrap_groups
from slashrt.ops.route import RoomForSources
from slashrt.ops.sinks import Callback
from slashrt.scheduler import Input
from slashrt.scheduler._bus_counts import initial_capabilities
from slashrt.snapshot.cluster_agent import agent_checkpointing
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import RingSpec
from slashrt.transport._channel import ChannelSilent, Liveness, Receiver
from slashrt.transport._accept import HandshakeListener, authenticated_peers
from slashrt.transport._auth import load_secret
from slashrt.transport._port import ChannelAddress, channel_name
from slashrt.transport._registry import open_channels, open_port, open_slot_pool

__all__ = ["serve", "run_job", "main", "SETUP_TIMEOUT"]

log = structlog.get_logger("slashrt.agent")

SETUP_TIMEOUT = 120.0  # connecting to every peer and making the input
CONNECT_TIMEOUT = 60.0  # every peer connects its channels within this, once the directory is out


class CoordinatorGone(ChannelClosed):
    """The coordinator closed the control connection, stopped answering, or asked to stop
    during a job."""


def _executor_sinks(plan, index: int, checkpointed: bool) -> None:
    """File sinks write one file per executor (part files), not one file from many processes;
    a Callback collects here, transactionally in a checkpointed run (what is committed goes to
    the coordinator, `slashrt.snapshot.collected`)."""
    for node in plan.sinks:
        if isinstance(node.sink, Callback):
            node.sink = node.sink.for_executor(index, transactional=checkpointed)
        elif (part := getattr(node.sink, "for_executor", None)) is not None:
            node.sink = part(index)


CHECKPOINT_MESSAGES = ("checkpoint", "commit", "finish", "savepoint", "stop", "go_on")  # `slashrt.snapshot.cluster`


async def _watch_coordinator(link: Link, checkpoints=None) -> None:
    """During the job: hand checkpoint messages to `checkpoints`; anything else stops the job."""
    while True:
        try:
            kind, payload = await link.receive()
        except PeerSilent as exc:
            raise CoordinatorGone(f"the coordinator {exc}") from None
        except ChannelClosed:
            raise CoordinatorGone("the coordinator closed the control connection during the job") from None
        if checkpoints is None or kind not in CHECKPOINT_MESSAGES:
            raise CoordinatorGone(f"the coordinator stopped the job ({kind})")
        checkpoints.on_message(kind, payload)


async def run_job(job: Job, control: Link, secret: bytes, setup: _Phases | None = None) -> None:
    """Run one executor's part of `job`; protocol messages go over `control`, a heartbeat link.
    `setup` notes how long each step of the set-up took (logged with "executor ready")."""
    bound = log.bind(executor=job.index, executors=job.executors, mode=job.mode, transport=job.transport)
    setup = _Phases() if setup is None else setup
    opts = dict(job.options)
    # run(..., on_report=): this executor's reports go to the coordinator, which gathers them
    reporter = AgentReporter() if opts.pop("on_report", None) == AGENT_MARKER else None
    routing = opts.pop("ssb_routing", "auto")
    regions = opts.pop("regions", False)
    role = ClusterRole(job.index, Partitioning(job.partitions, job.executors), job.mode, job.epoch_bytes, routing)
    plan = build_plan(job.flow, role)
    _executor_sinks(plan, job.index, job.checkpoint is not None)
    setup.note("plan")
    exchanges = {x.step_id: x for x in plan.exchanges()}
    peers = [e for e in range(job.executors) if e != job.index]
    slot_size = opts.pop("slot_size", DEFAULT_SLOT_SIZE)
    slots = opts.pop("slots", DEFAULT_SLOTS)
    exchange_slots = opts.pop("exchange_slots", EXCHANGE_SLOTS)
    floating, max_lent = opts.pop("exchange_floating", (0, 0))  # per exchange: a slot pool's (`_ring_budget`)
    watermark_every = opts.pop("watermark_every", None)
    where = {"host": job.host} if job.transport == "tcp" else {}

    def ring(step_id: str) -> RingSpec:
        return RingSpec(slots=exchange_slots, slot_size=slot_size, record_size=exchanges[step_id].exchange_dtype.itemsize)

    receivers = {}
    peer_of = {}  # channel end -> the executor at its other end (to name a partition)
    async with _naming_partitions(job.index, peer_of), contextlib.AsyncExitStack() as stack:
        # distributed pointstamp progress, over every executor; with failover="region", over its
        # region's (`_execution_plan`): an executor whose flow exchanges nothing is a region of its
        # own, whose operators wait on its own progress only, and it runs and restarts alone
        distributed = job.executors > 1 and (bool(exchanges) or not regions)
        # one port per executor: a peer names the channel it dials (`transport._port`), so the
        # coordinator hands out one address per executor, not one per channel
        port = await stack.enter_async_context(open_port(
            job.transport, secret, expected=len(peers) * (len(exchanges) + distributed), setup_timeout=CONNECT_TIMEOUT,
            **where))
        pools = {}  # exchange -> the slot pool its channels from every peer share here (`transport._pool`)
        if floating and peers:
            for step_id in exchanges:
                pools[step_id] = open_slot_pool(job.transport, ring(step_id), channels=len(peers), floating=floating,
                                                max_lent=max_lent)
                stack.callback(pools[step_id].close)  # after the channels (they close first)
        listeners = {(step_id, src): port.listener(channel_name(step_id, src), ring(step_id),
                                                   **({"pool": pools[step_id]} if step_id in pools else {}))
                     for step_id in exchanges for src in peers}
        ports = []  # every executor's port's address

        async def swap_addresses(progress_listeners: dict) -> dict:
            await control.send("addresses", port.address)
            _, table = await control.receive("peers")
            ports.extend(await trio.to_thread.run_sync(ports_of, table, job.executors))  # (maybe from the blob store)
            return {peer: ChannelAddress(ports[peer], channel_name("progress", job.index)) for peer in progress_listeners}

        async def dial_progress(channels, dst: int, address, spec: RingSpec):
            # as the exchanges' channels are dialled: silence or a refusing route names a partition
            return await connect_to_peer(channels, job.transport, job.index, dst, address, spec, secret,
                                         timeout=control.timeout)

        bus = None
        if distributed:
            sources = [i for i, spec in enumerate(job.flow.steps.values()) if spec.step_id in plan.sources]
            bus = await stack.enter_async_context(open_progress_bus(
                job.index, job.executors, plan.graph, transport=job.transport, secret=secret,
                swap_addresses=swap_addresses, initial=initial_capabilities(sources, job.executors),
                connect_timeout=CONNECT_TIMEOUT, dial=dial_progress,
                liveness=Liveness(control.interval, control.timeout), port=port,
            ))
            peer_of.update(bus.peer_of)
        else:
            await swap_addresses({})
        setup.note("listen_and_swap")

        async def accept() -> None:
            # one peer per listener; strangers' connections are dropped meanwhile (`_accept`)
            receivers.update(
                await channels.accept_each(listeners, timeout=CONNECT_TIMEOUT, describe=_channel_from)
            )
            peer_of.update({end: src for (_, src), end in receivers.items()})

        async def dial(step_id: str, dst: int) -> None:
            sender = await connect_to_peer(channels, job.transport, job.index, dst,
                                           ChannelAddress(ports[dst], channel_name(step_id, job.index)),
                                           ring(step_id), secret, timeout=control.timeout)
            peer_of[sender] = dst
            exchanges[step_id].add_peer(dst, sender)

        # every exchange channel is driven from the moment it is open, by its owner `channels`,
        # and closed with it: senders not ended are aborted, so a failed job never ends a stream;
        # each is watched with the control connection's heartbeat settings (a partition)
        async with open_channels(Liveness(control.interval, control.timeout)) as channels:
            with trio.fail_after(SETUP_TIMEOUT):
                async with unwrap_groups(), trio.open_nursery() as nursery:
                    nursery.start_soon(accept)
                    for step_id in exchanges:
                        for dst in peers:
                            nursery.start_soon(dial, step_id, dst)
                setup.note("connect")
                # the input is made before "ready": it is not part of the measured run
                inputs, targets = {}, {}
                for name, value in job.inputs.items():
                    if isinstance(value, PerExecutor):  # in a thread: heartbeats go on meanwhile
                        inputs[name] = await trio.to_thread.run_sync(value.open, f"{job.flow.name}.{name}", job.index, job.executors)
                    elif isinstance(value, Ingest):
                        endpoint = await stack.enter_async_context(
                            _ingest_endpoint(job, name, value, secret, slots=slots, slot_size=slot_size)
                        )
                        inputs[name], targets[name] = endpoint.receiver, endpoint.target
                    else:
                        inputs[name] = value
                setup.note("input")
                checkpoints = None
                if job.checkpoint is not None:
                    checkpoints = await agent_checkpointing(
                        job, plan, link=control, exchanges=exchanges.values(),
                        peer_inputs=[f"{step_id}.from{src}" for step_id in exchanges for src in peers],
                    )
                setup.note("restore_state")
                executor_inputs, sources = local_inputs(
                    plan, inputs, slot_size=slot_size, slots=slots, watermark_every=watermark_every,
                    checkpoints=checkpoints,
                )
                setup.note("rings_and_seek")
            for (step_id, src), receiver in sorted(receivers.items()):
                x = exchanges[step_id]
                executor_inputs.append(Input(f"{step_id}.from{src}", receiver, x.inbound(src), x.exchange_dtype))
            shipping = list(exchanges.values())
            if shipping:  # the ship queues are bounded at the sources (`RoomForSources`)
                throttle = RoomForSources(shipping, checkpoints.barrier_due if checkpoints is not None else lambda: False)
                for inp in executor_inputs:
                    if inp.name in plan.sources:
                        inp.throttle = throttle
            # the rings its channels hold (`_ring_budget`): its sources', and each end to a peer that keeps one
            channel_bytes = sum(inp.receiver.spec.ring_bytes for inp in executor_inputs if inp.name in plan.sources)
            channel_bytes += sum(end.spec.ring_bytes for end in peer_of
                                 if (isinstance(end, Receiver) and end.grants is None) or
                                 (not isinstance(end, Receiver) and ring_ends(job.transport) == 2))
            channel_bytes += sum(pool.nbytes for pool in pools.values())
            bound.info("executor ready", exchanges=list(exchanges), channel_bytes=channel_bytes,
                       records={k: len(v) if hasattr(v, "__len__") else "chunks" for k, v in inputs.items()
                                if k not in targets and not callable(getattr(v, "feed", None))},
                       connectors={k: repr(v) for k, v in inputs.items() if callable(getattr(v, "feed", None))},
                       ingest=sorted(targets), setup_s=setup.seconds)
            await control.send("ready", targets)
            await control.receive("start")

            async with unwrap_groups(), trio.open_nursery() as watch:
                watch.start_soon(_watch_coordinator, control, checkpoints)
                if reporter is not None:
                    watch.start_soon(reporter.send_to, control)
                try:
                    async with trio.open_nursery() as nursery:
                        for x in exchanges.values():
                            for task in x.background():
                                nursery.start_soon(task)
                        result = await execute(
                            job.flow, plan, executor_inputs, start=sources, index=job.index, progress_bus=bus,
                            on_report=reporter, checkpoints=checkpoints, **opts,
                        )
                        if result.savepoint is not None:  # stopped: what the shippers held went before its barrier
                            nursery.cancel_scope.cancel()
                finally:  # the last report (finished, or failed and why) goes before the outcome
                    if reporter is not None and reporter.latest is not None:
                        with trio.CancelScope(shield=True), contextlib.suppress(ChannelClosed):
                            await control.send("report", reporter.latest)
                watch.cancel_scope.cancel()
            result.stats[0].shipped_bytes = sum(x.shipped_bytes for x in plan.exchanges())
            result.stats[0].channel_bytes = channel_bytes
            result.stats[0].floating_peak = sum(pool.peak for pool in pools.values())
            if bus is not None:
                result.stats[0].progress_bytes, result.stats[0].progress_messages = bus.stats.bytes, bus.stats.messages
            if result.savepoint is not None:
                # stopped with a savepoint: its channels close (aborted: no stream ended) once every
                # executor stopped driving its own, so no peer takes the close for a failure
                channels.stop_driving()
            await control.send("finished")
            if result.savepoint is not None:
                await control.receive("release")
    await control.send("done", result)


async def connect_to_peer(channels, transport: str, index: int, dst: int, address, spec: RingSpec, secret: bytes, *,
                          timeout: float):
    """Connect executor `index`'s channel to executor `dst`'s listener at `address` (which the
    coordinator handed out: it listened there), naming what went wrong: no answer for `timeout`
    seconds, or a connection the network itself refused (a route to nowhere), is a partition
    (`PeersUnreachable`); a connection its host refused means the listener is closed, i.e. the
    peer already failed, and is only the echo of that failure (`ChannelClosed`), so that the
    coordinator names the first cause rather than this one."""
    try:
        # (shm: its set-up may take seconds when many executors set up their channels on few
        # cores; the listener gives it as long, `_accept.accept_each`)
        return await channels.connect(transport, address, spec, secret, connect_timeout=timeout)
    except ChannelSilent as exc:
        raise PeersUnreachable(index, dst, f"no answer to a connection between them for {exc.seconds:g} s") from None
    except OSError as exc:
        if _refused(exc):
            raise ChannelClosed(f"executor {dst}'s listener refused executor {index}'s connection: it had closed "
                                f"(executor {dst} failed first)") from None
        raise PeersUnreachable(index, dst, f"connecting their channel failed ({_why_not_connected(exc)})") from None


def _attempts(exc: OSError) -> tuple[BaseException, ...]:
    """The errors of a connection's attempts (trio's open_tcp_stream raises one OSError caused
    by a group of them)."""
    return exc.__cause__.exceptions if isinstance(exc.__cause__, BaseExceptionGroup) else (exc,)


def _refused(exc: OSError) -> bool:
    """Whether every attempt of a connection was refused by the peer's host."""
    return all(isinstance(e, ConnectionRefusedError) for e in _attempts(exc))


def _why_not_connected(exc: OSError) -> str:
    """The connection's failure, with what its attempts met (e.g. 'No route to host')."""
    if exc.strerror:
        return exc.strerror
    met = sorted({getattr(e, "strerror", None) or str(e) for e in _attempts(exc) if e is not exc})
    return f"{exc}: {'; '.join(met)}" if met else str(exc)


@contextlib.asynccontextmanager
async def _naming_partitions(index: int, peer_of: dict):
    """A job that failed because one of its channels went silent (whichever error surfaced
    first: the silence itself, or a send that found the channel failed) fails as
    `PeersUnreachable`, naming this executor and the one at the channel's other end."""
    try:
        yield
    except Exception as exc:
        for end, peer in list(peer_of.items()):
            silent = getattr(end, "error", None) or getattr(end, "_peer_error", None)
            if isinstance(silent, ChannelSilent):
                raise PeersUnreachable(index, peer, f"no traffic on their channel for {silent.seconds:g} s") from exc
        raise


class _Phases:
    """Seconds each step of a job's set-up took, in order (where a recovery's restore goes)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def note(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = round(now - self._last, 4)
        self._last = now


def _channel_from(key) -> str:
    step_id, src = key
    return f"executor {src}'s {step_id} channel"


def _ingest_endpoint(job: Job, name: str, spec: Ingest, secret: bytes, *, slots: int, slot_size: int):
    """The ingest endpoint feeding source `name` on this executor, on the executor's host."""
    from slashrt.spark._endpoint import IngestEndpoint  # needs pyarrow, not pyspark

    options = {"slot_size": spec.slot_size or slot_size, "forward_slots": slots}
    if spec.slots:
        options["slots"] = spec.slots
    return IngestEndpoint.for_source(job.flow, name, secret, host=job.host, transport=spec.transport, **options)


def _describe(exc: BaseException) -> str:
    """The cause in one line: an OperatorError already names its step and the user's exception."""
    return str(exc) if isinstance(exc, (OperatorError, PeersUnreachable)) else f"{type(exc).__name__}: {exc}"




async def _receive_job(stream: trio.SocketStream) -> dict | None:
    """The coordinator's "job" message (`_job.JobMessages`), or None (logged) if it sends none:
    it left, announced an absurd size, or sent something else. It beats from the handshake on,
    and until the job (which brings the heartbeat settings) comes, each of its heartbeats is
    answered with one."""
    while True:
        try:
            kind, payload = await receive_message(stream)
            if kind == HEARTBEAT:
                await send_message(stream, HEARTBEAT)
                continue
        except (ChannelClosed, trio.BrokenResourceError) as exc:
            log.warning("control connection dropped", reason=f"no job from the coordinator: {exc}")
            return None
        if kind != "job":
            log.warning("control connection dropped", reason=f"expected a 'job' control message, got {kind!r}")
            return None
        if not (isinstance(payload, dict) and MESSAGE_FIELDS <= payload.keys()):
            reason = f"the coordinator's job message holds a {type(payload).__name__}, not a Job"
            log.warning("control connection dropped", reason=reason)
            with contextlib.suppress(Exception):
                await send_message(stream, "failed", reason)
            return None
        return payload


async def _run_job_on(stream: trio.SocketStream, message: dict, secret: bytes) -> bool:
    """Run the job of `message` with heartbeats on its control connection; log and report a
    failure. True if the job succeeded."""
    index = message["index"]
    async with trio.open_nursery() as nursery:
        link = Link(stream, interval=message["heartbeat_interval"], timeout=message["heartbeat_timeout"])
        link.start(nursery)
        try:
            # unpickling imports the user's modules: in a thread, so that heartbeats go on
            setup = _Phases()
            job = await trio.to_thread.run_sync(job_of, message)
            setup.note("unpickle")
            async with stall_watch(link, nursery):  # a stuck loop is named, not taken for a frozen process
                await run_job(job, link, secret, setup)
            return True
        except Exception as exc:
            if isinstance(exc, CoordinatorGone) or (isinstance(exc, ChannelClosed) and link.ended is not None):
                if isinstance(link.ended, PeerSilent):
                    log.error("the coordinator stopped answering; job stopped", executor=index, error=str(exc))
                else:  # it ended the job itself (it says why); nothing to add on the user's terminal
                    log.info("the coordinator ended the job", executor=index, reason=str(exc))
            else:
                reported = False
                with contextlib.suppress(Exception):
                    await link.send("failed", f"{_describe(exc)} (on executor {index})")
                    reported = True
                # a reported failure is said once, by the coordinator; an echo of a peer's loss
                # is at debug; only what the coordinator may never hear stays an error here
                level = fault_level(exc) if isinstance(exc, ChannelClosed) else "error"
                getattr(log, "info" if reported and level == "error" else level)(
                    "job failed", executor=index, error=_describe(exc))
            return False
        finally:
            nursery.cancel_scope.cancel()


async def serve(host: str, port: int, secret: bytes, *, once: bool = False, task_status=trio.TASK_STATUS_IGNORED) -> bool:
    """Listen for coordinators and run their jobs one at a time (just one with `once`); with
    `once`, return whether that job failed (reported to its coordinator and logged).

    Connections that do not prove the secret are dropped without delaying a coordinator's
    (`_accept`); a coordinator that arrives during a job waits for it to end; one that
    misbehaves before its job is logged and dropped, and a job that fails is reported to its
    coordinator: the agent itself goes on serving."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    address = listeners[0].socket.getsockname()[:2]
    control = HandshakeListener(listeners[0], secret)
    task_status.started(address)
    try:
        sys.stdout.write(f"slashrt-agent listening {address[0]} {address[1]}\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the process that started this agent is gone before reading it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit
        log.info("nobody reads this agent's address; exiting")
        return
    log.info("agent listening", host=address[0], port=address[1])
    try:
        async with authenticated_peers(control) as coordinators:
            async for stream in coordinators:
                async with stream:
                    message = await _receive_job(stream)
                    ok = message is not None and await _run_job_on(stream, message, secret)
                if once:
                    return not ok
        return False
    finally:
        for listener in listeners:
            await listener.aclose()


async def _serve_while_parent_lives(host: str, port: int, secret: bytes, once: bool) -> bool:
    """A local executor does not outlive the coordinator that spawned it, even one killed by
    SIGKILL. (Not PR_SET_PDEATHSIG: that fires when the spawning *thread* ends, and the
    coordinator spawns from a worker thread that is retired after a few idle seconds.)"""
    parent = os.getppid()
    failed = False
    async with unwrap_groups(), trio.open_nursery() as nursery:

        async def watch() -> None:
            while os.getppid() == parent:
                await trio.sleep(0.5)
            log.error("the coordinator that started this executor is gone; exiting")
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        failed = await serve(host, port, secret, once=once)
        nursery.cancel_scope.cancel()
    return failed


def listen_address(text: str) -> tuple[str | None, int]:
    """--listen: HOST:PORT, [IPV6]:PORT, or :PORT for every interface (host None)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"must be HOST:PORT (e.g. 127.0.0.1:7700 or [::1]:7700), got {text!r}")
    if not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} of {text!r} is not in 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if "[" in host or "]" in host:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT (an IPv6 host in brackets: [::1]:7700), got {text!r}")
    return host or None, int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's options, shared by `slashrt executor` and `python -m slashrt.cluster.agent`."""
    from slashrt._logging import ENV_VAR, LEVELS

    parser.add_argument(
        "--listen", type=listen_address, default="127.0.0.1:0", metavar="HOST:PORT",
        help="where to listen for the control connection (:PORT: every interface; port 0: any free port)",
    )
    parser.add_argument("--once", action="store_true", help="exit after one job")
    parser.add_argument(
        "--log-level", choices=LEVELS, help=f"level of the log on standard error (default: ${ENV_VAR}, else warning)"
    )
    parser.add_argument("--with-parent", action="store_true", help=argparse.SUPPRESS)


def _error(message: str) -> int:
    """A bad argument or environment: one line, exit code 2."""
    print(f"slashrt executor: error: {message}", file=sys.stderr)
    return 2


def run_agent(args) -> int:
    """Serve as the parsed `args` say; returns the exit code."""
    from slashrt._logging import configure_logging, level_name

    try:
        configure_logging(args.log_level)
        peer_losses_are_echoes()  # the coordinator names a failure's cause once
        secret = load_secret()
    except Exception as exc:
        return _error(str(exc))
    host, port = args.listen
    if args.with_parent:
        # a local executor's life is its coordinator's: Ctrl-C at the terminal reaches the
        # whole process group, and the coordinator stops its executors itself
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if args.with_parent:
            failed = trio.run(_serve_while_parent_lives, host, port, secret, args.once)
        else:
            failed = trio.run(lambda: serve(host, port, secret, once=args.once))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if isinstance(exc, socket.gaierror) or (isinstance(exc, OSError) and exc.errno in _CANNOT_BIND):
            where = f"[{host}]:{port}" if host and ":" in host else f"{host or ''}:{port}"
            return _error(f"cannot listen on {where}: {exc.strerror or exc}")
        # one line, not a traceback on the user's terminal
        if level_name() == "debug":
            traceback.print_exc()
        print(f"slashrt executor: failed: {_describe(exc)}", file=sys.stderr)
        return 1
    return 1 if failed else 0  # a failed job was logged and reported: no traceback


_CANNOT_BIND = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EINVAL}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="slashrt executor", description="Run an executor agent for a slashrt cluster.")
    add_arguments(parser)
    return run_agent(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
