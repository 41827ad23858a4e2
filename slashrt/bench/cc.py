"""`slashrt bench cc`: connected components of a random graph, against scipy and NetworkX.

The graph has `edges` edges over as many nodes (uniform endpoints, or power-law: both
endpoints Zipf-distributed over randomly permuted ids, so hubs are not the least ids), cut
into `epochs` epochs of equal size. The benchmark times slashrt's dataflow
(`slashrt.examples.cc`) on all edges in one epoch against scipy's C `connected_components`
and NetworkX, then one extra epoch of 1% new edges processed incrementally against scipy
recomputing from scratch, and checks every epoch's labels against scipy (and the full
result against NetworkX).
"""

from __future__ import annotations

import numpy as np

from slashrt.bench._common import zipf_choice

__all__ = ["GRAPHS", "generate", "scipy_labels", "networkx_labels"]

GRAPHS = ("uniform", "powerlaw")
POWERLAW_EXPONENT = 1.0  # Zipf exponent of the endpoints of a power-law graph

EDGE_DTYPE = np.dtype([("src", "<i8"), ("dst", "<i8"), ("epoch", "<i8")])


def generate(edges: int, epochs: int = 1, *, graph: str = "uniform", nodes: int | None = None, seed: int = 0) -> np.ndarray:
    """`edges` random edges (src, dst, epoch) over `nodes` nodes (default: as many as edges),
    epochs 0..epochs-1 in equal runs, in epoch order."""
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {', '.join(GRAPHS)}, got {graph!r}")
    nodes = edges if nodes is None else nodes
    rng = np.random.default_rng(seed)
    out = np.empty(edges, dtype=EDGE_DTYPE)
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

    from slashrt.examples.cc import canonical

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
