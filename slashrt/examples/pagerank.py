"""PageRank for k iterations as a loop in a dataflow.

    ranks = pagerank(edges, iterations=20)      # edges: int64 columns src, dst (and epoch)

The dataflow (`pagerank_flow`): edges enter a loop whose body, `PowerIteration`, holds the
graph of each epoch (its edges and every earlier epoch's); the rank vector travels round the
loop, one power iteration per loop counter::

    edges ──enter──► ┌────────────────┐ ── final ──leave──► sink (epoch, node, rank)
    ranks ──enter──► │ PowerIteration │ ── ranks ──┐
              ▲      └────────────────┘            │
              └──────────── feed_back (+1) ────────┘

Once an epoch's edges are all in (`on_notify` at (epoch, 0)) it emits the starting ranks;
once the ranks of iteration i are all back (`on_notify` at (epoch, i)) it computes iteration
i and emits them, to the feedback edge until i = k, then out of the loop. Records on the
``ranks`` source replace the starting rank of their nodes (in every epoch after them).

`PowerIteration` declares its state (`snapshot` / `restore`: the edges, the ranks fed back
and waiting, the starting ranks; each epoch's `Graph` is rebuilt from the edges), so the flow
runs under checkpoints. Each iteration is `Graph.step` (slashrt.examples._power_iteration, vectorised): damping 0.85,
the rank of nodes without out-edges spread evenly over all nodes.
"""

from __future__ import annotations

import attrs
import numpy as np

from slashrt import Context, Dataflow, Operator, Schema, Timestamp, run
from slashrt.errors import DataflowError, SchemaError
from slashrt.examples import EDGES
from slashrt.examples._power_iteration import DAMPING, Graph
from slashrt.sinks import Collect
from slashrt.snapshot import State
from slashrt.snapshot.operators import array_times, pack_groups, times_array, unpack_groups

__all__ = ["Graph", "DAMPING", "PowerIteration", "pagerank_flow", "pagerank", "PageRankResult"]

RANKS = np.dtype([("node", "<i8"), ("rank", "<f8")])
IN_LOOP = np.dtype([("epoch", "<i8"), ("node", "<i8"), ("rank", "<f8"), ("final", "i1")])


class PowerIteration(Operator):
    """The loop body: port 0 new edges (entered), port 1 ranks (fed back; at counter 0 the
    ``ranks`` source's starting ranks)."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self, iterations: int, nodes: int | None = None, damping: float = DAMPING):
        _check_iterations(iterations)
        self.iterations, self.nodes, self.damping = iterations, nodes, damping
        self.edges: list[tuple[int, np.ndarray, np.ndarray]] = []  # (epoch, src, dst) of every epoch so far
        self.ranks: dict[Timestamp, list[tuple[np.ndarray, np.ndarray]]] = {}  # fed back, per time
        self.start: list[tuple[np.ndarray, np.ndarray]] = []  # the ``ranks`` source's starting ranks
        self.graphs: dict[int, Graph] = {}  # per epoch in iterations
        self.asked: set[Timestamp] = set()

    # -- checkpoints --------------------------------------------------------------------------------
    _RANK = {"node": np.int64, "rank": np.float64}

    def snapshot(self) -> State:
        edges: dict[int, list] = {}
        for e, s, d in self.edges:  # by epoch, in arrival order (epochs arrive in order)
            edges.setdefault(e, []).append((s, d))
        return State({
            **pack_groups("edges", edges, {"src": np.int64, "dst": np.int64}),
            **pack_groups("ranks", self.ranks, self._RANK), **pack_groups("start", {0: self.start}, self._RANK),
            "asked": times_array(sorted(self.asked)),
        }, {"graphs": sorted(self.graphs)})

    def restore(self, state: State) -> None:
        arrays = state.arrays
        by_epoch = unpack_groups("edges", arrays, {"src": np.int64, "dst": np.int64})
        self.edges = [(e, s, d) for e, [(s, d)] in by_epoch.items()]
        self.ranks = unpack_groups("ranks", arrays, self._RANK, times=True)
        self.start = unpack_groups("start", arrays, self._RANK).get(0, [])
        self.asked = set(array_times(arrays["asked"]))
        self.graphs = {epoch: self._graph(epoch) for epoch in state.meta["graphs"]}  # as built at (epoch, 0)

    def _graph(self, epoch: int) -> Graph:
        """The graph of every edge of the epochs up to `epoch`."""
        upto = [(s, d) for e, s, d in self.edges if e <= epoch]
        src = np.concatenate([s for s, _ in upto]) if upto else np.empty(0, np.int64)
        dst = np.concatenate([d for _, d in upto]) if upto else np.empty(0, np.int64)
        return Graph(src, dst, self.nodes, damping=self.damping)

    def _notify(self, ctx: Context, time: Timestamp) -> None:
        if time not in self.asked:
            self.asked.add(time)
            ctx.notify_at(time)

    async def on_batch(self, ctx: Context, port: int, batch) -> None:
        t = ctx.time
        if port == 1 and not any(t.counters):  # entered from outside: in before any epoch at or after it starts
            self.start.append((np.array(batch["node"]), np.array(batch["rank"])))
            return
        self._notify(ctx, t)
        if port == 0:
            self.edges.append((t.epoch, np.array(batch["src"], dtype=np.int64), np.array(batch["dst"], dtype=np.int64)))
        else:
            self.ranks.setdefault(t, []).append((np.array(batch["node"]), np.array(batch["rank"])))

    async def on_notify(self, ctx: Context, time: Timestamp) -> None:
        self.asked.discard(time)
        arrived = self.ranks.pop(time, [])
        i = time.counters[-1]
        if i == 0:  # every edge of the epoch is in: the starting ranks
            graph = self.graphs[time.epoch] = self._graph(time.epoch)
            ranks = graph.initial()
            for nodes, values in self.start:
                ranks[nodes] = values
        else:
            graph = self.graphs[time.epoch]
            ranks = np.empty(graph.nodes)
            for nodes, values in arrived:
                ranks[nodes] = values
            ranks = graph.step(ranks)
        final = i == self.iterations
        if final:
            del self.graphs[time.epoch]
        out = np.empty(graph.nodes, dtype=IN_LOOP)
        out["epoch"], out["node"], out["rank"], out["final"] = time.epoch, np.arange(graph.nodes), ranks, final
        await ctx.emit(out, time=time)


def _check_iterations(iterations) -> None:
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 0:
        raise DataflowError(f"pagerank: iterations must be a whole number >= 0, got {iterations!r}")


def pagerank_flow(sink, iterations: int, *, nodes: int | None = None, damping: float = DAMPING,
                  name: str = "pagerank") -> Dataflow:
    """The PageRank dataflow: sources ``edges`` (`EDGES`, in epoch order) and ``ranks``
    (`RANKS`, starting ranks; may be empty), `iterations` power iterations per epoch in a
    loop bounded by them, and `sink`, which receives (epoch, node, rank) per epoch."""
    _check_iterations(iterations)
    flow = Dataflow(name)
    edges = flow.source("edges", EDGES, time="epoch")
    start = flow.source("ranks", RANKS)
    with flow.loop("iterations", max_iterations=iterations) as loop:
        new_edges = loop.enter(edges.project("src", "dst"))
        ranks = loop.enter(start)
        step = new_edges.connect(ranks).operator(PowerIteration(iterations, nodes, damping), name="power_iteration",
                                                 schema=Schema.from_dtype(IN_LOOP))
        loop.feed_back(step.filter(lambda b: b["final"] == 0, name="next").project("node", "rank"), into=ranks)
        final = loop.leave(step.filter(lambda b: b["final"] == 1, name="final").project("epoch", "node", "rank"))
    final.sink(sink, name="out")
    return flow


@attrs.frozen
class PageRankResult:
    """The ranks after every epoch (`ranks[i]` of the graph of epochs <= `epochs[i]`)."""

    epochs: list[int]
    ranks: list[np.ndarray]
    seconds: float


def pagerank(edges: np.ndarray, iterations: int, *, nodes: int | None = None, damping: float = DAMPING) -> PageRankResult:
    """Run `pagerank_flow` over `edges` (a structured array with columns src, dst and,
    optionally, epoch)."""
    names = getattr(getattr(edges, "dtype", None), "names", None) or ()
    if "src" not in names or "dst" not in names:
        raise SchemaError("pagerank: edges need int64 columns src and dst (and optionally epoch)")
    data = np.zeros(len(edges), dtype=EDGES)
    for column in EDGES.names:
        if column in names:
            data[column] = edges[column]
    data = data[np.argsort(data["epoch"], kind="stable")]
    sink = Collect()
    result = run(pagerank_flow(sink, iterations, nodes=nodes, damping=damping), {"edges": data, "ranks": np.empty(0, RANKS)})
    out = sink.records
    epochs = sorted(set(out["epoch"].tolist()))
    ranks = []
    for e in epochs:
        rows = out[out["epoch"] == e]
        r = np.empty(len(rows))
        r[rows["node"]] = rows["rank"]
        ranks.append(r)
    return PageRankResult(epochs, ranks, result.seconds)
