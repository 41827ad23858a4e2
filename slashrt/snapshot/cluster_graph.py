"""Checkpoints of a graph flow on several executors (distributed pointstamp progress): an agent's side.

A graph flow's exchanges (`exchange(key=)`, the `WindowRoute` of a keyed window) may be chained
(an exchange fed by what another exchange delivered), so alignment goes one exchange at a time,
in the order the data flows, instead of the two stages of `AgentCheckpointing`:

    exchange X forwards barrier n to its peers (into each ship queue, behind the rows queued)
    once every input upstream of X delivered n (blocked behind it) or ended: this executor's
    sources, and the peers' channels of every exchange that feeds X;
    the executor snapshots once every input delivered n (the sources and every peer channel).

Nothing computed from an input after its barrier reaches an exchange that forwarded n (the
input is blocked until the snapshot), and what the peers' channels bring before their barriers
only flows downstream of their exchange, which forwards n only after them: without its back
edges the graph is acyclic, so no executor waits for its own barrier and alignment cannot deadlock.

What fires on the frontier (windows, notifications, an exchange's end) is not fed by an input
but by progress, which moves at any moment: from the first barrier forwarded to the snapshot the
tracker holds every delivery (`PointstampProgress.hold_deliveries`), so a window fires
either before the barrier went out (its output before the barrier, its state fired) or after the snapshot.

Progress at the cut: every record shipped before a barrier was received, and counted -n, before
the receiver's snapshot, so no count of records in flight belongs to a checkpoint; a restored run
starts from the initial view (every source instance at the least time) and each executor
recounts what its restored nodes hold (`PointstampProgress.recount`: sources' capabilities at
their restored watermarks, notification requests, windows' capabilities), in one batch.

Loops (the ABS seed's algorithm 2, the executor as the unit): the back edges are each
executor's feedback queue, which the forwarding rule does not follow (a walk stops at a
feedback). Between an exchange's forward and the snapshot, what the unblocked inputs and the
feedback queue send through it crosses after the barrier yet was computed before the snapshot:
the exchange logs it (`Outbox`, a part per exchange), and the snapshot also takes what the
feedback queues hold (`BackEdgeLog.take`). A restore ships the outboxes again, counted in
flight with the recount, then replays the feedback log before any new input.

Unaligned (past `alignment_timeout`, `AgentCheckpointing.between` on lane 0, which computes
every input): the sources' rings and the peers' channels whose barrier n is in the ring are
overtaken (their buffers in front of n are channel state) and count as delivered, so the
forwarding rule goes on at once; a late barrier goes ahead of the rows its exchange queued to
ship since the barrier before it (`ExchangeNode.overtake`), and those rows, with what ships until
the snapshot, are logged like the loops' outboxes: parts `<exchange>.to<j>.channel` without
loops (`_log_outboxes`), the `Outbox` part with them. A restore ships them again and counts the
peers' channels' records in flight with the recount; lane 0 computes those first (`replay_input`).

Stop with a savepoint: "savepoint" n is aligned as any checkpoint (its sources feed nothing
after barrier n, and, like a "checkpoint" request, it wakes the executor to forward at once what
ended sources owe). Nothing drains: notifications, open windows and the loops' log and outboxes
stay in n. From the snapshot until "stop" the executor computes nothing (`Executor.halt`, from
`Checkpointing._take`): no window fires, no notification, no end, no fed-back batch, no input
(a peer's outbox rows wait in the ring), though a peer's progress may still move the frontier
(a source's capability a peer publishes only once it halted): whatever fired there the resumed
run would fire again, twice into a sink that is not transactional. If n aborts, "go_on" lets it
compute again.
"""

from __future__ import annotations

import numpy as np

from slashrt.snapshot import channel_state
from slashrt.snapshot.alignment import Abort, Snapshot
from slashrt.snapshot.cluster import AgentCheckpointing
from slashrt.snapshot.loops import OUTBOX, Outbox
from slashrt.snapshot.runtime import Checkpointing
from slashrt.snapshot.rescale import graph_in_flight, reassigned
from slashrt.snapshot.storage import SnapshotStore

__all__ = ["GraphAgentCheckpointing", "agent_checkpointing", "upstream_inputs"]

def upstream_inputs(exchanges, local: list[str], peer_inputs) -> dict[str, list[str]]:
    """Exchange step id -> the inputs whose data can reach it: the executor's sources, and the
    peer channels (`<step>.from<executor>`) of every other exchange it lies downstream of."""
    inbound = {x.step_id: [i for i in peer_inputs if i.rpartition(".from")[0] == x.step_id] for x in exchanges}
    return {
        x.step_id: list(local) + [
            i for y in exchanges if y is not x and any(z is x for z in y.walk()) for i in inbound[y.step_id]
        ]
        for x in exchanges
    }


class GraphAgentCheckpointing(AgentCheckpointing):
    """`AgentCheckpointing` for a graph flow (see the module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.upstream = upstream_inputs(self.exchanges, self.local, self.aligner.channels.inputs[len(self.local):])
        self._sent = {x.step_id: 0 for x in self.exchanges}  # the newest barrier each exchange forwarded
        self.progress = None
        self._holding: int | None = None  # forwarded, not yet snapshotted: the tracker holds deliveries
        self._due = False  # a request came: `_advance` at the executor's next turn
        if self.loops is not None:  # records in flight at the cut: the feedback queues and the outboxes
            self.outboxes = {box.step_id: box for box in map(Outbox, self.exchanges)}
            self.nodes.update(self.outboxes)

    async def restore(self, progress=None) -> None:
        """The nodes, then the outboxes shipped again and counted in flight (an unaligned
        checkpoint's `<exchange>.to<j>` channel parts, as they are restored: `requeue`), and
        the records in flight on the peers' channels counted (their lanes compute them first:
        `replay_input`), before the feedback queues' log is replayed (`replay`): one batch of
        counts with the recount."""
        self.progress = progress
        states = {} if self.restored is None else self.restored.states
        outboxes = {key: states.pop(key) for key in list(states) if key[0].endswith(OUTBOX)}
        await super().restore(progress)
        if self.rescaled is not None:  # (their rows went to their keys' new owners: `rescale.graph_in_flight`)
            outboxes = {}
        for (step_id, _), state in outboxes.items():
            self.outboxes[step_id].restore(state)
        exchanges = {x.step_id: x for x in self.exchanges}
        for name, segments in self._in_flight.items():
            rows = [records for kind, records in segments if kind == channel_state.DATA and len(records)]
            if rows:
                exchanges[name.rpartition(".from")[0]].count_in_flight(np.concatenate(rows))

    def on_message(self, kind: str, n) -> None:
        super().on_message(kind, n)
        if kind in ("checkpoint", "savepoint") and self.progress is not None:
            # inputs that ended before n was asked for deliver it at once; but forwarding here,
            # in the control link's task, could cut a window's firing in two: the executor does
            # it between two batches (`between`), woken for it
            self._due = True
            self.progress.wake()

    def between(self, lane: int = 0) -> None:
        if self._due:
            self._due = False
            self._advance()
        super().between(lane)

    async def _obey(self, executor, outcomes) -> None:
        self._forward_overtaken(outcomes)
        await Checkpointing._obey(self, executor, outcomes)

    def _forward_overtaken(self, outcomes) -> None:
        """Barrier n into the ship queues of every exchange whose upstream inputs all delivered
        it (or were overtaken), of all of them for a snapshot `outcomes` make due."""
        for outcome in outcomes:
            if isinstance(outcome, Snapshot):
                if outcome.checkpoint not in self._requested:  # a peer's barrier overtook the request
                    self._requested.add(outcome.checkpoint)
                    self._request(outcome.checkpoint)
                self._send_barrier(outcome.checkpoint, self.exchanges)
        self._advance()

    def _overtake_forwarded(self, n: int) -> None:
        for x in self.exchanges:
            if self._sent[x.step_id] >= n:
                x.overtake(n)

    def _advance(self) -> None:
        """Forward each barrier on each exchange whose upstream inputs all delivered it; take
        at once what nothing can deliver any more (every input ended)."""
        channels, aligning, latest = self.aligner.channels, self.aligner.aligning, self.aligner.latest
        # what may still be aligned here: not taken, not aborted (a checkpoint at or below the
        # newest one started here is done with, unless it is the one aligning)
        pending = sorted({n for n in self._requested - self._taken if n > latest} | {aligning} - {None})
        for n in pending:
            ready = [
                x for x in self.exchanges if self._sent[x.step_id] < n and all(
                    i in channels.ended or (aligning == n and i in channels.blocked) for i in self.upstream[x.step_id]
                )
            ]
            self._send_barrier(n, ready)
        if channels.ended == set(channels.inputs):
            for n in pending:
                self._send_barrier(n, self.exchanges)
                self._take_now(n)

    def _send_barrier(self, n: int, exchanges) -> None:
        for x in exchanges:
            if self._sent[x.step_id] < n:
                self._sent[x.step_id] = n
                x.forward_barrier(n, log=self.loops is not None)
                if n in self._late:  # unaligned: ahead of what is queued, which is logged
                    x.overtake(n)
                if n not in self._taken and self.progress is not None:
                    self.progress.hold_deliveries()
                    self._holding = max(n, self._holding or 0)

    def _take(self, n, alignment, running: bool = False) -> None:
        # loops: the log of the feedback queues is what they hold now (deliveries are held
        # since the barriers went out, and the cut is this executor's, not a barrier's round)
        if self.loops is None:  # (with loops, the outboxes are parts of their own: `Outbox`)
            self._log_outboxes(n)
        super()._take(n, alignment, running=False)
        self._release(n)

    def _log_outboxes(self, n: int) -> None:
        """Unaligned n: what each exchange logged since its barrier overtook its queue, per
        peer, as channel parts `<exchange>.to<j>` (shipped again on a restore: `requeue`)."""
        for x in self.exchanges:
            owners, rows = x.take_outbox()
            for owner in np.unique(owners).tolist():
                name = f"{x.step_id}.to{owner}"
                segments = [(channel_state.DATA, rows[owners == owner])]
                self._channels.setdefault(n, {})[name] = channel_state.to_state(name, n, segments, x.exchange_dtype)
                self._unaligned.add(n)

    def _decline(self, outcome: Abort) -> None:
        super()._decline(outcome)
        if self.loops is None:
            for x in self.exchanges:  # what its overtaking barrier had them log (not a newer one's)
                if self._sent[x.step_id] <= outcome.checkpoint:
                    x.take_outbox()
        self._release(outcome.checkpoint)

    def _release(self, n: int) -> None:
        if self._holding is not None and n >= self._holding:
            self._holding = None
            self.progress.resume_deliveries()


async def agent_checkpointing(job, plan, *, link, exchanges, peer_inputs) -> AgentCheckpointing:
    """An agent's `AgentCheckpointing` for `job` (its `checkpoint` settings; a graph flow's:
    `GraphAgentCheckpointing`), with its restored checkpoint loaded (this executor's parts only, read in a thread: heartbeats go on)."""
    settings = job.checkpoint
    store = SnapshotStore(settings["location"], job=job.flow.name, keep=settings["keep"])
    restored = None
    if settings["restore"] is not None:  # rescaling: every executor's parts, to take its partitions
        restored = await store.aload(settings["restore"], executor=None if settings["rescale"] else job.index)
    checkpoints = GraphAgentCheckpointing(
        plan, settings["config"], store, restored, index=job.index, link=link, exchanges=exchanges,
        peer_inputs=peer_inputs,
    )
    if settings["rescale"]:
        checkpoints.rescaled = reassigned(restored, plan, job.index, job.executors, job.partitions)
        checkpoints.adopted = graph_in_flight(restored, plan, job.index, job.executors, job.partitions)
    return checkpoints
