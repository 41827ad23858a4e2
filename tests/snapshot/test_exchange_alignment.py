"""The alignment of cluster checkpoints exchange by exchange (`AgentCheckpointing`, `upstream_inputs`),
under forced interleavings: fake executor, link and exchanges (`test_cluster_protocol`'s), no
processes.

An agent with a source r and two chained exchanges: x (its peers' channel x.from1) feeds y
(y.from1): what x's peers send reaches y's sending half. An exchange forwards barrier n once
every input upstream of it delivered n (x: the source; y: the source and x's peers' channel),
whatever the order they deliver it in, and the snapshot is taken once every input did.
"""

from types import SimpleNamespace

import trio
import trio.testing

from slashrt.snapshot.cluster_agent import AgentCheckpointing, upstream_inputs
from slashrt.snapshot.coordinator import CheckpointConfig
from slashrt.snapshot.storage import SnapshotStore

from tests.snapshot.test_cluster_protocol import Exchange, Executor, Link, plan_of

PEERS = ["x.from1", "y.from1"]


def run_chained(tmp_path, exchanges, log, script) -> None:
    """Run `script(agent, executor)` on the agent of the module doc, checkpoint 1 requested, its
    snapshots logged."""
    executor = Executor("r", *PEERS)

    async def main():
        agent = AgentCheckpointing(
            plan=plan_of("r"), config=CheckpointConfig(), store=SnapshotStore(tmp_path, job="j"), restored=None,
            index=0, link=Link(), exchanges=exchanges, peer_inputs=PEERS,
        )
        take = agent._take
        agent._take = lambda n, *args, **kwargs: (log.append(("snapshot", n)), take(n, *args, **kwargs))
        async with trio.open_nursery() as nursery:
            agent._nursery = nursery
            agent.on_message("checkpoint", 1)
            await script(agent, executor)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def source_barrier(agent, executor, n):
    """Barrier n from source r, which recorded its position for n as its feeder does."""
    agent.sources["r"].positions[n] = {"fed": n}
    await agent.on_barrier(executor, SimpleNamespace(name="r"), n)


def test_what_feeds_each_exchange_is_the_sources_and_the_peer_channels_of_the_exchanges_before_it():
    y = Exchange("y")
    x = Exchange("x", downstream=[y])
    assert upstream_inputs([x, y], ["r"], PEERS) == {"x": ["r"], "y": ["r", "x.from1"]}
    assert upstream_inputs([y, x], ["r"], PEERS) == {"y": ["r", "x.from1"], "x": ["r"]}  # (not by their order)


def test_each_exchange_forwards_once_every_input_upstream_of_it_delivered_the_barrier(tmp_path):
    log = []
    y = Exchange("y")
    x = Exchange("x", downstream=[y])

    async def script(agent, executor):
        await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 1)  # x's peer came first
        assert (x.forwarded, y.forwarded) == ([], [])  # the source still feeds both
        await source_barrier(agent, executor, 1)
        assert (x.forwarded, y.forwarded) == ([1], [1]) and executor.held() == {"r", "x.from1"}
        assert ("snapshot", 1) not in log  # y's peers' channel still owes barrier 1
        await agent.on_barrier(executor, SimpleNamespace(name="y.from1"), 1)
        assert log[-1] == ("snapshot", 1) and executor.held() == set()
        agent.on_message("checkpoint", 2)  # the other order: the source first
        await source_barrier(agent, executor, 2)
        assert (x.forwarded, y.forwarded) == ([1, 2], [1])  # y waits for x's peers' barrier
        await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 2)
        assert y.forwarded == [1, 2] and ("snapshot", 2) not in log
        await agent.on_barrier(executor, SimpleNamespace(name="y.from1"), 2)
        assert log[-1] == ("snapshot", 2) and executor.held() == set()

    run_chained(tmp_path, [x, y], log, script)
