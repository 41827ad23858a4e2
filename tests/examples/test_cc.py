"""Connected components in a dataflow loop: the labels after every epoch equal scipy's on the
edges so far; the loop's bound and bad input are reported in one sentence."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.bench.cc import generate, networkx_labels, scipy_labels
from slashrt.examples import EDGES
from slashrt.errors import OperatorError, SchemaError
from slashrt.examples.cc import cc_flow, connected_components
from slashrt.sinks import Collect


def edges_of(pairs, epochs) -> np.ndarray:
    out = np.empty(len(pairs), dtype=EDGES)
    out["src"] = [p[0] for p in pairs]
    out["dst"] = [p[1] for p in pairs]
    out["epoch"] = epochs
    return out


def assert_every_epoch_equals_scipy(data, nodes, result):
    for e, labels in zip(result.epochs, result.labels):
        upto = data[data["epoch"] <= e]
        assert np.array_equal(labels, scipy_labels(upto["src"], upto["dst"], nodes)), f"epoch {e}"


@settings(max_examples=25, deadline=None)
@given(
    edges=st.integers(0, 300), nodes=st.integers(1, 200), epochs=st.integers(1, 5),
    graph=st.sampled_from(["uniform", "powerlaw"]), seed=st.integers(0, 2**32 - 1),
)
def test_labels_equal_scipy_after_every_epoch(edges, nodes, epochs, graph, seed):
    data = generate(edges, epochs, graph=graph, nodes=nodes, seed=seed)
    result = connected_components(data, nodes=nodes, epochs=range(epochs))
    assert result.epochs == list(range(epochs))
    assert_every_epoch_equals_scipy(data, nodes, result)


def test_many_batches_and_epochs_equal_scipy_and_networkx():
    data = generate(60_000, 12, graph="powerlaw", nodes=40_000, seed=5)  # edges span many buffers
    result = connected_components(data, nodes=40_000)
    assert result.epochs == list(range(12)) and all(r >= 1 for r in result.rounds.values())
    assert_every_epoch_equals_scipy(data, 40_000, result)
    assert np.array_equal(result.labels[-1], networkx_labels(data["src"], data["dst"], 40_000))


def test_isolated_nodes_self_loops_duplicates_and_an_epoch_without_edges():
    data = edges_of([(4, 4), (2, 5), (5, 2), (2, 5), (9, 9), (7, 5), (1, 0), (1, 0)], [0, 0, 0, 0, 0, 2, 2, 3])
    result = connected_components(data, nodes=11, epochs=[0, 1, 2, 3])
    after0 = [0, 1, 2, 3, 4, 2, 6, 7, 8, 9, 10]  # self loops and isolated nodes keep their own ids
    assert result.labels[0].tolist() == after0
    assert result.labels[1].tolist() == after0  # epoch 1 has no edges
    assert result.labels[2].tolist() == [0, 0, 2, 3, 4, 2, 6, 2, 8, 9, 10]
    assert result.labels[3].tolist() == result.labels[2].tolist()  # only duplicates of known edges


def test_unsorted_and_negative_epochs_keep_their_order():
    data = edges_of([(3, 4), (0, 1), (1, 3)], [1000, -5, 7])
    result = connected_components(data)
    assert result.epochs == [-5, 7, 1000]
    assert [r.tolist() for r in result.labels] == [[0, 0, 2, 3, 4], [0, 0, 2, 0, 4], [0, 0, 2, 0, 0]]


def test_the_sink_gets_each_epoch_once_in_epoch_order():
    data = generate(5_000, 6, nodes=3_000, seed=2)
    sink = Collect()
    flow, body = cc_flow(sink)
    from slashrt import run

    result = run(flow, {"edges": data, "labels": np.empty(0, dtype=[("node", "<i8"), ("label", "<i8")])})
    out = sink.records
    assert np.all(np.diff(out["epoch"]) >= 0)  # handed on as epochs finish, in order
    for e in range(6):
        nodes = out["node"][out["epoch"] == e]
        assert len(nodes) == len(np.unique(nodes))  # one final label per changed node per epoch
    assert set(body.rounds) == set(range(6)) and result.frontiers  # every epoch ran its rounds


def test_a_starting_labelling_joins_the_components():
    from slashrt import run

    sink = Collect()
    flow, _ = cc_flow(sink)
    start = np.array([(6, 2)], dtype=[("node", "<i8"), ("label", "<i8")])  # known: 6 is with 2
    run(flow, {"edges": edges_of([(2, 3)], [0]), "labels": start})
    changed = {int(n): int(lab) for n, lab in zip(sink.records["node"], sink.records["label"])}
    assert changed[3] == 2 and changed[6] == 2


def test_a_loop_bound_too_low_is_an_error_naming_the_loop():
    order = np.random.default_rng(1).permutation(4096)
    path = edges_of(list(zip(order[:-1].tolist(), order[1:].tolist())), 0)  # needs several rounds
    with pytest.raises(OperatorError, match=r"loop 'cc.rounds' reached its bound of max_iterations=1"):
        connected_components(path, max_iterations=1)


@pytest.mark.parametrize(
    "edges,message",
    [
        (np.zeros(3, dtype=[("src", "<i8"), ("dst", "<i8")]), r"missing \['epoch'\]"),
        (edges_of([(0, -2)], [0]), "negative node id -2"),
        ([(1, 2, 0)], "need int64 columns src, dst and epoch"),
    ],
)
def test_bad_edges_are_one_sentence(edges, message):
    with pytest.raises((SchemaError, OperatorError), match=message):
        connected_components(edges)


def test_nodes_below_the_largest_id_is_refused():
    with pytest.raises(SchemaError, match="nodes=3 is below the largest node id 7"):
        connected_components(edges_of([(7, 1)], [0]), nodes=3)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "slashrt", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("graph", ["uniform", "powerlaw"])
def test_bench_cc_json_is_one_correct_object(graph):
    proc = run_cli("bench", "cc", "--edges", "4000", "--epochs", "3", "--graph", graph, "--repeat", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for field in ("query", "events", "transport", "records_per_s", "edges", "epochs", "executors", "seconds", "scipy_seconds", "networkx_seconds",
                  "incremental_seconds", "scipy_recompute_seconds", "correct"):
        assert field in result
    assert result["correct"] is True and result["edges"] == 4000 and result["epochs"] == 3
    assert result["executors"] == 1 and result["graph"] == graph and result["incremental_edges"] == 40


@pytest.mark.parametrize(("executors", "transport"), [("2", "shm"), ("3", "tcp")])
def test_bench_cc_on_several_executors_runs_the_partitioned_example_against_one(executors, transport):
    proc = run_cli("bench", "cc", "--edges", "3000", "--epochs", "2", "--executors", executors, "--transport", transport,
                   "--repeat", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for field in ("edges", "epochs", "executors", "seconds", "scipy_seconds", "networkx_seconds", "incremental_seconds",
                  "scipy_recompute_seconds", "one_executor_seconds", "speedup_vs_one_executor", "correct"):
        assert field in result
    assert result["correct"] is True and result["example"] == "cc_partitioned"
    assert result["executors"] == int(executors) and result["transport"] == transport and result["epochs"] == 2
    assert result["incremental_seconds"] > 0 and result["one_executor_seconds"] > 0
