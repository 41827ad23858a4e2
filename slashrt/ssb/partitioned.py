"""Keyed window state cut by key partition: the layout a rescaled resume passes through.

SSB partitions are the unit of state when the executor count changes (as Flink's key groups
are): `slashrt.snapshot.rescale` puts every old executor's window state into this layout
(`as_partitioned`: an owner's window as leader state, its fragments as fragments), cuts it by
the partition of each key (`split_partitions`), and each new executor merges the partitions it
now leads (`merge_partitions`) before it leaves the layout as the kind of window the run has.
Checkpoints of slashrt's earlier per-source plans hold their SSB windows in this layout
(`SSB_STATE`): a resume takes them the same way.
"""

from __future__ import annotations

import numpy as np

from slashrt.errors import SnapshotError
from slashrt.ops.event_time import END_TIME
from slashrt.ops.window import NO_TIME, earliest_end
from slashrt.snapshot.operators import _packed, check, unpack_tables
from slashrt.snapshot.state_format import State

__all__ = ["SSB_STATE", "SSB_STATE_VERSION", "split_partitions", "merge_partitions"]

SSB_STATE, SSB_STATE_VERSION = "ssb_window", 1  # the kind and layout of the partitioned state

_TABLE_SETS = ("slices", "tails", "leader.slices", "leader.tails")


def split_partitions(state: State, partitioning) -> dict[int, State]:
    """Cut one executor's window state in this layout (`SSB_STATE`) by the partition of each
    key: partition -> the rows of its keys in every table (leader state and fragments alike),
    with the executor's meta. One vectorised pass per table set."""
    parts = {p: {} for p in range(partitioning.partitions)}
    for prefix in _TABLE_SETS:
        keys = state.arrays[f"{prefix}.keys"]
        owner = partitioning.partition_of(np.ascontiguousarray(keys, np.int64))
        bounds = state.arrays[f"{prefix}.bounds"]
        table_of_row = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        order = np.lexsort((table_of_row, owner))  # by partition, tables in order within one
        cuts = np.searchsorted(owner[order], np.arange(partitioning.partitions + 1))
        for p in range(partitioning.partitions):
            rows = order[cuts[p] : cuts[p + 1]]
            tables = table_of_row[rows]
            counts = np.bincount(tables, minlength=len(bounds) - 1)
            part_bounds = np.zeros(len(bounds), np.int64)
            np.cumsum(counts, out=part_bounds[1:])
            parts[p].update({
                f"{prefix}.ids": state.arrays[f"{prefix}.ids"],
                f"{prefix}.bounds": part_bounds,
                f"{prefix}.overflowed": state.arrays[f"{prefix}.overflowed"],
                **{f"{prefix}.{c}": state.arrays[f"{prefix}.{c}"][rows] for c in ("keys", "counts", "vals")},
            })
    return {p: State(arrays, dict(state.meta)) for p, arrays in parts.items()}


def merge_partitions(parts: list[State], partitioning, index: int) -> State:
    """The SSB state of executor `index` under `partitioning` (a new executor count), from the
    partition states (`split_partitions`) of the partitions it now leads, from every old executor.

    Old fragments join the leader state as their deltas would have at their epoch's end: under
    the promise of the watermark their executor shipped last (windows closed there stay closed
    to them, as tails). Old leaders may have fired up to different times (an unaligned
    checkpoint's watermarks in flight to some; owners, each on the progress it
    had heard of): the merged windows have fired up to the least of them, and the tables of a
    leader that had fired further join as tails closed at its time, so that the windows up to
    it fire again with the other leaders' keys only (its own were emitted). Epochs restart from
    0 on every new executor (they all restart together); the late-record count carries over to
    executor 0 only."""
    if not parts:
        raise SnapshotError(f"no partition state to give executor {index}: pass the states of the partitions it leads")
    metas = [check(part, part.meta.get("step", "?") if isinstance(part.meta, dict) else "?", SSB_STATE,
                   SSB_STATE_VERSION) for part in parts]
    first = metas[0]
    size, slide, slice_len = first["size"], first["slide"], first["slice_len"]
    leader_fired = min(m["leader"]["fired_until"] for m in metas)
    unfired = NO_TIME if leader_fired == NO_TIME else ((leader_fired - size) // slide + 1) * slide
    starts = [m["leader"]["next_start"] for m in metas if m["leader"]["next_start"] is not None]
    tables: dict[str, dict] = {"leader.slices": {}, "leader.tails": {}}
    for part, meta in zip(parts, metas):
        fired = meta["leader"]["fired_until"]
        past = fired if fired > leader_fired else NO_TIME  # its leader fired the windows up to it
        for prefix in _TABLE_SETS:
            leader = prefix.startswith("leader.")
            for table_id, keys, counts, vals, overflowed in unpack_tables(prefix, part.arrays):
                empty = not len(keys) and not overflowed
                if empty and not leader:  # (a leader's are kept: a tail's windows fire with its slice)
                    continue
                # the end of the last window it must not join: a leader's table, the windows its
                # leader fired past the merged ones; a fragment, those closed when it was folded
                s, closed = (table_id, NO_TIME) if prefix.endswith("slices") else table_id
                closed = max(closed, past if leader else meta["shipped_promise"])
                earliest = earliest_end(s, size, slide, slice_len)
                target, tid = ("leader.slices", s) if earliest > closed else ("leader.tails", (s, closed))
                if not leader:
                    starts.append(max(earliest - size, unfired))
                if target == "leader.tails":
                    tables["leader.slices"].setdefault(s, [[], [], [], False])  # so its windows fire
                    if empty:
                        continue
                got = tables[target].setdefault(tid, [[], [], [], False])
                got[0].append(keys), got[1].append(counts), got[2].append(vals)
                got[3] = got[3] or overflowed
    vdt = first["value_dtype"]
    arrays = {**_packed("slices", {}, vdt), **_packed("tails", {}, vdt)}
    for prefix, by_id in tables.items():
        arrays.update(_packed(prefix, by_id, vdt))
    # Every new executor starts where the least advanced old one whose stream had not ended
    # stood (the records left were all read after one's watermark): it has shipped up to that
    # watermark, so an owner closes to a helper's fragments the windows the helper closed
    # (whatever had been in flight to the old owners).
    live = [m for m in metas if END_TIME not in (m["watermark"], m["shipped_promise"])] or metas
    meta = {
        **first,
        "watermark": min(m["watermark"] for m in live),
        "shipped_promise": min(m["shipped_promise"] for m in live),
        "fired_until": min(m["fired_until"] for m in live),
        # each old executor's late count once (its meta is in every partition cut from it)
        "late_records": sum({m["index"]: m["late_records"] for m in metas}.values()) if index == 0 else 0,
        "next_start": None,
        "leader": {**first["leader"], "next_start": min(starts, default=None), "fired_until": leader_fired,
                   "late_records": 0},
        "partitions": partitioning.partitions,
        "executors": partitioning.executors,
        "index": index,
    }
    return State(arrays, meta)
