"""An executor agent: one process that runs its share of a job for a coordinator.

    python -m slashrt.cluster.agent --listen HOST:PORT [--once]     (or `slashrt executor`)

The agent listens for the coordinator's control connection (cluster secret from
$SLASHRT_SECRET or $SLASHRT_SECRET_FILE), prints ``slashrt-agent listening HOST PORT`` once
it listens, and for each job:

1. builds its plan: every keyed window is an exchange (SSB or UpPar, see `slashrt._plan`);
2. opens a data listener per (exchange, peer), reports the addresses, gets everyone's back;
3. connects a channel to every peer per exchange and accepts every peer's, then makes its
   own input (its share of arrays, or a `PerExecutor` generator) and reports ready; an
   `Ingest` input opens an ingest endpoint instead (slashrt.spark), whose `IngestTarget` the
   "ready" message carries ({source: target}; empty without such inputs);
4. on "start", runs one executor: its sources in lane 0, the peers' channels in lane 1, the
   exchanges' shippers beside it; sends the `RunResult` back, or the failure.

If the coordinator goes away mid-job the agent stops the job. Outgoing channels of a job that
fails are aborted, never ended, so no peer mistakes a partial stream for a complete one.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
import traceback

import structlog
import trio

from slashrt._buffer import DEFAULT_SLOT_SIZE
from slashrt._plan import ClusterRole, build_plan
from slashrt._runtime import execute, local_inputs
from slashrt.cluster._control import receive_message, send_message
from slashrt.cluster._job import Ingest, Job, PerExecutor
from slashrt.errors import ChannelClosed, unwrap_groups
from slashrt.scheduler import Input
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import RingSpec
from slashrt.transport._auth import AuthenticationFailed, load_secret, server_handshake
from slashrt.transport._registry import connect, open_listener

__all__ = ["serve", "run_job", "main", "SETUP_TIMEOUT"]

log = structlog.get_logger("slashrt.agent")

SETUP_TIMEOUT = 120.0  # connecting to every peer and making the input
EXCHANGE_SLOTS = 32


class CoordinatorGone(ChannelClosed):
    """The coordinator closed the control connection (or asked to stop) during a job."""


def _executor_sinks(plan, index: int) -> None:
    """File sinks write one file per executor (part files), not one file from many processes."""
    for node in plan.sinks:
        part = getattr(node.sink, "for_executor", None)
        if part is not None:
            node.sink = part(index)


async def _watch_coordinator(control: trio.SocketStream) -> None:
    try:
        kind, _ = await receive_message(control)
    except ChannelClosed:
        raise CoordinatorGone("the coordinator closed the control connection during the job") from None
    raise CoordinatorGone(f"the coordinator stopped the job ({kind})")


async def run_job(job: Job, control: trio.SocketStream, secret: bytes) -> None:
    """Run one executor's part of `job`; protocol messages go over `control`."""
    bound = log.bind(executor=job.index, executors=job.executors, mode=job.mode, transport=job.transport)
    opts = dict(job.options)
    routing = opts.pop("ssb_routing", "auto")
    role = ClusterRole(job.index, Partitioning(job.partitions, job.executors), job.mode, job.epoch_bytes, routing)
    plan = build_plan(job.flow, role)
    _executor_sinks(plan, job.index)
    exchanges = {x.step_id: x for x in plan.exchanges()}
    peers = [e for e in range(job.executors) if e != job.index]
    slot_size = opts.pop("slot_size", DEFAULT_SLOT_SIZE)
    slots = opts.pop("slots", 96)
    watermark_every = opts.pop("watermark_every", None)
    where = {"host": job.host} if job.transport == "tcp" else {}

    def ring(step_id: str) -> RingSpec:
        return RingSpec(slots=EXCHANGE_SLOTS, slot_size=slot_size, record_size=exchanges[step_id].exchange_dtype.itemsize)

    senders, receivers = [], {}
    async with contextlib.AsyncExitStack() as stack:
        listeners = {}
        for step_id in exchanges:
            for src in peers:
                listeners[(step_id, src)] = await stack.enter_async_context(
                    open_listener(job.transport, ring(step_id), secret, **where)
                )
        await send_message(control, "addresses", {key: lst.address for key, lst in listeners.items()})
        _, directory = await receive_message(control, "peers")

        async def accept(key, listener) -> None:
            receivers[key] = await listener.accept()

        async def dial(step_id: str, dst: int) -> None:
            sender = await connect(job.transport, directory[dst][(step_id, job.index)], ring(step_id), secret)
            senders.append(sender)
            exchanges[step_id].add_peer(dst, sender)

        try:
            with trio.fail_after(SETUP_TIMEOUT):
                async with unwrap_groups(), trio.open_nursery() as nursery:
                    for key, listener in listeners.items():
                        nursery.start_soon(accept, key, listener)
                    for step_id in exchanges:
                        for dst in peers:
                            nursery.start_soon(dial, step_id, dst)
                # the input is made before "ready": it is not part of the measured run
                inputs, targets = {}, {}
                for name, value in job.inputs.items():
                    if isinstance(value, PerExecutor):
                        inputs[name] = value.make(job.index, job.executors)
                    elif isinstance(value, Ingest):
                        endpoint = await stack.enter_async_context(
                            _ingest_endpoint(job, name, value, secret, slots=slots, slot_size=slot_size)
                        )
                        inputs[name], targets[name] = endpoint.receiver, endpoint.target
                    else:
                        inputs[name] = value
                executor_inputs, sources = local_inputs(
                    plan, inputs, slot_size=slot_size, slots=slots, watermark_every=watermark_every
                )
            for (step_id, src), receiver in sorted(receivers.items()):
                x = exchanges[step_id]
                executor_inputs.append(Input(f"{step_id}.from{src}", receiver, x.inbound(src), x.exchange_dtype, lane=1))
            bound.info("executor ready", exchanges=list(exchanges),
                       records={k: len(v) for k, v in inputs.items() if k not in targets}, ingest=sorted(targets))
            await send_message(control, "ready", targets)
            await receive_message(control, "start")

            async with unwrap_groups(), trio.open_nursery() as watch:
                watch.start_soon(_watch_coordinator, control)
                async with trio.open_nursery() as nursery:
                    for x in exchanges.values():
                        for task in x.background():
                            nursery.start_soon(task)
                    result = await execute(job.flow, plan, executor_inputs, start=sources, index=job.index, **opts)
                watch.cancel_scope.cancel()
            await send_message(control, "finished")
        finally:
            for sender in senders:
                if not sender._closed:
                    sender.abort()
            for receiver in receivers.values():
                with contextlib.suppress(Exception):
                    await receiver.aclose()
    await send_message(control, "done", result)


def _ingest_endpoint(job: Job, name: str, spec: Ingest, secret: bytes, *, slots: int, slot_size: int):
    """The ingest endpoint feeding source `name` on this executor, on the executor's host."""
    from slashrt.spark._endpoint import IngestEndpoint  # needs pyarrow, not pyspark

    options = {"slot_size": spec.slot_size or slot_size, "forward_slots": slots}
    if spec.slots:
        options["slots"] = spec.slots
    return IngestEndpoint.for_source(job.flow, name, secret, host=job.host, transport=spec.transport, **options)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


async def serve(host: str, port: int, secret: bytes, *, once: bool = False, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen for coordinators and run their jobs one at a time (just one with `once`)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    address = listeners[0].socket.getsockname()[:2]
    task_status.started(address)
    sys.stdout.write(f"slashrt-agent listening {address[0]} {address[1]}\n")
    sys.stdout.flush()
    log.info("agent listening", host=address[0], port=address[1])
    try:
        while True:
            stream = await listeners[0].accept()
            async with stream:
                try:
                    await server_handshake(stream, secret)
                except AuthenticationFailed as exc:
                    log.error("control connection refused", reason=str(exc))
                    continue
                _, job = await receive_message(stream, "job")
                try:
                    await run_job(job, stream, secret)
                except Exception as exc:
                    log.error("job failed", executor=job.index, error=_describe(exc))
                    with contextlib.suppress(Exception):
                        await send_message(stream, "failed", f"executor {job.index}: {_describe(exc)}")
                    if once:
                        raise
            if once:
                return
    finally:
        for listener in listeners:
            await listener.aclose()


async def _serve_while_parent_lives(host: str, port: int, secret: bytes, once: bool) -> None:
    """A local executor does not outlive the coordinator that spawned it, even one killed by
    SIGKILL. (Not PR_SET_PDEATHSIG: that fires when the spawning *thread* ends, and the
    coordinator spawns from a worker thread that is retired after a few idle seconds.)"""
    parent = os.getppid()
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            while os.getppid() == parent:
                await trio.sleep(0.5)
            log.error("the coordinator that started this executor is gone; exiting")
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await serve(host, port, secret, once=once)
        nursery.cancel_scope.cancel()


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
        secret = load_secret()
    except Exception as exc:
        return _error(str(exc))
    host, port = args.listen
    try:
        if args.with_parent:
            trio.run(_serve_while_parent_lives, host, port, secret, args.once)
        else:
            trio.run(lambda: serve(host, port, secret, once=args.once))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if isinstance(exc, socket.gaierror) or (isinstance(exc, OSError) and exc.errno in _CANNOT_BIND):
            where = f"[{host}]:{port}" if host and ":" in host else f"{host or ''}:{port}"
            return _error(f"cannot listen on {where}: {exc.strerror or exc}")
        # the job's failure was logged and reported to the coordinator; one line here
        if level_name() == "debug":
            traceback.print_exc()
        print(f"slashrt executor: job failed: {_describe(exc)}", file=sys.stderr)
        return 1
    return 0


_CANNOT_BIND = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EINVAL}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="slashrt executor", description="Run an executor agent for a slashrt cluster.")
    add_arguments(parser)
    return run_agent(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
