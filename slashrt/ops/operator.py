"""Graph operators: user operators with several inputs and notifications, union, loop steps.

These nodes run only under pointstamp progress (`slashrt.scheduler._pointstamp`), which sets
`clock`: the executor's progress, holding `now`, the logical time (`Timestamp`) of the batch
being pushed. A call tree is synchronous, so whoever starts one sets `now` (a source, the
feedback queue, a notification) and a node that changes the time (loop ingress and egress, an
operator emitting at a later time, a window firing) sets it for its own emission and restores
it. A multi-input node is called from each upstream through a `Port`, which names the input.
`now` is the least time of the batch's records; their own times, where a user operator below
reads them, travel with the batch (`Batch.times`, `Context.times`). Every user call ends with
`pace()`, which lets the event loop turn if it has not for a few ms (heartbeats, reports).

- `Operator` / `Context` (`slashrt._operator`): what users subclass and are handed (on_batch,
  on_notify, emit, notify_at); `OperatorNode` runs one, and takes its state for checkpoints: the operator's own
  (`snapshot()` / `restore(state)`, declared by the user: a `State` of named numpy arrays and
  JSON meta) together with its pending notification requests, the capabilities it holds.
- `UnionNode`: forwards every input's batches.
- `EnterNode`, `FeedbackNode`, `LeaveNode`: a loop's ingress (counter 0 appended; feedbacks
  join at input 1), feedback (counter + 1, queued on the executor, never pushed recursively)
  and egress (counter dropped).
"""

from __future__ import annotations

import inspect
import json

import numpy as np

from slashrt._batch import Batch
from slashrt._dataflow import FeedbackSpec, OperatorSpec, is_async, register_apply_both
from slashrt._operator import Context, Operator  # (what users subclass and are handed)
from slashrt.errors import DataflowError, OperatorError, SnapshotError
from slashrt.ops._node import Node
from slashrt.ops.stateless import UserErrors, user_batch
from slashrt.progress.timestamp import Timestamp
from slashrt.scheduler._budget import calling, pace
from slashrt.snapshot.operators import array_times, check, tagged, times_array
from slashrt.snapshot.state_format import State

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
    "declares_state",
    "undeclared_state",
    "keyed_rows",
]


GROUPED = "grouped"
_PER_TIME = (GROUPED, True, False)


class ApplyBoth(Operator):
    """`connect(...).apply(fn)`: fn(batch, port) -> Batch | array | None, emitted at once.
    Stateless, so it takes whole batches: their time is a lower bound of their records'."""

    per_time = False

    stateless = True  # fn is the step's code, not state

    def __init__(self, fn):
        self.fn = fn
        self._async = is_async(fn)

    async def on_batch(self, ctx: Context, port: int, batch: Batch) -> None:
        out = self.fn(batch, port)
        if self._async:
            out = await out
        if out is not None:
            await ctx.emit(out)



register_apply_both(ApplyBoth)  # connect(...).apply(fn) in slashrt._dataflow makes one

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
        if not any(spec.op.per_time is v or spec.op.per_time == v for v in _PER_TIME):
            raise DataflowError(
                f"step {spec.step_id!r}: {type(spec.op).__name__}.per_time is {spec.op.per_time!r}; it must be "
                f"{GROUPED!r} (the default: whole batches, each record's time in ctx.times), True (one call per time) "
                "or False (whole batches at their least time)"
            )
        if spec.op.keyed_by is not None and not declares_state(spec.op):
            raise DataflowError(
                f"step {spec.step_id!r}: {type(spec.op).__name__}.keyed_by is {spec.op.keyed_by!r} but it declares no "
                "state: define snapshot() -> slashrt.State (tables with that key field) and restore(state)"
            )
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
            with UserErrors(self.step_id, "operator"), calling(self.step_id, method.__name__):
                out = method(ctx, *args)
                if inspect.isawaitable(out):
                    await out
        finally:
            ctx._active = False
        await pace()  # many short calls in one pipeline call must not starve heartbeats and reports

    async def push_port(self, batch: Batch, port: int) -> None:
        ctx = Context(self, self.clock.now, batch.times, len(batch))
        await self._call(self.op.on_batch, ctx, port, batch)

    async def push(self, batch: Batch) -> None:
        await self.push_port(batch, 0)

    async def notify(self, time: Timestamp) -> None:
        clock = self.clock
        before, clock.now = clock.now, time
        try:
            await self._call(self.op.on_notify, Context(self, time, rows=None), time)
        finally:
            clock.now = before

    # -- state (the shape: slashrt.snapshot.operators) ---------------------------------------------
    STATE_KIND, STATE_VERSION = "operator", 1

    @property
    def state_bytes(self) -> int:
        return 0  # what the user's operator holds is its own business; its snapshot's size is reported

    def snapshot(self) -> State:
        """The pending notification requests (the capabilities the operator holds) and, if it
        declares state, a copy of the user operator's `State` (arrays under `user.`)."""
        op, arrays, user = self.op, {"requested": times_array(sorted(self.requested, key=Timestamp.sort_key))}, None
        declared = declares_state(op)
        if declared:
            with UserErrors(self.step_id, "snapshot()"):
                state = op.snapshot()
            if not isinstance(state, State) or not isinstance(state.arrays, dict):
                raise OperatorError(
                    self.step_id, f"snapshot() returned {type(state).__name__}, not a slashrt.State(arrays, meta)"
                )
            for name, array in state.arrays.items():
                if not isinstance(name, str) or not isinstance(array, np.ndarray) or array.dtype.hasobject:
                    raise OperatorError(
                        self.step_id, f"snapshot(): state array {name!r} is not a numpy array of numbers, bytes or "
                        "records (a State holds named numpy arrays; small values go in its meta)",
                    )
                _check_keyed(self.step_id, op, name, array)
                arrays[f"user.{name}"] = array.copy()  # the operator goes on changing its own
            try:
                user = json.loads(json.dumps(state.meta))  # a copy, and JSON-able
            except (TypeError, ValueError) as exc:
                raise OperatorError(self.step_id, f"snapshot(): the state's meta is not JSON-able: {exc}") from None
        return tagged(
            self.STATE_KIND, self.STATE_VERSION, arrays, step=self.step_id, operator=_name(op),
            operator_version=op.STATE_VERSION, declared=declared, user=user, keyed_by=op.keyed_by if declared else None,
        )

    def restore(self, state: State) -> None:
        """The requests go back as they were (the progress tracker counts them again); the
        user operator's state to its `restore`. Another operator's state, or one a later
        `STATE_VERSION` wrote, is refused naming the step."""
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        op, name = self.op, _name(self.op)
        if meta["operator"] != name:
            raise SnapshotError(
                f"step {self.step_id!r} runs operator {name} and cannot restore the state of operator "
                f"{meta['operator']}: the checkpoint belongs to another dataflow (or the dataflow changed)"
            )
        if meta["operator_version"] > op.STATE_VERSION:
            raise SnapshotError(
                f"step {self.step_id!r}: the state of operator {name} has STATE_VERSION {meta['operator_version']}, "
                f"this {name} reads up to {op.STATE_VERSION}: restore it with the code that wrote it"
            )
        if meta["declared"] != declares_state(op):
            raise SnapshotError(
                f"step {self.step_id!r}: operator {name} {'no longer' if meta['declared'] else 'now'} declares "
                "state (snapshot/restore) but the checkpoint was taken with the other: restore it with the code that "
                "wrote it"
            )
        self.requested = set(array_times(state.arrays["requested"]))
        if meta["declared"]:
            arrays = {k.removeprefix("user."): a for k, a in state.arrays.items() if k.startswith("user.")}
            with UserErrors(self.step_id, "restore()"):
                op.restore(State(arrays, meta["user"]))


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
        queued = Batch(records)
        queued.times = batch.times  # each record goes round at its own epoch
        self.clock.enqueue(self, queued, Timestamp(now.epoch, (*now.counters[:-1], iteration)))


def _check_keyed(step_id: str, op: Operator, name: str, array: np.ndarray) -> None:
    """A keyed state's array must be a table of records with the key's integer field."""
    key = op.keyed_by
    if key is None:
        return
    field = array.dtype.fields.get(key) if array.dtype.names else None
    if array.ndim != 1 or field is None or field[0].kind not in "iu":
        raise OperatorError(
            step_id, f"snapshot(): {type(op).__name__}.keyed_by is {key!r}, so every state array is a table of records "
            f"with an integer field {key!r} (cut by key on another executor count), and array {name!r} is "
            f"{array.dtype if array.ndim == 1 else f'{array.ndim}-d'}",
        )


def keyed_rows(step_id: str, states: list[State], key: str, owned) -> State:
    """One executor's `OperatorNode` state after a rescaling, out of every old executor's
    (`states`, in executor order): the rows of its keyed state (field `key`) whose key `owned`
    (int64 keys -> bool mask) says it owns, concatenated; every notification any old one had
    requested; the meta, which must be the same on every old executor."""
    first = states[0].meta
    metas = {json.dumps(s.meta["user"], sort_keys=True) for s in states}
    if len(metas) > 1:
        raise SnapshotError(
            f"step {step_id!r}: its keyed state's meta differs between the executors that took it, so it cannot be cut "
            "by key: keep what differs per key in the state's tables (the meta is what every executor shares)"
        )
    requested = sorted({t for s in states for t in array_times(s.arrays["requested"])}, key=Timestamp.sort_key)
    arrays = {"requested": times_array(requested) if requested else states[0].arrays["requested"][:0]}
    for name in (n for n in states[0].arrays if n.startswith("user.")):
        tables = [s.arrays[name] for s in states]
        if len({t.dtype for t in tables}) > 1:
            raise SnapshotError(f"step {step_id!r}: its keyed state's table {name[5:]!r} has another type on each executor")
        arrays[name] = np.concatenate([t[owned(t[key].astype(np.int64, copy=False))] for t in tables])
    return State(arrays, dict(first))


def _name(op: Operator) -> str:
    return f"{type(op).__module__}.{type(op).__qualname__}"


def declares_state(op: Operator) -> bool:
    """Does the operator take and give its state itself (`snapshot` and `restore`)?"""
    return callable(getattr(op, "snapshot", None)) and callable(getattr(op, "restore", None))


def undeclared_state(op: Operator) -> str | None:
    """Why a checkpointed run cannot take `op`'s state (one clause), or None if it can:
    attributes and no `snapshot`/`restore`, or one of the two without the other."""
    has = [m for m in ("snapshot", "restore") if callable(getattr(op, m, None))]
    if len(has) == 1:
        missing = ({"snapshot", "restore"} - set(has)).pop()
        return f"defines {has[0]}() but no {missing}()"
    if has or op.stateless:
        return None
    slots = {name for cls in type(op).__mro__ for name in getattr(cls, "__slots__", ()) if hasattr(op, name)}
    held = sorted(set(getattr(op, "__dict__", {})) | slots)
    if not held:
        return None
    return (
        f"holds state ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}) but declares none: define "
        "snapshot() -> slashrt.State and restore(state), or set stateless = True if those attributes never change"
    )
