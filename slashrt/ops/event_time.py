"""Where a source's watermark stands at each of its records, whatever the batching.

A source's watermark before its record i is ``W_i = max(t_0 .. t_i) - max_delay`` over the
event times of the records before it in its input (and at least any watermark received in
band). A record is late for a window that ends at or before W_i (P1: the window has closed
for it), so lateness is a function of the input's order and `max_delay` alone.

`SourceNode`, the root of a source's pipeline, makes every window below it see exactly that:
it keeps the running maximum across batches and, where a batch holds records behind the
watermark (``t_i < W_i``, the only ones that can be late), computes ``W_i`` per record
(``np.maximum.accumulate``) and cuts the batch where W crosses the end of a window
downstream, announcing the watermark before each piece. Within a piece every record behind
the watermark closes the same windows as the announced one, so a window's late split and
firing are those of a per-record evaluation, at the cost of one call per window end crossed.
A batch with no record behind its last watermark passes whole, as before.

A source fed by a channel whose producer sends its own watermarks (an ingest endpoint, whose
watermark advances with each committed batch; another dataflow's `ChannelSink`) keeps them:
`follow_channel`.

An input array shared out across executors (`Share`) keeps the order of the whole input:
every block carries the largest event time of the input before it (`blocks_before`,
computed once by the coordinator), which raises the watermark of the block's records exactly
as the records before it would on a single executor.
"""

from __future__ import annotations

import attrs
import numpy as np

from slashrt._batch import Batch
from slashrt._kernels import gather, minmax
from slashrt.errors import SnapshotError
from slashrt.ops._node import Node
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State

__all__ = ["SourceNode", "Share", "blocks_before", "watermark_of", "window_promise", "NO_TIME", "END_TIME", "I64_MIN", "I64_MAX"]

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
NO_TIME = I64_MIN  # no watermark yet
END_TIME = I64_MAX  # a source's watermark once its stream has ended


def watermark_of(high: int, max_delay: int) -> int:
    """The watermark after event time `high`: ``high - max_delay``, saturating at int64's
    minimum (no promise yet) instead of overflowing."""
    return max(high - max_delay, NO_TIME)


def blocks_before(times: np.ndarray, block: int) -> np.ndarray:
    """Per block of `block` records of an input, the largest event time of the records
    before the block (NO_TIME for the first)."""
    n = len(times)
    if not n:
        return np.empty(0, np.int64)
    tops = np.maximum.reduceat(times.astype(np.int64, copy=False), np.arange(0, n, block))
    return np.concatenate(([NO_TIME], np.maximum.accumulate(tops)[:-1])).astype(np.int64)


@attrs.frozen
class Share:
    """One executor's part of an input array shared out across executors: its records, in
    blocks of `block` records, and per block the largest event time of the whole input before
    it (so that lateness follows the input's order, not the executor count)."""

    records: np.ndarray
    before: np.ndarray  # int64, one per block of `records`
    block: int
    starts: np.ndarray | None = None  # irregular blocks (a rescaled resume's runs): where each begins

    def blocks(self, positions):
        """The block of each record position (an int or an int64 array)."""
        if self.starts is None:
            return np.minimum(positions // self.block, len(self.before) - 1)
        return np.maximum(np.searchsorted(self.starts, positions, side="right") - 1, 0)

    def __len__(self) -> int:
        return len(self.records)


def window_promise(watermark, size: int, slide: int):
    """End of the last window (of `size` every `slide`) complete at each watermark (an int
    or an int64 array)."""
    return (watermark - size) // slide * slide + size


class SourceNode(Node):
    """The root of a source's pipeline: announces the source's watermark at each record."""

    def __init__(self, step_id: str, time: str | None, max_delay: int):
        super().__init__(step_id)
        self.time = time
        self.max_delay = max_delay
        self.high = NO_TIME  # the largest event time of the input so far
        self.announced = NO_TIME  # the last watermark sent downstream
        self.grids: list[tuple[int, int]] = []  # (size, slide) of every window downstream
        self.before: np.ndarray | None = None  # a Share's per-block carry
        self.share: Share | None = None
        self.position = 0  # records of the input seen so far
        self._next_end = NO_TIME  # the first window end downstream after the announced watermark
        self.follows_channel = False  # the channel's producer owns the watermark
        self.forwards = True  # `watch`: every in-band watermark moves the capability
        # pointstamp progress: the logical time of the records now pushed (the capability held);
        # `exact`: a step below needs each batch at one time (a user operator: its ctx.time and
        # notifications), so batches are cut where the watermark changes; `every_batch`: graph
        # steps below take whole batches at their lower-bound time: the capability moves to the
        # watermark before a batch's first record before it is pushed, and to its last after
        # `record_times`: a user operator below takes whole batches with each record's time
        # (`Batch.times`: the watermark at each record, as exact cuts would have given it)
        self.now = None
        self.exact = False
        self.every_batch = False
        self.record_times = False

    def watch(self) -> None:
        """Learn the windows downstream (their ends are where the watermark must be exact)."""
        below = list(self.walk())
        grids = {n.window_grid() for n in below} - {None}
        self.grids = sorted(grids)
        # no window below, or a sink passing watermarks on (`ChannelSink`): every one is news
        self.forwards = not grids or any(getattr(n, "forwards_watermarks", False) for n in below)

    def carry(self, share: Share) -> None:
        self.before, self.share = share.before, share

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    STATE_KIND, STATE_VERSION = "source", 1
    state_bytes = 0  # a few integers

    def snapshot(self) -> State:
        """Records seen, the largest event time, the watermark announced and the window grids
        it was judged against: what makes lateness after a rewind the same as without one."""
        return tagged(
            self.STATE_KIND, self.STATE_VERSION, {}, step=self.step_id, position=self.position, high=self.high,
            announced=self.announced, grids=[list(g) for g in self.grids],
        )

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        grids = [tuple(g) for g in meta["grids"]]
        if grids != list(self.grids):
            raise SnapshotError(
                f"step {self.step_id!r}: the state was taken with windows (size, slide) {grids} downstream, this "
                f"dataflow has {list(self.grids)}: lateness would be judged differently; restore it into the "
                "dataflow that wrote it"
            )
        self.position, self.high = meta["position"], meta["high"]
        self.announced = meta["announced"]
        self._next_end = NO_TIME if self.announced == NO_TIME else self._end_after(self.announced)

    def follow_channel(self) -> None:
        """Take the watermark from the channel alone: a producer that sends its own (an ingest
        endpoint's advances with each committed batch, a `ChannelSink` forwards its stream's)."""
        self.follows_channel = True

    async def push(self, batch: Batch) -> None:
        if self.clock is not None:
            self.clock.now = self.now
        if self.time is None or self.follows_channel:
            await self.emit(batch)
            return
        n = len(batch)
        if not n:
            return
        times = batch.view(self.time)
        tmin, tmax = minmax(times)
        first, last = self.position, self.position + n
        self.position = last
        high = max(self.high, tmax)
        if self.before is not None and len(self.before):
            high = max(high, int(self.before[self.share.blocks(last - 1)]))
        end_watermark = max(watermark_of(high, self.max_delay), self.announced)
        if self.exact:
            await self._push_exact(batch, times, first, last, high)
            return
        watermarks = None
        if self.record_times:  # each record's time, in one vectorised pass (moves self.high)
            flat, watermarks = self._watermarks(times, first, last, high)
            batch.times = watermarks
        if watermarks is not None:  # the batch's time: the watermark before its first record
            await self._announce(int(watermarks[0]), always=True)
        elif self.every_batch:
            top = max(self.high, int(times[(0,) * times.ndim]))
            if self.before is not None and len(self.before):
                top = max(top, int(self.before[self.share.blocks(first)]))
            await self._announce(watermark_of(top, self.max_delay), always=True)
        if not self.grids:
            await self.emit(batch)  # no window: in-band watermarks are all there is to forward
            if self.every_batch:
                self.high = high
                await self._announce(end_watermark, always=True)
            return
        if self._cannot_close(tmin, end_watermark):
            # no record of the batch is in a window the batch's watermarks close
            self.high = high
            await self.emit(batch)
            await self._announce(end_watermark, always=self.every_batch)
            return
        if watermarks is None:
            flat, watermarks = self._watermarks(times, first, last, high)
        behind = np.flatnonzero(flat < watermarks)
        if not len(behind):
            await self.emit(batch)
            await self._announce(end_watermark, always=self.every_batch)
            return
        # cut before every record behind the watermark whose watermark closes other windows
        # than the one before it; the first piece (up to the first such record) needs none
        at = watermarks[behind]
        crossed = np.zeros(len(behind) - 1, bool)
        for size, slide in self.grids:
            ends = window_promise(at, size, slide)
            crossed |= ends[1:] != ends[:-1]
        cuts = behind[[0, *(np.flatnonzero(crossed) + 1)]].tolist()
        if cuts[0]:
            await self.emit(batch.select(slice(0, cuts[0])))
        for a, b in zip(cuts, [*cuts[1:], n]):
            await self._announce(int(watermarks[a]))
            await self.emit(batch if (a, b) == (0, n) else batch.select(slice(a, b)))
        await self._announce(end_watermark, always=self.every_batch)

    def _watermarks(self, times, first: int, last: int, high: int) -> tuple[np.ndarray, np.ndarray]:
        """The batch's event times (flat int64) and the watermark at each of its records."""
        flat = (gather(times) if times.ndim > 1 else times).astype(np.int64, copy=False)
        tops = flat
        if self.before is not None and len(self.before):
            tops = np.maximum(flat, self.before[self.share.blocks(np.arange(first, last))])
        tops = np.maximum(np.maximum.accumulate(tops), self.high)
        self.high = high
        return flat, np.maximum(np.maximum(tops, I64_MIN + self.max_delay) - self.max_delay, self.announced)

    async def _push_exact(self, batch: Batch, times, first: int, last: int, high: int) -> None:
        """Pointstamp progress with a user operator downstream: cut the batch where
        the watermark changes and announce it before each piece, so each piece is at one
        logical time, the watermark before its first record (the running maximum of the event
        times minus max_delay, never below the last announced one)."""
        _, watermarks = self._watermarks(times, first, last, high)
        n = len(watermarks)
        cuts = [0, *(np.flatnonzero(watermarks[1:] != watermarks[:-1]) + 1).tolist(), n]
        for a, b in zip(cuts[:-1], cuts[1:]):
            await self._announce(int(watermarks[a]), always=True)
            await self.emit(batch if (a, b) == (0, n) else batch.select(slice(a, b)))

    def _cannot_close(self, tmin: int, watermark: int) -> bool:
        """True if no window holding a time >= tmin ends at or before `watermark`."""
        for size, slide in self.grids:
            first_end = ((tmin - size) // slide + 1) * slide + size
            if first_end <= watermark:
                return False
        return True

    def _end_after(self, watermark: int) -> int:
        """The first window end downstream after the windows complete at `watermark`."""
        return min((int(window_promise(watermark, size, slide)) + slide for size, slide in self.grids), default=I64_MAX)

    async def _announce(self, watermark: int, *, always: bool = False) -> None:
        """Send `watermark` downstream if it is news: higher than the last one and (unless
        `always`) reaching the end of a window downstream, the only thing that changes there."""
        if watermark > self.announced and (always or watermark >= self._next_end):
            self.announced = watermark
            self._next_end = self._end_after(watermark)
            if self.clock is None:
                await super().on_watermark(watermark)
                return
            # pointstamp progress: the source's capability moves; the tracker tells whom it concerns
            old, self.now = self.now, self.clock.at(watermark)
            await self.clock.advance(self, old, self.now)
            self.clock.now = self.now

    async def on_watermark(self, watermark: int) -> None:
        # a watermark in band (from the source's channel) is a floor for the records after it.
        # Under pointstamp progress it moves the capability only where it reaches a window's
        # end (as the records' own watermarks do), unless a step below takes every watermark
        await self._announce(watermark, always=self.clock is None or self.every_batch or self.forwards)

    async def on_end(self) -> None:
        if self.clock is None:
            await super().on_end()
        else:
            await self.clock.release(self, self.now)
