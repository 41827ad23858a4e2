"""Rescaling: resuming a checkpoint on another number of executors, or in the other mode (its
keyed windows' states of the other kind: `other_mode`, taken through the same path).

SSB partitions are the unit of state (as Flink's key groups are): each old executor's window
state enters the partitioned layout (`as_partitioned`: an owner's windows as leader state, on
the SSB its fragments as fragments), is cut by the partition of each key (`split_partitions`),
and each new executor merges the partitions it now leads (`merge_partitions`) and leaves the
layout as the kind of window the run has (`as_window`, `as_graph_window`), inside loops
iteration by iteration (`_loop_window`). A window's old owners may have fired it up to
different times (each fires on the progress it has heard of): the merged window has fired up
to the least of them, and an owner's tables that had fired further join it as tails closed at
its time, so the windows in between fire again with the keys of the owners that had not fired
them only (`merge_partitions`). A user operator's keyed state goes by key to its new owners
(`Operator.keyed_by`, `keyed_rows`); operator state that is not keyed is refused
(`_refuse_unkeyed_state`). Rows in flight between executors (an unaligned checkpoint's channel
parts, the loops' outboxes) go to their keys' new owners, taken before any new input
(`graph_in_flight`, `ssb.graph_window.adopt_in_flight`); the back edges' logs to new executor
i % N (`_logs`).

Array sources start afresh on new shares of what no old executor had fed (`reshare`),
lateness judged as in a run without the rescaling; a FileSource's files are splits with
offsets (each new executor reads its files from where the old ones had stopped in them:
`FileSource.rescaled_starts`, `restarted`); a connector with `rescaled` (RedisStream) makes its
new readers from the old positions; the transactional sinks' pending transactions go to a
successor (`reassigned`), or are settled (`rescale`) where an old executor has none.

Checkpoints of slashrt's earlier per-source plans hold their keyed windows as kinds no node has
any more (`RETIRED`: the partitioned layout itself, or an UpPar owner's window with its
router's state `<window>.route`): a resume of one takes this path on any executor count
(`reshaped`), which reads them (`as_partitioned`).
"""

from __future__ import annotations

import numpy as np

from slashrt._inputs import SPLIT_BLOCK, PerExecutor, share
from slashrt._plan import per_source
from slashrt.errors import SnapshotError
from slashrt.ops.event_time import NO_TIME
from slashrt.snapshot.channel_state import CHANNEL_KIND, DATA, EXCHANGE_CHANNEL, part_name
from slashrt.snapshot.channel_state import restored as channel_segments
from slashrt.snapshot.runtime import source_position
from slashrt.snapshot.state_format import State

__all__ = ["rescale", "reshaped", "other_mode", "resumed_inputs", "reshare", "reassigned", "as_partitioned",
           "graph_in_flight", "RESCALABLE", "WINDOW_MODES"]

# the state kinds a rescaled resume reassigns: windows by key partition, sinks' pending
# transactions to a successor; sources start afresh on their new shares
RESCALABLE = {"window", "ssb_graph_window", "loop_window", "ssb_loop_window", "operator", "sink", "source",
              "array_source"}


# the window states of the per-source plans of slashrt before every flow was a graph: a resume
# takes them through the rescaling path, which reads them (`as_partitioned`)
RETIRED = {"ssb_window", "route_by_owner"}


# the state kinds of a keyed window on several executors, by the mode that keeps them (a window
# its records reach routed by its key is a plain one in both): a resume in the other mode takes
# the rescaling path, which turns them into the run's (`reassigned`)
WINDOW_MODES = {"window": "uppar", "ssb_graph_window": "slash", "loop_window": "uppar", "ssb_loop_window": "slash"}


def reshaped(restored, plan, executors: int) -> bool:
    """Whether checkpoint `restored` was taken on another number of executors than `executors`,
    in the other mode than `plan`'s (`other_mode`), or holds window state of a retired kind
    (`RETIRED`)."""
    if restored.meta.get("executors", 1) != executors or other_mode(restored, plan) is not None:
        return True
    return any(isinstance(state.meta, dict) and state.meta.get("kind") in RETIRED for state in restored.states.values())


def other_mode(restored, plan) -> tuple[str, str] | None:
    """(the mode checkpoint `restored` was taken in, `plan`'s) where a keyed window's state in
    it is of the other mode's kind than the window `plan` has (`WINDOW_MODES`); None if none is."""
    from slashrt.snapshot.operators import stateful_nodes

    nodes = stateful_nodes(plan)
    for (step, _), state in restored.states.items():
        node = nodes.get(step)
        taken = WINDOW_MODES.get(state.meta.get("kind")) if isinstance(state.meta, dict) else None
        now = None if node is None else WINDOW_MODES.get(node.STATE_KIND)
        if taken is not None and now is not None and taken != now:
            return taken, now
    return None


def rescale(flow, plan, role_plan, inputs: dict, restored, executors: int) -> tuple[dict, list]:
    """Resume `restored` on another number of executors (or in the other mode: every
    executor's input is shared out anew, as on another count): refuse what cannot be (one
    sentence), settle the sinks of old executors that have no successor, and return every array
    source's new shares and every FileSource's new readers with the run's rescalings
    (`resumed_inputs`)."""
    from slashrt.snapshot.commit import recover
    from slashrt.snapshot.loops import OUTBOX, loop_feedbacks
    from slashrt.snapshot.operators import stateful_nodes

    was, n = restored.meta.get("executors", 1), restored.number
    modes = other_mode(restored, role_plan) if was == executors else None
    if was != executors:
        refuse = f"run(): checkpoint {n} was taken on {was} executor(s) and cannot resume on {executors}:"
        keep = f"executors={was}"  # (every refusal's advice: what resumes it as it was taken)
    elif modes is not None:
        refuse = f"run(): checkpoint {n} was taken in mode {modes[0]!r} and cannot resume in mode {modes[1]!r}:"
        keep = f"mode={modes[0]!r}"
    else:  # its windows are of a retired kind (`RETIRED`): only this path reads them
        refuse = f"run(): checkpoint {n} was taken by an earlier slashrt's per-source plan and cannot resume here:"
        keep = "the slashrt that wrote it"
    flying = _in_flight(restored)
    _refuse_unkeyed_state(refuse, flow, role_plan, restored, keep)
    for step_id, node in stateful_nodes(role_plan).items():
        if node.STATE_KIND not in RESCALABLE:
            raise SnapshotError(
                f"{refuse} step {step_id!r} keeps {node.STATE_KIND} state, which is not cut by key partition; resume "
                f"it with {keep}"
            )
    steps = set(stateful_nodes(role_plan))
    steps |= {f"{step}.route" for step in steps}  # (an earlier plan's UpPar router: read with its window's)
    # loops' logs, and exchanges' outboxes (on one executor its exchanges ship nothing: the flow's steps)
    steps |= set(loop_feedbacks(role_plan)) | {step + OUTBOX for step in flow.steps}
    unknown = sorted({step for step, _ in restored.states} - steps - {part_name(source) for source in flying})
    if unknown:
        raise SnapshotError(
            f"{refuse} it holds state of step {unknown[0]!r}, which this dataflow does not have: resume it with the "
            "dataflow that wrote it"
        )
    fed, files, readers = {}, {}, {}
    for step_id, _spec, value in per_source(plan, inputs, "input"):
        if isinstance(value, PerExecutor):
            why = ("is another input on another executor count (no position in the old streams says what is left of "
                   "the new ones)") if was != executors else "is not shared out anew, as this resume needs"
            raise SnapshotError(
                f"{refuse} source {step_id!r} is a PerExecutor, whose stream make(index, executors) {why}; resume it "
                f"with {keep}, or give the input as an array"
            )
        if step_id in flying and not isinstance(value, np.ndarray):
            raise SnapshotError(
                f"{refuse} it was taken unaligned, with records of source {step_id!r} in flight, which are shared out "
                f"anew only for in-memory arrays; resume it with {keep}, or from an aligned checkpoint"
            )
        if callable(getattr(value, "rescaled_starts", None)):  # a FileSource: files are splits with offsets
            files[step_id] = _file_starts(refuse, restored, step_id, value, was)
            continue
        if callable(getattr(value, "rescaled", None)):  # a connector that reassigns its positions (RedisStream)
            readers[step_id.split(".", 1)[1]] = value.rescaled(_positions(restored, step_id, was, refuse), executors)
            continue
        if callable(getattr(value, "for_executor", None)) and callable(getattr(value, "feed", None)):
            raise SnapshotError(
                f"{refuse} source {step_id!r} reads {type(value).__name__}, whose input is assigned to executors by a "
                f"rule over their number (slashrt.connectors); resume it with {keep}"
            )
        if not isinstance(value, np.ndarray):
            raise SnapshotError(
                f"{refuse} source {step_id!r} reads a {type(value).__name__}, and only in-memory arrays are shared out "
                f"anew; resume it with {keep}"
            )
        positions = _positions(restored, step_id, was, refuse)
        if any("listing" in (p.get("cursor") or {}) for p in positions):  # (fed counts of files, not of it)
            raise SnapshotError(
                f"{refuse} its run read source {step_id!r} from files (a FileSource), and it is given an array now: "
                "give it the FileSource"
            )
        # an unaligned checkpoint (one executor): the records in flight are the last ones fed, so
        # what is left to share out starts at them (`slashrt.snapshot.channel_state`)
        fed[step_id] = [p["fed"] - flying.get(step_id, {}).get(i, 0) for i, p in enumerate(positions)]
    for node in plan.sinks:  # output of old executors without a successor: committed up to n, the rest dropped
        for i in range(executors, was):
            part = getattr(node.sink, "for_executor", None)
            if part is not None and getattr(node.sink, "transactional", False):
                recover(part(i), n)
    stage = {"executors": was, "fed": fed, **({"files": files} if files else {})}
    shares, stages = resumed_inputs(plan, inputs, [*restored.meta.get("reshared", []), stage], executors)
    return {**shares, **readers}, stages


def _refuse_unkeyed_state(refuse: str, flow, plan, restored, keep: str) -> None:
    """What of a checkpoint is not cut by key, refused in one sentence (`keep`: the option that
    resumes it as it was taken): user operators whose state is not keyed, or is keyed but not
    behind an exchange by key."""
    from slashrt.snapshot.operators import stateful_nodes

    for step_id, node in stateful_nodes(plan).items():
        if node.STATE_KIND != "operator":
            continue
        taken = [state.meta for (step, _), state in restored.states.items() if step == step_id]
        if not any(meta.get("declared") for meta in taken):
            continue  # no state of its own: its notifications go to every new executor
        key = node.op.keyed_by
        if key is None or any(meta.get("keyed_by") != key for meta in taken):
            what = "is not keyed" if key is None else f"was taken without keyed_by={key!r}"
            raise SnapshotError(
                f"{refuse} the state of user operator {step_id!r} {what}, so it is not cut by key (as Flink's "
                f"non-keyed operator state); resume it with {keep}, or key it (Operator.keyed_by, behind "
                "exchange(key=...))"
            )
        unkeyed = _reached_without_exchange(flow, step_id)
        if unkeyed is not None:
            raise SnapshotError(
                f"{refuse} user operator {step_id!r} keeps keyed state, but its input from {unkeyed!r} does not pass "
                f"an exchange(key=...), so its keys were not at their owners; resume it with {keep}"
            )


def _reached_without_exchange(flow, step_id: str) -> str | None:
    """The first step upstream of `step_id` reached without passing an exchange (through
    stateless steps and unions), one that does not keep records of a key at its owner (a
    source, another operator, a window, a loop's edge), or None: every input is exchanged."""
    from slashrt._dataflow import ApplySpec, ExchangeSpec, FilterSpec, ProjectSpec, UnionSpec, WithColumnSpec, inputs_of

    passing = (ApplySpec, FilterSpec, ProjectSpec, WithColumnSpec, UnionSpec)
    todo = list(inputs_of(flow.steps[step_id]))
    while todo:
        spec = flow.steps[todo.pop()]
        if isinstance(spec, ExchangeSpec):
            continue
        if not isinstance(spec, passing):
            return spec.step_id
        todo += inputs_of(spec)
    return None


def graph_in_flight(checkpoint, plan, index: int, executors: int, partitions: int) -> dict[str, np.ndarray]:
    """An unaligned checkpoint's rows in flight between executors (each exchange's
    channel parts: what receivers had not taken, `<step>.from<j>`, and what senders had queued
    behind the barrier, `<step>.to<j>`), by the step they were on their way to: those whose
    key (a record's exchange key, a partial row's `key`) executor `index` of `executors` now
    owns. They are taken on it as if they had just arrived (`ssb.graph_window.adopt_in_flight`)."""
    from slashrt.ssb.graph_window import is_partial
    from slashrt.ssb.partitions import Partitioning

    from slashrt.snapshot.loops import OUTBOX, Outbox

    after, sources = Partitioning(partitions, executors), checkpoint.meta.get("sources", {})
    pieces: dict[str, list] = {}
    for (step, _), state in sorted(checkpoint.states.items()):
        meta = state.meta if isinstance(state.meta, dict) else {}
        if meta.get("kind") == Outbox.STATE_KIND:  # loops: shipped after the barrier, before the snapshot
            target, rows = step[: -len(OUTBOX)], [state.arrays["rows"]]
        elif meta.get("kind") == CHANNEL_KIND and meta["source"] not in sources:
            match = EXCHANGE_CHANNEL.match(meta["source"])
            target = None if match is None or match["route"] else match["window"]
            rows = [value for kind, value in channel_segments(state, step)[1] if kind == DATA]
        else:
            continue
        if target not in plan.steps:
            raise SnapshotError(
                f"checkpoint {checkpoint.number} holds records in flight to step {target or meta.get('source')!r}, "
                "which this dataflow does not have: restore it into the dataflow that wrote it"
            )
        rows = [r for r in rows if len(r)]
        if not rows:
            continue
        rows = np.concatenate(rows)
        key = "key" if is_partial(rows) else plan.flow.steps[target].key
        pieces.setdefault(target, []).append(rows[after.owner_of(rows[key].astype(np.int64)) == index])
    return {step: np.concatenate(parts) for step, parts in pieces.items() if sum(map(len, parts))}


def _in_flight(restored) -> dict[str, dict[int, int]]:
    """Records in flight per source and executor in an unaligned checkpoint's channel state
    (none: aligned)."""
    flying: dict[str, dict[int, int]] = {}
    for (_, executor), state in restored.states.items():
        if isinstance(state.meta, dict) and state.meta.get("kind") == CHANNEL_KIND:
            flying.setdefault(state.meta["source"], {})[int(executor)] = len(state.arrays["records"])
    return flying


def _file_starts(refuse: str, restored, step_id: str, value, was: int) -> dict:
    """FileSource `value`'s starting point in every file (`FileSource.rescaled_starts`) from
    the old executors' positions, over the starts their readers had (a rescaled run's)."""
    positions = [source_position(restored.meta, step_id, i) for i in range(was)]
    if any(p is None or not isinstance(p.get("cursor"), dict) or "listing" not in p["cursor"] for p in positions):
        raise SnapshotError(
            f"{refuse} it holds no file position of source {step_id!r} on each of its executors: it was written by "
            "another dataflow or from another kind of input; resume it with the dataflow and input that wrote it"
        )
    stages = restored.meta.get("reshared", [])
    if stages and step_id not in stages[-1].get("files", {}):
        raise SnapshotError(
            f"{refuse} its run read source {step_id!r} from another kind of input than files: give it that input"
        )
    return value.rescaled_starts(positions, was, stages[-1]["files"][step_id]["starts"] if stages else None)


def _positions(restored, step_id: str, was: int, refuse: str) -> list[dict]:
    """Source `step_id`'s position on each of the `was` executors checkpoint `restored` was taken on."""
    positions = [source_position(restored.meta, step_id, i) for i in range(was)]
    if any(p is None or "fed" not in p for p in positions):
        raise SnapshotError(
            f"{refuse} it holds no position of source {step_id!r} on each of its executors: it was written by "
            "another dataflow; resume it with the dataflow that wrote it"
        )
    return positions


def resumed_inputs(plan, inputs: dict, stages: list, executors: int) -> tuple[dict, list]:
    """Every array source's shares on `executors` after the rescalings `stages` (a checkpoint's
    meta "reshared", oldest first: {"executors": old count, "fed": {source step: fed per old
    executor}, "files": {FileSource step: every file's start, `FileSource.rescaled_starts`}}),
    and every FileSource's readers from the last stage's starts (`FileSource.restarted`), as
    ({source name: [share per executor]}, stages); none without rescalings (the
    input is split as always). Its checkpoints keep `stages`, so that resuming one (on this
    count or another) makes the same shares again."""
    if not stages:
        return {}, []
    shares = {}
    for step_id, spec, value in per_source(plan, inputs, "input"):
        starts = stages[-1].get("files", {}).get(step_id)  # a FileSource: the last stage's starts say all
        if starts is not None and callable(getattr(value, "restarted", None)):
            shares[step_id.split(".", 1)[1]] = [value.restarted(starts, j, executors) for j in range(executors)]
            continue
        if callable(getattr(value, "rescaled", None)):  # (a connector's rescalings are in its positions)
            continue
        if not isinstance(value, np.ndarray) or any(step_id not in stage["fed"] for stage in stages):
            raise SnapshotError(
                f"run(): the checkpoint was taken by a run resumed on another executor count, which read source "
                f"{step_id!r} as shares of an array, and it is given {type(value).__name__} now: give it the same array"
            )
        steps = [(stage["executors"], stage["fed"][step_id]) for stage in stages]
        shares[step_id.split(".", 1)[1]] = reshare(value, spec.time, steps, executors)
    return shares, stages


def reshare(records: np.ndarray, time: str | None, stages: list, executors: int) -> list:
    """Every executor's share of `records` after the rescalings `stages` ([(old executors, fed
    per old executor)], oldest first): at each, old executor i had fed the first `fed[i]`
    records of its share (at the first stage `_inputs.share`); the rest, in the input's order, is
    dealt out in contiguous runs (`_deal`) to the next stage's executors, at the last to
    `executors`. Each run carries the largest event time of the whole input before it (`Share`
    with irregular blocks), so lateness is judged as in a run without the rescaling. A run
    resumed from a rescaled run's checkpoint (on any count) makes its shares again this way."""
    from slashrt.ops.event_time import NO_TIME, Share

    rows = np.arange(len(records))
    held = [share(rows, i, stages[0][0]) for i in range(stages[0][0])]
    for k, (old, fed) in enumerate(stages):
        if len(held) != old or len(fed) != old:
            raise SnapshotError(
                f"the checkpoint's record of its rescalings is inconsistent (stage {k}: {old} executors, {len(held)} "
                "shares): it was not written by this slashrt; resume it with the executor count it was taken on"
            )
        left = np.sort(np.concatenate([held[i][fed[i]:] for i in range(old)]))
        dealt = _deal(left, stages[k + 1][0] if k + 1 < len(stages) else executors, SPLIT_BLOCK)
        held = [taken for taken, _ in dealt]
    if time is None:
        return [records[taken] for taken, _ in dealt]
    prefix = np.maximum.accumulate(records[time].astype(np.int64)) if len(records) else rows
    shares = []
    for taken, offsets in dealt:
        first = taken[offsets]  # each run's first row of the whole input
        before = np.where(first > 0, prefix[np.maximum(first - 1, 0)], NO_TIME).astype(np.int64)
        shares.append(Share(records[taken], before, SPLIT_BLOCK, offsets))
    return shares


def _deal(left: np.ndarray, executors: int, block: int) -> list:
    """`left` (sorted row numbers) cut into contiguous runs (at gaps, and every `block` rows),
    dealt round robin: per executor (its rows, where each of its runs begins in them)."""
    breaks = np.flatnonzero(np.diff(left) != 1) + 1
    starts = np.unique(np.concatenate([[0], breaks, np.arange(0, len(left), block)])) if len(left) else left
    bounds = np.append(starts, len(left)).astype(np.int64)
    dealt = []
    for j in range(executors):
        runs = np.arange(j, len(starts), executors)
        pieces = [left[bounds[r] : bounds[r + 1]] for r in runs]
        taken = np.concatenate(pieces) if pieces else left[:0]
        lengths = np.array([len(p) for p in pieces], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(pieces) else lengths
        dealt.append((taken, offsets))
    return dealt


def reassigned(checkpoint, plan, index: int, executors: int, partitions: int) -> dict:
    """Executor `index`'s states (step id -> State) out of `checkpoint`, taken on another number
    of executors (or on one): the window state of every key partition executor `index` now leads
    (`merge_partitions` over every old executor's state cut by partition), as the kind of window
    this run has (SSB, a whole window, an UpPar owner's window and its router); sinks' pending
    transactions of old executors index, index + executors, ... joined; sources start afresh on
    their new shares (`reshare`)."""
    from slashrt.ops.operator import keyed_rows
    from slashrt.ssb.partitions import Partitioning
    from slashrt.snapshot.operators import stateful_nodes

    old = checkpoint.meta.get("executors", 1)
    after = Partitioning(partitions, executors)
    merged: dict[str, State] = {}  # window step -> its SSB state on executor `index`

    def window(step_id: str) -> State:
        if step_id not in merged:
            merged[step_id] = _merged_window(checkpoint, step_id, old, after, index)
        return merged[step_id]

    states = _logs(checkpoint, plan, index, executors, old)
    for step_id, node in stateful_nodes(plan).items():
        kind = node.STATE_KIND
        if kind in ("loop_window", "ssb_loop_window"):
            states[step_id] = _loop_window(checkpoint, step_id, kind, old, after, index)
        elif kind == "window":
            states[step_id] = as_window(window(step_id))
        elif kind == "ssb_graph_window":
            states[step_id] = as_graph_window(window(step_id))
        elif kind == "operator":
            owned = lambda keys: after.owner_of(keys) == index  # noqa: E731 (the exchanges' map)
            taken = [_state(checkpoint, step_id, i) for i in range(old)]
            states[step_id] = keyed_rows(step_id, taken, node.op.keyed_by, owned)
        elif kind == "sink":
            mine = [_state(checkpoint, step_id, i) for i in range(index, old, executors)]
            if mine:
                states[step_id] = _joined_sink_states(mine)
    return states


def _state(checkpoint, step_id: str, executor: int) -> State:
    state = checkpoint.states.get((step_id, executor))
    if state is None:
        raise SnapshotError(
            f"checkpoint {checkpoint.number} holds no state of step {step_id!r} on executor {executor}: it was "
            "written by another dataflow (or the dataflow changed); resume it with the dataflow that wrote it"
        )
    return state


def _merged_window(checkpoint, step_id: str, old: int, after, index: int) -> State:
    """Executor `index`'s SSB state under `after`: every old executor's window state of `step_id`
    (`as_partitioned`) cut by the partition of each key under `after`, the partitions `index`
    leads merged."""
    routes = [checkpoint.states.get((f"{step_id}.route", i)) for i in range(old)]  # an UpPar owner's router
    return _merged([as_partitioned(_state(checkpoint, step_id, i), routes[i], old, i) for i in range(old)], after, index)


def _merged(states: list[State], after, index: int) -> State:
    """Executor `index`'s SSB state under `after` from every old executor's (in the SSB layout)."""
    from slashrt.ssb.partitioned import merge_partitions, split_partitions

    led = set(after.led_by(index).tolist())
    parts = [part for state in states for p, part in split_partitions(state, after).items() if p in led]
    return merge_partitions(parts, after, index)


# -- loops: windows by iteration, the back edges' logs ---------------------------------------------------
def _loop_window(checkpoint, step_id: str, kind: str, old: int, after, index: int) -> State:
    """Executor `index`'s state of a window inside loops (`LoopWindow`; on the state backend an
    `SsbLoopWindow`: the owner's windows and the fragments, one of each per iteration) as
    `kind`: each iteration's window cut and merged by key partition as a window outside loops
    is, from every old executor's window of that iteration (of either kind). An old executor
    that had not made an iteration's window (it held none of its keys) stands in with an empty
    one fired as far as the least of those that were made: it holds back nothing
    (`merge_partitions` fires the merged windows from the least time their owners had)."""
    from slashrt.ops.loop_window import iteration_states, loop_window_state
    from slashrt.snapshot.operators import tagged

    made: dict[tuple, dict] = {}  # iteration -> old executor -> (its owner's window, its fragments)
    forgotten = 0
    for i in range(old):
        state = _state(checkpoint, step_id, i)
        ssb = state.meta["kind"] == "ssb_loop_window"
        owner, parts = iteration_states(state.arrays, state.meta), {}
        if ssb:
            inner = {k[len("fragments."):]: v for k, v in state.arrays.items() if k.startswith("fragments.")}
            parts = iteration_states(inner, {**state.meta["fragments"], "step": step_id})
        for counters in owner.keys() | parts.keys():
            made.setdefault(counters, {})[i] = (owner.get(counters), parts.get(counters) if ssb else None)
        if index == 0:  # late counts once, on executor 0 (as a window's)
            forgotten += state.meta["forgotten_late"] + (state.meta["fragments"]["forgotten_late"] if ssb else 0)
    by_iteration: dict[tuple, list] = {}
    for counters, windows in made.items():
        owners_fired = _least_fired(w for w, _ in windows.values())
        parts_fired = _least_fired(p for _, p in windows.values())
        for i, (window, part) in windows.items():
            meta = _state(checkpoint, step_id, i).meta
            window = window or _window_state(meta, step_id, owners_fired)
            if meta["kind"] == "ssb_loop_window":  # an SsbGraphWindow's state of this iteration
                part = part or _window_state(meta["fragments"], step_id, parts_fired)
                window = State({**window.arrays, **{f"fragments.{k}": v for k, v in part.arrays.items()}},
                               {**window.meta, "kind": "ssb_graph_window", "fragments": part.meta, "counters": [0, 0]})
            by_iteration.setdefault(counters, []).append(as_partitioned(window, None, old, i))
    template = _state(checkpoint, step_id, 0).meta
    if kind == "loop_window":
        windows = {c: as_window(_merged(states, after, index)) for c, states in sorted(by_iteration.items())}
        return loop_window_state(step_id, template, template["depth"], windows, forgotten)
    windows = {c: as_graph_window(_merged(states, after, index)) for c, states in sorted(by_iteration.items())}
    # (the fragments count what was late: the owner's windows judge nothing)
    owner = loop_window_state(step_id, template, template["depth"],
                              {c: State(w.arrays, {**w.meta, "late_records": 0}) for c, w in windows.items()}, 0)
    parts = {c: State({k[len("fragments."):]: v for k, v in w.arrays.items() if k.startswith("fragments.")},
                      w.meta["fragments"]) for c, w in windows.items()}
    fragments = loop_window_state(step_id, template, template["depth"], parts, forgotten)
    meta = {k: v for k, v in owner.meta.items() if k not in ("kind", "version")}
    return tagged("ssb_loop_window", 1, {**owner.arrays, **{f"fragments.{k}": v for k, v in fragments.arrays.items()}},
                  **meta, fragments=fragments.meta, counters=[0, 0])


def _least_fired(windows) -> int:
    """The least time any of `windows` (states, None where not made) had fired up to."""
    return min((w.meta["fired_until"] for w in windows if w is not None), default=NO_TIME)


def _window_state(meta: dict, step_id: str, fired_until: int = NO_TIME) -> State:
    """An empty window's state of `meta`'s grid (an iteration one old executor did not have),
    fired up to `fired_until`."""
    from slashrt.snapshot.operators import _packed, tagged

    vdt = meta["value_dtype"]
    return tagged("window", 1, {**_packed("slices", {}, vdt), **_packed("tails", {}, vdt)}, step=step_id,
                  **{k: meta[k] for k in ("size", "slide", "slice_len", "aggregate", "value_dtype")},
                  next_start=None, fired_until=fired_until, late_records=0)


def _logs(checkpoint, plan, index: int, executors: int, old: int) -> dict[str, State]:
    """Executor `index`'s back-edge logs (a part per feedback step): those of old executors
    index, index + executors, ..., one after another. What was going round a loop is records at
    their times, which the loop's exchanges route by key wherever they enter it again."""
    from slashrt.snapshot.loops import LOG_KIND, LOG_VERSION, _pack, _unpack, loop_feedbacks
    from slashrt.snapshot.operators import array_times, tagged, times_array

    feedbacks = list(loop_feedbacks(plan))
    logs = {step: ([], [], []) for step in feedbacks}
    base = 0
    for i in range(index, old, executors) if feedbacks else ():
        parts = {step: checkpoint.states.get((step, i)) for step in feedbacks}
        if any(p is None or p.meta.get("kind") != LOG_KIND for p in parts.values()):
            raise SnapshotError(
                f"checkpoint {checkpoint.number} holds no back-edge log of every loop on executor {i}: it was written "
                "by another dataflow; resume it with the dataflow that wrote it"
            )
        for step, part in parts.items():
            records, times, seq = logs[step]
            records += _unpack(part.arrays, part.meta["batches"])
            times += array_times(part.arrays["times"])
            seq += (part.arrays["seq"] + base).tolist()
        base += sum(p.meta["batches"] for p in parts.values())
    return {
        step: tagged(LOG_KIND, LOG_VERSION, {"times": times_array(times), "seq": np.array(seq, np.int64), **_pack(records)},
                     step=step, checkpoint=checkpoint.number, batches=len(records))
        for step, (records, times, seq) in logs.items()
    }


def as_partitioned(state: State, route: State | None = None, executors: int = 1, index: int = 0) -> State:
    """Executor `index`'s window state as an SSB state (`merge_partitions` takes it): an SSB
    state as it is; a whole window (one executor's) or an UpPar owner's window (with its
    router's state `route`) as leader state without fragments, its records judged up to the
    router's `fired_until` (a whole window's own: it judged and fired at once)."""
    from slashrt.ssb.partitioned import SSB_STATE, SSB_STATE_VERSION
    from slashrt.snapshot.operators import check, tagged

    kind = state.meta.get("kind") if isinstance(state.meta, dict) else None
    if kind == SSB_STATE:
        return state
    if kind == "ssb_graph_window":
        return _graph_as_partitioned(state, executors, index)
    step = state.meta.get("step", "?") if kind else "?"
    meta = check(state, step, "window", 1)
    window = {k: meta[k] for k in ("size", "slide", "slice_len", "aggregate", "value_dtype")}
    if route is not None:
        route_meta = check(route, route.meta.get("step", "?"), "route_by_owner", 1)
        judged, frontier = route_meta["fired_until"], list(route_meta["frontier"])
    else:  # fired up to F, which is a window end: as a watermark its promise is F again
        judged, frontier = meta["fired_until"], [meta["fired_until"]] * executors
    arrays = {**{f"leader.{k}": v for k, v in state.arrays.items()}, **_no_tables(state.arrays)}
    return tagged(
        SSB_STATE, SSB_STATE_VERSION, arrays, step=step, **window, next_start=None, fired_until=judged,
        late_records=meta["late_records"], leader={**window, "next_start": meta["next_start"],
        "fired_until": meta["fired_until"], "late_records": 0},
        partitions=1, executors=executors, index=index, watermark=frontier[index], shipped_promise=judged,
    )


def _graph_as_partitioned(state: State, executors: int, index: int) -> State:
    """An SSB window (`SsbGraphWindow`: the owner's windows and this executor's
    fragments) as an SSB state: the owner's tables as leader state, the fragments as
    fragments that shipped nothing yet (each holds its first window open: `merge_partitions`
    joins it into that window), judged late up to where the fragments judged."""
    from slashrt.ssb.partitioned import SSB_STATE, SSB_STATE_VERSION
    from slashrt.snapshot.operators import check, tagged

    meta = check(state, state.meta.get("step", "?"), "ssb_graph_window", 1)
    parts = meta["fragments"]
    window = {k: meta[k] for k in ("size", "slide", "slice_len", "aggregate")}
    window["value_dtype"] = meta["value_dtype"] or parts["value_dtype"]
    judged = parts["fired_until"]
    prefix = "fragments."
    arrays = {**{f"leader.{k}": v for k, v in state.arrays.items() if not k.startswith(prefix)},
              **{k[len(prefix):]: v for k, v in state.arrays.items() if k.startswith(prefix)}}
    return tagged(
        SSB_STATE, SSB_STATE_VERSION, arrays, step=meta["step"], **window, next_start=parts["next_start"],
        fired_until=judged, late_records=parts["late_records"], leader={**window, "next_start": meta["next_start"],
        "fired_until": meta["fired_until"], "late_records": 0},
        partitions=1, executors=executors, index=index, watermark=judged, shipped_promise=NO_TIME,
    )


def as_graph_window(state: State) -> State:
    """An SSB window's state out of an SSB state that `merge_partitions` made: the
    leader state as the owner's windows, no fragments (the old ones joined it), lateness judged
    on from where the old fragments had judged it."""
    from slashrt.snapshot.operators import tagged

    meta = state.meta
    owner = as_window(state)
    parts = _no_tables(state.arrays)
    fragments = {**{k: owner.meta[k] for k in ("size", "slide", "slice_len", "aggregate", "value_dtype")},
                 "next_start": None, "fired_until": meta["fired_until"], "late_records": meta["late_records"]}
    return tagged(
        "ssb_graph_window", 1, {**owner.arrays, **{f"fragments.{k}": v for k, v in parts.items()}}, step=meta["step"],
        **{k: v for k, v in owner.meta.items() if k not in ("kind", "version", "step")}, fragments=fragments,
        counters=[0, 0],
    )


def _no_tables(arrays: dict) -> dict:
    """Empty fragment table sets (`slices`, `tails`) of the layout of `arrays`' tables."""
    out = {}
    for prefix in ("slices", "tails"):
        ids = arrays[f"{prefix}.ids"]
        out.update({f"{prefix}.ids": ids[:0], f"{prefix}.bounds": np.zeros(1, np.int64),
                    f"{prefix}.overflowed": np.zeros(0, bool),
                    **{f"{prefix}.{c}": arrays[f"{prefix}.{c}"][:0] for c in ("keys", "counts", "vals")}})
    return out


def as_window(state: State) -> State:
    """A whole window's state (one executor, or an UpPar owner) out of an SSB state that
    `merge_partitions` made: the leader state's tables and firing, the late count."""
    from slashrt.snapshot.operators import tagged

    meta, leader = state.meta, state.meta["leader"]
    arrays = {k[len("leader."):]: v for k, v in state.arrays.items() if k.startswith("leader.")}
    return tagged(
        "window", 1, arrays, step=meta["step"], **{k: leader[k] for k in ("size", "slide", "slice_len", "aggregate",
        "value_dtype", "next_start", "fired_until")}, late_records=meta["late_records"],
    )


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
