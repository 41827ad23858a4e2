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
                           <───────────────────    "committed" (in-memory sinks' records:
                                                   `slashrt.snapshot.collected`)
                           <───────────────────    "drained" (every input ended)
      every agent drained: final checkpoint F
      "checkpoint" F, then "commit" F, "finish" ─> taken at once (nothing is in flight)

An agent that cannot write its part (a full disk), or whose sink could not pre-commit n (a
broker's, from the sink's worker thread, finished before the ack), declines n with the store's
or the sink's sentence; the coordinator counts it as a failed checkpoint, as a manifest it
cannot write (`CheckpointCoordinator.failing`: past `tolerable_failures` in a row the job fails;
a broker's failure is retried by a restart strategy).

Stop with a savepoint (`stop`, a StopHandle, asked before every agent drained): "savepoint" n
(the sources feed nothing after barrier n; from its snapshot the executor computes nothing:
`Executor.halt`), acks, manifest, "commit" n, then "stop" n: each agent cancels its executor's run (no end of stream: open windows stay in n), stops driving its
channels and says "finished"; once all did, "release" lets them close the channels (docs/
architecture.md, "Stop with a savepoint on a cluster"). If n aborts, "go_on": the sources feed on,
the executor computes again.

Stop-the-world (mode "sync", every flow): every checkpoint halts the sources as a savepoint does
(`SourceBarriers.stop`: nothing fed after barrier n); each executor, once aligned (everything fed
before the halt, through every exchange, processed; a graph flow's exchange by exchange, loops
included), snapshots and writes while its loop waits, then acks; once all acked (drained
everywhere), manifest, "commit" n, and only then "go_on" n.

Alignment goes stage by stage because every executor is upstream and downstream of every other:
lane k of an executor computes what peers send to its stage-k exchanges (`slashrt._plan`), and
the sending half of a stage-k exchange (fragments, routing) is fed by lanes 0..k-1 only, so once
they all delivered barrier n (their data behind it waits in their rings) barrier n goes out on
stage k's channels; the snapshot is taken when every lane delivered n, and the inputs are
released once every forward is out.
An executor does not wait for its own barrier to come back, so alignment cannot deadlock, and
what a peer sent before its barrier is in the receiver's snapshot, nothing sent after it is.
Graph flows (distributed pointstamp progress, loops) align exchange by exchange instead:
`slashrt.snapshot.cluster_graph`.

Unaligned (tree flows, `alignment_timeout`): a periodic checkpoint still aligning that long after
its request overtakes, until it is taken, the sources' rings at lane 0's turns
(`_overtake_sources`: their unconsumed buffers up to barrier n), the peers' stage-k channels at
lane k's turns once barrier n is in their rings (`_overtake_peers`: the buffers in front of it),
and the deltas the SSB shippers queued for their channels (`_overtake_queued`: barrier n goes
ahead of them). Those are its channel state; the inputs count as having delivered n, and the
forwards that makes due go out at once. Graph flows overtake on lane 0, with their exchanges'
ship queues: `slashrt.snapshot.cluster_graph`.
"""

from __future__ import annotations

import contextlib
import time

import structlog
import trio

from slashrt.errors import ClusterError, SlashError, SnapshotError, SnapshotWriteError, retryable_report
from slashrt.snapshot import channel_state
from slashrt.snapshot.alignment import Abort, AlignmentStats, BarrierAligner, Snapshot
from slashrt.snapshot.collected import COMMITTED, Outbox
from slashrt.snapshot.coordinator import AckStats, CheckpointCoordinator
from slashrt.snapshot.rescale import rescale, reshaped, resumed_inputs
from slashrt.snapshot.runtime import Checkpointing

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
        self.peer_inputs = peer_inputs
        self._peer_lanes = set(peer_inputs.values())
        self._forwarded = dict.fromkeys(self.feeding, 0)  # stage -> the newest barrier it claimed to send
        # forwards go out one batch at a time, in the order they were claimed (`_due`), whichever
        # task sends them (the compute task's `_obey`, or `_forward` spawned by an overtake)
        self._claimed, self._sent, self._turn = 0, 0, trio.lowlevel.ParkingLot()
        self._unsent = 0  # forwards claimed, not yet sent
        self._requested: set[int] = set()
        self._drained = False
        self._released = trio.Event()  # "finish" (the final checkpoint is committed) or "stop"
        self._body = trio.CancelScope()  # the executor's run (`running`), which "stop" cancels
        self.outbox = Outbox(plan)  # committed records of in-memory sinks, for the coordinator
        # unaligned checkpoints overtake the sources' rings (lane 0), the peers' channels (their
        # lanes) and the exchanges' queues (`_claim`)
        self._overtakes = config.unaligned_after is not None
        self._late: set[int] = set()  # checkpoints past their alignment timeout (`_overtaking` until taken)
        self._sources_overtaken: set[int] = set()
        self._scanned: dict[int, float] = {}  # lane -> when it last looked for barriers in its peers' rings
        self._in_flight: dict[str, list] = {}  # a restored checkpoint's channel states of peers' channels

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
    SCAN_EVERY = 0.002  # seconds between two looks of a lane for barrier n in its peers' rings

    def _still_aligning(self, n: int) -> bool:
        return n in self._requested and n not in self._taken and not self._drained

    def barrier_due(self) -> bool:
        """A checkpoint is requested or aligning here and not yet taken (a source throttled by a
        graph exchange's bound polls on meanwhile: `slashrt.ops.route.room_for_sources`)."""
        return self.aligner.aligning is not None or any(self._still_aligning(n) for n in self._requested)

    async def _overtake_after(self, n: int, seconds: float) -> None:
        await trio.sleep(seconds)
        if self._still_aligning(n) and self.aligner.latest <= n and self._overtakes:
            self._late.add(n)
            self._overtake_forwarded(n)
        await super()._overtake_after(n, 0)

    def _overtake_forwarded(self, n: int) -> None:
        """Barrier n, forwarded in time and still queued in front of a channel: moved ahead."""
        for k, forwarded in self._forwarded.items():
            if forwarded >= n:
                for exchange in self.stages[k]:
                    self._overtake_queued(exchange, n)

    def between(self, lane: int = 0) -> None:
        """A lane between two batches: checkpoints past their alignment timeout overtake what its
        inputs hold in front of their barriers: lane 0 its sources' rings (`_overtake_sources`),
        lane k its peers' stage-k channels (`_overtake_peers`; a graph flow's are all on lane 0),
        until the snapshot is taken."""
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
            if lane == 0 and n not in self._sources_overtaken:
                if all((s.feeder is not None and s.feeder.positioned) or n in s.positions
                       for s in self.sources.values()):  # (else a source has no position to take yet)
                    self._sources_overtaken.add(n)
                    self._overtake_sources(n)
            if self._overtakes and lane in self._peer_lanes and \
                    time.perf_counter() - self._scanned.get(lane, 0.0) >= self.SCAN_EVERY:
                self._scanned[lane] = time.perf_counter()
                self._overtake_peers(n, lane)
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
        position is then taken now) are n's channel state, `<source>.channel`. Lane 0 is between
        two batches, so everything before the cut is computed and nothing after it: n is
        forwarded on stage 1's channels at once, behind what lane 0 computed, instead of behind
        the sources' backlog."""
        executor, states, overtaken = self._executor, {}, []
        for inp in self._owing(n, self.sources):
            segments, reached = channel_state.capture(executor.unconsumed(inp), inp.receiver, inp.dtype, n)
            if not reached:
                segments += self.sources[inp.name].overtaken(n)
            if segments:
                states[inp.name] = channel_state.to_state(inp.name, n, segments, inp.dtype)
            overtaken.append(inp.name)
        self._overtaken(n, overtaken, states)

    def _overtake_peers(self, n: int, lane: int) -> None:
        """Unaligned checkpoint n at lane k's peers' channels: a channel whose barrier n is in its
        ring already (a peer forwards it as soon as its own lanes before stage k delivered n, and
        it waits for one credit only) counts as having delivered it now, and its buffers in front
        of the barrier are its channel state, `<exchange>.from<peer>.channel`, computed first on
        a resume (`replay_input`). The cut is the barrier's place, as when aligned: only what is
        computed before the snapshot differs. Lane k is between two batches."""
        executor, states, overtaken = self._executor, {}, []
        names = [name for name, stage in self.peer_inputs.items() if stage == lane]
        for inp in self._owing(n, names):
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
        forwards that makes due are claimed now (sent by `_forward`), and if every input
        delivered n the snapshot is taken."""
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
            elif isinstance(outcome, Snapshot):  # every other input delivered n: every lane is idle
                self._take(outcome.checkpoint, outcome.stats, running=True)
        self._block(self._executor)

    def _forward_overtaken(self, outcomes) -> None:
        """The forwards overtaken inputs make due, claimed now (until they are sent every input
        stays held: `_block`) and sent by `_forward`."""
        due = self._due(outcomes)
        if due:
            self._spawn(self._forward, self._executor, due)

    async def _forward(self, executor, due) -> None:
        await self._send_forwards(due)
        self._block(executor)

    # -- alignment: stage by stage, the sending halves, then the snapshot ---------------------------
    async def _obey(self, executor, outcomes) -> None:
        await self._send_forwards(self._due(outcomes))
        await super()._obey(executor, outcomes)  # a snapshot is taken now; `_block` releases the inputs

    def _due(self, outcomes) -> tuple[int, list[tuple[int, int]]] | None:
        """The forwards `outcomes` and the alignment in progress make due, claimed (in order):
        their batch's turn to be sent and the (stage, checkpoint) pairs; None if none."""
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
        if not due:
            return None
        self._claimed += 1
        return self._claimed - 1, due

    async def _send_forwards(self, claimed) -> None:
        """Send a batch `_due` claimed, after every batch claimed before it (barrier n must
        never follow n+1 on a channel: ids increase)."""
        if claimed is None:
            return
        turn, due = claimed
        while self._sent != turn:
            await self._turn.park()
        try:
            for stage, checkpoint in due:
                for exchange in self.stages[stage]:
                    await exchange.forward_barrier(checkpoint)
                self._unsent -= 1
        finally:  # (cancelled: the run is ending, the batches after it may go)
            self._sent += 1
            self._turn.unpark_all()

    def _claim(self, n: int, stages) -> list[tuple[int, int]]:
        """The stages among `stages` that have not forwarded barrier n yet, now claimed for it.
        Past n's alignment timeout, barrier n overtakes what their exchanges queued for their
        channels (an SSB exchange's shippers), which is n's channel state on this side."""
        due = [(k, n) for k in stages if self._forwarded[k] < n]
        for k, _ in due:
            self._forwarded[k] = n
            if n in self._late:
                for exchange in self.stages[k]:
                    self._overtake_queued(exchange, n)
        self._unsent += len(due)
        return due

    def _overtake_queued(self, exchange, n: int) -> None:
        overtake = getattr(exchange, "overtake_queued", None)
        if overtake is None:  # it sends as it computes: nothing queued in front of the ring
            return
        for name, segments in overtake(n).items():
            self._channels.setdefault(n, {})[name] = channel_state.to_state(name, n, segments, exchange.exchange_dtype)
            self._unaligned.add(n)

    def _block(self, executor) -> None:
        """After a snapshot every input is past its barrier: while a forward is still on its way
        (a peer's credits), hold them all, else a released lane would send what follows barrier
        n ahead of it on that channel; the task sending the last one releases them."""
        if not (self._unsent and self.aligner.aligning is None):
            return super()._block(executor)
        for inp in executor.inputs:
            if inp.blocked is None and not getattr(inp, "ended", False):
                executor.block(inp)

    def _restore_channel(self, number: int, channel: str, segments: list) -> None:
        """A peer's channel's records in flight: computed first by its lane (`replay_input`); an
        exchange's outgoing channel's: queued again first."""
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

    async def _send(self, kind: str | None, payload=None) -> None:
        """Send a message (None: none) to the coordinator, after the records committed before
        it: an ack of checkpoint r never overtakes a commit made before snapshot r (the
        link is FIFO; `slashrt.snapshot.collected`)."""
        committed = self.outbox.take()
        if committed:
            await self.link.send(COMMITTED, committed)
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


class ClusterCheckpoints:
    """The cluster coordinator's side: a `CheckpointCoordinator` over every (stateful step,
    executor), periodic triggers, the manifest once every instance acked, and the commits."""

    def __init__(self, store, config, steps, executors: int, stop=None):
        self.store = store
        self.executors = executors
        self.steps = sorted(steps) or [NO_STATE]
        self.config = config
        self.stop = stop  # a StopHandle, or None
        self.first: int | None = None  # the first checkpoint number (`slashrt.snapshot.published.check_run`)
        self.savepoint: int | None = None  # the run stopped with this savepoint
        self.stopped = False  # the agents were told to stop (each then waits for "release" to close its channels)
        self._kinds: dict[int, str] = {}  # savepoint and final checkpoints (in their manifest's meta)
        self.coordinator: CheckpointCoordinator | None = None  # made when the run starts (`triggers`)
        self.agents = None
        self._acks: dict[int, dict] = {}  # checkpoint -> {"parts": [...], "positions": {executor: ...}}
        self._completing = 0  # manifests being written and commits being sent
        self._drained: set[int] = set()  # executors whose inputs all ended
        self._changed = trio.Event()
        self.reshared: list = []  # the rescalings the sources' shares come from (`rescale.resumed_inputs`)

    def handlers(self) -> dict:
        return {"ack": self._on_ack, "decline": self._on_decline, "drained": self._on_drained}

    async def drive(self, agents) -> None:
        """While the run goes on: periodic checkpoints until every executor drained, then the
        final one; or, when `stop` asks first, a savepoint that stops every executor."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.triggers, agents)
            if self.stop is not None:
                nursery.start_soon(self._stop_when_asked, agents)
            await agents.settle(lambda: len(self._drained) == self.executors or self.stopped)
            nursery.cancel_scope.cancel()
        if not self.stopped:
            await self.final(agents)

    async def _stop_when_asked(self, agents) -> None:
        """Stop with a savepoint when `stop` asks: savepoint n at every agent's sources, which feed
        nothing after its barrier; once n is complete and its commit sent, "stop" every agent
        (each ends its executor's run there). If n aborts, the sources feed on ("go_on")."""
        await self.stop.wait()
        while self.config.mode == "sync" and (self.coordinator.pending or self._completing):
            await self._changed.wait()  # stop-the-world: one checkpoint halts the sources at a time
        with trio.CancelScope(shield=True):  # asked of every agent or none, as a trigger
            n = self.coordinator.stop_with_savepoint().checkpoint
            self._kinds[n] = "savepoint"
            log.info("stopping with a savepoint", checkpoint=n)
            await agents.send_all("savepoint", [n] * self.executors)
        while self.coordinator.state == "stopping" or self._completing:  # (its commit is sent once not completing)
            with trio.move_on_at(self._expiry()):
                await self._changed.wait()
            await self._expire()
        with trio.CancelScope(shield=True):
            if self.coordinator.state == "stopped":
                self.savepoint, self.stopped = n, True  # before "stop": the agents answer it with "finished"
                await agents.send_all("stop", [n] * self.executors)
                self._signal()
                return
            log.warning("stop with a savepoint failed", reason=self.coordinator.stop_failure)
            await agents.send_all("go_on", [None] * self.executors)

    async def _on_drained(self, executor: int, payload) -> None:
        self._drained.add(executor)
        self._signal()

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
            self.steps, range(self.executors), self.config, clock=trio.current_time,
            first=max(self.store.next_checkpoint(), self.first or 1),
        )
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while (due := coordinator.next_due()) is not None or coordinator.state == "stopping":
                if due is None:  # a stop's savepoint is pending: none starts; if it aborts, the job goes on
                    await self._changed.wait()
                    continue
                await trio.sleep_until(min(due, self._expiry()))
                await self._expire()
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

    async def _expire(self) -> None:
        for record in self.coordinator.expire():
            log.warning("checkpoint aborted", checkpoint=record.checkpoint, reason=record.reason)
            await self._go_on(record.checkpoint)
            self._signal()

    async def _go_on(self, n: int) -> None:
        """Stop-the-world (mode "sync"): checkpoint n is committed or aborted, so every agent's
        sources, halted after barrier n, feed on (after "commit" n on the same FIFO links)."""
        if self.config.mode == "sync" and self._kinds.get(n) is None:  # a savepoint's and the final one's stay
            with trio.CancelScope(shield=True):  # every agent or none
                await self.agents.send_all("go_on", [n] * self.executors)

    def _expiry(self) -> float:
        started = [c.triggered for c in self.coordinator.pending.values()]
        return min(started) + self.coordinator.config.timeout if started else float("inf")

    async def final(self, agents) -> None:
        """Every executor drained: the checkpoints in flight end (each agent takes what it was
        asked for), then the final one is taken, committed, and the agents finish. A stop's
        savepoint that completed with the end is the final one."""
        self.agents = agents
        await agents.settle(lambda: not self.coordinator.pending and not self._completing)
        if self.coordinator.state == "stopped":
            self.savepoint = self.coordinator.savepoint.checkpoint
        else:
            final = self.coordinator.trigger_savepoint().checkpoint
            self._kinds[final] = "final"
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
        meta = {"executors": self.executors, "cluster": True, "sources": got["positions"],
                "kind": self._kinds.get(n, "checkpoint")}
        if self.reshared:  # what the sources' positions are positions in
            meta["reshared"] = self.reshared
        if any(part.step.endswith(channel_state.SUFFIX) for part in got["parts"]):  # an executor overtook its rings
            meta["unaligned"] = completed.unaligned = True
        self._completing += 1  # complete in the coordinator's eyes, not yet in the store's nor committed
        try:
            try:
                await self.store.acomplete(n, meta, got["parts"])
            except SnapshotWriteError as exc:  # its manifest: declined after all, nothing commits it
                self.coordinator.unwritten(n, str(exc))
                await self._failed(n, str(exc))
                await self._go_on(n)  # stop-the-world: the sources feed on, as after any abort
                return
            log.info("checkpoint completed", checkpoint=n, bytes=completed.bytes)
            await self.agents.send_all("commit", [n] * self.executors)
            await self._go_on(n)
        finally:
            self._completing -= 1
            self._signal()

    async def _on_decline(self, executor: int, payload) -> None:
        # failure: the store's sentence (a full disk), or a sink's and its error's type (its pre-commit failed)
        n, reason, *failure = payload
        record = self.coordinator.decline(n, (self.steps[0], executor), reason, failed=bool(failure))
        if record is not None:
            self._acks.pop(n, None)
            if failure:
                await self._failed(n, *failure)
            else:
                log.warning("checkpoint aborted", checkpoint=n, reason=record.reason)
            await self._go_on(n)
            self._signal()

    async def _failed(self, n: int, cause: str, sink_error: str | None = None) -> None:
        """Checkpoint n could not be written (`cause` names it and its path), or a sink could
        not pre-commit it (`sink_error`: the type of its error, `cause` naming the broker): its
        directory goes (what an agent still writes into it, retention removes later); the job
        fails, in one sentence, if n was the run's last checkpoint or one failure too many in a
        row (a broker away or hung: retryable, as the sink's own failure would be)."""
        with contextlib.suppress(OSError):
            await trio.to_thread.run_sync(self.store.discard, n)
        sentence = self.coordinator.failing(cause, self._kinds.get(n), broker=sink_error is not None)
        if sentence is not None and sink_error is not None:
            report = f"{sink_error}: {sentence}"
            raise ClusterError(report, retryable=retryable_report(report))
        if sentence is not None:
            raise SnapshotError(sentence)
        log.warning("checkpoint declined", checkpoint=n, reason=cause, failures_in_a_row=self.coordinator.failures,
                    tolerated=self.config.tolerable_failures)

    def report(self) -> list[dict]:
        return self.coordinator.report()


def cluster_checkpoints(flow, plan, role_plan, inputs: dict, executors: int, options: dict):
    """The coordinator's `ClusterCheckpoints` for a run on `executors` (None without a
    `checkpoint_dir`), with `job` (what every agent needs: the config, the store's location, the
    checkpoint to restore). Pops the checkpoint options from `options`; refuses, in one sentence
    and before any agent starts, what clusters cannot checkpoint."""
    from slashrt._runtime import refuse_uncheckpointable
    from slashrt.snapshot.loops import loop_feedbacks, outbox_steps
    from slashrt.snapshot.operators import stateful_nodes
    from slashrt.snapshot.published import check_run
    from slashrt.snapshot.runtime import aligned_for_moved_positions, checkpoint_config, load_restored
    from slashrt.snapshot.stop import check_checkpoint_options
    from slashrt.snapshot.storage import SnapshotStore

    checkpoint, location, resume_from = (options.pop(k, None) for k in ("checkpoint", "checkpoint_dir", "resume_from"))
    stop = options.pop("stop", None)
    check_checkpoint_options(location, checkpoint, resume_from, stop)
    if location is None:
        check_run(plan, None, None, None)  # a transactional sink needs checkpoints
        return None
    config, keep = checkpoint_config(checkpoint)
    config = aligned_for_moved_positions(config, plan, inputs)
    refuse_uncheckpointable(flow, plan, inputs)
    steps = list(stateful_nodes(role_plan))
    if loop_feedbacks(role_plan):  # the feedback queues' logs and the exchanges' outboxes (`cluster_graph`)
        steps += list(loop_feedbacks(role_plan)) + outbox_steps(role_plan)
    store = SnapshotStore(location, job=flow.name, keep=keep)
    cluster = ClusterCheckpoints(store, config, steps, executors, stop=stop)
    restored = load_restored(store, resume_from, executor=None)  # every part verified: a corrupt one falls back
    cluster.first = check_run(plan, store, resume_from, restored)  # nothing published is published again
    cluster.job = {"config": config, "location": location, "keep": keep,
                   "restore": None if restored is None else restored.number, "rescale": False}
    cluster.shares, cluster.reshared = {}, []  # (a run resumed from a rescaled run's checkpoint makes its shares again)
    if restored is not None and reshaped(restored, role_plan, executors):
        cluster.shares, cluster.reshared = rescale(flow, plan, role_plan, inputs, restored, executors)
        cluster.job["rescale"] = True
    elif restored is not None:
        cluster.shares, cluster.reshared = resumed_inputs(plan, inputs, restored.meta.get("reshared", []), executors)
    return cluster
