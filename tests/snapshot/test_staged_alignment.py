"""The alignment of cluster checkpoints stage by stage (`AgentCheckpointing`), under forced
interleavings: fake executor, link and exchanges (`test_cluster_protocol`'s), no processes.

An agent with a source r and two exchange stages: x (its peer's channel x.from1, lane 1) feeds
y (y.from1, lane 2). Stage k forwards barrier n once every lane before it delivered n, whatever
the order the lanes deliver it in; after a snapshot every input stays held until every forward
is out (a forward to an UpPar peer waits for its credits), else a released lane would send what
follows the barrier ahead of it.
"""

from types import SimpleNamespace

import trio
import trio.testing

from slashrt.snapshot.cluster_agent import AgentCheckpointing
from slashrt.snapshot.coordinator import CheckpointConfig
from slashrt.snapshot.storage import SnapshotStore

from tests.snapshot.test_cluster_protocol import Exchange, Executor, Link


class Staged(Exchange):
    """An exchange of stage `lane` whose forwards wait for `release` (a peer without credits),
    logging when each ends."""

    def __init__(self, lane, log, gated=False):
        super().__init__()
        self.lane = lane
        self.log = log
        self.release = trio.Event()
        if not gated:
            self.release.set()

    async def forward_barrier(self, n):
        await self.release.wait()
        await super().forward_barrier(n)
        self.log.append(("forwarded", self.lane, n))


def run_staged(tmp_path, exchanges, log, script) -> None:
    """Run `script(agent, executor, nursery)` on the agent of the module doc, checkpoint 1
    requested, its snapshots logged."""
    executor = Executor("r", "x.from1", "y.from1")

    async def main():
        agent = AgentCheckpointing(
            plan=SimpleNamespace(nodes=lambda: [], sinks=[], sources=["r"], graph=None), config=CheckpointConfig(),
            store=SnapshotStore(tmp_path, job="j"), restored=None, index=0, link=Link(), exchanges=exchanges,
            peer_inputs={"x.from1": 1, "y.from1": 2},
        )
        take = agent._take
        agent._take = lambda n, *args, **kwargs: (log.append(("snapshot", n)), take(n, *args, **kwargs))
        async with trio.open_nursery() as nursery:
            agent._nursery = nursery
            agent.on_message("checkpoint", 1)
            await script(agent, executor, nursery)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def source_barrier(agent, executor, n):
    """Barrier n from source r, which recorded its position for n as its feeder does."""
    agent.sources["r"].positions[n] = {"fed": n}
    await agent.on_barrier(executor, SimpleNamespace(name="r"), n)


def test_each_stage_forwards_once_every_lane_before_it_delivered_the_barrier(tmp_path):
    # stage 1 (x) is fed by the sources only; stage 2 (y) by the sources and x's peers' channels
    log = []
    x, y = Staged(1, log), Staged(2, log)

    async def script(agent, executor, nursery):
        await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 1)  # the peer's stage 1 came first
        assert (x.forwarded, y.forwarded) == ([], [])  # the sources still feed both stages
        await source_barrier(agent, executor, 1)
        assert (x.forwarded, y.forwarded) == ([1], [1]) and executor.held() == {"r", "x.from1"}
        assert ("snapshot", 1) not in log  # y's peers' channel still owes barrier 1
        await agent.on_barrier(executor, SimpleNamespace(name="y.from1"), 1)
        assert log[-1] == ("snapshot", 1) and executor.held() == set()
        agent.on_message("checkpoint", 2)  # the other order: the sources first
        await source_barrier(agent, executor, 2)
        assert (x.forwarded, y.forwarded) == ([1, 2], [1])  # y waits for x's peers' barrier
        await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 2)
        assert y.forwarded == [1, 2]

    run_staged(tmp_path, [x, y], log, script)


def test_inputs_stay_held_after_a_snapshot_until_every_barrier_is_forwarded(tmp_path):
    # the sources' lane forwards stage 2's barrier and waits for a peer's credits; meanwhile the
    # last peer barrier completes the alignment in another lane: the snapshot is taken at once
    # (nothing runs after a barrier yet), but every input stays held until the forward is out
    log = []
    x, y = Staged(1, log), Staged(2, log, gated=True)

    async def script(agent, executor, nursery):
        await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 1)
        nursery.start_soon(source_barrier, agent, executor, 1)  # lane 0
        await trio.testing.wait_all_tasks_blocked()
        assert log == [("forwarded", 1, 1)]  # stage 2's forward hangs on the peer's credits
        await agent.on_barrier(executor, SimpleNamespace(name="y.from1"), 1)  # lane 2
        assert log == [("forwarded", 1, 1), ("snapshot", 1)]
        assert executor.held() == {"r", "x.from1", "y.from1"}
        y.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert log == [("forwarded", 1, 1), ("snapshot", 1), ("forwarded", 2, 1)]
        assert executor.held() == set()  # released by the task that sent the last forward

    run_staged(tmp_path, [x, y], log, script)
