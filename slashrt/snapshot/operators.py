"""Operator state: the one shape every stateful operator snapshots into, and a plan's walk over it.

Every stateful operator has `snapshot() -> State` (a synchronous copy taken between two
batches: exported tables and a few integers, never a reference into live state, nothing that
waits on I/O), `restore(State)` and `state_bytes`. A `State` names its arrays with fixed
strings and keeps small integers in `meta`, with the operator's `kind` and the `version` of its
layout, so that restoring another operator's state, or one a later slashrt wrote, is refused in
one sentence naming the step (`check`).

Keyed tables (window slices, tails, SSB fragments) go in as one group of arrays per table set
(`pack_tables` / `unpack_tables`): the rows of every table concatenated, with the table ids and
their row bounds, so a state has the same few names whatever the number of slices, and is
split by partition with one vectorised pass (`slashrt.ssb.partitioned.split_partitions`).

Ragged groups of arrays by key (a user operator's batches kept per epoch or per `Timestamp`)
go in the same way (`pack_groups` / `unpack_groups`): the keys as int64 rows, row bounds, and
each column's parts concatenated.

`snapshot_plan(plan)` / `restore_plan(plan, states)` take and give back the state of every
stateful node of a built plan, by step id.
"""

from __future__ import annotations

import numpy as np

from slashrt.errors import SnapshotError
from slashrt.snapshot.state_format import State

__all__ = [
    "check",
    "tagged",
    "pack_tables",
    "unpack_tables",
    "pack_groups",
    "unpack_groups",
    "times_array",
    "array_times",
    "snapshot_plan",
    "restore_plan",
    "stateful_nodes",
]


def tagged(kind: str, version: int, arrays: dict[str, np.ndarray], **meta) -> State:
    """An operator's state: its arrays, and `meta` with its kind and layout version."""
    return State(arrays, {"kind": kind, "version": version, **meta})


def check(state: State, step_id: str, kind: str, version: int) -> dict:
    """The state's meta, once it is known to be a `kind` state of a layout this slashrt reads."""
    meta = state.meta if isinstance(state, State) and isinstance(state.meta, dict) else None
    if meta is None or "kind" not in meta:
        raise SnapshotError(f"step {step_id!r}: the state to restore is not an operator state ({state!r:.80})")
    if meta["kind"] != kind:
        raise SnapshotError(
            f"step {step_id!r} is a {kind} operator and cannot restore the state of a {meta['kind']} operator: "
            "the checkpoint belongs to another dataflow (or the dataflow changed)"
        )
    if meta.get("version", 0) > version:
        raise SnapshotError(
            f"step {step_id!r}: its {kind} state has layout version {meta['version']}, this slashrt reads up to "
            f"version {version}: restore it with the slashrt that wrote it (or a later one)"
        )
    return meta


def pack_tables(prefix: str, tables: dict, value_dtype) -> dict[str, np.ndarray]:
    """The arrays of a set of HashAgg tables by id (an int, or a tuple of ints): `<prefix>.ids`
    (one row per table), `.bounds` (its rows are `bounds[i]:bounds[i+1]`), `.keys`, `.counts`,
    `.vals` (every table's rows, concatenated) and `.overflowed` (the sticky flags)."""
    ids = list(tables)
    exported = [tables[i].export() for i in ids]
    width = len(ids[0]) if ids and isinstance(ids[0], tuple) else 1
    id_array = np.array(ids, np.int64).reshape(len(ids), width) if ids else np.empty((0, width), np.int64)
    bounds = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(e[0]) for e in exported], out=bounds[1:])
    vdt = np.dtype("<i8" if value_dtype is None else value_dtype)

    def column(j: int, dtype) -> np.ndarray:
        if len(exported) == 1:  # the common case, one open window: export's fresh arrays, no second copy
            return exported[0][j]
        return np.concatenate([e[j] for e in exported]) if exported else np.empty(0, dtype)

    return {
        f"{prefix}.ids": id_array,
        f"{prefix}.bounds": bounds,
        f"{prefix}.keys": column(0, np.int64),
        f"{prefix}.counts": column(1, np.int64),
        f"{prefix}.vals": column(2, vdt),
        f"{prefix}.overflowed": np.array([tables[i].overflowed for i in ids], bool),
    }


def unpack_tables(prefix: str, arrays: dict[str, np.ndarray]):
    """(id, keys, counts, vals, overflowed) per table of a set `pack_tables` wrote; an id of
    width 1 comes back as an int, a wider one as a tuple."""
    ids, bounds = arrays[f"{prefix}.ids"], arrays[f"{prefix}.bounds"]
    keys, counts, vals = (arrays[f"{prefix}.{c}"] for c in ("keys", "counts", "vals"))
    overflowed = arrays[f"{prefix}.overflowed"]
    for i in range(len(ids)):
        a, b = int(bounds[i]), int(bounds[i + 1])
        table_id = int(ids[i, 0]) if ids.shape[1] == 1 else tuple(int(x) for x in ids[i])
        yield table_id, keys[a:b], counts[a:b], vals[a:b], bool(overflowed[i])


def _row(key) -> tuple[int, ...]:
    """An int, or a `Timestamp` (epoch, counters), as a row of int64s."""
    return (int(key),) if isinstance(key, (int, np.integer)) else (key.epoch, *key.counters)


def _time(row) -> object:
    from slashrt.progress.timestamp import Timestamp  # (progress imports nothing from here)

    return Timestamp(int(row[0]), tuple(int(c) for c in row[1:]))


def times_array(times) -> np.ndarray:
    """`Timestamp`s of one depth as int64 rows (epoch, counters...), in the order given."""
    rows = [_row(t) for t in times]
    return np.array(rows, np.int64).reshape(len(rows), len(rows[0]) if rows else 1)


def array_times(rows: np.ndarray) -> list:
    """The `Timestamp`s of `times_array`'s rows."""
    return [_time(r) for r in np.asarray(rows, np.int64).tolist()]


def pack_groups(prefix: str, groups: dict, columns: dict) -> dict[str, np.ndarray]:
    """Arrays for `groups`: key (an int, or a `Timestamp`) -> a list of parts, each a tuple of
    1-d arrays, one per column of `columns` (name -> dtype). `<prefix>.keys` (int64 rows:
    the int, or epoch and loop counters), `.bounds` (group i's rows are `bounds[i]:bounds[i+1]`)
    and `.<column>` (every part of every group, concatenated in order)."""
    keys = list(groups)
    bounds = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([sum(len(part[0]) for part in groups[k]) for k in keys], out=bounds[1:])
    out = {f"{prefix}.keys": times_array(keys), f"{prefix}.bounds": bounds}
    for j, (name, dtype) in enumerate(columns.items()):
        chunks = [part[j] for k in keys for part in groups[k]]
        out[f"{prefix}.{name}"] = np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.empty(0, dtype)
    return out


def unpack_groups(prefix: str, arrays: dict[str, np.ndarray], columns, *, times: bool = False) -> dict:
    """`pack_groups`' groups back, each as a list of one part (its parts concatenated, in
    order); keys as ints, or as `Timestamp`s with `times`."""
    keys, bounds = arrays[f"{prefix}.keys"].tolist(), arrays[f"{prefix}.bounds"]
    cols = [arrays[f"{prefix}.{name}"] for name in columns]
    out = {}
    for i, row in enumerate(keys):
        key = _time(row) if times else row[0]
        a, b = int(bounds[i]), int(bounds[i + 1])
        out[key] = [tuple(np.array(c[a:b]) for c in cols)]
    return out


def stateful_nodes(plan) -> dict:
    """Step id -> node, for every node of the plan that has state (the shape above, and its
    `STATE_KIND` and `STATE_VERSION`); sinks too that no path from a source reaches (a window's
    sink for late records), whose pending transactions are state as well."""
    nodes = [*plan.nodes(), *plan.sinks]
    return {node.step_id: node for node in nodes if hasattr(node, "STATE_KIND")}


def snapshot_plan(plan) -> dict[str, State]:
    """The state of every stateful node of `plan`, by step id (synchronous copies)."""
    return {step_id: node.snapshot() for step_id, node in stateful_nodes(plan).items()}


def restore_plan(plan, states: dict[str, State]) -> None:
    """Restore every stateful node of `plan` from `states` (by step id). Refused, before any
    node changes, if a state is missing or belongs to a step the plan does not have."""
    nodes = stateful_nodes(plan)
    unknown = sorted(set(states) - set(nodes))
    if unknown:
        raise SnapshotError(
            f"the snapshot holds state for step {unknown[0]!r}, which this dataflow does not have "
            f"(its stateful steps: {', '.join(sorted(nodes)) or 'none'}): restore it into the dataflow that wrote it"
        )
    missing = sorted(set(nodes) - set(states))
    if missing:
        raise SnapshotError(
            f"the snapshot holds no state for step {missing[0]!r} of this dataflow: it was written by another "
            "dataflow (or the dataflow changed); restore it into the dataflow that wrote it"
        )
    for step_id, node in nodes.items():  # every kind and version first: no node half restored
        check(states[step_id], step_id, node.STATE_KIND, node.STATE_VERSION)
    for step_id, node in nodes.items():
        node.restore(states[step_id])


def _packed(prefix: str, by_id: dict, value_dtype, width: int | None = None) -> dict[str, np.ndarray]:
    """`pack_tables`' layout from row pieces gathered per table id (pieces holding one key
    twice are joined when the state is restored: a table merges what it is given); ids of
    `width` ints (default: a window's, 1 for slices and 2 for tails)."""
    ids = sorted(by_id)
    pieces = [by_id[t] for t in ids]
    width = width if width is not None else 2 if prefix.endswith("tails") else 1
    bounds = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([sum(len(k) for k in p[0]) for p in pieces], out=bounds[1:])

    def column(j: int, dtype) -> np.ndarray:
        chunks = [c for p in pieces for c in p[j]]
        return np.concatenate(chunks) if chunks else np.empty(0, dtype)

    return {
        f"{prefix}.ids": np.array(ids, np.int64).reshape(len(ids), width),
        f"{prefix}.bounds": bounds,
        f"{prefix}.keys": column(0, np.int64),
        f"{prefix}.counts": column(1, np.int64),
        f"{prefix}.vals": column(2, np.dtype(value_dtype or "<i8")),
        f"{prefix}.overflowed": np.array([p[3] for p in pieces], bool),
    }
