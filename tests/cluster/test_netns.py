"""A multi-host run on this machine: executor agents in their own network namespaces (hosts
with their own addresses, joined by veth pairs on a bridge), the coordinator in the root
namespace, channels over tcp between the namespaces. The same code path as real hosts."""

import os

import numpy as np
import pytest
import trio

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.bench._common import sort_rows
from slashrt.cluster import ClusterError, PerExecutor
from slashrt.ops.sinks import Collect
from slashrt.testing import EXCHANGE_MODES, WRAPS, _netns as netns, check_exchanges
from slashrt.transport._auth import generate_secret

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
HOSTS = 3
AGENT_PORT = 7711


@pytest.fixture(scope="module")
def hosts():
    """Three test hosts (network namespaces, `slashrt.testing._netns`)."""
    if (why := netns.why_not()) is not None:
        pytest.fail(f"the multi-host test makes its test hosts as network namespaces: {why}")
    with netns.open_hosts(HOSTS) as made:
        yield made.names, made.addresses


def _start_agents(names, addresses, secret: bytes, once: bool = True):
    return netns.start_agents(netns.Hosts(names, addresses), secret, AGENT_PORT, once=once)


def _stop(procs) -> None:
    netns.stop_agents(procs)


def _stream(index: int, executors: int) -> np.ndarray:
    rng = np.random.default_rng(index)
    out = np.zeros(30_000, SCHEMA.dtype)
    out["ts"] = np.arange(len(out)) // 20
    out["key"] = rng.integers(0, 500, len(out))
    out["value"] = rng.integers(0, 100, len(out))
    return out


def _flow(sink, union: bool = False) -> Dataflow:
    """A keyed window sum; with `union`, its records go through a union first."""
    from tests.cluster.test_hostile import through_a_union

    f = Dataflow("netns")
    r = f.source("r", SCHEMA, time="ts")
    r = through_a_union(r) if union else r
    r.window(Tumbling(ms=200)).sum("value", key="key", output="total").sink(sink)
    return f


@pytest.mark.parametrize("mode", ["slash", "uppar"])
def test_executors_on_three_hosts_over_tcp_equal_the_sequential_run(hosts, mode):
    names, addresses = hosts
    secret = generate_secret()
    procs = _start_agents(names, addresses, secret)
    try:
        sink = Collect()
        slashrt.run(
            _flow(sink),
            {"r": PerExecutor(_stream)},
            executors=[f"{a}:{AGENT_PORT}" for a in addresses],
            transport="tcp",
            mode=mode,
            secret=secret,
        )
        for proc in procs:
            assert proc.wait(timeout=30) == 0
    finally:
        _stop(procs)
    whole = np.concatenate([_stream(i, HOSTS) for i in range(HOSTS)])
    expected = Collect()
    slashrt.run(_flow(expected), {"r": whole[np.argsort(whole["ts"], kind="stable")]})
    order = ("window_start", "key")
    np.testing.assert_array_equal(sort_rows(sink.records, *order), sort_rows(expected.records, *order))


@pytest.mark.parametrize("mode", list(EXCHANGE_MODES))
async def test_exchanges_between_hosts_wrap_small_rings_many_times_and_equal_one_executor(hosts, mode):
    # each tcp channel between two namespaces carries >= 100 rings of 4 x 4 KiB before its end
    names, addresses = hosts
    secret = generate_secret()
    procs = _start_agents(names, addresses, secret)
    try:
        report = await check_exchanges(
            "tcp", mode, executors=[f"{a}:{AGENT_PORT}" for a in addresses], secret=secret, deadline=180
        )
        for proc in procs:
            assert await trio.to_thread.run_sync(proc.wait, 30) == 0
    finally:
        _stop(procs)
    assert report["rings"] >= WRAPS


def test_a_coordinator_without_the_secret_is_refused(hosts):
    names, addresses = hosts
    procs = _start_agents(names[:1], addresses[:1], generate_secret())
    try:
        with pytest.raises(ClusterError, match="executor 0|secret|handshake"):
            slashrt.run(
                _flow(Collect()),
                {"r": PerExecutor(_stream)},
                executors=[f"{addresses[0]}:{AGENT_PORT}"],
                transport="tcp",
                secret=generate_secret(),
            )
    finally:
        _stop(procs)


def test_graph_flow_with_exchange_on_three_hosts_equals_one_executor_and_notifies_promptly(hosts):
    """Distributed pointstamp progress between hosts: exchange by key, a loop whose records hop
    hosts, and the notification latency `slashrt bench progress` reports (printed with -s)."""
    from slashrt.bench import progress
    from tests.cluster.test_graph_cluster import KEYED, N, exchange_flow

    names, addresses = hosts
    rng = np.random.default_rng(3)
    data = np.zeros(N, KEYED)
    data["v"], data["k"], data["t"] = 100 * np.arange(N), rng.integers(0, 60, N), np.arange(N) // 100
    agents = [f"{a}:{AGENT_PORT}" for a in addresses]
    secret = generate_secret()
    procs = _start_agents(names, addresses, secret)
    try:
        many = slashrt.run(exchange_flow(), {"a": data}, executors=agents, transport="tcp", secret=secret,
                           slot_size=256, slots=4)
        for proc in procs:
            assert proc.wait(timeout=30) == 0
    finally:
        _stop(procs)
    one = slashrt.run(exchange_flow(), {"a": data}, slot_size=256, slots=4)
    for sink in ("x.per_key_out", "x.hopped"):
        assert sorted(many.outputs[sink].tolist()) == sorted(one.outputs[sink].tolist())
    # sources at full speed, then an epoch a millisecond (3 executors, 2 cores); more gaps with
    # SLASHRT_NETNS_GAPS_US=0,1000,2000 (docs/benchmarks.md)
    gaps = [float(g) for g in os.environ.get("SLASHRT_NETNS_GAPS_US", "0,1000").split(",")]
    for gap_us in gaps:
        procs = _start_agents(names, addresses, secret)
        try:
            latencies, correct = progress.notify_latency(agents, "tcp", 200, gap_us=gap_us, secret=secret)
            for proc in procs:
                assert proc.wait(timeout=30) == 0
        finally:
            _stop(procs)
        assert correct
        print(f"notify latency on 3 hosts over tcp, epoch gap {gap_us:g} us: p50 {np.percentile(latencies, 50) / 1e3:.1f} us, "
              f"p99 {np.percentile(latencies, 99) / 1e3:.1f} us")


# -- a partition between two hosts that both still answer the coordinator -----------------------------------

def blackhole(hosts, a: int, b: int, on: bool = True) -> None:
    netns.blackhole(netns.Hosts(*hosts), a, b, on)


def _partitioned_flow(pace, sink) -> Dataflow:
    """The netns window job, each executor's stream slowed behind its source by `pace`."""
    from tests.snapshot._paced import behind

    f = Dataflow("netns")  # (`pace`: a pass-through filter, `_held.HeldUntil`)
    behind(f.source("r", SCHEMA, time="ts"), pace).window(Tumbling(ms=200)).sum(
        "value", key="key", output="total").sink(sink)
    return f


async def _cut_when_running(hosts, tally, executors: int) -> float:
    """Blackhole hosts 1 and 2 once every executor has seen records (the pace's files);
    returns when (trio time). The job cannot end first: its end of stream must cross the cut."""
    while len(os.listdir(tally)) < executors:
        await trio.sleep(0.02)
    await trio.to_thread.run_sync(blackhole, hosts, 1, 2)
    return trio.current_time()


HEARTBEAT = {"heartbeat_interval": 0.5, "heartbeat_timeout": 3.0}


async def test_a_partition_between_two_executors_fails_the_job_naming_both_within_the_heartbeat_timeout(hosts, tmp_path):
    """Item 6 of issue 20: before, the job stalled silently for as long as the partition lasted."""
    from slashrt.bench._held import HeldUntil
    from slashrt.bench.fault_partition import SLOW_S
    from slashrt.cluster.coordinator import run_cluster_async

    names, addresses = hosts
    (tmp_path / "tally").mkdir()
    pace = HeldUntil(str(tmp_path / "healed"), SLOW_S, per_record=True, tally=str(tmp_path / "tally"))  # never healed: slow to the end
    secret = generate_secret()
    procs = _start_agents(names, addresses, secret)
    try:
        cut = []

        async def cutter():
            cut.append(await _cut_when_running(hosts, tmp_path / "tally", HOSTS))

        with trio.fail_after(60):  # (before: no end until the partition healed)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cutter)
                with pytest.raises(ClusterError) as failed:
                    await run_cluster_async(
                        _partitioned_flow(pace, Collect()), {"r": PerExecutor(_stream)},
                        executors=[f"{a}:{AGENT_PORT}" for a in addresses], transport="tcp", secret=secret,
                        slot_size=4096, **HEARTBEAT,
                    )
                detected = trio.current_time()
                nursery.cancel_scope.cancel()
    finally:
        blackhole(hosts, 1, 2, on=False)
        _stop(procs)
    assert str(failed.value).startswith("executors 1 and 2 cannot reach each other: no traffic on their channel for 3 s")
    assert failed.value.retryable
    # the timeout, then the coordinator's moment for the other executors' last words
    assert cut, f"the job failed before the cut: {failed.value}"
    assert detected - cut[0] < 2 * HEARTBEAT["heartbeat_timeout"] + 2


async def test_with_restart_on_agents_at_addresses_the_job_recovers_once_the_partition_heals(hosts, tmp_path):
    """The same partition with `restart=` on agents given by address (refused before): the
    job is re-submitted to the agents, which serve job after job, once the partition healed
    (the strategy heals it as it decides to restart: no guessing how long detection takes),
    and its output is exactly the failure-free one."""
    from slashrt.bench._held import HeldUntil
    from slashrt.bench.fault_partition import SLOW_S
    from slashrt.cluster.coordinator import run_cluster_async
    from slashrt.snapshot.restart import FixedDelay

    names, addresses = hosts
    (tmp_path / "tally").mkdir()
    pace = HeldUntil(str(tmp_path / "healed"), SLOW_S, per_record=True, tally=str(tmp_path / "tally"))

    class HealThenRestart(FixedDelay):
        def on_failure(self, now):
            blackhole(hosts, 1, 2, on=False)
            (tmp_path / "healed").touch()  # the rest of the stream at full speed
            return super().on_failure(now)

    secret = generate_secret()
    procs = _start_agents(names, addresses, secret, once=False)
    sink = Collect(transactional=True)
    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cut_when_running, hosts, tmp_path / "tally", HOSTS)
                result = await run_cluster_async(
                    _partitioned_flow(pace, sink), {"r": PerExecutor(_stream, deterministic=True)},
                    executors=[f"{a}:{AGENT_PORT}" for a in addresses], transport="tcp", secret=secret,
                    slot_size=4096, checkpoint={"interval": 0.2}, checkpoint_dir=tmp_path / "chk",
                    restart=HealThenRestart(attempts=1, delay=0), **HEARTBEAT,
                )
                nursery.cancel_scope.cancel()
    finally:
        blackhole(hosts, 1, 2, on=False)
        _stop(procs)
    assert len(result.recoveries) == 1 and result.recoveries[0]["cause"].startswith(
        "executors 1 and 2 cannot reach each other: no traffic on their channel for 3 s"), result.recoveries
    expected = await trio.to_thread.run_sync(_sequential)
    order = ("window_start", "key")
    np.testing.assert_array_equal(sort_rows(sink.records, *order), sort_rows(expected, *order))


def _sequential() -> np.ndarray:
    """What the netns window job outputs, run on one executor over every host's stream."""
    whole = np.concatenate([_stream(i, HOSTS) for i in range(HOSTS)])
    expected = Collect()
    slashrt.run(_flow(expected), {"r": whole[np.argsort(whole["ts"], kind="stable")]})
    return expected.records


def test_the_partition_fault_of_bench_chaos_recovers_exactly_once():
    """`slashrt bench chaos --faults partition` at a small size (its own three hosts)."""
    import argparse

    from slashrt.bench.faults import FAULTS

    if (why := netns.why_not()) is not None:
        pytest.fail(f"the partition fault makes its hosts as network namespaces: {why}")
    fields = FAULTS["partition"](argparse.Namespace(events=30_000, interval=0.2))
    assert fields["refused"] is False and fields["exact"], fields
    assert fields["duplicates"] == fields["missing"] == 0 and fields["recoveries"] == 1
    assert fields["cause"].startswith("executors 1 and 2 cannot reach each other: no traffic on their channel for 3 s")


@pytest.mark.parametrize("union", [False, True], ids=["linear", "union"])
async def test_a_partition_before_the_job_fails_it_naming_both_executors_within_the_heartbeat_timeout(hosts, union):
    """Hosts 1 and 2 cannot reach each other when the job arrives (say, a recovery re-submitted
    before the partition healed): their channels' connections go unanswered, and the job fails
    within the heartbeat timeout naming both (before: after a minute of TCP retries, naming a
    missing channel). The first channels dialled are the progress bus's."""
    from slashrt.cluster.coordinator import run_cluster_async

    names, addresses = hosts
    secret = generate_secret()
    procs = _start_agents(names, addresses, secret)
    blackhole(hosts, 1, 2)
    try:
        began = trio.current_time()
        with trio.fail_after(60), pytest.raises(ClusterError) as failed:
            await run_cluster_async(_flow(Collect(), union), {"r": PerExecutor(_stream)},
                                    executors=[f"{a}:{AGENT_PORT}" for a in addresses], transport="tcp", secret=secret,
                                    **HEARTBEAT)
        took = trio.current_time() - began
    finally:
        blackhole(hosts, 1, 2, on=False)
        _stop(procs)
    # (a new connection meets the blackhole route at once: its connect fails; one whose answers
    # are dropped waits out the heartbeat timeout: "no answer to a connection between them")
    assert str(failed.value).startswith("executors 1 and 2 cannot reach each other: "), str(failed.value)
    assert failed.value.retryable
    assert took < 2 * HEARTBEAT["heartbeat_timeout"] + 10  # (agents' set-up included; before: 60 s)


def _graph_stream(index: int, executors: int) -> np.ndarray:
    from tests.cluster.test_graph_cluster import REC

    out = np.zeros(30_000, REC)
    out["v"], out["t"] = np.arange(len(out)), np.arange(len(out)) // 100
    return out


async def test_a_partition_between_two_executors_of_a_graph_flow_is_named_too(hosts, tmp_path):
    """A graph flow without an exchange: its executors share only their progress (the progress
    bus's channels), whose stall would hold every notification silently; its channels are
    watched as the exchanges' are."""
    from slashrt.bench._held import HeldUntil
    from slashrt.bench.fault_partition import SLOW_S
    from slashrt.cluster.coordinator import run_cluster_async
    from tests.cluster.test_graph_cluster import REC, Hold

    names, addresses = hosts
    (tmp_path / "tally").mkdir()
    f = Dataflow("graph-partition")
    f.source("a", REC, time="t").filter(HeldUntil(str(tmp_path / "healed"), SLOW_S, per_record=True, tally=str(tmp_path / "tally")), name="slowed") \
        .operator(Hold(), name="hold").sink(Collect(), name="held")
    secret = generate_secret()
    procs = _start_agents(names, addresses, secret)
    try:
        with trio.fail_after(60):  # (before: no end until the partition healed)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cut_when_running, hosts, tmp_path / "tally", HOSTS)
                with pytest.raises(ClusterError) as failed:
                    await run_cluster_async(f, {"a": PerExecutor(_graph_stream)},
                                            executors=[f"{a}:{AGENT_PORT}" for a in addresses], transport="tcp",
                                            secret=secret, slot_size=4096, **HEARTBEAT)
                nursery.cancel_scope.cancel()
    finally:
        blackhole(hosts, 1, 2, on=False)
        _stop(procs)
    assert str(failed.value).startswith("executors 1 and 2 cannot reach each other: no traffic on their channel for 3 s")


async def test_a_channel_connection_nobody_answers_fails_at_its_connect_timeout(hosts):
    """Host 2 drops every answer to this (root) namespace: a SYN goes out, nothing comes back,
    as across a partition. TCP would retry for minutes; the channel gives up at its timeout."""
    import subprocess

    from slashrt.transport import RingSpec
    from slashrt.transport._channel import ChannelSilent
    from slashrt.transport.tcp import connect_tcp

    names, addresses = hosts
    bridge = addresses[0].rsplit(".", 1)[0] + ".1"
    subprocess.run(["ip", "-n", names[2], "route", "add", "blackhole", f"{bridge}/32"], check=True)
    try:
        began = trio.current_time()
        with trio.fail_after(30), pytest.raises(ChannelSilent, match=rf"^no answer to a connection from "
                                                                     rf"{addresses[2]}:7799 for 0.5 s$"):
            await connect_tcp((addresses[2], 7799), RingSpec(), generate_secret(), connect_timeout=0.5)
        assert trio.current_time() - began >= 0.5
    finally:
        subprocess.run(["ip", "-n", names[2], "route", "del", "blackhole", f"{bridge}/32"], capture_output=True)
