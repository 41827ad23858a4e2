"""Checkpoints of a multi-executor run: an agent's side (the protocol and the coordinator's
side: `slashrt.snapshot.cluster`).

A flow's exchanges (`exchange(key=)`, the `WindowRoute` or `SsbRoute` of a keyed window) may be
chained (an exchange fed by what another exchange delivered), so alignment goes one exchange at
a time, in the order the data flows:

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

Unaligned (past `alignment_timeout`, `AgentCheckpointing.between`, between two batches): the
sources' rings and the peers' channels whose barrier n is in the ring are overtaken (their buffers in front of n are channel state) and count as delivered, so the
forwarding rule goes on at once; a late barrier goes ahead of the rows its exchange queued to
ship since the barrier before it (`ExchangeNode.overtake`), and those rows, with what ships until
the snapshot, are logged like the loops' outboxes: parts `<exchange>.to<j>.channel` without
loops (`_log_outboxes`), the `Outbox` part with them. A restore ships them again and counts the
peers' channels' records in flight with the recount, and computes those first (`replay_input`).

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

import contextlib
import time

import numpy as np
import structlog
import trio

from slashrt.errors import SlashError, SnapshotWriteError
from slashrt.snapshot import channel_state, collected
from slashrt.snapshot.alignment import Abort, AlignmentStats, BarrierAligner, Snapshot
from slashrt.snapshot.coordinator import AckStats
from slashrt.snapshot.loops import OUTBOX, Outbox
from slashrt.snapshot.rescale import graph_in_flight, reassigned
from slashrt.snapshot.runtime import Checkpointing
from slashrt.snapshot.storage import SnapshotStore

__all__ = ["AgentCheckpointing", "NO_STATE", "agent_checkpointing", "upstream_inputs"]

log = structlog.get_logger("slashrt.checkpoint")

NO_STATE = "executor"  # the instance that acks for an executor without stateful steps


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


class AgentCheckpointing(Checkpointing):
    """The checkpoints of one agent's executor in a cluster run (see the module doc): requests,
    commits and the end come over the control `link`; acks go back over it."""

    def __init__(self, plan, config, store, restored, *, index: int, link, exchanges, peer_inputs):
        """`exchanges`: the plan's exchanges; `peer_inputs`: the names of the channels arriving
        from peers (`<exchange>.from<peer>`)."""
        super().__init__(plan, config, store, restored, executor=index)
        self.link = link
        self.exchanges = list(exchanges)
        self.local = list(plan.sources)
        self.peer_inputs = list(peer_inputs)
        self.aligner = BarrierAligner(self.local + self.peer_inputs, clock=time.perf_counter)
        self.upstream = upstream_inputs(self.exchanges, self.local, self.peer_inputs)
        self._sent = {x.step_id: 0 for x in self.exchanges}  # the newest barrier each exchange forwarded
        self.progress = None
        self._holding: int | None = None  # forwarded, not yet snapshotted: the tracker holds deliveries
        self._due = False  # a request came: `_advance` at the executor's next turn
        if self.loops is not None:  # records in flight at the cut: the feedback queues and the outboxes
            self.outboxes = {box.step_id: box for box in map(Outbox, self.exchanges)}
            self.nodes.update(self.outboxes)
        self._requested: set[int] = set()
        self._drained = False
        self._released = trio.Event()  # "finish" (the final checkpoint is committed) or "stop"
        self._body = trio.CancelScope()  # the executor's run (`running`), which "stop" cancels
        self.outbox = collected.Outbox(plan)  # committed records of in-memory sinks, for the coordinator
        # unaligned checkpoints overtake the sources' rings, the peers' channels and the exchanges' queues
        self._overtakes = config.unaligned_after is not None
        self._late: set[int] = set()  # checkpoints past their alignment timeout (`_overtaking` until taken)
        self._sources_overtaken: set[int] = set()
        self._scanned = 0.0  # when it last looked for barriers in its peers' rings
        self._in_flight: dict[str, list] = {}  # a restored checkpoint's channel states of peers' channels

    async def restore(self, progress=None) -> None:
        """The nodes, then the outboxes shipped again and counted in flight (an unaligned
        checkpoint's `<exchange>.to<j>` channel parts, as they are restored: `requeue`), and
        the records in flight on the peers' channels counted (computed first: `replay_input`),
        before the feedback queues' log is replayed (`replay`): one batch of counts with the
        recount."""
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

    # -- the coordinator's messages ----------------------------------------------------------------
    def on_message(self, kind: str, n) -> None:
        if kind in ("checkpoint", "savepoint"):  # a savepoint stops: its sources feed nothing after its barrier
            if n in self._requested:  # a peer's barrier came first and it was taken then (`_obey`)
                if kind == "savepoint" and self._executor is not None:  # (its sources had ended): from now on
                    self._halting = True
                    self._executor.halt()
                return
            self._requested.add(n)
            if kind == "savepoint":  # an in-memory transactional sink commits it at once (`_take`), as on one executor
                self._kinds[n], self._halting = "savepoint", True
            self._request(n, stop=kind == "savepoint")
            if kind == "checkpoint" and self._overtakes:  # savepoints and the final checkpoint align
                self._spawn(self._overtake_after, n, self.config.unaligned_after)
            if self._drained and self._nursery is not None:  # nothing in flight any more: take it at once
                self._take_now(n)  # (unless the run is over: it failed)
        elif kind == "stop":  # savepoint n is committed: the run ends here (nothing came after its barrier)
            self.savepoint = n
            self._body.cancel()
            self._released.set()
        elif kind == "go_on" and n is None:  # the savepoint aborted: the sources feed on, the executor computes again
            self._go_on()
        elif kind == "go_on":  # stop-the-world checkpoint n is committed or aborted
            for source in self.sources.values():
                source.go_on(n)
        elif kind == "commit":
            for sink in self.sinks:
                if self._nursery is not None and getattr(sink, "acommit", None) is not None:
                    self._spawn(sink.acommit, n)  # a broker's round trips: off the loop, its failure the run's
                else:
                    sink.commit(n)
            self._spawn(self._send, None, None)  # (before the run: the next message takes them)
            log.debug("checkpoint committed", checkpoint=n, executor=self.executor)
        elif kind == "finish":
            self._released.set()
        if kind in ("checkpoint", "savepoint") and self.progress is not None:
            # inputs that ended before n was asked for deliver it at once; but forwarding here,
            # in the control link's task, could cut a window's firing in two: the executor does
            # it between two batches (`between`), woken for it
            self._due = True
            self.progress.wake()

    def _take_now(self, n: int) -> None:
        now = time.perf_counter()
        self._take(n, AlignmentStats(n, now, now))

    @contextlib.asynccontextmanager
    async def running(self):
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    with trio.CancelScope() as self._body:
                        yield
                    if self.savepoint is None:
                        await self._finish()
                except BaseException:
                    self._nursery = None  # failing: nothing starts more (`Checkpointing.running`)
                    raise
        finally:
            self._nursery = None  # the run ended (or failed): `_spawn` starts nothing more

    async def _finish(self) -> None:
        """Every input ended: take what was requested and not aligned (ended inputs deliver every
        barrier), say so, and take what comes (the final checkpoint) until told to finish."""
        self._drained = True
        for n in sorted(self._requested - self._taken):
            self._take_now(n)
        await self._send("drained")
        await self._released.wait()
        while self._writing:
            await self._changed.wait()

    # -- unaligned: barrier n overtakes the sources' rings, the peers' channels, the queues ---------
    SCAN_EVERY = 0.002  # seconds between two looks for barrier n in the peers' rings

    def _still_aligning(self, n: int) -> bool:
        return n in self._requested and n not in self._taken and not self._drained

    def barrier_due(self) -> bool:
        """A checkpoint is requested or aligning here and not yet taken (a source throttled by a
        exchange's bound polls on meanwhile: `slashrt.ops.route.RoomForSources`)."""
        return self.aligner.aligning is not None or any(self._still_aligning(n) for n in self._requested)

    async def _overtake_after(self, n: int, seconds: float) -> None:
        await trio.sleep(seconds)
        if self._still_aligning(n) and self.aligner.latest <= n and self._overtakes:
            self._late.add(n)
            self._overtake_forwarded(n)
        await super()._overtake_after(n, 0)

    def _overtake_forwarded(self, n: int) -> None:
        for x in self.exchanges:
            if self._sent[x.step_id] >= n:
                x.overtake(n)

    def between(self) -> None:
        """Between two batches: forward what a request made due (`_advance`); checkpoints past
        their alignment timeout overtake what the inputs hold in front of their barriers (the
        sources' rings: `_overtake_sources`, the peers' channels: `_overtake_peers`), until the
        snapshot is taken."""
        if self._due:
            self._due = False
            self._advance()
        if not self._overtaking:
            return
        later = []
        for n in self._overtaking:
            if not self._still_aligning(n) or self.aligner.latest > n:
                self._late.discard(n)
                continue  # taken or aborted
            later.append(n)
            if self.aligner.aligning not in (None, n) or any(
                    self.aligner.latest < m < n for m in self._requested - self._taken):
                continue  # another checkpoint aligning, or an older one goes first: n waits
            if n not in self._sources_overtaken:
                if all((s.feeder is not None and s.feeder.positioned) or n in s.positions
                       for s in self.sources.values()):  # (else a source has no position to take yet)
                    self._sources_overtaken.add(n)
                    self._overtake_sources(n)
            if self._overtakes and self.peer_inputs and time.perf_counter() - self._scanned >= self.SCAN_EVERY:
                self._scanned = time.perf_counter()
                self._overtake_peers(n)
        self._overtaking = later

    def _owing(self, n: int, names) -> list:
        """The executor's inputs among `names` that have not delivered barrier n (nor ended)."""
        channels = self.aligner.channels
        return [inp for inp in self._executor.inputs if inp.name in names and inp.name not in channels.ended
                and channels.last.get(inp.name, -1) < n]

    def _overtake_sources(self, n: int) -> None:
        """Unaligned checkpoint n on a cluster (FLIP-76 at the executor's sources): each source
        input that has not delivered barrier n counts as having delivered it now, and its
        unconsumed buffers up to barrier n (all of them if its feeder has not posted n: its
        position is then taken now) are n's channel state, `<source>.channel`. The executor is
        between two batches, so everything before the cut is computed and nothing after it: n is
        forwarded at once by the exchanges it makes due, behind what was computed, instead of
        behind the sources' backlog."""
        executor, states, overtaken = self._executor, {}, []
        for inp in self._owing(n, self.sources):
            segments, reached = channel_state.capture(executor.unconsumed(inp), inp.receiver, inp.dtype, n)
            if not reached:
                segments += self.sources[inp.name].overtaken(n)
            if segments:
                states[inp.name] = channel_state.to_state(inp.name, n, segments, inp.dtype)
            overtaken.append(inp.name)
        self._overtaken(n, overtaken, states)

    def _overtake_peers(self, n: int) -> None:
        """Unaligned checkpoint n at the peers' channels: a channel whose barrier n is in its ring
        already (a peer forwards it as soon as every input upstream of its exchange delivered n,
        and it waits for one credit only) counts as having delivered it now, and its buffers in
        front of the barrier are its channel state, `<exchange>.from<peer>.channel`, computed
        first on a resume (`replay_input`). The cut is the barrier's place, as when aligned: only
        what is computed before the snapshot differs. The executor is between two batches."""
        executor, states, overtaken = self._executor, {}, []
        for inp in self._owing(n, self.peer_inputs):
            items = executor.unconsumed(inp)
            if not channel_state.reaches(items, n):
                continue  # its barrier is still on its way (behind the peer's queue): a later turn
            segments, _ = channel_state.capture(items, inp.receiver, inp.dtype, n)
            if segments:
                states[inp.name] = channel_state.to_state(inp.name, n, segments, inp.dtype)
            overtaken.append(inp.name)
        self._overtaken(n, overtaken, states)

    def _overtaken(self, n: int, overtaken: list, states: dict) -> None:
        """Inputs `overtaken` count as having delivered barrier n, with `states` in flight: the
        forwards that makes due go out now, and if every input delivered n the snapshot is taken."""
        if not overtaken:
            return
        self._channels.setdefault(n, {}).update(states)
        self._unaligned.add(n)
        log.debug("checkpoint overtakes", checkpoint=n, executor=self.executor, inputs=overtaken,
                  in_flight=sum(len(c.arrays["records"]) for c in states.values()))
        outcomes = self.aligner.overtake_inputs(overtaken, n)
        self._forward_overtaken(outcomes)
        for outcome in outcomes:
            if isinstance(outcome, Abort):
                self._decline(outcome)
            elif isinstance(outcome, Snapshot):  # every other input delivered n
                self._take(outcome.checkpoint, outcome.stats, running=True)
        self._block(self._executor)

    # -- alignment: exchange by exchange, in the order the data flows, then the snapshot ------------
    async def _obey(self, executor, outcomes) -> None:
        self._forward_overtaken(outcomes)
        await super()._obey(executor, outcomes)  # a snapshot is taken now; `_block` releases the inputs

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

    def _restore_channel(self, number: int, channel: str, segments: list) -> None:
        """A peer's channel's records in flight: computed first (`replay_input`); an exchange's
        outgoing channel's: shipped again first."""
        if channel in self.peer_inputs:
            self._in_flight[channel] = segments
        elif not any(getattr(x, "requeue", None) is not None and x.requeue(channel, segments) for x in self.exchanges):
            super()._restore_channel(number, channel, segments)

    async def replay_input(self, inp) -> None:
        segments = self._in_flight.pop(inp.name, None)
        if segments:
            await channel_state.replay_into(inp.pipeline, segments)

    def _resume(self, n: int, world) -> None:
        """Stop-the-world: this executor's part of n is written and acked; its sources feed on
        when the coordinator says "go_on" n, once every executor's part is in and n committed."""

    def _decline(self, outcome: Abort) -> None:
        self._spawn(self._send, "decline", (outcome.checkpoint, outcome.reason))
        if self.loops is None:
            for x in self.exchanges:  # what its overtaking barrier had them log (not a newer one's)
                if self._sent[x.step_id] <= outcome.checkpoint:
                    x.take_outbox()
        self._release(outcome.checkpoint)

    async def _send(self, kind: str | None, payload=None) -> None:
        """Send a message (None: none) to the coordinator, after the records committed before
        it: an ack of checkpoint r never overtakes a commit made before snapshot r (the
        link is FIFO; `slashrt.snapshot.collected`)."""
        committed = self.outbox.take()
        if committed:
            await self.link.send(collected.COMMITTED, committed)
        if kind is not None:
            await self.link.send(kind, payload)

    async def _pre_commit_failed(self, n: int, exc) -> None:
        """A sink could not pre-commit n (its broker): declined, counted as a failed checkpoint,
        as a part that cannot be written; the job's failure, if it comes to that, names the
        broker and is retried by a restart strategy (`ClusterCheckpoints._failed`)."""
        await self._send("decline", (n, f"executor {self.executor}: {exc}", str(exc), type(exc).__name__))

    def _write_all_timed(self, n: int, states: dict) -> tuple[list, list]:
        parts, seconds = [], []
        for step_id, state in states.items():
            t0 = time.perf_counter()
            parts.append(self.store.write_part(n, step_id, self.executor, state.arrays, state.meta))
            seconds.append(time.perf_counter() - t0)
        return parts, seconds

    async def _write_parts(self, n: int, states: dict, sync: dict, positions: dict, alignment_s: float) -> None:
        stats, extra = {}, 0
        try:
            # every part in one worker-thread call: a busy loop (a slow step) resumes this task
            # only between two pipeline calls, so each hop back to it would add to the duration
            parts, seconds = await trio.to_thread.run_sync(self._write_all_timed, n, states) if states else ([], [])
            for (step_id, part), took in zip(zip(states, parts), seconds):
                if step_id.endswith(channel_state.SUFFIX):  # channel state: no instance of its own, its bytes count with the next ack
                    extra += part.size
                    continue
                stats[step_id] = AckStats(alignment_s, sync[step_id], took, part.size + extra)
                extra = 0
        except SnapshotWriteError as exc:  # a full disk: a failure, counted against the tolerated ones
            await self._send("decline", (n, f"executor {self.executor}: {exc}", str(exc)))
            return
        except (OSError, SlashError) as exc:  # e.g. an older checkpoint removed by retention meanwhile
            await self._send("decline", (n, f"executor {self.executor} could not write its state: {exc}"))
            return
        if not stats:
            stats[NO_STATE] = AckStats(alignment_s, 0.0, 0.0, extra)
        await self._send("ack", (n, stats, parts, positions))

    def _release(self, n: int) -> None:
        if self._holding is not None and n >= self._holding:
            self._holding = None
            self.progress.resume_deliveries()


async def agent_checkpointing(job, plan, *, link, exchanges, peer_inputs) -> AgentCheckpointing:
    """An agent's `AgentCheckpointing` for `job` (its `checkpoint` settings), with its restored
    checkpoint loaded (this executor's parts only, read in a thread: heartbeats go on)."""
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
        checkpoints.adopted = graph_in_flight(restored, plan, job.index, job.executors, job.partitions)
    return checkpoints
