"""The numpy kernels of connected components equal scipy after every epoch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.bench.cc import generate, scipy_labels
from slashrt.errors import SchemaError
from slashrt.examples._components import Components, canonical


def epochs_of(edges: np.ndarray):
    for e in np.unique(edges["epoch"]):
        part = edges[edges["epoch"] == e]
        yield part["src"], part["dst"]


@settings(max_examples=60, deadline=None)
@given(
    edges=st.integers(0, 300), nodes=st.integers(1, 200), epochs=st.integers(1, 5),
    graph=st.sampled_from(["uniform", "powerlaw"]), seed=st.integers(0, 2**32 - 1),
)
def test_labels_equal_scipy_after_every_epoch(edges, nodes, epochs, graph, seed):
    data = generate(edges, epochs, graph=graph, nodes=nodes, seed=seed)
    state = Components()
    seen = 0
    labels = np.arange(nodes, dtype=np.int64)  # rebuilt from the changes each epoch returns
    for src, dst in epochs_of(data):
        changed, new = state.add_edges(src, dst)
        labels[changed] = new
        seen += len(src)
        expected = scipy_labels(data["src"][:seen], data["dst"][:seen], nodes)
        assert np.array_equal(state.labels(nodes), expected)
        assert np.array_equal(labels, expected)  # the changes are exactly what changed


def test_isolated_nodes_self_loops_and_duplicates():
    state = Components(10)
    changed, new = state.add_edges(np.array([3, 3, 3, 7, 7, 5]), np.array([3, 7, 7, 3, 9, 5]))
    assert state.labels(10).tolist() == [0, 1, 2, 3, 4, 5, 6, 3, 8, 3]
    assert sorted(zip(changed.tolist(), new.tolist())) == [(7, 3), (9, 3)]


def test_an_epoch_without_edges_changes_nothing():
    state = Components()
    state.add_edges(np.array([1]), np.array([2]))
    changed, new = state.add_edges(np.array([], np.int64), np.array([], np.int64))
    assert len(changed) == len(new) == 0 and state.labels(3).tolist() == [0, 1, 1]


def test_a_long_path_merges_in_few_rounds():
    from slashrt.examples._components import ComponentsEpoch

    n = 1 << 14
    order = np.random.default_rng(0).permutation(n)
    epoch = ComponentsEpoch(Components(), order[:-1], order[1:])
    while (changes := epoch.propose()) is not None:
        epoch.apply(*changes)
    epoch.finish()
    assert (epoch.state.labels(n) == 0).all() and epoch.rounds <= 4 * 14


@pytest.mark.parametrize(
    "src,dst,message",
    [([-1], [2], "negative node id -1"), ([1.5], [2], "integer node ids"), ([1, 2], [3], "2 sources but 1")],
)
def test_bad_node_ids_are_one_sentence(src, dst, message):
    with pytest.raises(SchemaError, match=message):
        Components().add_edges(np.array(src), np.array(dst))


def test_canonical_relabels_to_least_member():
    assert canonical(np.array([1, 0, 1, 2, 0])).tolist() == [0, 1, 0, 3, 1]
