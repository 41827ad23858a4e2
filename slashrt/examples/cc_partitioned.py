"""Connected components with labels partitioned by node id: a loop that runs on several executors.

    flow = cc_partitioned_flow(sink)     # sources: edges (EDGES), sink gets (node, label) changes

`slashrt.examples.cc` keeps every label in one operator (pointer jumping reads any node's
label); here each executor owns the nodes whose id hashes to it (`stream.exchange(key=)`, the
windows' partitioning) and min-label propagation moves labels along edges as messages::

    edges ─both ways─ exchange(src) ─enter─► Propagate ── changes ──leave──► sink
                       proposals: exchange(node) ─enter─►   │ (port 1)
                                     ▲                      │
                                     └──── feed_back ◄──────┘ proposals (node, label)

`Propagate` stores the edges of the nodes it owns (sorted by source, so a node's edges are a
run); proposals (node, label) lower the nodes' labels if smaller, and every lowered label is
proposed to the node's neighbours. Rounds are synchronous: the proposals of a loop counter
are applied together once it is complete (`notify_at`), in one vectorised pass however many
batches and executors they came from, and the next round's go round the feedback. A node's
label ends as the least node id of its component.

Epochs run one after another so that the labels after epoch e hold exactly the edges of
epochs <= e: an epoch's edges wait (`notify_at((e, 0))`: all arrived) until the previous
epoch has no work left anywhere (`notify_at((e - 1, DONE))`, complete once no record of e - 1
can still go round the loop on any executor); until then the operator asks again one loop
counter later. Proposals need no waiting: one at epoch e exists only once e has started, so
every earlier epoch is done. Every executor must see every epoch: its input carries, per
epoch, a self-loop on a node it owns (`ticks`), which changes no component.
"""

from __future__ import annotations

import time

import numpy as np

from slashrt import Context, Dataflow, Operator, Schema, Timestamp
from slashrt.examples import EDGES
from slashrt.snapshot import State
from slashrt.snapshot.operators import pack_groups, unpack_groups
from slashrt.ssb.partitions import DEFAULT_PARTITIONS, Partitioning

__all__ = ["Propagate", "cc_partitioned_flow", "ticks", "labels_after", "MESSAGES", "DONE"]

# final: a change, leaves the loop; epoch: the epoch whose edges it comes from
MESSAGES = np.dtype([("node", "<i8"), ("label", "<i8"), ("final", "i1"), ("epoch", "<i8")])
DONE = 1 << 40  # a loop counter no epoch reaches: (e, DONE) is complete once epoch e's rounds are


class Propagate(Operator):
    """The loop body: port 0 edges (src owned here), port 1 proposals (node owned here)."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.labels = np.zeros(0, np.int64)
        self.src = np.zeros(0, np.int64)  # the edges of the nodes owned here, sorted by src
        self.dst = np.zeros(0, np.int64)
        self.waiting: dict[int, list[np.ndarray]] = {}  # epoch -> its edges, until it may start
        self.epochs: list[int] = []  # epochs seen, in order
        self.done: set[int] = set()
        self.proposals: dict[Timestamp, list[np.ndarray]] = {}  # a round's (node, label), until it is complete
        self.asked: dict[int, int] = {}  # epoch -> the loop counter its edges last asked to start at

    _EDGE = {"src": np.int64, "dst": np.int64}
    _PROPOSAL = {"node": np.int64, "label": np.int64}

    def snapshot(self) -> State:
        waiting = {e: [(p[0], p[1]) for p in parts] for e, parts in self.waiting.items()}
        proposals = {t: [(p[0], p[1]) for p in parts] for t, parts in self.proposals.items()}
        return State(
            {"labels": self.labels, "src": self.src, "dst": self.dst, **pack_groups("waiting", waiting, self._EDGE),
             **pack_groups("proposals", proposals, self._PROPOSAL)},
            {"epochs": self.epochs, "done": sorted(self.done), "asked": sorted(self.asked.items())},
        )

    def restore(self, state: State) -> None:
        arrays = state.arrays
        self.labels, self.src, self.dst = (np.array(arrays[k]) for k in ("labels", "src", "dst"))
        self.waiting = {e: [np.stack([src, dst])] for e, [(src, dst)] in unpack_groups("waiting", arrays, self._EDGE).items()}
        self.proposals = {
            t: [np.stack([node, label])]
            for t, [(node, label)] in unpack_groups("proposals", arrays, self._PROPOSAL, times=True).items()
        }
        self.epochs, self.done = list(state.meta["epochs"]), set(state.meta["done"])
        self.asked = {int(e): int(r) for e, r in state.meta["asked"]}

    def _grow(self, *ids: np.ndarray) -> None:
        top = max((int(a.max()) + 1 for a in ids if len(a)), default=0)
        if top > len(self.labels):
            self.labels = np.concatenate([self.labels, np.arange(len(self.labels), top, dtype=np.int64)])

    async def on_batch(self, ctx: Context, port: int, batch) -> None:
        if port == 0:
            epoch = ctx.time.epoch
            if epoch not in self.waiting:
                self.waiting[epoch] = []
                self.epochs.append(epoch)
                ctx.notify_at(ctx.time)
                ctx.notify_at(Timestamp(epoch, (DONE,)))
            self.waiting[epoch].append(np.stack([batch["src"], batch["dst"]]))
            return
        # a round's proposals are applied together once the round is complete (one pass over
        # all of them, however many batches they came in from however many executors)
        round_ = self.proposals.get(ctx.time)
        if round_ is None:
            round_ = self.proposals[ctx.time] = []
            ctx.notify_at(ctx.time)
        round_.append(np.stack([batch["node"], batch["label"]]))

    async def on_notify(self, ctx: Context, time: Timestamp) -> None:
        epoch = time.epoch
        if time in self.proposals:
            both = np.concatenate(self.proposals.pop(time), axis=1)
            node, label = both[0], both[1]
            self._grow(node)
            before = self.labels[node]
            np.minimum.at(self.labels, node, label)
            await self._changed(ctx, np.unique(node[label < before]), epoch)
        if time.counters[-1] == DONE:
            self.done.add(epoch)
            return
        if epoch not in self.waiting or time.counters[-1] < self.asked.get(epoch, 0):
            return  # (a round of proposals only)
        earlier = [e for e in self.epochs if e < epoch]
        if earlier and max(earlier) not in self.done:
            self.asked[epoch] = time.counters[-1] + 1
            ctx.notify_at(Timestamp(epoch, (self.asked[epoch],)))  # ask again a round later
            return
        edges = np.concatenate(self.waiting.pop(epoch), axis=1)
        src, dst = edges[0], edges[1]
        self._grow(src, dst)
        every_src, every_dst = np.concatenate([self.src, src]), np.concatenate([self.dst, dst])
        order = np.argsort(every_src, kind="stable")  # once per epoch: a changed node's edges are a run
        self.src, self.dst = every_src[order], every_dst[order]
        await ctx.emit(_messages(dst, self.labels[src], 0, epoch))

    async def _changed(self, ctx: Context, changed: np.ndarray, epoch: int) -> None:
        if not len(changed):
            return
        await ctx.emit(_messages(changed, self.labels[changed], 1, epoch))
        # the runs of the changed nodes' edges (changed is sorted): O(their degrees), not O(edges)
        starts = np.searchsorted(self.src, changed, "left")
        lengths = np.searchsorted(self.src, changed, "right") - starts
        at = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        await ctx.emit(_messages(self.dst[at], np.repeat(self.labels[changed], lengths), 0, epoch))


def _messages(node: np.ndarray, label: np.ndarray, final: int, epoch: int) -> np.ndarray:
    out = np.empty(len(node), MESSAGES)
    out["node"], out["label"], out["final"], out["epoch"] = node, label, final, epoch
    return out


def cc_partitioned_flow(sink, *, name: str = "ccp", stamp: bool = False) -> Dataflow:
    """Sources ``edges`` (`EDGES`, by epoch) and ``proposals`` (`MESSAGES` to start from, e.g.
    none); `sink` receives (node, label, final, epoch) for every label an epoch lowered, and
    with `stamp` a `left_ns` column: CLOCK_MONOTONIC when it left the loop (one clock for
    every process of a machine: how `slashrt bench cc --executors K` times an epoch)."""
    flow = Dataflow(name)
    edges = flow.source("edges", EDGES, time="epoch")

    def both_ways(batch):
        rows = batch.to_numpy(EDGES)
        back = rows.copy()
        back["src"], back["dst"] = rows["dst"], rows["src"]
        return np.concatenate([rows, back])

    owned = edges.apply(both_ways, name="both_ways").exchange(key="src", name="by_src")
    start = flow.source("proposals", MESSAGES)
    with flow.loop("rounds") as loop:
        new_edges = loop.enter(owned.project("src", "dst"))
        proposals = loop.enter(start)
        step = new_edges.connect(proposals).operator(Propagate(), name="propagate", schema=Schema.from_dtype(MESSAGES))
        again = step.filter(lambda b: b["final"] == 0, name="proposed").exchange(key="node", name="by_node")
        loop.feed_back(again, into=proposals)
        changes = loop.leave(step.filter(lambda b: b["final"] == 1, name="changes"))
    if stamp:
        changes = changes.with_column("left_ns", _monotonic_ns, dtype="<i8", name="stamped")
    changes.sink(sink, name="out")
    return flow


def _monotonic_ns(batch) -> np.ndarray:
    return np.full(len(batch), time.monotonic_ns(), np.int64)


def ticks(epochs, index: int, executors: int, partitions: int = DEFAULT_PARTITIONS) -> np.ndarray:
    """A self-loop per epoch on the least node executor `index` owns: every executor sees
    every epoch (it changes no component)."""
    owners = Partitioning(partitions, executors).owner_of(np.arange(64 * executors, dtype=np.int64))
    node = int(np.flatnonzero(owners == index)[0])
    out = np.zeros(len(epochs), EDGES)
    out["src"], out["dst"], out["epoch"] = node, node, epochs
    return out


def labels_after(changes: np.ndarray, nodes: int, epochs) -> list[np.ndarray]:
    """The labels (least node id of each component) after each of `epochs`, from the changes."""
    labels, out = np.arange(nodes, dtype=np.int64), []
    for e in sorted(epochs):
        part = changes[changes["epoch"] == e]
        np.minimum.at(labels, part["node"], part["label"])
        out.append(labels.copy())
    return out
