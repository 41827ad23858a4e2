"""The coordinator's execution plan (`cluster._execution_plan`): exchanges as groups, regions,
restart sets and descriptors in O(N), and `slashrt bench plan`, which measures them."""

import json

import numpy as np
import pytest

from slashrt import Dataflow, Schema, Tumbling
from slashrt.cli import main
from slashrt.cluster import PerExecutor
from slashrt.cluster._execution_plan import ExecutionPlan
from slashrt.cluster._job import LZMA_FROM, port_table, ports_of
from slashrt.errors import ChannelClosed, DataflowError
from slashrt.ops.sinks import Collect

SCHEMA = Schema({"t": "i8", "k": "i8"})


def windowed() -> Dataflow:
    f = Dataflow("windowed")
    f.source("a", SCHEMA, time="t").window(Tumbling(ms=10)).count(key="k").sink(Collect())
    return f


def pipelines() -> Dataflow:
    f = Dataflow("pipelines")
    f.source("a", SCHEMA, time="t").filter(lambda b: b["k"] > 0).sink(Collect())
    return f


def _make(index: int, executors: int) -> np.ndarray:
    return np.zeros(3, SCHEMA.dtype)


@pytest.mark.parametrize("mode", ["slash", "uppar"])
def test_an_exchange_is_one_group_and_joins_every_executor_in_one_region(mode):
    plan = ExecutionPlan(windowed(), 8, mode=mode)
    assert [g.step_id for g in plan.groups] == [s.step_id for s in plan.executor.exchanges()] and len(plan.groups) == 1
    assert plan.regions == 1 and plan.channels() == 8 * 7
    np.testing.assert_array_equal(plan.restart_set([3]), np.arange(8))


def test_pipelines_that_never_exchange_are_a_region_each_and_a_failure_restarts_only_its_own():
    plan = ExecutionPlan(pipelines(), 8)
    assert plan.groups == () and plan.regions == 8 and plan.channels() == 0
    np.testing.assert_array_equal(plan.restart_set([3]), [3])
    np.testing.assert_array_equal(plan.restart_set([6, 1]), [1, 6])
    with pytest.raises(DataflowError, match=r"executors \[8\] are not all among the job's 8"):
        plan.restart_set([8])


def test_a_plan_of_a_million_executors_holds_no_channel():
    plan = ExecutionPlan(windowed(), 1_000_000)
    assert plan.channels() == 1_000_000 * 999_999
    assert plan.region_of.nbytes == 4_000_000  # one number per executor, nothing per channel
    assert plan.restart_set([999_999]).size == 1_000_000


def test_inputs_every_executor_opens_alike_are_shared_and_arrays_split():
    flow = Dataflow("two")
    flow.source("a", SCHEMA, time="t").sink(Collect())
    flow.source("b", SCHEMA, time="t").sink(Collect())
    made = PerExecutor(_make)
    data = np.zeros(9, SCHEMA.dtype)
    data["t"] = np.arange(9)

    def split(step_id, spec, value, executors):
        return None if isinstance(value, PerExecutor) else np.array_split(value, executors)

    common, own = ExecutionPlan(flow, 3).input_parts({"a": made, "b": data}, split)
    assert common == {"a": made}
    assert [sorted(o) for o in own] == [["b"]] * 3
    np.testing.assert_array_equal(np.concatenate([o["b"] for o in own]), data)


@pytest.mark.parametrize("executors", [5, 5000], ids=["zlib", "lzma"])
def test_the_port_table_round_trips_and_a_damaged_one_is_one_sentence(executors):
    ports = [(f"10.0.0.{i % 200}", 32768 + i % 20000) for i in range(executors)]
    table = port_table(ports)
    assert table[:1] == (b"x" if executors * 10 >= LZMA_FROM else b"z")
    assert ports_of(table, executors) == ports
    with pytest.raises(ChannelClosed, match=f"is not a list of {executors} addresses"):
        ports_of(port_table(ports[:-1]), executors)
    with pytest.raises(ChannelClosed, match="^the coordinator's table of ports does not unpickle"):
        ports_of(table[: len(table) // 2], executors)
    with pytest.raises(ChannelClosed, match="neither of the compressions"):
        ports_of(b"q" + table[1:], executors)


def test_bench_plan_measures_both_sizes_and_checks_the_descriptors(capsys):
    assert main(["bench", "plan", "--executors", "200", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] and result["executors"] == 200 and result["at_20"]["executors"] == 20
    assert result["restart_set_size"] == 200 and result["regions"] == 1 and result["channels"] == 200 * 199
    assert 0 < result["compression"] < 1 and result["descriptor_bytes"] < result["descriptor_raw_bytes"]
    assert set(result["growth"]) == {"plan_s", "descriptors_s", "restart_set_s", "port_table_bytes", "descriptor_bytes"}
    assert result["peak_rss_mb"] >= result["baseline_rss_mb"] > 0


def test_bench_plan_refuses_fewer_than_ten_executors(capsys):
    assert main(["bench", "plan", "--executors", "9"]) == 2
    assert "give 10 or more" in capsys.readouterr().err


def test_bench_plan_hosts_every_and_seed_shape_the_ports_the_descriptors_carry(capsys):
    def table_bytes(*options: str) -> int:
        assert main(["bench", "plan", "--executors", "400", "--repeat", "1", "--json", *options]) == 0
        return json.loads(capsys.readouterr().out)["port_table_bytes"]

    one_host, a_host_each = table_bytes("--hosts-every", "400"), table_bytes("--hosts-every", "1")
    assert one_host < a_host_each  # 400 host names cost more than one
    assert table_bytes("--seed", "3") == table_bytes("--seed", "3")  # the same ports again


def test_bench_plan_prints_every_figure_on_a_line_of_its_own(capsys):
    assert main(["bench", "plan", "--executors", "100", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = {line.split()[0]: line.split()[1] for line in lines}
    assert "growth.plan_s" in fields and "at_10.descriptors_s" in fields and fields["correct"] == "True"
    assert not any("{" in line for line in lines)  # no nested figure on one line
    assert float(fields["plan_s"]) > 0  # (a fraction of a millisecond, not 0.000)
