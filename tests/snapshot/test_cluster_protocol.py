"""The cluster checkpoint protocol's pieces (`slashrt.snapshot.cluster`) under forced interleavings.

Fake agents (no processes) record what the coordinator's side sends, and the test decides when
each send returns; trio's MockClock drives the periodic triggers. The law: a checkpoint the
coordinator counts as pending was requested of every agent, whatever cancels the triggers (the
run loop cancels them as soon as every executor drained): otherwise `final` waits forever for
acks of a checkpoint some agent never heard of.
"""

import trio
import trio.testing

from slashrt.snapshot.cluster import ClusterCheckpoints
from slashrt.snapshot.coordinator import CheckpointConfig
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
