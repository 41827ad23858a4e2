"""The numpy kernel of PageRank: one power iteration over a directed graph's edges.

`Graph.step(ranks)` is one power iteration with damping 0.85: every node passes
`damping * rank / out_degree` along each of its edges, the rank of nodes without out-edges
(dangling) is spread evenly over all nodes, and every node gets `(1 - damping) / n` on top.
Ranks start at 1/n and always sum to 1. Duplicate edges count as often as they appear; a self
loop is an edge like any other. One step is a gather, a bincount and a sum: no Python loop.
"""

from __future__ import annotations

import numpy as np

from slashrt.errors import SchemaError

__all__ = ["Graph", "DAMPING"]

DAMPING = 0.85


class Graph:
    """A directed graph over nodes 0..nodes-1, ready for vectorised power iterations."""

    def __init__(self, src, dst, nodes: int | None = None, *, damping: float = DAMPING):
        src, dst = np.asarray(src), np.asarray(dst)
        for name, ids in (("src", src), ("dst", dst)):
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise SchemaError(f"pagerank: {name} must be a 1-d array of integer node ids, got {ids.dtype}")
            if ids.size and ids.min() < 0:
                raise SchemaError(f"pagerank: {name} holds negative node id {int(ids.min())}; node ids are >= 0")
        if len(src) != len(dst):
            raise SchemaError(f"pagerank: {len(src)} sources but {len(dst)} destinations")
        largest = int(max(src.max(), dst.max())) + 1 if len(src) else 0
        nodes = largest if nodes is None else nodes
        if nodes < largest or nodes <= 0:
            raise SchemaError(f"pagerank: nodes={nodes} must be positive and above every node id (the largest is "
                              f"{largest - 1})")
        if not 0 <= damping <= 1:
            raise SchemaError(f"pagerank: damping must be in [0, 1], got {damping}")
        self.nodes, self.damping = nodes, damping
        self.src, self.dst = src.astype(np.int64), dst.astype(np.int64)
        out_degree = np.bincount(self.src, minlength=nodes)
        self.dangling = np.flatnonzero(out_degree == 0)
        with np.errstate(divide="ignore"):
            self.share = np.where(out_degree > 0, 1.0 / out_degree, 0.0)  # of a node's rank, per out-edge

    def initial(self) -> np.ndarray:
        return np.full(self.nodes, 1.0 / self.nodes)

    def step(self, ranks: np.ndarray) -> np.ndarray:
        """One power iteration."""
        passed = np.bincount(self.dst, weights=(ranks * self.share)[self.src], minlength=self.nodes)
        spread = ranks[self.dangling].sum() / self.nodes
        return (1.0 - self.damping) / self.nodes + self.damping * (passed + spread)
