"""The slashrt side of ingestion: an endpoint that many Spark tasks stream into, feeding one source.

`IngestEndpoint` is a plain object that runs inside any executor process: it opens a TCP
listener (cluster secret handshake, loopback unless a host is given) and, where the host has an
RDMA device (`transport="auto"`, the default) or must (`"verbs"`), a verbs listener beside it,
and offers a `receiver` for `run_receivers`. The executor runs the receiver's `drive()` as it does for every channel;
for this receiver the drive is the endpoint itself: it accepts one connection per Spark task
attempt (and the driver's) on either listener (each set up in a task of its own, so a
connection without the secret is dropped without delaying anyone's), stages each attempt's records, and when the driver commits an
ingest, forwards the chosen attempts' records into the dataflow's source, followed by a
watermark (the largest committed event time minus the source's `max_delay`). See
`slashrt.spark._protocol` for what travels and why commits come from the driver.

    async with IngestEndpoint.for_source(flow, "events", secret) as endpoint:
        target = endpoint.target                      # give this to slashrt.spark.ingest
        result = await run_receivers(flow, {"events": endpoint.receiver})

Staged data is held in memory until its ingest is committed or aborted: an ingest (a
`slashrt.spark.ingest` call, or one micro-batch of a stream) must fit in the endpoint's memory.

`IngestServer` runs a whole dataflow whose sources are ingest endpoints on one executor in a
background thread, for a Spark driver program (or a test) that runs beside it.
"""

from __future__ import annotations

import math
import threading

import attrs
import numpy as np
import structlog
import trio

from slashrt import _kernels as kernels
from slashrt._buffer import Control
from slashrt._inputs import Ingest
from slashrt._runtime import RunResult, check_rewindable, run_receivers
from slashrt._schema import Schema
from slashrt.ops.event_time import watermark_of
from slashrt.errors import ChannelClosed, DataflowError, MalformedBuffer, SlashError
from slashrt.spark._protocol import (
    DEFAULT_SLOT_SIZE, DEFAULT_SLOTS, IngestTarget, check_transport, fields_of, read_message, verbs_unavailable,
)
from slashrt.transport import RingSpec
from slashrt.transport._auth import generate_secret
from slashrt.transport._registry import open_channels, open_listener
from slashrt.transport.inproc import InprocReceiver, _Shared, InprocSender

__all__ = ["BackgroundRun", "IngestEndpoint", "IngestError", "IngestStats", "IngestServer"]

log = structlog.get_logger("slashrt.spark.endpoint")


class IngestError(SlashError):
    """An ingest could not be delivered exactly once (a commit names data never received, a
    task's stream broke the protocol, the stream already ended)."""


@attrs.define
class IngestStats:
    """What an endpoint has seen so far."""

    connections: int = 0
    attempts_opened: int = 0
    attempts_prepared: int = 0  # complete streams staged
    attempts_aborted: int = 0  # streams that ended or broke before INGEST_PREPARE
    attempts_dropped: int = 0  # complete streams not picked by their commit (retries, speculation)
    duplicate_buffers: int = 0  # data buffers for an ingest already committed, discarded on arrival
    staged_bytes: int = 0  # bytes held now
    ingests_committed: int = 0
    partitions_committed: int = 0
    rows_committed: int = 0
    bytes_committed: int = 0
    refused_connections: int = 0
    verbs_connections: int = 0  # of `connections`, those that arrived over verbs


@attrs.define(eq=False)
class _Attempt:
    partition: int
    attempt: int
    chunks: list
    rows: int = 0
    nbytes: int = 0
    max_time: int | None = None


class _EndpointReceiver(InprocReceiver):
    """The source's channel receiver; its drive() runs the endpoint."""

    def __init__(self, shared: _Shared, endpoint: IngestEndpoint):
        super().__init__(shared)
        self._endpoint = endpoint

    async def drive(self) -> None:
        await self._endpoint._serve()

    def _fail_source(self, exc: BaseException) -> None:
        if self._peer_error is None:
            self._peer_error = exc
        self._shared.data_lot.unpark_all()


class IngestEndpoint:
    """Accepts Spark tasks' partition streams and feeds one dataflow source, exactly once."""

    def __init__(
        self,
        schema: Schema,
        secret: bytes,
        *,
        source: str = "events",
        time: str | None = None,
        max_delay: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        slots: int = DEFAULT_SLOTS,
        slot_size: int = DEFAULT_SLOT_SIZE,
        forward_slots: int = 96,
        transport: str = "auto",
    ):
        if not secret:
            raise ValueError("an ingest endpoint needs the cluster secret")
        self.transport = check_transport(transport)
        self.schema = schema
        self.source = source
        self.time = time
        self.max_delay = max_delay
        self.host, self.port = host, port
        self.stats = IngestStats()
        self._secret = secret
        self._spec = RingSpec(slots=slots, slot_size=slot_size, record_size=None)
        shared = _Shared(RingSpec(slots=forward_slots, slot_size=slot_size, record_size=schema.record_size))
        self._sender = InprocSender(shared)
        self.receiver = _EndpointReceiver(shared, self)
        self._listener_cms: list = []
        self._listeners: list = []  # tcp, and verbs where offered
        self.address: tuple[str, int] | None = None
        self.verbs_address: tuple[str, int] | None = None
        self._staged: dict[int, dict[tuple[int, int], _Attempt]] = {}
        self._committed: set[int] = set()
        self._max_time: int | None = None
        self._watermark: int | None = None
        self._ended = False
        self._queue_in, self._queue_out = trio.open_memory_channel(math.inf)
        self._log = log.bind(source=source)

    @classmethod
    def for_source(cls, flow, source: str, secret: bytes, **options) -> IngestEndpoint:
        """An endpoint for the named source of `flow`, with its schema, time column and delay."""
        for spec in flow.sources():
            if spec.step_id.split(".", 1)[1] == source or spec.step_id == source:
                return cls(spec.schema, secret, source=source, time=spec.time, max_delay=spec.max_delay, **options)
        names = [s.step_id.split(".", 1)[1] for s in flow.sources()]
        raise DataflowError(f"dataflow {flow.name!r} has no source {source!r} (sources: {names})")

    @property
    def target(self) -> IngestTarget:
        if self.address is None:
            raise RuntimeError("the endpoint is not open yet: use `async with endpoint:` first")
        return IngestTarget(
            self.address, fields_of(self.schema), self.source, self._spec.slots, self._spec.slot_size, self.verbs_address
        )

    async def __aenter__(self) -> IngestEndpoint:
        try:
            self.address = await self._listen("tcp")
            why_not = verbs_unavailable() if self.transport != "tcp" else "not asked for"
            if why_not is None:
                self.verbs_address = await self._listen("verbs")
            elif self.transport == "verbs":
                raise IngestError(f"ingest endpoint of source {self.source!r}: verbs asked for, but {why_not}")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        verbs = f"{self.verbs_address[0]}:{self.verbs_address[1]}" if self.verbs_address else f"no ({why_not})"
        self._log = self._log.bind(address=f"{self.address[0]}:{self.address[1]}")
        self._log.info("ingest endpoint listening", verbs=verbs)
        return self

    async def _listen(self, transport: str) -> tuple[str, int]:
        port = self.port if transport == "tcp" else 0
        cm = open_listener(transport, self._spec, self._secret, host=self.host, port=port)
        listener = await cm.__aenter__()
        self._listener_cms.append(cm)
        self._listeners.append(listener)
        return tuple(listener.address)

    async def __aexit__(self, *exc_info) -> None:
        cms, self._listener_cms = self._listener_cms, []
        for cm in reversed(cms):
            await cm.__aexit__(*exc_info)

    # -- the service (the receiver's drive) -----------------------------------------------------------
    async def _serve(self) -> None:
        if not self._listeners:
            self.receiver._fail_source(ChannelClosed("the ingest endpoint was never opened (use `async with`)"))
            return
        # the endpoint owns the connections it accepts: `channels` drives each one while it lives
        async with open_channels() as channels, trio.open_nursery() as nursery:
            nursery.start_soon(self._forward)
            for listener in self._listeners:
                nursery.start_soon(self._accept, channels, listener)

    async def _accept(self, channels, listener) -> None:
        """Take every connection that proves the secret, set up concurrently (`_accept`),
        driven by `channels` and served in a task of its own: a stranger's connection is
        dropped (and counted) without delaying a task's."""
        verbs = listener.medium == "verbs"

        async def take(rx) -> None:
            self.stats.connections += 1
            self.stats.verbs_connections += verbs
            await self._connection(rx)

        def refused(peer: str, reason: str) -> None:
            self.stats.refused_connections += 1

        await channels.serve(listener, take, on_refused=refused)
        self._log.debug("ingest endpoint stops accepting", verbs=verbs)

    async def _connection(self, rx) -> None:
        try:
            await self._talk(rx)
        except (MalformedBuffer, ChannelClosed, IngestError) as exc:
            self._log.warning("ingest connection closed", peer=rx.peer, reason=str(exc))
        finally:
            await rx.aclose()

    @staticmethod
    async def _next(rx):
        """The next buffer of a connection, or None once it ended (END_OF_STREAM polled)."""
        while True:
            buf = rx.poll()
            if buf is not None:
                return buf
            if rx.finished:
                return None
            await rx.wait_readable()

    async def _talk(self, rx) -> None:
        first = await self._next(rx)
        if first is None or not first.is_control:
            raise MalformedBuffer(f"{rx.peer} did not start with an ingest message")
        msg = read_message(first.payload)
        if msg.ctype is Control.INGEST_OPEN:
            rx.release()
            await self._producer(rx, ingest=msg.value, attempt=msg.aux, partition=msg.pad)
        else:
            await self._driver(rx, msg)

    async def _producer(self, rx, *, ingest: int, attempt: int, partition: int) -> None:
        stats, rs = self.stats, self.schema.record_size
        stats.attempts_opened += 1
        if self._ended:
            raise IngestError(f"ingest {ingest:x} partition {partition}: the stream has ended, nothing more is taken")
        state = _Attempt(partition, attempt, [])
        time = self.time
        buffers = 0
        try:
            while True:
                buf = await self._next(rx)
                if buf is None or buf.is_control and buf.control()[0] is Control.END_OF_STREAM:
                    raise ChannelClosed(f"partition {partition} attempt {attempt} ended before it was complete")
                if buf.is_control:
                    msg = read_message(buf.payload)
                    if msg.ctype is not Control.INGEST_PREPARE:
                        raise MalformedBuffer(f"unexpected {msg.ctype.name} in partition {partition}'s stream")
                    if (msg.value, msg.aux) != (state.rows, buffers):
                        raise MalformedBuffer(
                            f"partition {partition} attempt {attempt} claims {msg.value} rows in {msg.aux} buffers, "
                            f"{state.rows} rows in {buffers} arrived"
                        )
                    break
                footer = buf.footer
                if footer.count * rs != footer.nbytes:
                    raise MalformedBuffer(
                        f"buffer {footer.seq} of partition {partition} holds {footer.nbytes} bytes for {footer.count} "
                        f"records of {rs} bytes"
                    )
                buffers += 1
                state.rows += footer.count
                if ingest in self._committed:
                    stats.duplicate_buffers += 1
                else:
                    chunk = buf.payload.copy()
                    state.chunks.append(chunk)
                    state.nbytes += chunk.size
                    stats.staged_bytes += chunk.size
                    if time is not None and footer.count:
                        column = chunk.view(self.schema.dtype)[time]
                        top = kernels.minmax(column)[1] if column.dtype == np.int64 else int(column.max())
                        state.max_time = top if state.max_time is None else max(state.max_time, top)
                rx.release()
        except BaseException:
            stats.attempts_aborted += 1
            stats.staged_bytes -= state.nbytes
            raise
        if ingest in self._committed:
            stats.staged_bytes -= state.nbytes
            self._log.info("duplicate attempt discarded", ingest=f"{ingest:x}", partition=partition, attempt=attempt)
        else:
            self._staged.setdefault(ingest, {})[(partition, attempt)] = state
            stats.attempts_prepared += 1
        rx.release()  # the task waits for this credit: its partition is staged
        await self._next(rx)  # END_OF_STREAM

    async def _driver(self, rx, msg) -> None:
        picks: list[tuple[int, int, int]] = []
        while True:
            ctype = msg.ctype
            if ctype is Control.INGEST_PICK:
                picks.append((msg.pad, msg.value, msg.aux))
            elif ctype is Control.INGEST_COMMIT:
                if msg.aux != len(picks):
                    raise MalformedBuffer(f"commit of {msg.aux} partitions after {len(picks)} picks")
                self._commit(msg.value, picks)
                picks = []
            elif ctype is Control.INGEST_ABORT:
                self._drop(msg.value, "aborted by the driver")
            elif ctype is Control.INGEST_END:
                if not self._ended:
                    self._ended = True
                    self._queue_in.send_nowait(("end", None))
                    self._log.info("ingest stream ends", **attrs.asdict(self.stats))
            elif ctype is Control.END_OF_STREAM:
                rx.release()
                return
            else:
                raise MalformedBuffer(f"unexpected {ctype.name} from the driver {rx.peer}")
            # released once done: the driver's wait for all its credits is its acknowledgement
            rx.release()
            buf = await self._next(rx)
            if buf is None:
                return
            if not buf.is_control:
                raise MalformedBuffer(f"data from the driver {rx.peer}")
            msg = read_message(buf.payload)

    def _drop(self, ingest: int, why: str) -> int:
        staged = self._staged.pop(ingest, {})
        for state in staged.values():
            self.stats.staged_bytes -= state.nbytes
        if staged:
            self._log.info("staged attempts dropped", ingest=f"{ingest:x}", attempts=len(staged), why=why)
        return len(staged)

    def _commit(self, ingest: int, picks: list[tuple[int, int, int]]) -> None:
        if ingest in self._committed:
            self._drop(ingest, "ingest committed before (a replayed batch)")
            self._log.info("duplicate commit ignored", ingest=f"{ingest:x}")
            return
        if self._ended:
            self._fatal(IngestError(f"commit of ingest {ingest:x} after the stream ended"))
        staged = self._staged.get(ingest, {})
        chosen = []
        for partition, attempt, rows in sorted(picks):
            state = staged.get((partition, attempt))
            if state is None:
                have = sorted(a for p, a in staged if p == partition)
                self._fatal(IngestError(
                    f"ingest {ingest:x}: the driver commits attempt {attempt} of partition {partition}, which never "
                    f"arrived complete here (complete attempts of that partition: {have})"
                ))
            if state.rows != rows:
                self._fatal(IngestError(
                    f"ingest {ingest:x} partition {partition}: the driver counts {rows} rows, {state.rows} arrived"
                ))
            chosen.append(state)
        self._staged.pop(ingest, None)
        self._committed.add(ingest)
        stats = self.stats
        stats.attempts_dropped += len(staged) - len(chosen)
        for state in staged.values():
            stats.staged_bytes -= state.nbytes
        for state in chosen:
            for chunk in state.chunks:
                self._queue_in.send_nowait(("data", chunk))
            stats.rows_committed += state.rows
            stats.bytes_committed += state.nbytes
            if state.max_time is not None:
                self._max_time = state.max_time if self._max_time is None else max(self._max_time, state.max_time)
        stats.ingests_committed += 1
        stats.partitions_committed += len(chosen)
        if self.time is not None and self._max_time is not None:
            watermark = watermark_of(self._max_time, self.max_delay)
            if self._watermark is None or watermark > self._watermark:
                self._watermark = watermark
                self._queue_in.send_nowait(("watermark", watermark))
        self._log.info("ingest committed", ingest=f"{ingest:x}", partitions=len(chosen),
                       rows=sum(s.rows for s in chosen), dropped_attempts=len(staged) - len(chosen))

    def _fatal(self, exc: IngestError):
        """The source cannot be exact any more: fail it (the run raises ChannelFailed) and the
        connection that found out (its driver sees the channel closed)."""
        self._log.error("ingest failed", reason=str(exc))
        failure = ChannelClosed(f"ingest endpoint of source {self.source!r}: {exc}")
        failure.__cause__ = exc
        self.receiver._fail_source(failure)
        raise exc

    async def _forward(self) -> None:
        """Committed records, watermarks and the end, in commit order, into the source's channel."""
        sender, rs = self._sender, self.schema.record_size
        async for kind, item in self._queue_out:
            if kind == "data":
                n = item.size
                await sender.wait_credit()
                sender.reserve()[:n] = item
                sender.post(nbytes=n, count=n // rs)
            elif kind == "watermark":
                await sender.send_control(Control.WATERMARK, item)
            else:
                await sender.aclose()
                return


class BackgroundRun:
    """A dataflow run in a trio loop of its own thread, for a Spark driver program.

    Subclasses implement `_serve()`, which sets `_ready` once its endpoints listen and returns
    the run's result. `start()` returns when they listen, `result()` waits for the end of the
    streams, `stop()` (or leaving the `with` block) cancels the run."""

    thread_name = "slashrt-run"
    what = "the dataflow"  # named when start() times out

    def __init__(self, flow):
        self.flow = flow
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._token = None
        self._cancel: trio.CancelScope | None = None
        self._result: RunResult | None = None
        self._error: BaseException | None = None

    async def _serve(self) -> RunResult:
        raise NotImplementedError

    def start(self, timeout: float | None = None):
        self._thread = threading.Thread(target=self._main, name=f"{self.thread_name}-{self.flow.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise IngestError(f"{self.what} for {self.flow.name!r} was not ready within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        try:
            trio.run(self._main_async)
        except BaseException as exc:  # handed to whoever asks for the result
            self._error = exc
        finally:
            self._ready.set()

    async def _main_async(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._cancel:
            self._result = await self._serve()

    def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the dataflow to finish (its streams ended) and return its result."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the dataflow {self.flow.name!r} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise IngestError(f"the dataflow {self.flow.name!r} was stopped before its streams ended")
        return self._result

    def stop(self) -> None:
        """Stop the dataflow now (whatever was not committed is lost)."""
        if self._thread is None or not self._thread.is_alive():
            return
        if self._token is not None:
            try:
                trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


class IngestServer(BackgroundRun):
    """A dataflow whose sources are ingest endpoints, run on one executor in a background thread.

        with IngestServer(flow) as server:          # endpoints listen once this returns
            ingest(df, server.target("events"), secret=server.secret, end=True)
            result = server.result()                # RunResult, once the stream has ended

    Leaving the `with` block before the stream ended stops the dataflow. `transport` is the
    endpoints' (see `IngestEndpoint`): "auto" adds a verbs listener where there is an RDMA device."""

    thread_name = "slashrt-ingest"

    def __init__(
        self, flow, *, secret: bytes | None = None, host: str = "127.0.0.1", transport: str = "auto", **run_options
    ):
        super().__init__(flow)
        # ingestion does not replay: a checkpointed run is refused here, before anything listens
        check_rewindable(flow, {spec.step_id: Ingest() for spec in flow.sources()}, run_options)
        self.secret = secret or generate_secret()
        self.endpoints = {
            name: IngestEndpoint.for_source(flow, name, self.secret, host=host, transport=transport)
            for name in (spec.step_id.split(".", 1)[1] for spec in flow.sources())
        }
        self._run_options = run_options

    def target(self, source: str | None = None) -> IngestTarget:
        if source is None:
            if len(self.endpoints) != 1:
                raise DataflowError(f"name the source: this dataflow has {sorted(self.endpoints)}")
            source = next(iter(self.endpoints))
        return self.endpoints[source].target

    async def _serve(self) -> RunResult:
        opened = []
        try:
            for endpoint in self.endpoints.values():
                await endpoint.__aenter__()
                opened.append(endpoint)
            self._ready.set()
            receivers = {name: ep.receiver for name, ep in self.endpoints.items()}
            return await run_receivers(self.flow, receivers, **self._run_options)
        finally:
            for endpoint in opened:
                await endpoint.__aexit__(None, None, None)
