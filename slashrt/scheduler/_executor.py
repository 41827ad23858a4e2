"""The executor: one trio event loop running compute and polling coroutines.

::

      channel 0 ──poller 0──┐                        ┌─ pipeline of input 0 ─┐
      channel 1 ──poller 1──┼──> ready (FIFO) ──> compute ─ pipeline of input 1 ─┼─> sinks
      channel n ──poller n──┘                        └─ ...                  ┘

One tick of a poller: read every posted slot of its channel into the ready queue and wake the
compute coroutine; if nothing was there, count an empty poll and yield at once, so an empty or
slow channel never blocks the others. When the whole executor is idle (nothing ready, nothing
being computed), pollers park on their channel's notification (an eventfd, a socket, a verbs
completion channel or, in process, a trio parking lot) instead of spinning. When compute
still has this channel's buffers to finish (ready, or polled and not yet released), they
wait for its next turn instead: a compute that awaits a worker thread (a broker's sink, a file
source) would otherwise find its loop spinning through empty polls, holding the GIL the thread
needs, and crawl at one GIL hand-over (5 ms) per call the thread makes.

One tick of the compute coroutine: take the oldest ready buffer, run its input's fused
pipeline on it (data: a zero-copy Batch; control: watermark or end of stream), release the
slot (its credit goes back to the sender), and yield every `yield_every` pipeline calls.
Pollers take data buffers in runs (up to `coalesce` consecutive slots whose buffers hold the
same number of records, validated in one native pass) and compute hands a run to the pipeline
as one 2-D zero-copy view, so Python's fixed cost per call is paid once per run of buffers
instead of once per 64 KiB. A slow pipeline's runs are cut so that a call takes about
`SLICE_S`, and a longer call yields at once: the loop's other tasks (a checkpoint's trigger and
write among them) never wait for a whole run of slow buffers.

One compute coroutine runs every input, the sources' and the channels arriving from other
executors alike, with the one tracker: exchanges (`ops/route.py`) ship from background tasks,
so compute never waits for a peer's credits, and two executors sending to each other cannot
deadlock.

With its tracker (`progress`; unit tests run an executor without one) the compute coroutine
also runs the batches loops feed back (`PointstampProgress.queue`), alternating with channel input, and
settles the tracker after every item; it finishes when every input ended and the queue is
empty, and then nothing may be outstanding. On several executors it also settles what peers'
progress messages changed, publishes what the progress bus holds back before it sleeps (while
its inputs stream, only once it stayed idle for `BusCounts`' grace), and finishes only when
no executor has work outstanding (`PointstampProgress.waiting`). At debug level it logs,
before it parks, what holds each frontier not at the end (`PointstampProgress.idle_holds`).

Stop with a savepoint: once the executor took the savepoint's snapshot it computes nothing more
(`halt`: no input, no fed-back batch, no frontier delivered) until the run is cancelled, or the
savepoint failed (`go_on`): what it would compute there, the run resuming the savepoint computes
again, so a sink that is not transactional would get it twice.

A channel that delivers a malformed buffer is closed and reported; the other channels and
their pipelines go on. An exception from an operator fails the executor (trio cancels every
coroutine, nothing hangs).
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING

import attrs
import numpy as np
import structlog
import trio

from slashrt._batch import Batch
from slashrt._buffer import Control
from slashrt._logging import fault_level
from slashrt.errors import ChannelClosed, MalformedBuffer, unwrap_groups
from slashrt.ops._node import Node
from slashrt.scheduler._stats import ExecutorStats
from slashrt.transport import Buffer, DataRun, Receiver

if TYPE_CHECKING:
    from slashrt.ops.route import RoomForSources

__all__ = ["Executor", "Input"]

log = structlog.get_logger("slashrt.executor")


@attrs.define(eq=False)
class Input:
    """A channel feeding one pipeline."""

    name: str  # the source's step id
    receiver: Receiver
    pipeline: Node
    dtype: np.dtype
    ended: bool = False
    error: BaseException | None = None
    # barrier alignment (checkpoints): a blocked input is neither polled nor computed; what was
    # already polled of it waits in `held` (its slots unreleased: credits give backpressure)
    blocked: trio.Event | None = None
    held: collections.deque = attrs.field(factory=collections.deque)
    run_cap: int = 1 << 30  # buffers per pipeline call (the executor shortens the runs of a slow pipeline)
    throttle: RoomForSources | None = None  # room downstream, looked at before each poll (a source's)


class Executor:
    # Defaults measured on YSB (docs/benchmarks.md): long runs amortise the fixed cost of a
    # pipeline call; yielding every few calls keeps pollers and sources moving.
    YIELD_EVERY = 4
    COALESCE = 32
    SLICE_S = 0.01  # a pipeline call longer than this yields at once, and gets shorter runs

    def __init__(
        self, inputs: list[Input], *, index: int = 0, yield_every: int = YIELD_EVERY, coalesce: int = COALESCE,
        progress=None, checkpoints=None,
    ):
        self.inputs = inputs
        self.checkpoints = checkpoints  # slashrt.snapshot.runtime.ExecutorCheckpoints, or None
        self.progress = progress  # PointstampProgress (None in unit tests of polling: watermarks alone)
        self.stats = ExecutorStats(executor=index)
        self.yield_every = yield_every
        self.coalesce = coalesce
        self._ready: collections.deque[tuple[Input, Buffer | DataRun | None]] = collections.deque()
        self._lot = trio.lowlevel.ParkingLot()  # compute waits here for work
        self._turns = trio.lowlevel.ParkingLot()  # pollers waiting for compute's next turn
        self._open = len(inputs)  # inputs whose end (or failure) compute has not handled yet
        self.log = log.bind(executor=index)
        self._halted: trio.Event | None = None  # a stop's savepoint is taken (`halt`); set by `go_on`
        if checkpoints is not None:
            checkpoints.attach(self)

    @property
    def failed(self) -> dict[str, BaseException]:
        return {i.name: i.error for i in self.inputs if i.error is not None}

    async def run(self) -> ExecutorStats:
        started, cpu = time.perf_counter(), time.process_time()
        async with unwrap_groups(), trio.open_nursery() as drivers:
            # whoever opened a channel drives it already (`open_channels`): this call joins that
            # drive; it is the only one for receivers handed over by hand (an ingest endpoint's)
            for inp in self.inputs:
                drivers.start_soon(inp.receiver.drive, name=f"drive:{inp.name}")
            async with trio.open_nursery() as nursery:
                for inp in self.inputs:
                    nursery.start_soon(self._poller, inp, name=f"poller:{inp.name}")
                nursery.start_soon(self._compute, name="compute")
            # every input ended or failed: stop moving bytes for them
            drivers.cancel_scope.cancel()
        self.stats.cpu_s = time.process_time() - cpu
        if self.progress is not None and not self.failed and not self.progress.idle():
            raise self.progress.stuck()
        self.log.info("executor finished", seconds=round(time.perf_counter() - started, 6), **self.stats.as_dict())
        return self.stats

    # -- polling -----------------------------------------------------------------------------------
    async def _poller(self, inp: Input) -> None:
        rx, stats, ready, coalesce = inp.receiver, self.stats, self._ready, self.coalesce
        while True:
            if inp.blocked is not None:  # aligning a barrier: its data waits in the ring
                await inp.blocked.wait()
            if inp.throttle is not None and inp.throttle.full():  # its ring fills meanwhile: backpressure to its feeder
                await inp.throttle.wait()
            t0 = time.perf_counter()
            got = 0
            try:
                while True:
                    # runs of data buffers in one native pass; anything else one by one
                    item = rx.poll_run(coalesce)
                    if item is None and (item := rx.poll()) is None:
                        break
                    ready.append((inp, item))
                    got += 1
            except (MalformedBuffer, ChannelClosed) as exc:
                self._fail_channel(inp, exc)
                return
            finally:
                stats.poll_s += time.perf_counter() - t0
            if got:
                self._lot.unpark_all()
            if rx.finished:
                return
            if got == 0:
                stats.empty_polls += 1
            if got == 0 and (ready or rx.outstanding):
                # nothing new, compute has work: polling again before its next turn finds nothing
                stats.waits += 1
                await self._turns.park()
            elif got == 0 and self._idle():
                # the whole executor is idle as far as this channel can tell: park, don't spin
                stats.parks += 1
                t0 = time.perf_counter()
                await rx.wait_readable()
                stats.parked_s += time.perf_counter() - t0
            else:
                await trio.lowlevel.checkpoint()

    def _fail_channel(self, inp: Input, exc: BaseException) -> None:
        inp.error = exc
        self.stats.failed_channels += 1
        getattr(self.log, fault_level(exc))("channel closed after bad input", channel=inp.name, error=str(exc))
        # buffers polled before the bad one are good: compute handles them, then this marker
        self._ready.append((inp, None))
        self._lot.unpark_all()

    def _idle(self) -> bool:
        return not self._ready

    # -- computing ---------------------------------------------------------------------------------
    async def _compute(self) -> None:
        ready, stats, progress = self._ready, self.stats, self.progress
        queue = () if progress is None else progress.queue
        if progress is not None:
            progress.wake = self._lot.unpark_all  # a peer executor's progress news
        checkpoints = self.checkpoints
        handled = 0
        try:
            if progress is not None:
                # the frontiers as they start (or as restored) first: the tracker consolidates
                # what it has not propagated, so a source that ended before this (restored at
                # its end) would cancel its own capability unseen, and no window would fire
                await progress.settle()
            if checkpoints is not None:  # a restored checkpoint's records in flight on a peer's channel come first
                for inp in self.inputs:
                    await checkpoints.replay_input(inp)
            while self._open > 0 or queue or (progress is not None and progress.waiting()):
                if self._turns:  # a poller waits for this turn: it runs at the next yield
                    self._turns.unpark_all()
                if checkpoints is not None:  # between two batches: what a checkpoint may do only here
                    checkpoints.between()
                if self._halted is not None:  # (its pollers wait for a turn: the rings keep their data)
                    await self._halted.wait()
                    continue
                if queue and (not ready or handled % 2):  # fed-back batches alternate with input
                    t0 = time.perf_counter()
                    await progress.run_queued()
                    stats.compute_s += time.perf_counter() - t0
                    handled += 1
                    if handled % self.yield_every == 0:
                        await trio.lowlevel.checkpoint()
                    continue
                if not ready:
                    if progress is not None and progress.quiet(streaming=self._open > 0):
                        await progress.settle()
                    else:
                        if progress is not None and progress.debug and (holds := progress.idle_holds()) is not None:
                            self.log.debug("idle, frontiers held", inputs=holds)  # where is it stuck
                        if progress is None or progress.grace is None:
                            await self._lot.park()
                        else:  # progress to publish, unless work comes within the grace
                            # (a scope of its own, not move_on_after's context manager: this runs at
                            # every idle moment of a streaming executor)
                            with trio.CancelScope(deadline=trio.current_time() + progress.grace) as grace:
                                await self._lot.park()
                            if grace.cancelled_caught:
                                progress.publish()
                    continue
                inp, buf = ready.popleft()
                if inp.blocked is not None:  # polled before its barrier was computed: wait
                    inp.held.append(buf)
                    continue
                if buf is None:  # the channel failed after the buffers before this marker
                    self._open -= 1
                    if self.checkpoints is not None:  # it delivers no more barriers: never wait for one
                        await self.checkpoints.on_end(self, inp)
                    continue
                t0 = time.perf_counter()
                rx = inp.receiver
                if buf.is_control:
                    await self._handle_control(inp, buf)
                    rx.release()
                else:
                    if isinstance(buf, DataRun):
                        if buf.n > inp.run_cap:  # a slow pipeline: the rest of the run goes next
                            ready.appendleft((inp, DataRun(buf.first_slot + inp.run_cap, buf.n - inp.run_cap, buf.count)))
                            buf = DataRun(buf.first_slot, inp.run_cap, buf.count)
                        records, n = rx.run_records(buf, inp.dtype), buf.n
                    else:  # a data buffer polled on its own (e.g. a partial last one)
                        records, n = buf.records(inp.dtype), 1
                    stats.buffers += n
                    stats.records += records.size
                    await inp.pipeline.push(Batch(records))
                    rx.release(n)
                    # runs sized so that one call takes about SLICE_S: the loop's other tasks
                    # (pollers, sources, checkpoints' triggers and writes) run between two calls
                    took = time.perf_counter() - t0
                    inp.run_cap = self.coalesce if took * self.coalesce <= n * self.SLICE_S else max(1, int(n * self.SLICE_S / took))
                if progress is not None and self._halted is None and progress.unsettled:  # (halted by the barrier just computed)
                    await progress.settle()
                stats.compute_s += time.perf_counter() - t0
                handled += 1
                # every few calls, or after a slow one: the loop's other tasks wait for these yields
                if handled % self.yield_every == 0 or time.perf_counter() - t0 > self.SLICE_S:
                    await trio.lowlevel.checkpoint()
        finally:  # (a poller waiting for a turn that will not come)
            self._turns.unpark_all()

    async def _handle_control(self, inp: Input, buf: Buffer) -> None:
        self.stats.control += 1
        ctype, value, _ = buf.control()
        if ctype is Control.WATERMARK:
            await inp.pipeline.on_watermark(value)
        elif ctype is Control.END_OF_STREAM:
            await inp.pipeline.on_end()
            inp.ended = True
            self._open -= 1
            if self.checkpoints is not None:
                await self.checkpoints.on_end(self, inp)
        elif ctype is Control.BARRIER and self.checkpoints is not None:
            await self.checkpoints.on_barrier(self, inp, value)

    # -- barrier alignment (called by `checkpoints`) ------------------------------------------------
    def block(self, inp: Input) -> None:
        """Stop consuming `inp` until `unblock_all` (it delivered a barrier the others have not)."""
        inp.blocked = trio.Event()

    def unblock(self, inp: Input) -> None:
        """Consume `inp` again; what waited of it goes first, in its order."""
        if inp.blocked is None:
            return
        self._ready.extendleft((inp, buf) for buf in reversed(inp.held))
        inp.held.clear()
        inp.blocked.set()
        inp.blocked = None
        self._lot.unpark_all()

    def unconsumed(self, inp: Input) -> list:
        """`inp`'s buffers not computed yet, oldest first: held behind a barrier, polled and
        ready, still in the ring (an unaligned checkpoint's in-flight data). Views: copy them
        before the next batch."""
        ready = [buf for i, buf in self._ready if i is inp]
        return [*inp.held, *ready, *([] if inp.receiver.finished else inp.receiver.posted_unpolled())]

    def wake(self) -> None:
        """Wake the compute coroutine (a checkpoint waits for its next turn: `between`)."""
        self._lot.unpark_all()

    def halt(self) -> None:
        """A stop's savepoint is taken: compute nothing more until the run is cancelled or `go_on`."""
        if self._halted is None:
            self._halted = trio.Event()

    def go_on(self) -> None:
        """The savepoint failed: compute again (what waited in the rings, the queue, the tracker)."""
        if self._halted is not None:
            self._halted.set()
            self._halted = None
            self.wake()

    def unblock_all(self) -> None:
        """Consume every input again."""
        for inp in self.inputs:
            self.unblock(inp)
