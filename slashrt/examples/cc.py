"""Connected components of a graph whose edges arrive in epochs, as a loop in a dataflow.

    result = connected_components(edges)      # edges: int64 columns src, dst, epoch
    result.labels[i]                           # labels after epoch result.epochs[i]

A node's label is the least node id of its component. The dataflow (`cc_flow`)::

    edges ──enter──► ┌──────────────┐ ── final ──leave──► EpochLabels ──► sink
                     │ HookAndJump  │                     (on_notify(e): the labels
    labels ─enter──► │  (port 0/1)  │ ── changed ──┐       that epoch e changed)
              ▲      └──────────────┘              │
              └──────────── feed_back (+1) ────────┘

`HookAndJump` keeps the labels (`Components`, grown as node ids appear). An epoch's edges
enter the loop at (epoch, 0); once all of them are in (`on_notify`), it hooks roots and
jumps pointers (one round, `ComponentsEpoch.propose`) and emits the labels that round
changes. Those travel round the feedback edge to its port 1 at the next loop counter; when a
round's changes are all back (`on_notify` again) it writes them into its labels and runs
the next round, so every loop iteration is one round. A round that changes nothing ends the
epoch: its changed labels leave the loop, and `EpochLabels` hands them to the sink once the
frontier passes the epoch. Epochs run one after another (an epoch's rounds start when the
previous epoch's are done), so the labels after epoch e hold the edges of epochs <= e
exactly. Both operators declare their state (`snapshot` / `restore`), so the flow runs under
checkpoints, a kill in the middle of an epoch's rounds included. Records on port 1 at loop counter 0 (the `labels` source: a labelling to start
from, e.g. an earlier run's, or nothing) are taken as edges node-label of their epoch.
"""

from __future__ import annotations

import time as _time

import attrs
import numpy as np

from slashrt import Context, Dataflow, Operator, Schema, Timestamp, run
from slashrt.errors import SchemaError
from slashrt.examples import EDGES
from slashrt.examples._components import Components, ComponentsEpoch, canonical
from slashrt.snapshot import State
from slashrt.snapshot.operators import pack_groups, unpack_groups
from slashrt.sinks import Collect

__all__ = [
    "Components", "ComponentsEpoch", "canonical", "EDGES", "LABELS", "CHANGES", "HookAndJump", "EpochLabels",
    "cc_flow", "connected_components", "ComponentsResult",
]

LABELS = np.dtype([("node", "<i8"), ("label", "<i8")])  # a labelling to start from
CHANGES = np.dtype([("node", "<i8"), ("label", "<i8"), ("final", "i1")])  # in the loop (final: leaves it)
EPOCH_LABELS = np.dtype([("epoch", "<i8"), ("node", "<i8"), ("label", "<i8")])  # to the sink


def _records(dtype: np.dtype, **columns) -> np.ndarray:
    n = len(next(iter(columns.values())))
    out = np.empty(n, dtype=dtype)
    for name, values in columns.items():
        out[name] = values
    return out


class HookAndJump(Operator):
    """The loop body: port 0 new edges (entered), port 1 label changes (fed back)."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.state = Components()
        self.edges: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # epoch -> its edges so far
        self.changes: dict[Timestamp, list[tuple[np.ndarray, np.ndarray]]] = {}  # fed back, per round
        self.ready: list[int] = []  # epochs whose edges are all in, waiting for the one in rounds
        self.epoch: ComponentsEpoch | None = None  # the epoch in rounds
        self.current: int | None = None
        self.started = 0.0
        self.epoch_seconds: dict[int, float] = {}  # from an epoch's first round to its last
        self.rounds: dict[int, int] = {}

    # -- checkpoints: the labels, the edges and changes waiting, the epoch in rounds ------------------
    _EDGE = {"src": np.int64, "dst": np.int64}
    _CHANGE = {"node": np.int64, "label": np.int64}

    def snapshot(self) -> State:
        arrays = {
            "label": self.state.label, **pack_groups("edges", self.edges, self._EDGE),
            **pack_groups("changes", self.changes, self._CHANGE),
        }
        epoch = None
        if self.epoch is not None:
            a, b, hooked, rounds = self.epoch.snapshot()
            arrays.update({"epoch.a": a, "epoch.b": b})
            if hooked is not None:
                arrays["epoch.hooked"] = hooked
            epoch = {"rounds": rounds, "hooked": hooked is not None}
        return State(arrays, {
            "ready": self.ready, "current": self.current, "epoch": epoch,
            "epoch_seconds": [[e, s] for e, s in self.epoch_seconds.items()], "rounds": [[e, r] for e, r in self.rounds.items()],
        })

    def restore(self, state: State) -> None:
        arrays, meta = state.arrays, state.meta
        self.state = Components.from_labels(arrays["label"])
        self.edges = unpack_groups("edges", arrays, self._EDGE)
        self.changes = unpack_groups("changes", arrays, self._CHANGE, times=True)
        self.ready, self.current = list(meta["ready"]), meta["current"]
        self.epoch = None
        if meta["epoch"] is not None:
            hooked = arrays["epoch.hooked"] if meta["epoch"]["hooked"] else None
            self.epoch = ComponentsEpoch.resume(self.state, arrays["epoch.a"], arrays["epoch.b"], hooked, meta["epoch"]["rounds"])
            self.started = _time.perf_counter()
        self.epoch_seconds = {e: s for e, s in meta["epoch_seconds"]}
        self.rounds = {e: r for e, r in meta["rounds"]}

    async def on_batch(self, ctx: Context, port: int, batch) -> None:
        t = ctx.time
        if port == 1 and any(t.counters):
            if t not in self.changes:
                self.changes[t] = []
                ctx.notify_at(t)
            self.changes[t].append((np.array(batch["node"]), np.array(batch["label"])))
            return
        src, dst = (batch["src"], batch["dst"]) if port == 0 else (batch["node"], batch["label"])
        if t.epoch not in self.edges:
            self.edges[t.epoch] = []
            ctx.notify_at(t)
        self.edges[t.epoch].append((np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)))

    async def on_notify(self, ctx: Context, time: Timestamp) -> None:
        parts = self.changes.pop(time, None)
        if parts is None:  # every edge of an epoch is in
            self.ready.append(time.epoch)
            self.ready.sort()
            if self.epoch is None:
                await self._start(ctx, time)
            return
        for nodes, labels in parts:
            self.epoch.apply(nodes, labels)
        await self._round(ctx, time)

    async def _start(self, ctx: Context, time: Timestamp) -> None:
        self.current = self.ready.pop(0)
        parts = self.edges.pop(self.current)
        src = np.concatenate([p[0] for p in parts])
        dst = np.concatenate([p[1] for p in parts])
        self.epoch = ComponentsEpoch(self.state, src, dst)
        self.started = _time.perf_counter()
        # at the same loop counter as the capability we hold: an epoch's rounds may start
        # while an earlier epoch's feedback had advanced the counter
        await self._round(ctx, Timestamp(self.current, time.counters))

    async def _round(self, ctx: Context, time: Timestamp) -> None:
        changes = self.epoch.propose()
        if changes is not None:
            await ctx.emit(_records(CHANGES, node=changes[0], label=changes[1], final=0), time=time)
            return
        nodes, labels = self.epoch.finish()
        await ctx.emit(_records(CHANGES, node=nodes, label=labels, final=1), time=time)
        self.epoch_seconds[self.current] = _time.perf_counter() - self.started  # its labels have left the loop
        self.rounds[self.current] = self.epoch.rounds
        self.epoch = None
        if self.ready:
            await self._start(ctx, time)


class EpochLabels(Operator):
    """After the loop: the labels each epoch changed, handed on once the frontier passes it."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.pending: dict[Timestamp, list[np.ndarray]] = {}

    async def on_batch(self, ctx: Context, port: int, batch) -> None:
        if ctx.time not in self.pending:
            self.pending[ctx.time] = []
            ctx.notify_at(ctx.time)
        self.pending[ctx.time].append(
            _records(EPOCH_LABELS, epoch=np.full(len(batch), ctx.time.epoch), node=batch["node"], label=batch["label"])
        )

    async def on_notify(self, ctx: Context, time: Timestamp) -> None:
        parts = self.pending.pop(time)
        await ctx.emit(np.concatenate(parts) if len(parts) > 1 else parts[0])

    def snapshot(self) -> State:
        return State(pack_groups("pending", {t: [(p,) for p in parts] for t, parts in self.pending.items()},
                                 {"rows": EPOCH_LABELS}), {})

    def restore(self, state: State) -> None:
        groups = unpack_groups("pending", state.arrays, {"rows": EPOCH_LABELS}, times=True)
        self.pending = {t: [rows] for t, [(rows,)] in groups.items()}


def cc_flow(sink, *, name: str = "cc", max_iterations: int | None = None) -> tuple[Dataflow, HookAndJump]:
    """The connected-components dataflow: sources ``edges`` (`EDGES`, in epoch order) and
    ``labels`` (`LABELS`, a labelling to start from; may be empty), the loop, and `sink`,
    which receives (epoch, node, label) for every label each epoch changed. Returns the flow
    and its loop operator (which records `epoch_seconds` and `rounds` per epoch)."""
    flow = Dataflow(name)
    edges = flow.source("edges", EDGES, time="epoch")
    start = flow.source("labels", LABELS)
    body = HookAndJump()
    with flow.loop("rounds", max_iterations=max_iterations) as loop:
        new_edges = loop.enter(edges.project("src", "dst"))
        changed = loop.enter(start)
        step = new_edges.connect(changed).operator(body, name="hook_and_jump", schema=Schema.from_dtype(CHANGES))
        loop.feed_back(step.filter(lambda b: b["final"] == 0, name="changed").project("node", "label"), into=changed)
        finished = loop.leave(step.filter(lambda b: b["final"] == 1, name="finished").project("node", "label"))
    finished.operator(EpochLabels(), name="finished_epochs", schema=Schema.from_dtype(EPOCH_LABELS)).sink(sink, name="out")
    return flow, body


@attrs.frozen
class ComponentsResult:
    """The labels after every epoch (`labels[i]` after `epochs[i]`, one int64 per node)."""

    epochs: list[int]
    labels: list[np.ndarray]
    epoch_seconds: dict[int, float]  # each epoch's rounds, in the loop
    rounds: dict[int, int]
    seconds: float  # the whole run


def connected_components(edges: np.ndarray, *, nodes: int | None = None, epochs=None,
                         max_iterations: int | None = None) -> ComponentsResult:
    """Run `cc_flow` over `edges` (a structured array with int64-compatible columns src, dst
    and epoch; sorted by epoch here) and return the labels after each of `epochs` (default:
    every epoch that has edges) for nodes 0..nodes-1 (default: up to the largest id)."""
    names = getattr(getattr(edges, "dtype", None), "names", None) or ()
    missing = [c for c in EDGES.names if c not in names]
    if missing:
        raise SchemaError(f"connected_components: edges need int64 columns src, dst and epoch; missing {missing}")
    data = np.empty(len(edges), dtype=EDGES)
    for column in EDGES.names:
        data[column] = edges[column]
    data = data[np.argsort(data["epoch"], kind="stable")]
    largest = int(max(data["src"].max(), data["dst"].max())) + 1 if len(data) else 0
    nodes = largest if nodes is None else nodes
    if nodes < largest:
        raise SchemaError(f"connected_components: nodes={nodes} is below the largest node id {largest - 1}")
    epochs = sorted(set(data["epoch"].tolist())) if epochs is None else sorted(int(e) for e in epochs)
    sink = Collect()
    flow, body = cc_flow(sink, max_iterations=max_iterations)
    result = run(flow, {"edges": data, "labels": np.empty(0, dtype=LABELS)})
    changes = sink.records
    changes = changes[np.argsort(changes["epoch"], kind="stable")]
    labels = np.arange(nodes, dtype=np.int64)
    out, seen = [], 0
    for e in epochs:  # apply the changes of every epoch <= e, in order
        upto = int(np.searchsorted(changes["epoch"], e, side="right"))
        part = changes[seen:upto]
        labels[part["node"]] = part["label"]
        seen = upto
        out.append(labels.copy())
    return ComponentsResult(epochs, out, dict(body.epoch_seconds), dict(body.rounds), result.seconds)
