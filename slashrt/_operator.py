"""What users subclass and are handed: `Operator` and its `Context`.

The description of a dataflow (`slashrt._dataflow`) takes Operator instances; the node that
runs one is `slashrt.ops.operator.OperatorNode` (its `Context`'s node: `clock`, `check_output`,
`emit`).
"""

from __future__ import annotations

import numpy as np

from slashrt._batch import Batch
from slashrt.errors import OperatorError
from slashrt.progress.timestamp import Timestamp

__all__ = ["Operator", "Context"]


class Operator:
    """Base class of user operators: override `on_batch`, and `on_notify` to act once a time
    is complete (after `ctx.notify_at(time)`). Both may be `async def` or plain methods.

    Times: by default (`per_time = "grouped"`) on_batch gets each batch whole, once, its
    records in time order: `ctx.times` is each record's epoch (int64, aligned with the rows)
    and `ctx.time` the least of them, the time the operator holds during the call (it may
    emit, and ask to be notified, at that time or later: at any of its records' times). Work
    on the batch with numpy (e.g. notify at `ctx.times.max()` and, in on_notify(t), handle
    every held record with a time <= t) rather than a Python loop per time. `per_time = True`
    calls on_batch once per distinct time, every record at `ctx.time` (one Python call per
    time: slow on millisecond event times); `per_time = False` takes whole batches without
    the records' own times (`ctx.times` all the lower bound), for stateless operators.
    Notifications are exact in every mode.

    State for checkpoints: an operator that keeps anything between calls defines
    `snapshot(self) -> slashrt.State` (named numpy arrays and a small JSON-able meta; slashrt
    copies the arrays, so hand over live ones) and `restore(self, state)`; `STATE_VERSION`
    (default 1) is stored with it, and a state written by a later version is refused. Pending
    `notify_at` requests are taken and restored by slashrt, never by the operator. One whose
    attributes are configuration only (set in `__init__`, never changed) says so with
    `stateless = True`; any other operator with attributes and no `snapshot` is refused by a
    checkpointed run before it starts.

    Keyed state (to resume on another number of executors): an operator behind
    `exchange(key=...)` whose state is per key sets `keyed_by` to the name of the key's field
    in its state. Every array of its `snapshot()` is then a table of records (a structured
    array) with that integer field, and a resume on another executor count gives each
    executor's `restore` the rows of the keys it now owns from every old executor, concatenated
    in executor order, with the meta (which must be the same on every executor: what differs
    per key goes in the tables). A notification is a time, not a key: every new executor is
    notified at every time any old one had asked for, so `on_notify` acts on the rows it holds.
    Operator state that is not keyed is not cut (a resume on another count is refused)."""

    stateless = False
    STATE_VERSION = 1
    keyed_by: str | None = None

    # how batches reach on_batch (above; docs/guide.md, "Operators"): "grouped", True, False
    per_time = "grouped"

    async def on_batch(self, ctx: Context, port: int, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define on_batch(self, ctx, port, batch)")

    async def on_notify(self, ctx: Context, time: Timestamp) -> None:
        return None


class Context:
    """Handed to an operator's callbacks; valid only during the call it was handed to.

    `time` is the least time of the batch's records, the time the operator holds (in
    on_notify: the notified time). `times` (in on_batch) is each record's epoch, an int64
    array aligned with the batch's rows, every one >= `time.epoch` (the loop counters are
    those of `time`). `emit` sends records at `time` or later; `notify_at(t)` asks for
    `on_notify(t)` once nothing at a time <= t can still reach any input of the operator."""

    __slots__ = ("_node", "time", "_active", "_times", "_rows")

    def __init__(self, node, time: Timestamp, times=None, rows: int = 0):
        self._node = node
        self.time = time
        self._active = True
        self._times, self._rows = times, rows

    @property
    def times(self) -> np.ndarray | None:
        """Each record's epoch (int64, aligned with the batch's rows); None in on_notify."""
        if self._times is None and self._rows is not None:
            self._times = np.full(self._rows, self.time.epoch, np.int64)
        return self._times

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
        if batch.times is not None and (time != self.time or self._rows is None):
            # passed on at a later time (or from on_notify): none of its records is earlier
            batch.times = np.maximum(batch.times, time.epoch)
        clock = node.clock
        before, clock.now = clock.now, time
        try:
            await node.emit(batch)
        finally:
            clock.now = before
