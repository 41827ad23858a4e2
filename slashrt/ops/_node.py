"""Runtime operators: push-based nodes fused into one pipeline per input.

A pipeline is a tree of nodes called directly, one after the other, on each batch: no queue
and no task switch between operators. Every node handles three events in stream order:
a batch, a watermark (no later record has an event time below it) and the end of the stream.
"""

from __future__ import annotations

from slashrt._batch import Batch

__all__ = ["Node"]


class Node:
    """Forwards everything to its children; operators override what they change.

    Under pointstamp progress `clock` is the executor's progress (its `now` is the logical
    time of the batch being pushed) and watermarks do not travel down the tree: the tracker
    calls `on_frontier` of the nodes that define it when their input's frontier moves."""

    clock = None

    def __init__(self, step_id: str):
        self.step_id = step_id
        self.children: list[Node] = []

    async def emit(self, batch: Batch) -> None:
        if len(batch):
            for child in self.children:
                await child.push(batch)

    async def push(self, batch: Batch) -> None:
        await self.emit(batch)

    async def emit_at(self, epoch: int, batch: Batch, counters: tuple[int, ...] = ()) -> None:
        """Emit a batch of event time `epoch` (a window's end): under pointstamp progress
        its logical time is that epoch with the loop `counters` of the iteration it belongs to."""
        clock = self.clock
        if clock is None:
            await self.emit(batch)
            return
        before = clock.now
        clock.now = clock.at(epoch, counters)
        try:
            await self.emit(batch)
        finally:
            clock.now = before

    async def on_watermark(self, watermark: int) -> None:
        for child in self.children:
            await child.on_watermark(watermark)

    async def on_end(self) -> None:
        for child in self.children:
            await child.on_end()

    def window_grid(self) -> tuple[int, int] | None:
        """(size, slide) of the event-time windows this node fires, None if it fires none: the
        source above cuts its watermark exactly at their ends (`slashrt.ops.event_time`)."""
        return None

    def walk(self):
        """This node and everything downstream of it."""
        yield self
        for child in self.children:
            yield from child.walk()
