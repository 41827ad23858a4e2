"""Automatic recovery with in-memory sinks (`slashrt.snapshot.collected`): a transactional
`Collect` and a `Callback` on clusters (2 executors over shm, 3 over tcp, rings of 8 KiB under
2.4 MB of input) whose agents are SIGKILLed at chosen points (the chaos hooks: alignment, the
asynchronous write, between pre-commit and commit, after a commit before its records were sent,
after they were sent, twice in a row) and at points drawn at random (seeded); the result equals
the failure-free one exactly: nothing lost, nothing twice. Plus the coordinator's keeping of
committed records, the agent's ordering of them before its acks (forced interleavings), and
the refusal of a non-transactional Collect."""

import collections
import random

import numpy as np
import pytest
import trio

import slashrt
from slashrt import Dataflow, Tumbling
from slashrt.bench import chaos
from slashrt.errors import SlashError
from slashrt.ops.sinks import Collect
from slashrt.snapshot.cluster_agent import AgentCheckpointing
from slashrt.snapshot.collected import COMMITTED, Committed, Outbox

from tests.snapshot import _cluster_child
from tests.snapshot._paced import behind, until_fired
from tests.snapshot.test_recovery import bounded

SMALL = {"slots": 8, "slot_size": 1024, "partitions": 16}
DATA = _cluster_child.records()


def flow(out, late, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind the source (`tests.snapshot._paced.Paced`), or none."""
    job = Dataflow("recovery-collect")
    source = job.source("r", _cluster_child.SCHEMA, time="t", max_delay=20)
    source = behind(source, pace)
    source.window(Tumbling(ms=100), late=late).sum(
        "v", key="k", output="total").sink(out, name="out")
    return job


def rows(records: np.ndarray) -> collections.Counter:
    return collections.Counter(map(tuple, records.tolist()))


@pytest.fixture(scope="module")
def reference() -> tuple[collections.Counter, collections.Counter]:
    out, late = Collect(), Collect()
    slashrt.run(flow(out, late), {"r": DATA})  # one executor, no checkpoints, nothing killed
    expected = rows(out.records), rows(late.records)
    assert sum(expected[0].values()) > 10_000 and sum(expected[1].values()) > 1000  # late records are part of it
    assert max(expected[0].values()) == 1
    return expected


class Calls:
    """A Callback's function: the arrays it was called with (in this process, the coordinator)."""

    def __init__(self):
        self.arrays = []

    def __call__(self, records):
        self.arrays.append(records)


def run_and_check(tmp_path, monkeypatch, reference, kills: str, executors: int, transport: str, collect_out: bool):
    """Run `flow` with restart=, the chaos hooks armed with `kills`, a transactional Collect and a
    Callback as its two sinks (`collect_out`: the Collect takes the sums, else the late records);
    check both got exactly the failure-free records. Until every kill has fired each batch takes
    4 ms more, so that however fast the machine the job cannot end before its k-th alignment
    (a run at full speed aligns only 2-4 times per executor). Returns (result, kills fired)."""
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv(chaos.KILLS_ENV, kills)
    monkeypatch.setenv(chaos.MARKS_ENV, str(tmp_path / "marks"))
    collect, calls = chaos.ChaosCollect(transactional=True), Calls()
    callback = chaos.ChaosCallback(calls)
    pace = until_fired(tmp_path / "marks", kills)
    result = bounded(flow(*((collect, callback) if collect_out else (callback, collect)), pace), {"r": DATA},
                     executors=executors, transport=transport, checkpoint={"interval": 0.02, "keep": 2},
                     checkpoint_dir=tmp_path / "chk", restart="fixed-delay:attempts=6,delay=0", **SMALL)
    # the Callback is called here, once per executor that committed records
    assert 1 <= len(calls.arrays) <= executors and all(len(a) for a in calls.arrays)
    collected, called = reference if collect_out else reference[::-1]
    assert rows(collect.records) == collected and rows(np.concatenate(calls.arrays)) == called
    return result, len(list((tmp_path / "marks").iterdir()))


@pytest.mark.parametrize("executors,transport,collect_out,kills", [
    # between pre-commit and commit, after a commit before its records were sent, after they were sent
    pytest.param(2, "shm", True, "pre_commit:2;commit:2;sent:2", id="2-shm-commit-windows"),
    # during alignment, during the asynchronous write, twice in a row
    pytest.param(3, "tcp", False, "align:2;async:3;commit:1;sent:1", id="3-tcp-align-async-twice-in-a-row"),
])
def test_kills_at_chosen_points_give_exactly_the_failure_free_result(tmp_path, monkeypatch, reference, executors,
                                                                     transport, collect_out, kills):
    result, fired = run_and_check(tmp_path, monkeypatch, reference, kills, executors, transport, collect_out)
    planned = len(kills.split(";"))
    assert fired == planned and len(result.recoveries) == planned, result.recoveries


def test_kills_drawn_at_random_give_exactly_the_failure_free_result(tmp_path, monkeypatch, reference):
    rng = random.Random(11)
    kills = ";".join(f"{rng.choice(chaos.POINTS)}:{rng.randint(1, 2)}" for _ in range(rng.randint(1, 3)))
    executors, transport = rng.choice([(2, "shm"), (3, "tcp")])
    result, fired = run_and_check(tmp_path, monkeypatch, reference, kills, executors, transport, rng.random() < 0.5)
    assert fired == len(kills.split(";")) and len(result.recoveries) == fired, (kills, result.recoveries)


def test_a_collect_without_transactional_is_refused_with_restart_in_one_sentence(tmp_path):
    with pytest.raises(SlashError) as refused:
        slashrt.run(flow(Collect(), None), {"r": DATA[:1000]}, executors=2, checkpoint_dir=tmp_path, restart="fixed-delay")
    assert str(refused.value) == (
        "run(): restart=: sink 'recovery-collect.out' is a Collect without transactional=True, which would return "
        "again what a recovery replays: make it Collect(transactional=True)")
    assert not list(tmp_path.iterdir())  # refused before anything started


# -- the coordinator's side: kept once per (sink, executor, checkpoint), newer than a resume dropped --------------
def test_committed_keeps_each_checkpoint_once_and_orders_by_executor_then_checkpoint():
    committed = Committed()
    a, b, c, d = (np.arange(i * 10, i * 10 + 3) for i in range(4))

    async def receive():
        await committed.receive(1, [("s", 2, b)])
        await committed.receive(0, [("s", 3, c), ("s", 1, a)])
        await committed.receive(1, [("s", 2, b.copy()), ("t", 2, d)])  # a re-send after a recovery

    trio.run(receive)
    assert committed.resent == 3
    parts = committed.parts("s", 3)
    assert parts[0].tolist() == [*a, *c] and parts[1].tolist() == list(b) and parts[2] is None
    committed.restored(2)  # an attempt resuming from checkpoint 2: checkpoint 3 is produced again
    assert committed.parts("s", 2)[0].tolist() == list(a)
    committed.restored(None)
    assert committed.parts("t", 2) == [None, None]


# -- the agent's side: committed records go before any later message, whatever the interleaving ------------------
class _Link:
    """A control link whose send yields `delays[i]` times inside its lock (forcing interleavings)."""

    def __init__(self, delays):
        self.sent, self._lock, self._delays = [], trio.Lock(), list(delays)

    async def send(self, kind, payload=None):
        async with self._lock:
            for _ in range(self._delays.pop(0) if self._delays else 0):
                await trio.lowlevel.checkpoint()
            self.sent.append((kind, payload if kind != COMMITTED else None))


class _Plan:
    def __init__(self, sink):
        self.sinks = [type("Node", (), {"step_id": "s", "sink": sink, "_pending_records": lambda self: sink._transactions})()]


@pytest.mark.parametrize("delays", [(0, 0, 0), (3, 0, 0), (0, 5, 1), (2, 2, 2)])
@pytest.mark.parametrize("before", [0, 1, 2, 4])
def test_an_ack_never_overtakes_records_committed_before_it(delays, before):
    sink = Collect(transactional=True)
    agent = AgentCheckpointing.__new__(AgentCheckpointing)  # only its sending: the outbox and the link
    agent.link, agent.outbox = _Link(delays), Outbox(_Plan(sink))
    sink.open()

    async def main():
        async with trio.open_nursery() as nursery:
            sink.write(np.arange(5))
            sink.pre_commit(1)
            nursery.start_soon(agent._send, "ack", 1)  # on its way (not started, or inside the link) when 1 commits
            for _ in range(before):
                await trio.lowlevel.checkpoint()
            sink.commit(1)  # the "commit" 1 handler: records handed over, their sending started
            nursery.start_soon(agent._send, None)
            nursery.start_soon(agent._send, "ack", 2)  # the snapshot of 2 came after the commit

    trio.run(main)
    sent = agent.link.sent
    assert [kind for kind, _ in sent].count(COMMITTED) == 1 and len(agent.outbox) == 0
    assert [kind for kind, _ in sent].index(COMMITTED) < sent.index(("ack", 2)), sent
