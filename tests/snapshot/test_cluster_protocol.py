"""The cluster checkpoint protocol's pieces (`slashrt.snapshot.cluster`) under forced interleavings.

Fake agents (no processes) record what the coordinator's side sends, and the test decides when
each send returns; trio's MockClock drives the periodic triggers. The law: a checkpoint the
coordinator counts as pending was requested of every agent, whatever cancels the triggers (the
run loop cancels them as soon as every executor drained): otherwise `final` waits forever for
acks of a checkpoint some agent never heard of. An agent (`AgentCheckpointing`, driven with fake
executor, link and exchange) whose sources ended may see a peer's barrier n before the
coordinator's request n: it takes n then, with its sources' ends as their positions, exactly once.
An alignment aborted by a newer barrier releases every input it blocked, even when the newer one
blocks another input at once.
"""

from types import SimpleNamespace

import trio
import trio.testing

from slashrt.snapshot.cluster import AgentCheckpointing, ClusterCheckpoints
from slashrt.snapshot.coordinator import CheckpointConfig
from slashrt.snapshot.state_format import State
from slashrt.snapshot.storage import SnapshotStore


class ScriptedAgents:
    """`_Agents` as `ClusterCheckpoints` uses it; each send to agent 1 waits for `release`."""

    def __init__(self, executors: int):
        self.got = [[] for _ in range(executors)]
        self.halfway = trio.Event()  # agent 0 got a checkpoint, agent 1 not yet
        self.release = trio.Event()

    async def send_all(self, kind, payloads):
        for i, payload in enumerate(payloads):
            if i == 1 and kind == "checkpoint":
                self.halfway.set()
                await self.release.wait()
            self.got[i].append((kind, payload))

    def poke(self):
        pass


def test_triggers_cancelled_midway_through_a_request_still_ask_every_agent(tmp_path):
    cluster = ClusterCheckpoints(SnapshotStore(tmp_path, job="j"), CheckpointConfig(interval=1.0), ["s"], 2)
    agents = ScriptedAgents(2)

    async def main():
        async with trio.open_nursery() as nursery:
            triggers = await nursery.start(cluster.triggers, agents)
            await agents.halfway.wait()  # checkpoint 1 went to agent 0 only so far
            triggers.cancel()  # every executor drained: the run loop stops the triggers here
            await trio.testing.wait_all_tasks_blocked()
            agents.release.set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    pending = sorted(cluster.coordinator.pending)
    assert pending == [1]
    assert agents.got == [[("checkpoint", 1)], [("checkpoint", 1)]]  # both will ack it: `final` can end


class Link:
    def __init__(self):
        self.sent = []
        self.changed = trio.Event()

    async def send(self, kind, payload=None):
        self.sent.append((kind, payload))
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, kind):
        while not any(k == kind for k, _ in self.sent):
            await self.changed.wait()


class Exchange:
    def __init__(self):
        self.forwarded = []

    async def forward_barrier(self, n):
        self.forwarded.append(n)


class Executor:
    """The executor's blocking as `Checkpointing._block` drives it."""

    def __init__(self, *names):
        self.inputs = [SimpleNamespace(name=name, blocked=None) for name in names]

    def block(self, inp):
        inp.blocked = trio.Event()

    def unblock(self, inp):
        inp.blocked = None

    def unblock_all(self):
        for inp in self.inputs:
            self.unblock(inp)

    def held(self):
        return {inp.name for inp in self.inputs if inp.blocked is not None}


def test_a_peer_barrier_before_the_request_is_taken_once_with_the_ended_sources_positions(tmp_path):
    plan = SimpleNamespace(nodes=lambda: [], sinks=[], sources=["r"], graph=None)
    link, exchange, executor = Link(), Exchange(), Executor()  # nothing left to block: no inputs
    feeder = SimpleNamespace(snapshot=lambda step_id: State({}, {"fed": 10}))

    async def main():
        agent = AgentCheckpointing(
            plan, CheckpointConfig(), SnapshotStore(tmp_path, job="j"), None, index=0, link=link,
            exchanges=[exchange], peer_inputs=["x.from1"],
        )
        async with trio.open_nursery() as nursery:

            async def coordinator():  # its request for 1 comes late, after the agent drained
                await link.wait_for("drained")
                agent.on_message("checkpoint", 1)
                agent.on_message("finish", None)

            nursery.start_soon(coordinator)
            async with agent.running():
                agent.sources["r"].end(feeder)  # the source fed its last record: its end is recorded
                await agent.on_end(executor, SimpleNamespace(name="r"))
                # the peer got request 1 first: its barrier arrives here before ours
                await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 1)
                await agent.on_end(executor, SimpleNamespace(name="x.from1"))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    acks = [payload for kind, payload in link.sent if kind == "ack"]
    assert [n for n, *_ in acks] == [1]
    assert acks[0][3] == {"r": {"0": {"fed": 10}}}  # the source's end is its position in checkpoint 1
    assert exchange.forwarded == [1]
    assert sorted(kind for kind, _ in link.sent) == ["ack", "drained"]


def test_an_aborted_alignment_releases_its_inputs_when_the_next_one_blocks_another(tmp_path):
    link, exchange = Link(), Exchange()
    executor = Executor("r", "x.from1", "x.from2")

    async def main():
        agent = AgentCheckpointing(
            plan=SimpleNamespace(nodes=lambda: [], sinks=[], sources=["r"], graph=None), config=CheckpointConfig(),
            store=SnapshotStore(tmp_path, job="j"), restored=None, index=0, link=link, exchanges=[exchange],
            peer_inputs=["x.from1", "x.from2"],
        )
        async with trio.open_nursery() as nursery:
            agent._nursery = nursery
            agent.on_message("checkpoint", 1)
            agent.on_message("checkpoint", 2)
            await agent.on_barrier(executor, SimpleNamespace(name="r"), 1)
            assert executor.held() == {"r"} and exchange.forwarded == [1]  # stage 1: sent on to the peers
            # executor 1 skipped 1 (it aborted it): 1 cannot complete here, 2 starts with x.from1 held
            await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 2)
            assert executor.held() == {"x.from1"}  # r is free to deliver barrier 2
        assert link.sent[0][0] == "decline" and link.sent[0][1][0] == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
