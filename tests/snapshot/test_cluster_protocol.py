"""The cluster checkpoint protocol's pieces (`slashrt.snapshot.cluster`) under forced interleavings.

Fake agents (no processes) record what the coordinator's side sends, and the test decides when
each send returns; trio's MockClock drives the periodic triggers. The law: a checkpoint the
coordinator counts as pending was requested of every agent, whatever cancels the triggers (the
run loop cancels them as soon as every executor drained): otherwise `final` waits forever for
acks of a checkpoint some agent never heard of. An agent (`AgentCheckpointing`, driven with fake
executor, link and exchange) whose sources ended may see a peer's barrier n before the
coordinator's request n: it takes n then, with its sources' ends as their positions, exactly once.
An alignment aborted by a newer barrier releases every input it blocked, even when the newer one
blocks another input at once. A stop with a savepoint (`drive`, scripted agents): the savepoint is
committed before the agents are told to stop, and no final checkpoint follows; one still pending
when every executor drained is the final checkpoint (the agents finish, nobody is stopped); one
that aborts lets the sources go on and periodic checkpoints start again. An agent that drained
before the stop takes the savepoint at once and its run ends on "stop", as the others' do.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import trio
import trio.testing

from slashrt import StopHandle
from slashrt.cluster.coordinator import ClusterError
from slashrt.errors import first_error, unwrap_groups
from slashrt.progress import Builder
from slashrt.snapshot.cluster import ClusterCheckpoints
from slashrt.snapshot.cluster_agent import AgentCheckpointing
from slashrt.snapshot.coordinator import AckStats, CheckpointConfig
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
    """An exchange as the agent's checkpoints drive it: `downstream` are the exchanges its
    records reach (their senders are fed by its peers' channels)."""

    def __init__(self, step_id: str = "x", downstream=()):
        self.step_id = step_id
        self.downstream = list(downstream)
        self.forwarded = []

    def walk(self):
        yield self
        for x in self.downstream:
            yield from x.walk()

    def forward_barrier(self, n, log=False):
        self.forwarded.append(n)

    def overtake(self, n):
        pass

    def take_outbox(self):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)


def plan_of(*sources):
    """A plan as checkpoints read it: its sources, no stateful step, no loop."""
    return SimpleNamespace(nodes=lambda: [], sinks=[], sources=list(sources), flow=SimpleNamespace(steps={}),
                           graph=Builder().build())


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


ENDED = SimpleNamespace(snapshot=lambda step_id: State({}, {"fed": 10}))  # a feeder that fed its 10 records


def one_source_agent(tmp_path, link, exchange) -> AgentCheckpointing:
    """Executor 0's side, with source "r" and a channel from executor 1 ("x.from1")."""
    return AgentCheckpointing(plan_of("r"), CheckpointConfig(), SnapshotStore(tmp_path, job="j"), None, index=0, link=link,
                              exchanges=[exchange], peer_inputs=["x.from1"])


def test_a_peer_barrier_before_the_request_is_taken_once_with_the_ended_sources_positions(tmp_path):
    link, exchange, executor = Link(), Exchange(), Executor()  # nothing left to block: no inputs

    async def main():
        agent = one_source_agent(tmp_path, link, exchange)
        async with trio.open_nursery() as nursery:

            async def coordinator():  # its request for 1 comes late, after the agent drained
                await link.wait_for("drained")
                agent.on_message("checkpoint", 1)
                agent.on_message("finish", None)

            nursery.start_soon(coordinator)
            async with agent.running():
                agent.sources["r"].end(ENDED)  # the source fed its last record: its end is recorded
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
            plan=plan_of("r"), config=CheckpointConfig(),
            store=SnapshotStore(tmp_path, job="j"), restored=None, index=0, link=link, exchanges=[exchange],
            peer_inputs=["x.from1", "x.from2"],
        )
        async with trio.open_nursery() as nursery:
            agent._nursery = nursery
            agent.on_message("checkpoint", 1)
            agent.on_message("checkpoint", 2)
            await agent.on_barrier(executor, SimpleNamespace(name="r"), 1)
            assert executor.held() == {"r"} and exchange.forwarded == [1]  # its upstream delivered 1: sent on
            # executor 1 skipped 1 (it aborted it): 1 cannot complete here, 2 starts with x.from1 held
            await agent.on_barrier(executor, SimpleNamespace(name="x.from1"), 2)
            assert executor.held() == {"x.from1"}  # r is free to deliver barrier 2
        assert link.sent[0][0] == "decline" and link.sent[0][1][0] == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- stop with a savepoint: the coordinator's side (`ClusterCheckpoints.drive`) ----------------------
class AnsweringAgents:
    """`_Agents` as `drive` uses it: every message is recorded, and `answer(kind, n, nursery)`
    (a test's script) plays what the agents do back, through the coordinator's handlers."""

    def __init__(self, answer, nursery):
        self.answer, self.nursery, self.got = answer, nursery, []
        self._poked = trio.Event()

    async def send_all(self, kind, payloads):
        self.got.append((kind, payloads[0]))
        await self.answer(kind, payloads[0], self.nursery)

    def poke(self):
        self._poked.set()

    async def settle(self, done):
        while not done():
            self._poked = trio.Event()
            await self._poked.wait()


def drive(tmp_path, answer, interval=None, clock=None):
    """A 2-executor coordinator's side whose stop was asked before the run: what it sent."""
    stop = StopHandle()
    stop.request()  # the savepoint is the first checkpoint
    cluster = ClusterCheckpoints(SnapshotStore(tmp_path, job="j"), CheckpointConfig(interval=interval), ["s"], 2, stop=stop)

    async def main():
        async with trio.open_nursery() as nursery:
            agents = AnsweringAgents(lambda kind, n, nursery: answer(cluster, kind, n, nursery), nursery)
            await cluster.drive(agents)
        return agents.got

    return cluster, trio.run(main, clock=clock)


async def ack_all(cluster, n):
    """Both agents write their part of step "s" and ack n."""
    for executor in range(2):
        part = cluster.store.write_part(n, "s", executor, {}, {})
        await cluster._on_ack(executor, (n, {"s": AckStats()}, [part], {"j.r": {str(executor): {"fed": 5}}}))


async def drain_all(cluster):
    for executor in range(2):
        await cluster._on_drained(executor, None)


def test_a_stop_ends_with_the_savepoint_committed_then_stop_sent_and_no_final_checkpoint(tmp_path):
    async def answer(cluster, kind, n, nursery):
        if kind == "savepoint":
            nursery.start_soon(ack_all, cluster, n)

    cluster, got = drive(tmp_path, answer)
    assert got == [("savepoint", 1), ("commit", 1), ("stop", 1)]  # committed before the agents stop
    assert cluster.savepoint == 1 and cluster.stopped
    assert SnapshotStore(tmp_path, job="j").load(1).meta["kind"] == "savepoint"


def test_a_savepoint_pending_when_every_executor_drained_is_the_final_checkpoint(tmp_path):
    async def answer(cluster, kind, n, nursery):
        if kind == "savepoint":  # both agents drain before they ack: the savepoint comes with the end

            async def drained_then_acked():
                await drain_all(cluster)
                await trio.testing.wait_all_tasks_blocked()  # `drive` went on to `final` meanwhile
                await ack_all(cluster, n)

            nursery.start_soon(drained_then_acked)

    cluster, got = drive(tmp_path, answer)
    # no other final checkpoint and no "stop": the agents finish as at any end
    assert got == [("savepoint", 1), ("commit", 1), ("finish", None)]
    assert cluster.savepoint == 1 and not cluster.stopped


def test_an_aborted_savepoint_lets_the_sources_go_on_and_periodic_checkpoints_start_again(tmp_path):
    async def answer(cluster, kind, n, nursery):
        if kind == "savepoint":
            await cluster._on_decline(0, (n, "forced by the test"))
        elif kind == "checkpoint" and n == 2:  # the next periodic one, after which every executor drains
            nursery.start_soon(ack_all, cluster, n)
            await drain_all(cluster)
        elif kind == "checkpoint":  # the final one
            nursery.start_soon(ack_all, cluster, n)

    cluster, got = drive(tmp_path, answer, interval=1.0, clock=trio.testing.MockClock(autojump_threshold=0))
    assert got[:3] == [("savepoint", 1), ("go_on", None), ("checkpoint", 2)] and got[-1] == ("finish", None)
    assert cluster.savepoint is None and not cluster.stopped
    assert "forced by the test" in cluster.coordinator.history[0].reason


def test_an_agent_that_drained_takes_the_savepoint_at_once_and_ends_on_stop(tmp_path):
    # its share ended before the others': it waits for the coordinator in `_finish` when the stop comes
    link, exchange, executor = Link(), Exchange(), Executor()

    async def main():
        agent = one_source_agent(tmp_path, link, exchange)
        async with trio.open_nursery() as nursery:

            async def coordinator():
                await link.wait_for("drained")
                agent.on_message("savepoint", 1)
                await link.wait_for("ack")
                agent.on_message("commit", 1)
                agent.on_message("stop", 1)

            nursery.start_soon(coordinator)
            async with agent.running():
                agent.sources["r"].end(ENDED)
                await agent.on_end(executor, SimpleNamespace(name="r"))
                await agent.on_end(executor, SimpleNamespace(name="x.from1"))
        return agent

    async def bounded():
        with trio.fail_after(10):  # mock time: a run that never ends fails at once
            return await main()

    agent = trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))
    assert agent.savepoint == 1  # its run returns stopped, as the others' do (then all wait for "release")
    acks = [payload for kind, payload in link.sent if kind == "ack"]
    assert [n for n, *_ in acks] == [1] and acks[0][3] == {"r": {"0": {"fed": 10}}}
    assert [kind for kind, _ in link.sent] == ["drained", "ack"]  # no final checkpoint of its own


@pytest.mark.parametrize("message", [("commit", 1), ("checkpoint", 2)])
def test_a_coordinators_message_handled_after_the_run_failed_keeps_the_runs_error(tmp_path, message):
    """The executor's run failed (an operator's error) and its checkpointing nursery closed; the
    coordinator's commit (or a request, once drained) is then handled by the control task: it
    starts nothing, so the job's error stays the operator's, not trio's "Nursery is closed"."""
    link, exchange = Link(), Exchange()

    async def main():
        agent = one_source_agent(tmp_path, link, exchange)
        agent._drained = True  # a request would be taken at once
        with pytest.raises(ValueError, match="the operator failed"):
            async with unwrap_groups(), agent.running():
                raise ValueError("the operator failed")
        agent.on_message(*message)  # the control task, after the run
        await trio.testing.wait_all_tasks_blocked()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert link.sent == []


@pytest.mark.parametrize("side", ["one executor", "agent"])
def test_nothing_starts_while_a_failed_runs_tasks_are_cancelled(tmp_path, side):
    """The run failed and its checkpointing nursery is cancelling its tasks (or has just closed,
    the run's task not yet resumed: another task may run in between): a coordinator's message
    handled then starts nothing, so trio's "Nursery is closed" cannot replace the run's error."""
    from slashrt.snapshot.runtime import Checkpointing

    link, exchange = Link(), Exchange()
    started = []

    async def probe():
        started.append("probe")  # (a task runs up to its first checkpoint even in a cancelled nursery)

    async def lingering():
        try:
            await trio.sleep_forever()
        finally:  # cancelled because the run failed: the control task's turn comes now
            agent._spawn(probe)

    async def main():
        nonlocal agent
        agent = one_source_agent(tmp_path, link, exchange) if side == "agent" else Checkpointing(
            plan_of("r"), CheckpointConfig(),
            SnapshotStore(tmp_path, job="j"), None)
        with pytest.raises(ValueError, match="the operator failed"):
            async with unwrap_groups(), agent.running():
                agent._spawn(lingering)
                await trio.testing.wait_all_tasks_blocked()
                raise ValueError("the operator failed")

    agent = None
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert started == [] and link.sent == []


def test_a_sinks_failed_pre_commit_fails_the_job_naming_the_broker_and_retryable(tmp_path):
    """An agent declines the savepoint because its sink could not pre-commit it (the sink's
    sentence and its error's type): the run's last checkpoint failed, so the job fails, in the
    broker's sentence, as a failure a restart strategy retries (not a full disk's advice)."""
    hung = "the Redis broker at 127.0.0.1:1 did not answer within 1 s while pre-committing checkpoint 1 of stream 'out'"

    async def answer(cluster, kind, n, nursery):
        if kind == "savepoint":
            await cluster._on_decline(0, (n, f"executor 0: {hung}", hung, "BrokerUnavailable"))

    with pytest.raises(BaseException) as failed:
        drive(tmp_path, answer)
    error = first_error(failed.value) if isinstance(failed.value, BaseExceptionGroup) else failed.value
    assert isinstance(error, ClusterError) and error.retryable, repr(error)
    assert str(error) == (
        f"BrokerUnavailable: {hung}; it was the run's savepoint, so the job fails: once the broker answers again, "
        "resume from the latest checkpoint (a restart strategy does so itself)"
    )
