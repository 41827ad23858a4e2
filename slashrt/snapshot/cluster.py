"""Checkpoints of a multi-executor run: each agent's side, and the cluster coordinator's side.

    cluster coordinator                          agent i (one executor)
      CheckpointCoordinator over every             sources: record position, barrier n in band
      (stateful step, executor)
      "checkpoint" n  ───────────────────────>     align n over lane 0 (its sources): forward
                                                   barrier n on stage 1's exchange channels;
                                                   over lanes 0..k-1: on stage k's; over every
                                                   lane (the peers' channels of every stage):
                                                   pre-commit sinks, copy state (sync), write parts
                           <───────────────────    "ack" (n, stats, parts, source positions)   (async)
      all acked: manifest (every executor's
      positions, the executor count)
      "commit" n  ───────────────────────────>     2PC sinks commit n
                           <───────────────────    "drained" (every input ended)
      every agent drained: final checkpoint F
      "checkpoint" F, then "commit" F, "finish" ─> taken at once (nothing is in flight)

Alignment goes stage by stage because every executor is upstream and downstream of every other:
lane k of an executor computes what peers send to its stage-k exchanges (`slashrt._plan`), and
the sending half of a stage-k exchange (fragments, routing) is fed by lanes 0..k-1 only, so once
they all delivered barrier n (their data behind it waits in their rings) barrier n goes out on
stage k's channels; the snapshot is taken when every lane delivered n, and the inputs are
released once every forward is out.
An executor does not wait for its own barrier to come back, so alignment cannot deadlock, and
what a peer sent before its barrier is in the receiver's snapshot, nothing sent after it is.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import structlog
import trio

from slashrt.errors import OptionError, SlashError, SnapshotError
from slashrt.snapshot.alignment import Abort, AlignmentStats, BarrierAligner, Snapshot
from slashrt.snapshot.commit import recover
from slashrt.snapshot.coordinator import AckStats, CheckpointCoordinator
from slashrt.snapshot.runtime import Checkpointing, source_position
from slashrt.snapshot.state_format import State

__all__ = ["AgentCheckpointing", "ClusterCheckpoints"]

log = structlog.get_logger("slashrt.checkpoint")

NO_STATE = "executor"  # the instance that acks for an executor without stateful steps


class AgentCheckpointing(Checkpointing):
    """The checkpoints of one agent's executor in a cluster run (see the module doc): requests,
    commits and the end come over the control `link`; acks go back over it."""

    def __init__(self, plan, config, store, restored, *, index: int, link, exchanges, peer_inputs):
        """`exchanges`: the plan's exchanges, each with its stage (`lane`); `peer_inputs`: the
        names of the channels arriving from peers, each with the stage it feeds ({name: stage};
        a list: all of stage 1)."""
        super().__init__(plan, config, store, restored, executor=index)
        self.link = link
        self.exchanges = list(exchanges)
        self.local = list(plan.sources)
        if not isinstance(peer_inputs, dict):
            peer_inputs = dict.fromkeys(peer_inputs, 1)
        self.stages: dict[int, list] = {}  # stage -> its exchanges, whose sending halves forward barriers
        for exchange in self.exchanges:
            self.stages.setdefault(getattr(exchange, "lane", 1), []).append(exchange)
        # what feeds stage k's sending half: the sources and the peers' channels of the stages before k
        self.feeding = {k: self.local + [i for i, lane in peer_inputs.items() if lane < k] for k in sorted(self.stages)}
        self.aligner = BarrierAligner(self.local + list(peer_inputs), clock=time.perf_counter)
        self._forwarded = dict.fromkeys(self.feeding, 0)  # stage -> the newest barrier it claimed to send
        self._sending = trio.Lock()  # forwards go out one at a time, in the order they were claimed
        self._unsent = 0  # forwards claimed, not yet sent
        self._requested: set[int] = set()
        self._drained = False
        self._released = trio.Event()  # "finish": the final checkpoint is committed

    rescaled: dict | None = None  # resuming a checkpoint of another executor count: the states reassigned here

    def restore(self, progress=None) -> None:
        if self.rescaled is None:
            return super().restore(progress)
        from slashrt.snapshot.operators import check

        for step_id, node in self.nodes.items():  # sources start afresh on their new shares
            if step_id in self.rescaled:
                check(self.rescaled[step_id], step_id, node.STATE_KIND, node.STATE_VERSION)
                node.restore(self.rescaled[step_id])
        for sink in self.sinks:
            recover(sink, self.restored.number)
        log.info("checkpoint restored", checkpoint=self.restored.number, rescaled_from=self.restored.meta["executors"])

    def position(self, step_id: str) -> State | None:
        if self.rescaled is not None:  # sources start afresh on their new shares
            return None
        return super().position(step_id)

    # -- the coordinator's messages ----------------------------------------------------------------
    def on_message(self, kind: str, n) -> None:
        if kind == "checkpoint":
            if n in self._requested:  # a peer's barrier came first and it was taken then (`_obey`)
                return
            self._requested.add(n)
            self._request(n)
            if self._drained:  # nothing in flight any more: take it at once
                self._take_now(n)
        elif kind == "commit":
            for sink in self.sinks:
                sink.commit(n)
            log.debug("checkpoint committed", checkpoint=n, executor=self.executor)
        elif kind == "finish":
            self._released.set()

    def _take_now(self, n: int) -> None:
        now = time.perf_counter()
        self._take(n, AlignmentStats(n, now, now))

    @contextlib.asynccontextmanager
    async def running(self):
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            yield
            await self._finish()

    async def _finish(self) -> None:
        """Every input ended: take what was requested and not aligned (ended inputs deliver every
        barrier), say so, and take what comes (the final checkpoint) until told to finish."""
        self._drained = True
        for n in sorted(self._requested - self._taken):
            self._take_now(n)
        await self.link.send("drained")
        await self._released.wait()
        while self._writing:
            await self._changed.wait()

    # -- alignment: stage by stage, the sending halves, then the snapshot ---------------------------
    async def _obey(self, executor, outcomes) -> None:
        due = []  # (stage, checkpoint) to forward, claimed here in order
        for outcome in outcomes:
            if isinstance(outcome, Snapshot):
                if outcome.checkpoint not in self._requested:
                    # the peers' barriers overtook the coordinator's request, and this executor's
                    # sources all ended (else they would still owe barrier n): what they fed is
                    # whole before n, so their end is their position in n, recorded here
                    self._requested.add(outcome.checkpoint)
                    self._request(outcome.checkpoint)
                due += self._claim(outcome.checkpoint, self.feeding)
        n = self.aligner.aligning
        if n is not None:
            channels = self.aligner.channels
            ready = [k for k, inputs in self.feeding.items() if all(i in channels.blocked or i in channels.ended for i in inputs)]
            due += self._claim(n, ready)
        if due:
            async with self._sending:  # in claim order
                for stage, checkpoint in due:
                    for exchange in self.stages[stage]:
                        await exchange.forward_barrier(checkpoint)
                    self._unsent -= 1
        await super()._obey(executor, outcomes)  # a snapshot is taken now; `_block` releases the inputs

    def _claim(self, n: int, stages) -> list[tuple[int, int]]:
        """The stages among `stages` that have not forwarded barrier n yet, now claimed for it."""
        due = [(k, n) for k in stages if self._forwarded[k] < n]
        for k, _ in due:
            self._forwarded[k] = n
        self._unsent += len(due)
        return due

    def _block(self, executor) -> None:
        """After a snapshot every input is past its barrier: while a forward is still on its way
        (a peer's credits), hold them all, else a released lane would send what follows barrier
        n ahead of it on that channel; the task sending the last one releases them."""
        if not (self._unsent and self.aligner.aligning is None):
            return super()._block(executor)
        for inp in executor.inputs:
            if inp.blocked is None and not getattr(inp, "ended", False):
                executor.block(inp)

    def _decline(self, outcome: Abort) -> None:
        self._nursery.start_soon(self.link.send, "decline", (outcome.checkpoint, outcome.reason))

    async def _write_parts(self, n: int, states: dict, sync: dict, positions: dict, alignment_s: float) -> None:
        stats, parts = {}, []
        try:
            for step_id, state in states.items():
                t0 = time.perf_counter()
                part = await self.store.awrite_part(n, step_id, self.executor, state.arrays, state.meta)
                stats[step_id] = AckStats(alignment_s, sync[step_id], time.perf_counter() - t0, part.size)
                parts.append(part)
        except (OSError, SlashError) as exc:  # e.g. an older checkpoint removed by retention meanwhile
            await self.link.send("decline", (n, f"executor {self.executor} could not write its state: {exc}"))
            return
        if not states:
            stats[NO_STATE] = AckStats(alignment_s)
        await self.link.send("ack", (n, stats, parts, positions))


class ClusterCheckpoints:
    """The cluster coordinator's side: a `CheckpointCoordinator` over every (stateful step,
    executor), periodic triggers, the manifest once every instance acked, and the commits."""

    def __init__(self, store, config, steps, executors: int):
        if config.mode != "abs":
            raise OptionError(
                f"run(): checkpoint mode {config.mode!r} stops the world on one executor only; clusters take barrier "
                "snapshots (mode 'abs')"
            )
        self.store = store
        self.executors = executors
        self.steps = sorted(steps) or [NO_STATE]
        self.config = config
        self.coordinator: CheckpointCoordinator | None = None  # made when the run starts (`triggers`)
        self.agents = None
        self._acks: dict[int, dict] = {}  # checkpoint -> {"parts": [...], "positions": {executor: ...}}
        self._completing = 0  # manifests being written and commits being sent
        self._changed = trio.Event()

    def handlers(self) -> dict:
        return {"ack": self._on_ack, "decline": self._on_decline}

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if self.agents is not None:
            self.agents.poke()

    async def triggers(self, agents, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Trigger checkpoints every interval (and expire the late ones) until cancelled."""
        self.agents = agents
        # the first periodic checkpoint comes one interval after the run started, not its setup
        coordinator = self.coordinator = CheckpointCoordinator.for_steps(
            self.steps, range(self.executors), self.config, clock=trio.current_time, first=self.store.next_checkpoint()
        )
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while (due := coordinator.next_due()) is not None:
                await trio.sleep_until(min(due, self._expiry()))
                for record in coordinator.expire():
                    log.warning("checkpoint aborted", checkpoint=record.checkpoint, reason=record.reason)
                    self._signal()
                record = coordinator.maybe_trigger()
                if record is None:  # max_in_flight pending (or not due yet): wait for one to end
                    with trio.move_on_at(self._expiry()):
                        await self._changed.wait()
                    continue
                log.debug("checkpoint triggered", checkpoint=record.checkpoint)
                # pending now, so every agent must be asked for it: the run loop cancels the
                # triggers once every executor drained, and a request that reached some agents
                # only would leave `final` waiting for acks that never come
                with trio.CancelScope(shield=True):
                    await agents.send_all("checkpoint", [record.checkpoint] * self.executors)

    def _expiry(self) -> float:
        started = [c.triggered for c in self.coordinator.pending.values()]
        return min(started) + self.coordinator.config.timeout if started else float("inf")

    async def final(self, agents) -> None:
        """Every executor drained: the checkpoints in flight end (each agent takes what it was
        asked for), then the final one is taken, committed, and the agents finish."""
        self.agents = agents
        await agents.settle(lambda: not self.coordinator.pending and not self._completing)
        final = self.coordinator.trigger_savepoint().checkpoint
        await agents.send_all("checkpoint", [final] * self.executors)
        await agents.settle(lambda: final not in self.coordinator.pending and not self._completing)
        record = self.coordinator.history[-1]
        if record.checkpoint != final or record.status != "completed":
            raise SnapshotError(f"the final checkpoint {final} of the run was {record.status}: {record.reason}")
        await agents.send_all("finish", [None] * self.executors)

    async def _on_ack(self, executor: int, payload) -> None:
        n, stats, parts, positions = payload
        got = self._acks.setdefault(n, {"parts": [], "positions": {}})
        got["parts"].extend(parts)
        for step_id, per_executor in positions.items():  # {source: {executor: position}}, as one executor keeps them
            got["positions"].setdefault(step_id, {}).update(per_executor)
        completed = None
        for step_id, ack in stats.items():
            completed = self.coordinator.ack(n, (step_id, executor), ack) or completed
        if completed is None:
            if n not in self.coordinator.pending:
                self._acks.pop(n, None)
            return
        for m in [m for m in self._acks if m <= n]:
            del self._acks[m]
        meta = {"executors": self.executors, "cluster": True, "sources": got["positions"]}
        self._completing += 1  # complete in the coordinator's eyes, not yet in the store's nor committed
        try:
            await self.store.acomplete(n, meta, got["parts"])
            log.info("checkpoint completed", checkpoint=n, bytes=completed.bytes)
            await self.agents.send_all("commit", [n] * self.executors)
        finally:
            self._completing -= 1
            self._signal()

    async def _on_decline(self, executor: int, payload) -> None:
        n, reason = payload
        record = self.coordinator.decline(n, (self.steps[0], executor), reason)
        if record is not None:
            log.warning("checkpoint aborted", checkpoint=n, reason=record.reason)
            self._acks.pop(n, None)
            self._signal()

    def report(self) -> list[dict]:
        return self.coordinator.report()


def cluster_checkpoints(flow, plan, role_plan, inputs: dict, executors: int, options: dict):
    """The coordinator's `ClusterCheckpoints` for a run on `executors` (None without a
    `checkpoint_dir`), with `job` (what every agent needs: the config, the store's location, the
    checkpoint to restore). Pops the checkpoint options from `options`; refuses, in one sentence
    and before any agent starts, what clusters cannot checkpoint."""
    from slashrt._runtime import refuse_uncheckpointable
    from slashrt.errors import DataflowError
    from slashrt.snapshot.operators import stateful_nodes
    from slashrt.snapshot.runtime import checkpoint_config, load_restored
    from slashrt.snapshot.storage import SnapshotStore

    checkpoint, location, resume_from = (options.pop(k, None) for k in ("checkpoint", "checkpoint_dir", "resume_from"))
    if options.pop("stop", None) is not None:
        raise DataflowError(
            "run(): stop=: stopping with a savepoint runs on one executor for now; on a cluster, end the run and "
            "resume it with resume_from='latest'"
        )
    if location is None:
        if checkpoint is not None or resume_from is not None:
            raise OptionError("run(): checkpoint= and resume_from= need checkpoint_dir= (a directory or fsspec URL for the checkpoints)")
        return None
    config, keep = checkpoint_config(checkpoint)
    refuse_uncheckpointable(flow, plan, inputs)
    if role_plan.graph is not None:
        raise DataflowError(
            f"run(): dataflow {flow.name!r} runs on distributed pointstamp progress across executors, which checkpoints "
            "do not cover yet: run it without checkpoint_dir= or on one executor"
        )
    store = SnapshotStore(location, job=flow.name, keep=keep)
    cluster = ClusterCheckpoints(store, config, stateful_nodes(role_plan), executors)
    restored = load_restored(store, resume_from, executor=None)  # every part verified: a corrupt one falls back
    cluster.job = {"config": config, "location": location, "keep": keep,
                   "restore": None if restored is None else restored.number, "rescale": False}
    cluster.shares = {}
    if restored is not None and restored.meta.get("executors", 1) != executors:
        cluster.shares = _rescale(flow, plan, role_plan, inputs, restored, executors)
        cluster.job["rescale"] = True
    return cluster


def _rescale(flow, plan, role_plan, inputs: dict, restored, executors: int) -> dict:
    """Resume `restored` on another number of executors: refuse what cannot be (one sentence),
    settle the sinks of old executors that have no successor, and return every array source's
    new shares ({source name: [share per executor]})."""
    from slashrt._runtime import _per_source
    from slashrt.snapshot.commit import recover
    from slashrt.snapshot.operators import stateful_nodes

    was, n = restored.meta.get("executors", 1), restored.number
    refuse = f"run(): checkpoint {n} was taken on {was} executor(s) and cannot resume on {executors}:"
    if not restored.meta.get("cluster"):
        raise SnapshotError(
            f"{refuse} one executor keeps its windows whole, not as SSB partitions to reassign; resume it on one executor"
        )
    kinds = {node.STATE_KIND for node in stateful_nodes(role_plan).values()}
    if "route_by_owner" in kinds or "window" in kinds:
        raise SnapshotError(f"{refuse} only SSB state (mode 'slash') is reassigned by partition; resume it with executors={was}")
    ssb = [s for (step, e), s in restored.states.items() if s.meta.get("kind") == "ssb_window"]
    partitions = {s.meta["partitions"] for s in ssb} or {None}
    if role_plan.exchanges() and partitions != {role_plan.exchanges()[0].partitioning.partitions}:
        raise SnapshotError(f"{refuse} it has {partitions.pop()} SSB partitions; give partitions= the same number")
    shares = {}
    for step_id, spec, value in _per_source(plan, inputs, "input"):
        if not isinstance(value, np.ndarray):
            raise SnapshotError(
                f"{refuse} source {step_id!r} makes its own stream per executor; only in-memory arrays are shared out anew"
            )
        fed = [source_position(restored.meta, step_id, i)["fed"] for i in range(was)]
        shares[step_id.split(".", 1)[1]] = reshare(value, spec.time, was, fed, executors)
    for node in plan.sinks:  # output of old executors without a successor: committed up to n, the rest dropped
        for i in range(executors, was):
            part = getattr(node.sink, "for_executor", None)
            if part is not None and getattr(node.sink, "transactional", False):
                recover(part(i), n)
    return shares


async def agent_checkpointing(job, plan, *, link, exchanges, peer_inputs) -> AgentCheckpointing:
    """An agent's `AgentCheckpointing` for `job` (its `checkpoint` settings), with its restored
    checkpoint loaded (this executor's parts only, read in a thread: heartbeats go on)."""
    from slashrt.snapshot.storage import SnapshotStore

    settings = job.checkpoint
    store = SnapshotStore(settings["location"], job=job.flow.name, keep=settings["keep"])
    restored = None
    if settings["restore"] is not None:  # rescaling: every executor's parts, to take its partitions
        restored = await store.aload(settings["restore"], executor=None if settings["rescale"] else job.index)
    checkpoints = AgentCheckpointing(
        plan, settings["config"], store, restored, index=job.index, link=link, exchanges=exchanges,
        peer_inputs=peer_inputs,
    )
    if settings["rescale"]:
        checkpoints.rescaled = reassigned(restored, plan, job.index, job.executors, job.partitions)
    return checkpoints


# -- rescaling: resuming a cluster checkpoint on another number of executors -----------------------
def reshare(records: np.ndarray, time: str | None, old: int, fed: list[int], executors: int) -> list:
    """Every new executor's share of what no old executor had fed: old executor i had fed the
    first `fed[i]` records of its share (`_job.share`); the rest, in the input's order, is shared
    out in contiguous runs, each carrying the largest event time of the whole input before it
    (`Share` with irregular blocks), so lateness is judged as in a run without the rescaling."""
    from slashrt.cluster._job import SPLIT_BLOCK, share
    from slashrt.ops.event_time import NO_TIME, Share

    rows = np.arange(len(records))
    left = np.sort(np.concatenate([share(rows, i, old)[fed[i]:] for i in range(old)]))
    # contiguous runs of what is left, cut at SPLIT_BLOCK, dealt round robin to the new executors
    breaks = np.flatnonzero(np.diff(left) != 1) + 1
    starts = np.unique(np.concatenate([[0], breaks, np.arange(0, len(left), SPLIT_BLOCK)])) if len(left) else left
    bounds = np.append(starts, len(left)).astype(np.int64)
    if time is None:
        before = np.full(len(starts), NO_TIME, np.int64)
    else:
        prefix = np.maximum.accumulate(records[time].astype(np.int64)) if len(records) else rows
        first = left[starts] if len(left) else left
        before = np.where(first > 0, prefix[np.maximum(first - 1, 0)], NO_TIME).astype(np.int64)
    shares = []
    for j in range(executors):
        runs = np.arange(j, len(starts), executors)
        pieces = [left[bounds[r] : bounds[r + 1]] for r in runs]
        taken = np.concatenate(pieces) if pieces else left[:0]
        lengths = np.array([len(p) for p in pieces], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(pieces) else lengths
        shares.append(Share(records[taken], before[runs], SPLIT_BLOCK, offsets) if time is not None else records[taken])
    return shares


def reassigned(checkpoint, plan, index: int, executors: int, partitions: int) -> dict:
    """Executor `index`'s states (step id -> State) out of `checkpoint`, taken on another number
    of executors: SSB partitions reassigned to their new leaders (`merge_partitions`), sinks'
    pending transactions of old executors index, index + executors, ... joined; sources start
    afresh on their new shares (`reshare`)."""
    from slashrt.ssb.partitions import Partitioning
    from slashrt.snapshot.operators import merge_partitions, split_partitions, stateful_nodes

    old = checkpoint.meta["executors"]
    before, after = Partitioning(partitions, old), Partitioning(partitions, executors)
    led = set(after.led_by(index).tolist())
    states = {}
    for step_id, node in stateful_nodes(plan).items():
        kind = node.STATE_KIND
        if kind == "ssb_window":
            parts = [
                part for i in range(old)
                for p, part in split_partitions(checkpoint.state(step_id, i), before).items() if p in led
            ]
            states[step_id] = merge_partitions(parts, after, index)
        elif kind == "sink":
            mine = [checkpoint.state(step_id, i) for i in range(index, old, executors)]
            if mine:
                states[step_id] = _joined_sink_states(mine)
    return states


def _joined_sink_states(states: list[State]) -> State:
    pending = sorted({n for s in states for n in s.meta["pending"]})
    if not any("pending.records" in s.arrays for s in states):
        return State({}, {**states[0].meta, "pending": pending})
    by_n: dict[int, list] = {n: [] for n in pending}
    for s in states:
        records, bounds = s.arrays.get("pending.records"), s.arrays.get("pending.bounds")
        for i, n in enumerate(s.meta["pending"]):
            if records is not None:
                by_n[n].append(records[bounds[i] : bounds[i + 1]])
    parts = [np.concatenate(by_n[n]) for n in pending if by_n[n]]
    arrays = {"pending.records": np.concatenate(parts), "pending.bounds": np.cumsum([0, *map(len, parts)]).astype(np.int64)}
    return State(arrays, {**states[0].meta, "pending": [n for n in pending if by_n[n]]})
