"""Rescaling: resuming a checkpoint on another number of executors.

SSB partitions are the unit of state (as Flink's key groups are): each old executor's window
state is cut by the partition of each key (`split_partitions`) and each new executor merges the
partitions it now leads (`merge_partitions`). Array sources start afresh on new shares of what
no old executor had fed (`reshare`), lateness judged as in a run without the rescaling; the
transactional sinks' pending transactions go to a successor (`reassigned`), or are settled
(`rescale`) where an old executor has none.
"""

from __future__ import annotations

import numpy as np

from slashrt.errors import SnapshotError
from slashrt.snapshot.runtime import source_position
from slashrt.snapshot.state_format import State

__all__ = ["rescale", "reshare", "reassigned"]


def rescale(flow, plan, role_plan, inputs: dict, restored, executors: int) -> dict:
    """Resume `restored` on another number of executors: refuse what cannot be (one sentence),
    settle the sinks of old executors that have no successor, and return every array source's
    new shares ({source name: [share per executor]})."""
    from slashrt._runtime import _per_source
    from slashrt.snapshot.commit import recover
    from slashrt.snapshot.operators import stateful_nodes

    was, n = restored.meta.get("executors", 1), restored.number
    refuse = f"run(): checkpoint {n} was taken on {was} executor(s) and cannot resume on {executors}:"
    if not restored.meta.get("cluster"):
        raise SnapshotError(
            f"{refuse} one executor keeps its windows whole, not as SSB partitions to reassign; resume it on one executor"
        )
    kinds = {node.STATE_KIND for node in stateful_nodes(role_plan).values()}
    if "route_by_owner" in kinds or "window" in kinds:
        raise SnapshotError(f"{refuse} only SSB state (mode 'slash') is reassigned by partition; resume it with executors={was}")
    ssb = [s for (step, e), s in restored.states.items() if s.meta.get("kind") == "ssb_window"]
    partitions = {s.meta["partitions"] for s in ssb} or {None}
    if role_plan.exchanges() and partitions != {role_plan.exchanges()[0].partitioning.partitions}:
        raise SnapshotError(f"{refuse} it has {partitions.pop()} SSB partitions; give partitions= the same number")
    shares = {}
    for step_id, spec, value in _per_source(plan, inputs, "input"):
        if not isinstance(value, np.ndarray):
            raise SnapshotError(
                f"{refuse} source {step_id!r} makes its own stream per executor; only in-memory arrays are shared out anew"
            )
        fed = [source_position(restored.meta, step_id, i)["fed"] for i in range(was)]
        shares[step_id.split(".", 1)[1]] = reshare(value, spec.time, was, fed, executors)
    for node in plan.sinks:  # output of old executors without a successor: committed up to n, the rest dropped
        for i in range(executors, was):
            part = getattr(node.sink, "for_executor", None)
            if part is not None and getattr(node.sink, "transactional", False):
                recover(part(i), n)
    return shares


def reshare(records: np.ndarray, time: str | None, old: int, fed: list[int], executors: int) -> list:
    """Every new executor's share of what no old executor had fed: old executor i had fed the
    first `fed[i]` records of its share (`_job.share`); the rest, in the input's order, is shared
    out in contiguous runs, each carrying the largest event time of the whole input before it
    (`Share` with irregular blocks), so lateness is judged as in a run without the rescaling."""
    from slashrt.cluster._job import SPLIT_BLOCK, share
    from slashrt.ops.event_time import NO_TIME, Share

    rows = np.arange(len(records))
    left = np.sort(np.concatenate([share(rows, i, old)[fed[i]:] for i in range(old)]))
    # contiguous runs of what is left, cut at SPLIT_BLOCK, dealt round robin to the new executors
    breaks = np.flatnonzero(np.diff(left) != 1) + 1
    starts = np.unique(np.concatenate([[0], breaks, np.arange(0, len(left), SPLIT_BLOCK)])) if len(left) else left
    bounds = np.append(starts, len(left)).astype(np.int64)
    if time is None:
        before = np.full(len(starts), NO_TIME, np.int64)
    else:
        prefix = np.maximum.accumulate(records[time].astype(np.int64)) if len(records) else rows
        first = left[starts] if len(left) else left
        before = np.where(first > 0, prefix[np.maximum(first - 1, 0)], NO_TIME).astype(np.int64)
    shares = []
    for j in range(executors):
        runs = np.arange(j, len(starts), executors)
        pieces = [left[bounds[r] : bounds[r + 1]] for r in runs]
        taken = np.concatenate(pieces) if pieces else left[:0]
        lengths = np.array([len(p) for p in pieces], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(pieces) else lengths
        shares.append(Share(records[taken], before[runs], SPLIT_BLOCK, offsets) if time is not None else records[taken])
    return shares


def reassigned(checkpoint, plan, index: int, executors: int, partitions: int) -> dict:
    """Executor `index`'s states (step id -> State) out of `checkpoint`, taken on another number
    of executors: SSB partitions reassigned to their new leaders (`merge_partitions`), sinks'
    pending transactions of old executors index, index + executors, ... joined; sources start
    afresh on their new shares (`reshare`)."""
    from slashrt.ssb.partitions import Partitioning
    from slashrt.snapshot.operators import merge_partitions, split_partitions, stateful_nodes

    old = checkpoint.meta["executors"]
    before, after = Partitioning(partitions, old), Partitioning(partitions, executors)
    led = set(after.led_by(index).tolist())
    states = {}
    for step_id, node in stateful_nodes(plan).items():
        kind = node.STATE_KIND
        if kind == "ssb_window":
            parts = [
                part for i in range(old)
                for p, part in split_partitions(checkpoint.state(step_id, i), before).items() if p in led
            ]
            states[step_id] = merge_partitions(parts, after, index)
        elif kind == "sink":
            mine = [checkpoint.state(step_id, i) for i in range(index, old, executors)]
            if mine:
                states[step_id] = _joined_sink_states(mine)
    return states


def _joined_sink_states(states: list[State]) -> State:
    pending = sorted({n for s in states for n in s.meta["pending"]})
    if not any("pending.records" in s.arrays for s in states):
        return State({}, {**states[0].meta, "pending": pending})
    by_n: dict[int, list] = {n: [] for n in pending}
    for s in states:
        records, bounds = s.arrays.get("pending.records"), s.arrays.get("pending.bounds")
        for i, n in enumerate(s.meta["pending"]):
            if records is not None:
                by_n[n].append(records[bounds[i] : bounds[i + 1]])
    parts = [np.concatenate(by_n[n]) for n in pending if by_n[n]]
    arrays = {"pending.records": np.concatenate(parts), "pending.bounds": np.cumsum([0, *map(len, parts)]).astype(np.int64)}
    return State(arrays, {**states[0].meta, "pending": [n for n in pending if by_n[n]]})
