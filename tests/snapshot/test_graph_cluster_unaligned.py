"""Unaligned checkpoints of flows whose exchanges are chained after exchanges, on clusters
(`AgentCheckpointing`: pointstamp progress, loops), in real agent processes over shm and tcp.

- a slow step after an exchange (a union's explicit exchange, or a linear flow's window): past
  the alignment timeout (0: at once) barrier n overtakes what the peers' channels hold in front
  of it (`<exchange>.from<j>.channel`) and what the exchanges queued to ship
  (`<exchange>.to<j>.channel`: records, or the SSB's partial rows); the output equals the
  reference, and a resume from a checkpoint holding both computes each exactly once (the
  receiver's replayed records, the sender's shipped again, each counted in flight until they
  arrive), also on 3 executors, on one, and on 3 in the other mode (every row in flight taken by
  its key's new owner: `rescale.graph_in_flight`);
- a loop that ships every round across executors, with every checkpoint unaligned: its parts
  hold the feedback log, the outboxes and channel state, and a resume from the latest is exact;
- the exchange's ship queue: barrier n moves ahead of the rows queued since the barrier before
  it, never past another barrier, and those rows are logged (in flight at the cut).

The kill trials of test_graph_cluster_checkpoints.py run with the default timeout (half their
10 ms interval), so their checkpoints are unaligned whenever an alignment takes longer.
"""

import collections
import time

import numpy as np
import pytest

import slashrt
from slashrt.bench import chaos
from slashrt.errors import SlashError
from slashrt import Dataflow, Schema, Tumbling
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.channel_state import CHANNEL_KIND
from slashrt.ssb.partitions import DEFAULT_PARTITIONS, Partitioning

from tests.snapshot import _graph_flow
from tests.snapshot.test_graph_cluster_checkpoints import RINGS as GRAPH_RINGS, chaos_env, published
from tests.snapshot._paced import until_fired

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
RINGS = {"slots": 16, "slot_size": 1024}
PER_BUFFER = (1024 - 32) // SCHEMA.record_size
N = 30_000  # per source: ~730 buffers, each ring (16 slots) wraps ~45 times


def stream(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(N, SCHEMA.dtype)
    out["t"] = np.arange(N) // 10
    out["k"] = rng.integers(0, 1000, N)
    out["v"] = rng.integers(0, 300, N)
    return out


INPUTS = {"a": stream(1), "b": stream(2)}


def chained(slow, window_ms: int = 10**9, shape: str = "union") -> tuple[Dataflow, Collect]:
    """Two exchanges chained, the slow step between them, then a count per v ("counts"; by
    default one window over the whole stream): summed over its windows, the counts are how many
    records went in. `shape` "union": the two sources' union and an exchange by k before the
    slow step; "linear": source a alone and a count per v and 10 ms before it (a window's
    exchange: records, or in mode slash the SSB's partial rows), "counts" summing those counts."""
    job = Dataflow("gcount")
    out = Collect(transactional=True)
    a = job.source("a", SCHEMA, time="t")
    if shape == "union":
        routed = a.union(job.source("b", SCHEMA, time="t")).exchange(key="k").filter(slow, name="slow")
        counted = routed.window(Tumbling(ms=window_ms)).count(key="v", name="counts")
    else:
        routed = a.window(Tumbling(ms=10)).count(key="v", output="n").filter(slow, name="slow")
        counted = routed.window(Tumbling(ms=window_ms)).sum("n", key="v", output="count", name="counts")
    counted.sink(out, name="out")
    return job, out


def inputs_of(shape: str) -> dict:
    return INPUTS if shape == "union" else {"a": INPUTS["a"]}


class SlowCalls:
    """A step after an exchange taking `seconds` a row, at most `cap` a call: the peers' channels
    of the exchange before it, and the exchanges' ship queues before them, stay full."""

    def __init__(self, seconds: float, cap: float):
        self.seconds, self.cap = seconds, cap

    def __call__(self, batch):
        time.sleep(min(self.seconds * len(batch), self.cap))
        return np.ones(len(batch), bool)


def channel_parts(checkpoint, kind: str) -> int:
    """Parts of records in flight on the peers' channels (`kind` "from") or in the exchanges'
    ship queues ("to"), holding at least one record."""
    return sum(1 for (step, _), state in checkpoint.states.items()
               if state.meta.get("kind") == CHANNEL_KIND and step.split(".")[-2].startswith(kind)
               and len(state.arrays["records"]))


def window_rows(out: Collect) -> np.ndarray:
    rows = np.sort(out.records, order=["window_start", "v"])
    return np.column_stack([rows["window_start"], rows["v"], rows["count"]])


def reference_rows(window_ms: int, shape: str = "union") -> np.ndarray:
    """(window start, v, count) of "counts": the input's records per v in each window, at their
    time t, or linear at the end of their 10 ms window (the time of its row)."""
    rows = np.concatenate(list(inputs_of(shape).values()))
    times = rows["t"] if shape == "union" else (rows["t"] // 10 + 1) * 10
    keys, n = np.unique(np.stack([times // window_ms * window_ms, rows["v"]], axis=1), axis=0, return_counts=True)
    return np.column_stack([keys, n])


def counts(out: Collect) -> np.ndarray:
    got = np.zeros(300, np.int64)
    np.add.at(got, out.records["v"], out.records["count"])
    return got


@pytest.mark.parametrize(("shape", "transport", "mode"), [
    ("union", "shm", "uppar"), ("union", "tcp", "uppar"), ("union", "shm", "slash"), ("union", "tcp", "slash"),
    ("linear", "shm", "slash"), ("linear", "tcp", "uppar"),
])
def test_a_slow_step_after_an_exchange_is_overtaken_and_a_resume_from_its_channel_state_is_exact(
        tmp_path, shape, transport, mode):
    """mode="slash": the count folds into fragments shipped as partial states every 100 ms of
    event time (30 windows), which the checkpoints hold, with the partials on their way (linear:
    the first window's too, every 10 ms)."""
    inputs = inputs_of(shape)
    expected = np.bincount(np.concatenate([r["v"] for r in inputs.values()]), minlength=300)
    window_ms = 100 if mode == "slash" else 10**9
    # barriers overtake the backlog of the peers' channels, and (behind a union's exchange, whose
    # ship queues fill while the slow step holds the channels) the rows queued to ship; a
    # linear flow's route queues only while its channel has no credit, which a run may not meet.
    # Whether a barrier meets a backlog is the machine's timing (a linear flow in mode slash
    # ships only its fragments' partial rows: about one run in eight has no checkpoint that
    # overtook any): up to three runs, each exact, until one did
    for attempt in range(3):
        directory = tmp_path / f"run{attempt}"
        job, out = chained(SlowCalls(60e-6, 0.004), window_ms, shape)
        result = slashrt.run(job, inputs, executors=2, transport=transport, mode=mode, checkpoint_dir=directory,
                             **RINGS, checkpoint={"interval": 0.02, "keep": 1000, "alignment_timeout": 0})
        assert np.array_equal(counts(out), expected)
        np.testing.assert_array_equal(window_rows(out), reference_rows(window_ms, shape))
        store = SnapshotStore(directory, job="gcount", keep=1000)
        checkpoints = {n: store.load(n) for n in store.checkpoints()}
        assert all(c.meta.get("unaligned") for c in checkpoints.values()
                   if any(state.meta.get("kind") == CHANNEL_KIND for state in c.states.values()))
        overtook = [n for n, c in checkpoints.items() if channel_parts(c, "from")]
        queued = [n for n, c in checkpoints.items() if channel_parts(c, "to")]
        if overtook and (queued or shape == "linear"):
            break
    assert overtook and (queued or shape == "linear"), {
        n: sorted(step for step, _ in c.states) for n, c in checkpoints.items()}
    assert len([c for c in result.checkpoints if c["status"] == "completed"]) == len(checkpoints)
    if mode == "slash":
        assert len(result.epochs["gcount.counts"][0]) > 1  # shipped while the stream went on
        assert {s.meta["kind"] for c in checkpoints.values() for (step, _), s in c.states.items()
                if step == "gcount.counts"} == {"ssb_graph_window"}
    # a resume from one computes each record in flight once: the receiver replays what its
    # peers' channels held, the sender ships again what it had queued behind the barrier; on
    # another executor count (3, and one; 3 in the other mode too) every row in flight goes to its
    # key's new owner (records, or the SSB's partial rows, into whatever window the run has)
    both, other = (sorted(set(overtook) & set(queued)) or overtook)[-1], {"slash": "uppar", "uppar": "slash"}[mode]
    resumes = {(both, 2, mode), (both, 3, mode), (both, 1, mode), (both, 3, other)} | {(n, 2, mode) for n in queued[:1]}
    for n, executors, resumed in sorted(resumes):
        job, out = chained(SlowCalls(0, 0), window_ms, shape)
        slashrt.run(job, inputs, executors=executors, transport=transport, mode=resumed, checkpoint_dir=directory,
                    **RINGS, checkpoint={"keep": 1000}, resume_from=n)
        # what n pre-committed (published by the restore) and all after: the windows each key's
        # owner had not fired at the checkpoint before n, each exact (one window over the whole
        # stream: every count; 100 ms windows: those from that cut on)
        before = max((m for m in checkpoints if m < n), default=None)
        fired = collections.defaultdict(lambda: np.iinfo(np.int64).min)
        if before is not None:
            fired.update({e: state.meta["fired_until"] for (step, e), state in checkpoints[before].states.items()
                          if step == "gcount.counts"})
        reference = reference_rows(window_ms, shape)
        owners = Partitioning(DEFAULT_PARTITIONS, 2).owner_of(reference[:, 1])
        unfired = reference[reference[:, 0] + window_ms > np.array([fired[int(o)] for o in owners])]
        assert len(unfired), n
        np.testing.assert_array_equal(window_rows(out), unfired[np.lexsort((unfired[:, 1], unfired[:, 0]))],
                                      err_msg=f"checkpoint {n} on {executors} executor(s), {resumed}")


def test_a_loop_shipping_every_round_with_unaligned_checkpoints_killed_and_resumed_is_exactly_once(tmp_path, monkeypatch):
    """Every round re-ships what the feedback brought back; every checkpoint is unaligned
    (timeout 0): its parts hold the feedback queues' log, the exchanges' outboxes and what the
    channels held in front of the barriers. Killed between pre-commit and commit of the third,
    resumed from the latest: exactly the reference."""
    inputs = {"a": _graph_flow.inputs()["a"]}
    slashrt.run(_graph_flow.hop_flow(tmp_path / "ref"), inputs, checkpoint_dir=tmp_path / "ref-chk")
    reference = published(tmp_path / "ref" / "hopped")
    chaos_env(monkeypatch, tmp_path, "pre_commit:3")
    options = dict(executors=2, transport="shm", checkpoint_dir=tmp_path / "chk", **GRAPH_RINGS,
                   checkpoint={"interval": 0.01, "keep": 1000, "alignment_timeout": 0})
    with pytest.raises(SlashError, match=r"executor \d was killed by signal 9 \(SIGKILL\)"):
        slashrt.run(_graph_flow.hop_flow(tmp_path / "out", until_fired(tmp_path / "marks", "pre_commit:3")), inputs,
                    **options)
    store = SnapshotStore(tmp_path / "chk", job="hop-ckpt", keep=1000)
    steps = {step for n in store.checkpoints() for (step, _), state in store.load(n).states.items()
             if len(state.arrays.get("rows", ())) or len(state.arrays.get("records", ()))}
    assert any(step.endswith(".channel") for step in steps), steps
    latest = store.latest()
    monkeypatch.delenv(chaos.KILLS_ENV)
    result = slashrt.run(_graph_flow.hop_flow(tmp_path / "out"), inputs, resume_from="latest", **options)
    assert result.resumed_from == latest.number
    assert published(tmp_path / "out" / "hopped") == reference


async def test_an_exchanges_barrier_overtakes_the_rows_queued_since_the_barrier_before_it():
    from slashrt._dataflow import ExchangeSpec
    from slashrt.ops.route import ExchangeNode
    from slashrt.ssb.partitions import Partitioning

    spec = ExchangeSpec("x", "up", "k", SCHEMA.dtype, 0)
    node = ExchangeNode(spec, index=0, partitioning=Partitioning(8, 2))
    node.add_peer(1, sender=None)
    rows = [np.zeros(n, node.exchange_dtype) for n in (1, 2, 3, 4)]
    queue = node._queues[1]
    queue.extend([rows[0], 6, rows[1], rows[2], 7, rows[3]])
    node.forward_barrier(8)  # aligned (no log), behind rows[3]
    assert node.overtake(7) == 5  # ahead of rows[1] and rows[2], not past barrier 6
    assert [x if isinstance(x, int) else len(x) for x in queue] == [1, 6, 7, 2, 3, 4, 8]
    owners, logged = node.take_outbox()
    assert owners.tolist() == [1] * 5 and len(logged) == 5 and node.outbox is None
    assert node.overtake(7) == 0  # already ahead: nothing to move
    node.outbox = [(1, rows[0])]  # (logging since an earlier overtake) the moved rows join it
    assert node.overtake(8) == 9 and [len(r) for _, r in node.outbox] == [2, 3, 4, 1]
    assert [x if isinstance(x, int) else len(x) for x in queue] == [1, 6, 7, 8, 2, 3, 4]
    node.forward_barrier(9, log=False)  # a new barrier: a log left from n ends
    assert node.outbox is None
