"""Graph operators: user operators with several inputs and notifications, union, loop steps.

These nodes run only under pointstamp progress (`slashrt.scheduler._pointstamp`), which sets
`clock`: the executor's progress, holding `now`, the logical time (`Timestamp`) of the batch
being pushed. A call tree is synchronous, so whoever starts one sets `now` (a source, the
feedback queue, a notification) and a node that changes the time (loop ingress and egress, an
operator emitting at a later time, a window firing) sets it for its own emission and restores
it. A multi-input node is called from each upstream through a `Port`, which names the input.

- `Operator` / `Context`: what users subclass and are handed (on_batch, on_notify, emit,
  notify_at); `OperatorNode` runs one.
- `UnionNode`: forwards every input's batches.
- `EnterNode`, `FeedbackNode`, `LeaveNode`: a loop's ingress (counter 0 appended; feedbacks
  join at input 1), feedback (counter + 1, queued on the executor, never pushed recursively)
  and egress (counter dropped).
"""

from __future__ import annotations

import inspect

from slashrt._batch import Batch
from slashrt._dataflow import FeedbackSpec, OperatorSpec, is_async
from slashrt.errors import OperatorError
from slashrt.ops._node import Node
from slashrt.ops.stateless import UserErrors, user_batch
from slashrt.progress.timestamp import Timestamp

__all__ = [
    "Operator",
    "Context",
    "ApplyBoth",
    "OperatorNode",
    "UnionNode",
    "EnterNode",
    "FeedbackNode",
    "LeaveNode",
    "Port",
]


class Operator:
    """Base class of user operators: override `on_batch`, and `on_notify` to act once a time
    is complete (after `ctx.notify_at(time)`). Both may be `async def` or plain methods."""

    # every batch handed to on_batch is at one logical time (ctx.time): a source above cuts
    # its batches where its watermark changes. A stateless operator sets it False and takes
    # whole batches at their lower-bound time (the watermark before their first record).
    per_time = True

    async def on_batch(self, ctx: Context, port: int, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define on_batch(self, ctx, port, batch)")

    async def on_notify(self, ctx: Context, time: Timestamp) -> None:
        return None


class Context:
    """Handed to an operator's callbacks; valid only during the call it was handed to.

    `time` is the batch's time (in on_notify: the notified time). `emit` sends records at
    `time` or later; `notify_at(t)` asks for `on_notify(t)` once nothing at a time <= t can
    still reach any input of the operator."""

    __slots__ = ("_node", "time", "_active")

    def __init__(self, node: OperatorNode, time: Timestamp):
        self._node = node
        self.time = time
        self._active = True

    @property
    def step_id(self) -> str:
        return self._node.step_id

    def _check_time(self, time, what: str) -> Timestamp:
        node = self._node
        if not self._active:
            raise OperatorError(
                node.step_id,
                f"{what} with a context whose call returned (time {self.time} may be complete already); use the "
                "ctx of the current on_batch/on_notify call",
            )
        if not isinstance(time, Timestamp):
            raise OperatorError(node.step_id, f"{what}: {time!r} is no slashrt.Timestamp")
        if time.depth != self.time.depth:
            raise OperatorError(
                node.step_id,
                f"{what}: time {time} has {time.depth} loop counters but the operator runs inside {self.time.depth} "
                "loops",
            )
        if not self.time.less_equal(time):
            raise OperatorError(
                node.step_id,
                f"{what} at time {time}, below the time it holds {self.time}: an operator may only act at its "
                "current time or later",
            )
        return time

    def notify_at(self, time: Timestamp) -> None:
        self._node.clock.request(self._node, self._check_time(time, "notify_at"))

    async def emit(self, records, *, port: int = 0, time: Timestamp | None = None) -> None:
        node = self._node
        time = self._check_time(self.time if time is None else time, "emit")
        if port != 0:
            raise OperatorError(node.step_id, f"emit(port={port}): the operator has one output, port 0")
        batch = node.check_output(records)
        if batch is None or not len(batch):
            return
        clock = node.clock
        before, clock.now = clock.now, time
        try:
            await node.emit(batch)
        finally:
            clock.now = before


class ApplyBoth(Operator):
    """`connect(...).apply(fn)`: fn(batch, port) -> Batch | array | None, emitted at once.
    Stateless, so it takes whole batches: their time is a lower bound of their records'."""

    per_time = False

    def __init__(self, fn):
        self.fn = fn
        self._async = is_async(fn)

    async def on_batch(self, ctx: Context, port: int, batch: Batch) -> None:
        out = self.fn(batch, port)
        if self._async:
            out = await out
        if out is not None:
            await ctx.emit(out)


class Port(Node):
    """The edge into input `port` of a multi-input node."""

    def __init__(self, target: Node, port: int):
        super().__init__(f"{target.step_id}.in{port}")
        self.target = target
        self.port = port

    async def push(self, batch: Batch) -> None:
        await self.target.push_port(batch, self.port)

    async def on_watermark(self, watermark: int) -> None:
        return None  # multi-input nodes take progress from the tracker, never from one input

    async def on_end(self) -> None:
        return None

    def walk(self):
        yield from self.target.walk()


class OperatorNode(Node):
    """Runs a user `Operator`; its failures name the step."""

    def __init__(self, spec: OperatorSpec):
        super().__init__(spec.step_id)
        self.op = spec.op
        self.inputs = len(spec.ups)
        self._names = tuple(spec.fields)
        self.requested: set[Timestamp] = set()  # notifications asked for, not yet delivered

    def check_output(self, records) -> Batch | None:
        if records is None:
            return None
        fix = "declare the columns it emits with schema="
        return user_batch(self.step_id, records, self._names, did="emitted", fix=fix)

    async def _call(self, method, ctx: Context, *args) -> None:
        try:
            with UserErrors(self.step_id, "operator"):
                out = method(ctx, *args)
                if inspect.isawaitable(out):
                    await out
        finally:
            ctx._active = False

    async def push_port(self, batch: Batch, port: int) -> None:
        await self._call(self.op.on_batch, Context(self, self.clock.now), port, batch)

    async def push(self, batch: Batch) -> None:
        await self.push_port(batch, 0)

    async def notify(self, time: Timestamp) -> None:
        clock = self.clock
        before, clock.now = clock.now, time
        try:
            await self._call(self.op.on_notify, Context(self, time), time)
        finally:
            clock.now = before


class UnionNode(Node):
    async def push_port(self, batch: Batch, port: int) -> None:
        await self.emit(batch)


class EnterNode(Node):
    """Loop ingress: input 0 from outside (loop counter 0 appended), input 1 the feedbacks'
    batches (their time is set already)."""

    async def push_port(self, batch: Batch, port: int) -> None:
        if port == 1:
            await self.emit(batch)
            return
        clock = self.clock
        before = clock.now
        clock.now = Timestamp(before.epoch, (*before.counters, 0))
        try:
            await self.emit(batch)
        finally:
            clock.now = before

    async def push(self, batch: Batch) -> None:
        await self.push_port(batch, 0)


class LeaveNode(Node):
    """Loop egress: the innermost loop counter dropped."""

    async def push(self, batch: Batch) -> None:
        clock = self.clock
        before = clock.now
        clock.now = Timestamp(before.epoch, before.counters[:-1])
        try:
            await self.emit(batch)
        finally:
            clock.now = before


class FeedbackNode(Node):
    """Loop feedback: queues its batches on the executor, one iteration later."""

    def __init__(self, spec: FeedbackSpec, enter: EnterNode):
        super().__init__(spec.step_id)
        self.loop = spec.loop
        self.max_iterations = spec.max_iterations
        self.enter = enter

    async def push(self, batch: Batch) -> None:
        now = self.clock.now
        iteration = now.counters[-1] + 1
        if self.max_iterations is not None and iteration > self.max_iterations:
            raise OperatorError(
                self.step_id,
                f"loop {self.loop!r} reached its bound of max_iterations={self.max_iterations} at epoch {now.epoch} "
                f"(time {now}) and still feeds back {len(batch)} records; raise the bound or make the loop converge",
            )
        records = batch.to_numpy()
        if not records.flags.owndata:  # a view into a channel slot, reused once released
            records = records.copy()
        self.clock.enqueue(self, Batch(records), Timestamp(now.epoch, (*now.counters[:-1], iteration)))
