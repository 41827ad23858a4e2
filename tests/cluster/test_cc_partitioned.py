"""Connected components with labels partitioned by node id on 1-3 executors: after every
epoch the labels equal scipy's on the edges seen so far."""

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

import slashrt
from slashrt.cluster import PerExecutor
from slashrt.examples import EDGES
from slashrt.examples._components import canonical
from slashrt.examples.cc_partitioned import MESSAGES, cc_partitioned_flow, labels_after, ticks
from slashrt.sinks import Collect

NODES, EPOCHS, PER_EPOCH = 400, 4, 120


def edges() -> np.ndarray:
    rng = np.random.default_rng(5)
    out = np.zeros(EPOCHS * PER_EPOCH, EDGES)
    out["src"], out["dst"] = rng.integers(0, NODES, len(out)), rng.integers(0, NODES, len(out))
    out["epoch"] = np.repeat(np.arange(EPOCHS), PER_EPOCH)
    return out


def scipy_labels(upto: int) -> np.ndarray:
    e = edges()
    e = e[e["epoch"] <= upto]
    graph = coo_matrix((np.ones(len(e)), (e["src"], e["dst"])), shape=(NODES, NODES))
    return canonical(connected_components(graph, directed=False)[1])


def share(index: int, executors: int) -> np.ndarray:
    mine = edges()[index::executors]
    both = np.concatenate([mine, ticks(np.arange(EPOCHS), index, executors)])
    return both[np.argsort(both["epoch"], kind="stable")]


@pytest.mark.parametrize(("executors", "transport"), [(1, None), (2, "shm"), (3, "tcp")])
def test_labels_equal_scipy_after_every_epoch(executors, transport):
    sink = Collect()
    inputs = {"edges": share(0, 1), "proposals": np.empty(0, MESSAGES)}
    if executors > 1:
        inputs = {"edges": PerExecutor(share), "proposals": PerExecutor(lambda i, n: np.empty(0, MESSAGES))}
        result = slashrt.run(cc_partitioned_flow(sink), inputs, executors=executors, transport=transport)
        changes = result.outputs["ccp.out"]
    else:
        slashrt.run(cc_partitioned_flow(sink), inputs)
        changes = sink.records
    for epoch, labels in zip(range(EPOCHS), labels_after(changes, NODES, range(EPOCHS))):
        np.testing.assert_array_equal(labels, scipy_labels(epoch), err_msg=f"after epoch {epoch}")
