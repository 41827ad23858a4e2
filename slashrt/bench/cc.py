"""`slashrt bench cc`: connected components of a random graph, against scipy and NetworkX.

The graph has `edges` edges over as many nodes (uniform endpoints, or power-law: both
endpoints Zipf-distributed over randomly permuted ids, so hubs are not the least ids), cut
into `epochs` epochs of equal size. The benchmark times slashrt's dataflow
(`slashrt.examples.cc`) on all edges in one epoch (and its numpy kernels alone, without the
dataflow: `kernel_seconds`) against scipy's C `connected_components` and NetworkX, then one extra epoch of 1% new edges processed incrementally against scipy
recomputing from scratch, and checks every epoch's labels against scipy (and the full
result against NetworkX).
"""

from __future__ import annotations

import importlib

import numpy as np

from slashrt.bench._common import Timer, zipf_choice
from slashrt.examples import EDGES

__all__ = ["GRAPHS", "generate", "scipy_labels", "networkx_labels", "bench"]

GRAPHS = ("uniform", "powerlaw")
INCREMENT = 0.01  # the extra epoch adds this fraction of new edges
POWERLAW_EXPONENT = 1.0  # Zipf exponent of the endpoints of a power-law graph


def generate(edges: int, epochs: int = 1, *, graph: str = "uniform", nodes: int | None = None, seed: int = 0) -> np.ndarray:
    """`edges` random edges (src, dst, epoch) over `nodes` nodes (default: as many as edges),
    epochs 0..epochs-1 in equal runs, in epoch order."""
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {', '.join(GRAPHS)}, got {graph!r}")
    nodes = edges if nodes is None else nodes
    rng = np.random.default_rng(seed)
    out = np.empty(edges, dtype=EDGES)
    if graph == "uniform":
        out["src"] = rng.integers(0, nodes, edges)
        out["dst"] = rng.integers(0, nodes, edges)
    else:
        ids = rng.permutation(nodes).astype(np.int64)
        out["src"] = ids[zipf_choice(rng, nodes, edges, POWERLAW_EXPONENT)]
        out["dst"] = ids[zipf_choice(rng, nodes, edges, POWERLAW_EXPONENT)]
    out["epoch"] = np.arange(edges, dtype=np.int64) * epochs // max(edges, 1)
    return out


def scipy_labels(src, dst, nodes: int) -> np.ndarray:
    """Least node id of every node's component, by scipy's C connected_components."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from slashrt.examples._components import canonical

    matrix = coo_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(nodes, nodes))
    return canonical(connected_components(matrix, directed=False)[1])


def networkx_labels(src, dst, nodes: int) -> np.ndarray:
    """The same by NetworkX (pure Python): the least node id of every node's component."""
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(nodes))
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    labels = np.empty(nodes, dtype=np.int64)
    for component in nx.connected_components(g):
        members = np.fromiter(component, dtype=np.int64, count=len(component))
        labels[members] = members.min()
    return labels


def _best(repeat: int, fn):
    """(fastest seconds, last result) of `repeat` calls of `fn()`."""
    seconds, result = None, None
    for _ in range(repeat):
        with Timer() as t:
            result = fn()
        seconds = t.seconds if seconds is None else min(seconds, t.seconds)
    return seconds, result


def bench(*, edges: int, epochs: int = 1, graph: str = "uniform", seed: int = 0, repeat: int = 3) -> dict:
    """Time and check slashrt's connected components; returns the JSON fields of `bench cc`."""
    for module in ("scipy.sparse.csgraph", "networkx"):  # imported before timing, not by the first call
        importlib.import_module(module)

    from slashrt.examples.cc import Components, connected_components

    nodes = edges
    data = generate(edges, epochs, graph=graph, nodes=nodes, seed=seed)
    src, dst = data["src"], data["dst"]
    whole = data.copy()
    whole["epoch"] = 0

    # all edges in one epoch: slashrt's dataflow, scipy, NetworkX
    runs = [connected_components(whole, nodes=nodes) for _ in range(repeat)]
    seconds = min(r.seconds for r in runs)
    kernel_seconds, _ = _best(repeat, lambda: Components(nodes).add_edges(src, dst))  # numpy alone
    scipy_seconds, expected = _best(repeat, lambda: scipy_labels(src, dst, nodes))
    networkx_seconds, by_networkx = _best(1, lambda: networkx_labels(src, dst, nodes))
    correct = np.array_equal(runs[-1].labels[0], expected) and np.array_equal(expected, by_networkx)

    # one more epoch of 1% new edges, incrementally, against scipy from scratch
    extra = generate(max(1, int(edges * INCREMENT)), graph=graph, nodes=nodes, seed=seed + 1)
    extra["epoch"] = 1
    grown = np.concatenate([whole, extra])
    increments = [connected_components(grown, nodes=nodes) for _ in range(repeat)]
    incremental_seconds = min(r.epoch_seconds[1] for r in increments)
    recompute_seconds, recomputed = _best(repeat, lambda: scipy_labels(grown["src"], grown["dst"], nodes))
    correct = correct and np.array_equal(increments[-1].labels[1], recomputed)

    # every epoch of the graph as it arrives
    if epochs > 1:
        arriving = connected_components(data, nodes=nodes)
        for e, labels in zip(arriving.epochs, arriving.labels):
            seen = int(np.searchsorted(data["epoch"], e, side="right"))
            correct = correct and np.array_equal(labels, scipy_labels(src[:seen], dst[:seen], nodes))
    return _result(
        edges=edges, epochs=epochs, graph=graph, seed=seed, executors=1, transport="inproc", seconds=seconds,
        scipy_seconds=scipy_seconds, networkx_seconds=networkx_seconds, incremental_edges=len(extra),
        incremental_seconds=incremental_seconds, recompute_seconds=recompute_seconds, expected=expected,
        correct=correct, kernel_seconds=round(kernel_seconds, 6), rounds=runs[-1].rounds[0],
    )


def _result(
    *, edges: int, epochs: int, graph: str, seed: int, executors: int, transport: str, seconds: float,
    scipy_seconds: float, networkx_seconds: float, incremental_edges: int, incremental_seconds: float,
    recompute_seconds: float, expected: np.ndarray, correct: bool, **more,
) -> dict:
    """The JSON fields of `bench cc` (`more`: those of one path)."""
    return {
        "query": "cc",
        "events": edges,  # the fields every benchmark reports: an edge is an event
        "executors": executors,
        "transport": transport,
        "seconds": round(seconds, 6),
        "records_per_s": round(edges / seconds, 1),
        "graph": graph,
        "edges": edges,
        "nodes": edges,
        "epochs": epochs,
        "seed": seed,
        **more,
        "scipy_seconds": round(scipy_seconds, 6),
        "networkx_seconds": round(networkx_seconds, 6),
        "incremental_edges": incremental_edges,
        "incremental_seconds": round(incremental_seconds, 6),
        "scipy_recompute_seconds": round(recompute_seconds, 6),
        "vs_scipy": round(seconds / scipy_seconds, 3),
        "speedup_vs_networkx": round(networkx_seconds / seconds, 1),
        "incremental_vs_recompute": round(incremental_seconds / recompute_seconds, 4),
        "components": int(np.count_nonzero(expected == np.arange(edges))),
        "correct": bool(correct),
    }


# -- several executors: slashrt.examples.cc_partitioned ----------------------------------------------


def _executor_edges(index: int, executors: int, *, edges: int, epochs: int, graph: str, seed: int, grow: bool):
    """Executor `index`'s share of the benchmark's graph (every executor generates it from the
    seed, and keeps every `executors`-th edge), with a tick per epoch (`ticks`), by epoch."""
    from slashrt.examples.cc_partitioned import ticks

    data = _graph(edges, epochs, graph, seed, grow)
    mine = data[index::executors]
    both = np.concatenate([mine, ticks(np.unique(data["epoch"]), index, executors)])
    return both[np.argsort(both["epoch"], kind="stable")]


def _no_proposals(index: int, executors: int) -> np.ndarray:
    from slashrt.examples.cc_partitioned import MESSAGES

    return np.empty(0, MESSAGES)


def _graph(edges: int, epochs: int, graph: str, seed: int, grow: bool) -> np.ndarray:
    """The graph of `bench`: all edges in one epoch (epochs == 0), or as they arrive; `grow`
    adds the epoch of INCREMENT new edges after the whole graph."""
    data = generate(edges, max(epochs, 1), graph=graph, nodes=edges, seed=seed)
    if epochs == 0:
        data["epoch"] = 0
    if grow:
        extra = generate(max(1, int(edges * INCREMENT)), graph=graph, nodes=edges, seed=seed + 1)
        extra["epoch"] = int(data["epoch"].max()) + 1
        data = np.concatenate([data, extra])
    return data


def _partitioned_run(executors: int, transport: str, **graph):
    """One run of the partitioned example: (seconds, changes with left_ns)."""
    import functools

    import slashrt
    from slashrt.cluster import PerExecutor
    from slashrt.examples.cc_partitioned import cc_partitioned_flow
    from slashrt.sinks import Collect

    make = functools.partial(_executor_edges, **graph)
    if executors == 1:
        sink = Collect()
        result = slashrt.run(cc_partitioned_flow(sink, stamp=True), {"edges": make(0, 1), "proposals": _no_proposals(0, 1)})
        return result.seconds, sink.records
    result = slashrt.run(
        cc_partitioned_flow(Collect(), stamp=True), {"edges": PerExecutor(make), "proposals": PerExecutor(_no_proposals)},
        executors=executors, transport=transport,
    )
    return result.seconds, result.outputs["ccp.out"]


def bench_partitioned(
    *, edges: int, epochs: int = 1, graph: str = "uniform", seed: int = 0, repeat: int = 3, executors: int = 2,
    transport: str = "shm",
) -> dict:
    """`bench cc --executors K`: `slashrt.examples.cc_partitioned` (labels owned by node id,
    min-label proposals exchanged between executors) on K executor processes and, in the same
    command, on one executor: all edges in one epoch (`seconds`, `one_executor_seconds`),
    then the epoch of 1% new edges after them on K executors (`incremental_seconds`: from the
    last label of the first epoch leaving the loop to the last of the new one), against scipy
    and NetworkX as `bench`; every epoch's labels are checked against scipy."""
    for module in ("scipy.sparse.csgraph", "networkx"):
        importlib.import_module(module)
    from slashrt.examples.cc_partitioned import labels_after

    nodes = edges
    whole = _graph(edges, 0, graph, seed, grow=False)
    src, dst = whole["src"], whole["dst"]
    shape = {"edges": edges, "graph": graph, "seed": seed}

    def labels_ok(changes, data) -> bool:
        epochs_seen = np.unique(data["epoch"]).tolist()
        ok = True
        for e, labels in zip(epochs_seen, labels_after(changes, nodes, epochs_seen)):
            seen = data[data["epoch"] <= e]
            ok = ok and np.array_equal(labels, scipy_labels(seen["src"], seen["dst"], nodes))
        return ok

    runs = [_partitioned_run(executors, transport, epochs=0, grow=False, **shape) for _ in range(repeat)]
    seconds = min(s for s, _ in runs)
    ones = [_partitioned_run(1, transport, epochs=0, grow=False, **shape) for _ in range(repeat)]
    one_seconds = min(s for s, _ in ones)
    scipy_seconds, expected = _best(repeat, lambda: scipy_labels(src, dst, nodes))
    networkx_seconds, by_networkx = _best(1, lambda: networkx_labels(src, dst, nodes))
    correct = labels_ok(runs[-1][1], whole) and labels_ok(ones[-1][1], whole) and np.array_equal(expected, by_networkx)

    grown = _graph(edges, 0, graph, seed, grow=True)
    increments = []
    for _ in range(repeat):
        _, changes = _partitioned_run(executors, transport, epochs=0, grow=True, **shape)
        correct = correct and labels_ok(changes, grown)
        last = [int(changes["left_ns"][changes["epoch"] == e].max(initial=0)) for e in (0, 1)]
        increments.append((last[1] - last[0]) / 1e9)
    incremental_seconds = min(increments)
    recompute_seconds, _ = _best(repeat, lambda: scipy_labels(grown["src"], grown["dst"], nodes))

    if epochs > 1:  # the graph as it arrives, every epoch checked
        _, changes = _partitioned_run(executors, transport, epochs=epochs, grow=False, **shape)
        correct = correct and labels_ok(changes, _graph(edges, epochs, graph, seed, grow=False))
    return _result(
        edges=edges, epochs=epochs, graph=graph, seed=seed, executors=executors, transport=transport, seconds=seconds,
        scipy_seconds=scipy_seconds, networkx_seconds=networkx_seconds, incremental_edges=max(1, int(edges * INCREMENT)),
        incremental_seconds=incremental_seconds, recompute_seconds=recompute_seconds, expected=expected,
        correct=correct, example="cc_partitioned", one_executor_seconds=round(one_seconds, 6),
        speedup_vs_one_executor=round(one_seconds / seconds, 3),
    )
