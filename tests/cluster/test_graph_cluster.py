"""Graph flows (union, connect, user operators, loops) on several executors in real processes:
the results equal one executor's, notifications are never early on any executor (checked on
the machine's one monotonic clock) and never lost; an operator's error fails the job naming
it, and so do the errors of progress (an emit below the time held, a notification in the
past, a loop reaching its bound), in one sentence, leaving no executor process behind; a slow
key owner bounds what its senders queue for it (their sources wait)."""

import os
import re
import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, sinks
from slashrt.cluster import ClusterError
from tests.cluster._processes import children
from tests.test_loops import spin_flow
from tests.test_notify import EmitPast, NotifyPast

REC = np.dtype([("v", "<i8"), ("n", "<i8"), ("t", "<i8")])
LOG = np.dtype([("kind", "<i8"), ("epoch", "<i8"), ("ns", "<i8")])  # kind 0: a batch, 1: a notification
K = 3  # loop iterations
N = 12_000  # 288 KB a source: ~280 rings of 4 slots of 256 bytes


class Hold(Operator):
    """Emits each time's batches only when the time is complete (a notification), n + 1."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.held = {}

    async def on_batch(self, ctx, port, batch):
        self.held.setdefault(ctx.time, []).append(batch.to_numpy(REC).copy())
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time):
        out = np.concatenate(self.held.pop(time))
        out["n"] += 1
        await ctx.emit(out)


class Log(Operator):
    """Emits a row per batch and per notification with the monotonic clock's time (one clock
    for every process of the machine)."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    async def on_batch(self, ctx, port, batch):
        ctx.notify_at(ctx.time)
        await ctx.emit(np.array([(0, ctx.time.epoch, time.monotonic_ns())], LOG))

    async def on_notify(self, ctx, time_):
        await ctx.emit(np.array([(1, time_.epoch, time.monotonic_ns())], LOG))


class PerPort(Operator):
    """A two-input operator: tags each record with the port it came in on."""

    async def on_batch(self, ctx, port, batch):
        out = batch.to_numpy(REC).copy()
        out["n"] = port
        await ctx.emit(out)


def graph_flow() -> tuple[Dataflow, dict]:
    flow = Dataflow("g")
    a, b = flow.source("a", REC, time="t"), flow.source("b", REC, time="t")
    out = {name: sinks.Collect() for name in ("held", "tagged", "looped", "log")}
    a.union(b).operator(Hold(), name="hold").sink(out["held"], name="held")
    a.connect(b).operator(PerPort(), name="tag").sink(out["tagged"], name="tagged")
    with flow.loop("up") as loop:
        step = loop.enter(b).operator(Hold(), name="step")
        loop.feed_back(step.filter(lambda x: x["n"] < K))
        loop.leave(step.filter(lambda x: x["n"] >= K)).sink(out["looped"], name="looped")
    a.operator(Log(), name="log", schema={"kind": "<i8", "epoch": "<i8", "ns": "<i8"}).sink(out["log"], name="logged")
    return flow, out


def inputs() -> dict:
    rng = np.random.default_rng(7)
    a = np.zeros(N, REC)
    a["v"], a["t"] = np.arange(N), np.sort(rng.integers(0, 300, N))
    b = a.copy()
    b["v"] += N
    b["t"] = np.maximum(b["t"] - rng.integers(0, 5, N), 0)  # a little disorder
    return {"a": a, "b": b}


def sorted_rows(rows: np.ndarray) -> list:
    return sorted(rows[["v", "n"]].tolist())


@pytest.mark.parametrize(("executors", "transport"), [(2, "shm"), (3, "tcp")])
def test_graph_flow_on_executors_equals_one_executor(executors, transport):
    flow, _ = graph_flow()
    one = slashrt.run(flow, inputs(), slot_size=256, slots=4)
    flow, _ = graph_flow()
    many = slashrt.run(flow, inputs(), executors=executors, transport=transport, slot_size=256, slots=4)
    for sink in ("g.held", "g.tagged", "g.looped"):
        assert len(many.outputs[sink]) > 0
        assert sorted_rows(many.outputs[sink]) == sorted_rows(one.outputs[sink]), sink
    assert set(many.outputs["g.looped"]["n"].tolist()) == {K}
    assert sorted_rows(many.outputs["g.held"]) == sorted((v, 1) for v in range(2 * N))  # never lost
    log = many.outputs["g.logged"]
    batches, notes = log[log["kind"] == 0], log[log["kind"] == 1]
    # every time a batch carried is notified once per executor that saw it, and never early:
    # no batch at a time <= t reaches the operator on ANY executor after on_notify(t) anywhere
    assert set(notes["epoch"].tolist()) == set(batches["epoch"].tolist())
    assert len(notes) <= executors * len(set(notes["epoch"].tolist()))
    first_notify = {}
    for epoch, ns in notes[["epoch", "ns"]].tolist():
        first_notify[epoch] = min(ns, first_notify.get(epoch, ns))
    epochs = np.array(sorted(first_notify))
    earliest = np.minimum.accumulate(np.array([first_notify[e] for e in epochs])[::-1])[::-1]  # min over times >= e
    at = np.searchsorted(epochs, batches["epoch"])
    assert (batches["ns"] < earliest[at]).all()


class FailOn(Operator):
    async def on_batch(self, ctx, port, batch):
        if (batch["v"] == N - 1).any():  # in one executor's share only
            raise ValueError("record N - 1 is poisoned")
        await ctx.emit(batch)


def test_an_operator_error_on_one_executor_fails_the_job_naming_it():
    flow = Dataflow("f")
    flow.source("a", REC, time="t").operator(FailOn(), name="poison").sink(sinks.Collect(), name="out")
    with pytest.raises(ClusterError, match=r"f\.poison.*poisoned \(on executor [01]\)$"):
        slashrt.run(flow, {"a": inputs()["a"]}, executors=2, slot_size=256, slots=4)


KEYED = np.dtype([("v", "<i8"), ("k", "<i8"), ("t", "<i8")])


class SumPerKeyOnNotify(Operator):
    """Counts records per key per time and emits (count, key, time) when the time is complete;
    a batch at a time it was already notified of (one that came early) fails the job."""

    per_time = True  # its state is keyed by ctx.time: one call per time, every record at it

    def __init__(self):
        self.counts, self.notified = {}, []

    async def on_batch(self, ctx, port, batch):
        if any(ctx.time.less_equal(t) for t in self.notified):
            raise AssertionError(f"a batch at {ctx.time} after on_notify({self.notified[-1]})")
        keys, counts = np.unique(batch.to_numpy(KEYED)["k"], return_counts=True)
        per_key = self.counts.setdefault(ctx.time, {})
        for k, c in zip(keys.tolist(), counts.tolist()):
            per_key[k] = per_key.get(k, 0) + c
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time_):
        self.notified.append(time_)
        per_key = self.counts.pop(time_)
        out = np.zeros(len(per_key), KEYED)
        out["k"], out["v"], out["t"] = list(per_key), list(per_key.values()), time_.epoch
        await ctx.emit(out)


def hop(batch):
    out = batch.to_numpy(KEYED).copy()
    out["k"] = out["k"] * 7 + 1  # a new owner, most of the time
    out["v"] += 1
    return out


def exchange_flow() -> Dataflow:
    flow = Dataflow("x")
    src = flow.source("a", KEYED, time="t")
    src.exchange(key="k").operator(SumPerKeyOnNotify(), name="per_key").sink(sinks.Collect(), name="per_key_out")
    with flow.loop("hops") as loop:
        moved = loop.enter(src).exchange(key="k", name="hop_exchange").apply(hop, name="hop")
        loop.feed_back(moved.filter(lambda b: b["v"] % 100 < K, name="again"))
        loop.leave(moved.filter(lambda b: b["v"] % 100 >= K, name="done")).sink(sinks.Collect(), name="hopped")
    return flow


@pytest.mark.parametrize(("executors", "transport"), [(2, "shm"), (3, "tcp")])
def test_exchange_by_key_on_executors_equals_one_executor(executors, transport):
    rng = np.random.default_rng(3)
    data = np.zeros(N, KEYED)
    data["v"], data["k"], data["t"] = 100 * np.arange(N), rng.integers(0, 60, N), np.arange(N) // 100
    one = slashrt.run(exchange_flow(), {"a": data}, slot_size=256, slots=4)
    many = slashrt.run(exchange_flow(), {"a": data}, executors=executors, transport=transport, slot_size=256, slots=4)
    # every key's records meet on one executor: one row per (time, key), the same counts
    rows = many.outputs["x.per_key_out"]
    assert len(rows) == len({(t, k) for t, k in data[["t", "k"]].tolist()})
    assert sorted(rows.tolist()) == sorted(one.outputs["x.per_key_out"].tolist())
    # records crossed executors K times inside the loop, none lost
    hopped = many.outputs["x.hopped"]
    assert sorted(hopped.tolist()) == sorted(one.outputs["x.hopped"].tolist()) and len(hopped) == N


# -- the errors of progress (the one-executor flows of tests/test_notify.py and test_loops.py) ----

def last_record_poisons(kind: str) -> Dataflow:
    """A flow that goes wrong only at the last record (v = N - 1, epoch 299), after ~280
    rings' worth of data went through: an operator emitting below the time it holds, one
    asking for a notification at a time already passed, or a loop whose record keeps going
    round until it reaches its bound of 3 iterations."""
    if kind == "loop":
        return spin_flow(3, spinning=lambda b: b["v"] == N - 1)
    flow = Dataflow("e")
    op = EmitPast(from_v=N - 1) if kind == "emit" else NotifyPast(from_v=N - 1)
    flow.source("src", REC, time="t").operator(op, name="bad").sink(sinks.Collect(), name="out")
    return flow


PROGRESS_ERRORS = {
    "emit": r"step 'e\.bad': emit at time \(\d+\), below the time it holds \(\d+\): an operator may only act at "
            r"its current time or later",
    "notify": r"step 'e\.bad': notify_at at time \(\d+\), below the time it holds \(\d+\): an operator may only act "
              r"at its current time or later",
    "loop": r"step 'spin\.forever_feedback_\d+': loop 'spin\.forever' reached its bound of max_iterations=3 at epoch "
            r"299 \(time \(299, <3>\)\) and still feeds back 1 records; raise the bound or make the loop converge",
}


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("kind", sorted(PROGRESS_ERRORS))
@pytest.mark.parametrize(("executors", "transport"), [(2, "shm"), (3, "tcp")])
def test_a_progress_error_fails_the_cluster_in_one_sentence_and_leaves_nothing_behind(kind, executors, transport, capfd):
    data = np.zeros(N, REC)
    data["v"], data["t"] = np.arange(N), np.arange(N) // 40
    before, shm_before = children(), _shm_entries()
    with pytest.raises(ClusterError) as failed:
        slashrt.run(last_record_poisons(kind), {"src": data}, executors=executors, transport=transport, slot_size=256,
                    slots=4)
    message = str(failed.value)
    # one sentence: the step, what went wrong, the executor; the peers' broken channels are no cause
    assert re.fullmatch(PROGRESS_ERRORS[kind] + rf" \(on executor [0-{executors - 1}]\)", message), message
    assert "\n" not in message and "Traceback" not in message and "ChannelClosed" not in message
    assert not failed.value.retryable  # a bug in the job, not an executor's death
    assert "Traceback" not in capfd.readouterr().err  # the agents log their failure in one line each
    assert children() - before == set(), "an executor process was left behind"
    assert _shm_entries() - shm_before == set()


def test_a_slow_owner_bounds_what_its_senders_queue_for_it():
    """Every key is owned by executor 1, whose step after the exchange is slow: executor 0 ships
    all it reads to it. Its ship queue is bounded at its sources (`RoomForSources`: they are
    polled no more while the queue holds over two rings' worth), so the records on their way
    between executors (the tracker's pointstamps at the exchange) stay a small part of the
    input, instead of all of it queued as fast as the sources read; the counts are exact."""
    from slashrt import Schema, Tumbling
    from slashrt.ssb.partitions import DEFAULT_PARTITIONS, Partitioning

    schema = Schema({"t": "i8", "k": "i8", "v": "i8"})
    n = 400_000
    keys = np.arange(20_000)
    ones = keys[Partitioning(DEFAULT_PARTITIONS, 2).owner_of(keys) == 1]
    rng = np.random.default_rng(0)
    data = np.zeros(n, schema.dtype)
    data["t"], data["k"], data["v"] = np.arange(n) // 100, rng.choice(ones, n), rng.integers(0, 50, n)

    def slow(batch):  # 1 ms per 500 records (about 1.6 s on executor 1 in all)
        time.sleep(0.001 * -(-len(batch) // 500))
        return np.ones(len(batch), bool)

    flow, out = Dataflow("skew"), sinks.Collect()
    a, b = flow.source("a", schema, time="t"), flow.source("b", schema, time="t")
    a.union(b).exchange(key="k").filter(slow, name="slow").window(Tumbling(ms=10**9)).count(key="v").sink(out, name="out")
    reports = []
    slashrt.run(flow, {"a": data, "b": data}, executors=2, on_report=reports.append, report_every=0.05,
                slots=8, slot_size=4096)
    expected = np.bincount(data["v"], minlength=50) * 2
    got = np.zeros(50, np.int64)
    np.add.at(got, out.records["v"], out.records["count"])
    assert np.array_equal(got, expected)
    flying = [sum(p["count"] for p in r["pointstamps"] if "on their way" in p["what"]) for r in reports]
    assert len(flying) >= 10 and max(flying) > 0
    # unbounded, executor 0's queue took in its whole share at once (measured: 760,916 of 800,000
    # on their way); bounded, ~50,000
    assert max(flying) < 2 * n // 4, flying
