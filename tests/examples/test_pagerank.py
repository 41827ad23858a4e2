"""PageRank equals a dense numpy power iteration within 1e-9."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.bench.cc import generate
from slashrt.errors import SchemaError
from slashrt.examples._power_iteration import DAMPING, Graph


def dense_power_iteration(src, dst, nodes: int, k: int) -> np.ndarray:
    """The reference: the column-stochastic matrix (dangling columns uniform), k products."""
    m = np.zeros((nodes, nodes))
    np.add.at(m, (dst, src), 1.0)
    out = m.sum(axis=0)
    m = np.where(out > 0, m / np.where(out > 0, out, 1.0), 1.0 / nodes)
    ranks = np.full(nodes, 1.0 / nodes)
    for _ in range(k):
        ranks = (1 - DAMPING) / nodes + DAMPING * (m @ ranks)
    return ranks


def kernel_pagerank(src, dst, nodes, k):
    g = Graph(src, dst, nodes)
    ranks = g.initial()
    for _ in range(k):
        ranks = g.step(ranks)
    return ranks


@settings(max_examples=40, deadline=None)
@given(edges=st.integers(0, 200), nodes=st.integers(1, 60), k=st.integers(0, 30),
       graph=st.sampled_from(["uniform", "powerlaw"]), seed=st.integers(0, 2**32 - 1))
def test_kernel_equals_dense_power_iteration(edges, nodes, k, graph, seed):
    data = generate(edges, graph=graph, nodes=nodes, seed=seed)
    got = kernel_pagerank(data["src"], data["dst"], nodes, k)
    assert np.max(np.abs(got - dense_power_iteration(data["src"], data["dst"], nodes, k))) <= 1e-9
    assert abs(got.sum() - 1.0) <= 1e-9


@pytest.mark.parametrize(
    "src,dst,nodes,message",
    [([-1], [0], None, "negative node id"), ([0, 1], [1], None, "2 sources but 1"), ([0], [5], 3, "nodes=3")],
)
def test_bad_graphs_are_one_sentence(src, dst, nodes, message):
    with pytest.raises(SchemaError, match=message):
        Graph(np.array(src), np.array(dst), nodes)
