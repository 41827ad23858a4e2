"""PageRank, the kernel and the dataflow loop, equals a numpy power iteration within 1e-9."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt import run
from slashrt.bench.cc import generate
from slashrt.errors import DataflowError, SchemaError
from slashrt.examples._power_iteration import DAMPING, Graph
from slashrt.examples.pagerank import pagerank, pagerank_flow
from slashrt.sinks import Collect


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


# --- in a dataflow loop -------------------------------------------------------------------------


def sparse_power_iteration(src, dst, nodes: int, k: int) -> np.ndarray:
    """The reference for larger graphs: scipy's sparse matrix, dangling mass spread evenly."""
    from scipy.sparse import csr_matrix

    out = np.bincount(src, minlength=nodes).astype(float)
    m = csr_matrix((1.0 / out[src], (dst, src)), shape=(nodes, nodes))
    dangling = out == 0
    ranks = np.full(nodes, 1.0 / nodes)
    for _ in range(k):
        ranks = (1 - DAMPING) / nodes + DAMPING * (m @ ranks + ranks[dangling].sum() / nodes)
    return ranks


@settings(max_examples=15, deadline=None)
@given(edges=st.integers(1, 200), nodes=st.integers(1, 60), k=st.integers(0, 12), epochs=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_loop_equals_dense_power_iteration_after_every_epoch(edges, nodes, k, epochs, seed):
    data = generate(edges, epochs, nodes=nodes, seed=seed)
    result = pagerank(data, k, nodes=nodes)
    assert result.epochs == sorted(set(data["epoch"].tolist()))
    for e, ranks in zip(result.epochs, result.ranks):
        upto = data[data["epoch"] <= e]
        assert np.max(np.abs(ranks - dense_power_iteration(upto["src"], upto["dst"], nodes, k))) <= 1e-9


def test_loop_on_a_power_law_graph_equals_scipy_within_1e_9():
    data = generate(100_000, graph="powerlaw", nodes=20_000, seed=4)
    ranks = pagerank(data, 30).ranks[0]
    assert np.max(np.abs(ranks - sparse_power_iteration(data["src"], data["dst"], 20_000, 30))) <= 1e-9


def test_starting_ranks_replace_the_uniform_start():
    sink = Collect()
    flow = pagerank_flow(sink, 0)
    edges = np.zeros(1, dtype=[("src", "<i8"), ("dst", "<i8"), ("epoch", "<i8")])
    edges["dst"] = 2
    run(flow, {"edges": edges, "ranks": np.array([(1, 0.5)], dtype=[("node", "<i8"), ("rank", "<f8")])})
    assert sink.records["rank"].tolist() == [1 / 3, 0.5, 1 / 3]  # zero iterations: the start itself


def test_k_iterations_stay_within_a_loop_bounded_by_k():
    # max_iterations=k: one feedback more than k would fail the run with an OperatorError
    result = pagerank(generate(500, nodes=50, seed=1), 7)
    assert len(result.ranks) == 1 and abs(result.ranks[0].sum() - 1) <= 1e-9
    with pytest.raises(DataflowError, match="iterations must be a whole number >= 0, got -1"):
        pagerank(generate(10, nodes=5), -1)
