"""The back-edge log of a loop in a checkpointed run on one executor (the ABS seed's algorithm 2).

On one executor the executor is the alignment unit: every step runs in the call trees its
inputs start, so once every source delivered barrier n, every record before the barriers has
gone through every step, except the batches that loops fed back. Those wait on the executor's
feedback queue (`PointstampProgress.queue`): the queue is the loops' back edges, found from the
graph (`back_edges_of`: the edges leaving a feedback step). So the executor is a `LoopHead`:

    sources ──|n|──► align (regular inputs only) ──► Snapshot(n): copy every node's state
                                                     enqueue_barrier(f, n) per back edge f
    feedback queue:  [.. b9 b8 |n| b7 b6]  ──► run_queued
                      b6, b7 delivered as always and logged (record); |n| popped: returned(f, n)
                      every back edge returned n: LogComplete(n) -> the log is part of checkpoint n

The log holds exactly the batches in flight on the back edges at the snapshot (FIFO: the
barrier is queued behind them), each with its logical time. It is written as one part per
back edge, named by its feedback step (`kind` "back_edge_log"): the logged batches' records
(`records`, concatenated, batch i's rows `bounds[i]:bounds[i+1]`; batches of different record
layouts, which a step without a schema may send, each as `batch.<i>`), their times (`times`, int64 rows epoch, counters...) and their places in
the queue's order across edges (`seq`). Recovery restores the nodes' state, then `replay`
queues the logged batches again in that order and delivers each once, before any new input.

In the stop-the-world mode, for a stop's savepoint (the executor computes nothing after it) and
for the final checkpoint (taken after the executor ended) nothing runs between the snapshot and
the log: the log is what the queue holds (`take`).

On a cluster, exchanges with loops also log what they ship between their
barrier and the snapshot: an `Outbox` part per exchange (`slashrt.snapshot.cluster_agent`).
"""

from __future__ import annotations

import time as _time

import numpy as np
import trio

from slashrt._batch import Batch
from slashrt.errors import SnapshotError
from slashrt.snapshot.alignment import LogComplete, LoopHead, LoopLog, back_edges_of
from slashrt.snapshot.operators import array_times, check, tagged, times_array
from slashrt.snapshot.state_format import State

__all__ = ["BackEdgeLog", "LOG_KIND", "loop_feedbacks", "OUTBOX", "Outbox", "outbox_steps"]

LOG_KIND, LOG_VERSION = "back_edge_log", 1


def loop_feedbacks(plan) -> dict:
    """Feedback step id -> its node, for every back edge of the plan's graph (none: {})."""
    steps = list(plan.flow.steps)
    return {steps[out.node]: plan.steps[steps[out.node]] for out, _ in back_edges_of(plan.graph)}


class BackEdgeLog:
    """The executor as a loop head: barrier alignment over `regular` inputs (the sources), the
    log of what the feedback queue delivers between a snapshot and its barrier's return."""

    def __init__(self, feedbacks: dict, regular, clock=_time.perf_counter):
        self.feedbacks = feedbacks  # step id -> FeedbackNode
        self.head = LoopHead(regular, list(feedbacks), clock)
        self.progress = None  # PointstampProgress, `attach`ed once the executor's tracker exists
        self._logs: dict[int, LoopLog] = {}  # closed, not yet written
        self._closed: dict[int, trio.Event] = {}

    @property
    def steps(self) -> list[str]:
        """The parts this log adds to every checkpoint: one per back edge."""
        return list(self.feedbacks)

    def attach(self, progress) -> None:
        self.progress = progress
        progress.back_edges = self

    # -- taking ----------------------------------------------------------------------------------
    def open(self, n: int) -> None:
        """`Snapshot(n)` was answered and the state copied: barrier n goes round every loop."""
        self._closed[n] = trio.Event()
        for feedback in self.feedbacks.values():
            self.progress.enqueue_barrier(feedback, n)

    def take(self, n: int) -> None:
        """Nothing runs until the log is written (stop-the-world, a stop's savepoint, or the
        executor ended): the log of n is what the queue holds now."""
        queued = () if self.progress is None else self.progress.queue
        entries = [(f.step_id, (batch, t)) for f, batch, t, location in queued if location is not None]
        self.head.taken(n)
        self._close(LoopLog(n, tuple(entries)))

    def ended(self) -> None:
        """The executor's run ended, so its feedback queue is empty and every barrier came back:
        a log still open would keep its checkpoint's write waiting for ever, so say so instead."""
        open_logs = sorted(n for n, closed in self._closed.items() if not closed.is_set())
        if open_logs:
            raise SnapshotError(
                f"checkpoints {open_logs}: the run ended but their barriers never came back round the loops "
                f"(open in the loop head: {self.head.logging}); this is a slashrt bug, please report it"
            )

    def record(self, step_id: str, batch, time) -> None:
        self.head.record(step_id, (batch, time))

    def returned(self, step_id: str, n: int) -> None:
        for outcome in self.head.barrier(step_id, n):
            if isinstance(outcome, LogComplete):
                self._close(outcome.log)

    def _close(self, log: LoopLog) -> None:
        self._logs[log.checkpoint] = log
        self._closed.setdefault(log.checkpoint, trio.Event()).set()

    async def states(self, n: int) -> dict[str, State]:
        """Once barrier n came back on every back edge: the log as one state per back edge."""
        await self._closed[n].wait()
        del self._closed[n]
        log = self._logs.pop(n)
        by_edge = {step_id: ([], [], []) for step_id in self.feedbacks}
        for seq, (step_id, (batch, t)) in enumerate(log.replay()):
            records, times, order = by_edge[step_id]
            records.append(batch.to_numpy() if isinstance(batch, Batch) else batch)
            times.append(t)
            order.append(seq)
        return {
            step_id: tagged(
                LOG_KIND, LOG_VERSION, {"times": times_array(times), "seq": np.array(order, np.int64), **_pack(records)},
                step=step_id, checkpoint=n, batches=len(records),
            )
            for step_id, (records, times, order) in by_edge.items()
        }

    # -- recovery ----------------------------------------------------------------------------------
    def restored(self, states: dict[str, State]) -> list[tuple[str, np.ndarray, object]]:
        """The logged (feedback step, records, time) of a checkpoint's log parts, in queue
        order; a log part missing, or of a back edge this dataflow does not have, is refused."""
        unknown = sorted(set(states) - set(self.feedbacks))
        missing = sorted(set(self.feedbacks) - set(states))
        if unknown or missing:
            raise SnapshotError(
                f"the checkpoint's back-edge logs ({', '.join(sorted(states)) or 'none'}) do not match this dataflow's "
                f"loops ({', '.join(sorted(self.feedbacks)) or 'none'}): restore it into the dataflow that wrote it"
            )
        entries = []
        for step_id, state in states.items():
            meta = check(state, step_id, LOG_KIND, LOG_VERSION)
            batches = _unpack(state.arrays, meta["batches"])
            for seq, t, records in zip(state.arrays["seq"].tolist(), array_times(state.arrays["times"]), batches):
                entries.append((seq, step_id, records, t))
        return [(step_id, records, t) for _, step_id, records, t in sorted(entries, key=lambda e: e[0])]

    async def replay(self, entries) -> None:
        """Recovery, after the state: each logged batch back on its edge, delivered once, in
        the order it was logged (what it feeds back queues behind them)."""
        for step_id, records, t in entries:
            self.progress.enqueue(self.feedbacks[step_id], Batch(np.array(records)), t)
        for _ in entries:
            await self.progress.run_queued()


def _pack(records: list[np.ndarray]) -> dict[str, np.ndarray]:
    if len({r.dtype for r in records}) == 1:  # one layout: one array, not one per batch
        bounds = np.zeros(len(records) + 1, np.int64)
        np.cumsum([len(r) for r in records], out=bounds[1:])
        return {"records": np.concatenate(records), "bounds": bounds}
    return {f"batch.{i}": r for i, r in enumerate(records)}


def _unpack(arrays: dict[str, np.ndarray], count: int) -> list[np.ndarray]:
    if "records" in arrays:
        bounds = arrays["bounds"].tolist()
        return [arrays["records"][a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return [arrays[f"batch.{i}"] for i in range(count)]


# -- exchanges on a cluster, with loops: their outboxes (`snapshot.cluster_agent`) --

OUTBOX = ".outbox"  # an exchange's outbox part: <exchange step id>.outbox


def outbox_steps(plan) -> list[str]:
    """The outbox parts a checkpoint of a flow with loops holds per executor: one per exchange."""
    return [x.step_id + OUTBOX for x in plan.exchanges()]


class Outbox:
    """An exchange's rows shipped after its barrier and before the executor's snapshot (a flow
    with loops on a cluster: `slashrt.snapshot.cluster_agent`): records in flight at the
    cut, which the receiver's snapshot does not hold."""

    STATE_KIND, STATE_VERSION = "exchange_outbox", 1

    def __init__(self, exchange):
        self.exchange = exchange
        self.step_id = exchange.step_id + OUTBOX

    def snapshot(self) -> State:
        owners, rows = self.exchange.take_outbox()
        return tagged(self.STATE_KIND, self.STATE_VERSION, {"owners": owners, "rows": rows}, step=self.step_id)

    def restore(self, state: State) -> None:
        check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        self.exchange.reship(state.arrays["owners"], state.arrays["rows"])
