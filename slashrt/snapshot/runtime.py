"""Checkpoints of a run on one executor: the pieces of `slashrt.snapshot` driven by trio.

    coordinator (every `interval`) ──request n──> SourceBarriers of each source
    feeder: records its position, sends barrier n in band (after every record before it)
    executor: BarrierAligner over its input channels; an input that delivered n is blocked
    (its data waits in its ring) until every input delivered n; then, between two batches:
        pre-commit the 2PC sinks for n (a broker's: queued in its worker thread, after the
        writes before the barrier), copy every stateful node's state (sync), and in the
        background wait for those pre-commits, write each state as a part (async, a worker
        thread), ack n
    all acked: the manifest is written (source positions in its meta), sinks commit n
    a part or the manifest cannot be written (a full disk), or a sink's pre-commit failed (its
        broker away or hung past its timeout): n is declined, its directory removed, the next
        one tried; past `tolerable_failures` in a row the job fails, in one sentence
        (`CheckpointCoordinator.failing`; a broker's failure stays a BrokerUnavailable, which a
        restart strategy retries)

When every input has ended, the run takes a final checkpoint, so a transactional sink publishes
everything and a resume from it finds nothing left to do. Stop with a savepoint (`stop`, a
`StopHandle`): the coordinator's `stop_with_savepoint` n goes to every source, which halts after
sending barrier n; from n's snapshot the executor computes nothing more (`Executor.halt`: its loops'
log is what their back edges hold then); once n is written and its sinks committed, the run ends
(the executor's run is cancelled: nothing came after the barrier) and `savepoint` is n; resuming
from n continues there. `restore` (resume_from) restores every
stateful node, and settles each 2PC sink (`commit.recover_async`: a broker's sink from its
worker thread); `positions` rewinds the sources.

A dataflow with loops (`slashrt.snapshot.loops`): the executor aligns as a `LoopHead` over its
sources, and checkpoint n also holds the batches its loops' back edges delivered between the
snapshot and barrier n's return; `replay` delivers them again after `restore`, before new input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np
import structlog
import trio

from slashrt._buffer import Control
from slashrt._plan import per_source
from slashrt.errors import ConnectorError, OptionError, SnapshotError, SnapshotWriteError
from slashrt.snapshot import channel_state
from slashrt.snapshot.alignment import Abort, AlignmentStats, BarrierAligner, LoopHead, Snapshot
from slashrt.snapshot.commit import TwoPhaseCommit, begin, commit_async, recover_async
from slashrt.snapshot.coordinator import AUTO, AckStats, CheckpointConfig, CheckpointCoordinator, StopTheWorld
from slashrt.snapshot.loops import LOG_KIND, BackEdgeLog, loop_feedbacks
from slashrt.snapshot.operators import check, restore_plan, stateful_nodes
from slashrt.snapshot.state_format import State
from slashrt.snapshot.storage import Checkpoint, SnapshotStore

__all__ = ["Checkpointing", "SourceBarriers", "checkpoint_config", "source_positions", "source_position"]

log = structlog.get_logger("slashrt.checkpoint")

EXECUTOR = 0  # one executor: every part is executor 0's
KEEP = 3  # complete checkpoints kept by default


def aligned_for_moved_positions(config, plan, inputs: dict):
    """`config`, always aligned if its alignment timeout is the default ("auto") and a source
    reads files or broker streams: their checkpoints resume on another executor count by moving
    the readers' positions (`rescale`), which records in flight would not follow, and a default
    must not make a checkpoint unusable there. An explicit timeout still overtakes them (such a
    checkpoint resumes on as many executors as took it, `rescale` says so)."""
    if config.alignment_timeout != AUTO or config.unaligned_after is None:
        return config
    movable = [step_id for step_id, _, value in per_source(plan, inputs, "input")
               if callable(getattr(value, "rescaled_starts", None)) or callable(getattr(value, "rescaled", None))]
    if not movable:
        return config
    log.debug("checkpoints align: sources read files or streams", sources=movable)
    return dataclasses.replace(config, alignment_timeout=None)


def checkpoint_config(checkpoint) -> tuple[CheckpointConfig, int]:
    """`run(checkpoint=...)` as (config, complete checkpoints to keep): a CheckpointConfig, a
    dict of its options (and `keep`, default 3), an interval (seconds or a string like '500ms'),
    or None (only the final checkpoint)."""
    if checkpoint is None:
        return CheckpointConfig(), KEEP
    if isinstance(checkpoint, CheckpointConfig):
        return checkpoint, KEEP
    if isinstance(checkpoint, dict):
        options = dict(checkpoint)
        keep = options.pop("keep", KEEP)
        try:
            return CheckpointConfig.from_options(**options), keep
        except TypeError:
            raise OptionError(
                f"run(): checkpoint={checkpoint!r} has an unknown key; the keys are interval, min_pause, "
                "max_in_flight, timeout, mode, alignment_timeout, tolerable_failures and keep"
            ) from None
    return CheckpointConfig.from_options(interval=checkpoint), KEEP


class SourceBarriers:
    """Barriers requested of one source on one executor: the coordinator `request`s checkpoint
    n; the source's feeder `emit`s it between two runs of buffers, recording its position
    (`ChannelFeeder.snapshot`, see `slashrt.ops.sources`) for n first. A source that ended
    records its end for every later checkpoint. A checkpoint keeps the positions by source and
    executor (`source_positions`)."""

    def __init__(self, step_id: str, executor: int = EXECUTOR):
        self.step_id = step_id
        self.executor = executor
        # barriers after which the source feeds nothing until `go_on` (a savepoint, whose stop
        # cancels the run; a stop-the-world checkpoint, resumed once it is committed)
        self._held: dict[int, trio.Event] = {}
        self.requested = 0
        self.sent = 0
        self._numbers: set[int] = set()  # requested, not sent: several in flight go out in order
        self.final: dict | None = None  # the position at the end of the stream
        self.positions: dict[int, dict] = {}  # checkpoint -> position (a feeder state's meta)
        self.feeder = None  # the ChannelFeeder carrying these barriers, once it started
        self.in_flight: list = []  # a restored unaligned checkpoint's channel state, posted first

    async def replay(self, sender) -> None:
        """Post the restored channel state (`slashrt.snapshot.channel_state`) before anything new."""
        segments, self.in_flight = self.in_flight, []
        if segments:
            await channel_state.replay(sender, segments)

    def overtaken(self, n: int) -> list:
        """Unaligned checkpoint n is taken now and barrier n was not posted: the position is
        where the feeder stands now (a source that ended: its end) and n is not sent any more.
        Returns the control message the position counts but the ring does not hold yet (in
        flight too)."""
        unposted = []
        if n not in self.positions:
            self.positions[n] = self.feeder.snapshot(self.step_id).meta
            if self.feeder.unposted is not None:
                unposted = [(channel_state.WATERMARK, self.feeder.unposted[1])]
        self._numbers = {m for m in self._numbers if m > n}
        self.sent = max(self.sent, n)
        return unposted

    @property
    def due(self) -> bool:
        return self.requested > self.sent and self.final is None

    def request(self, n: int) -> None:
        self.requested = n
        self._numbers.add(n)
        if self.final is not None:
            self._numbers.clear()
            self.positions[n] = self.final
            self.sent = n

    async def emit(self, feeder) -> None:
        while self.due:
            n = min(self._numbers)
            self._numbers.discard(n)
            self.positions[n] = feeder.snapshot(self.step_id).meta
            self.sent = n
            await feeder.sender.send_control(Control.BARRIER, n)
            if n in self._held:  # (a savepoint's wait is cancelled once it is committed)
                await self._held[n].wait()
                del self._held[n]

    def stop(self, n: int) -> None:
        """Halt at barrier n: send it, then nothing more until `go_on` (a savepoint; a
        stop-the-world checkpoint)."""
        self._held[n] = trio.Event()
        self.request(n)

    def go_on(self, n: int | None = None) -> None:
        """Feed on after barrier n (None: any): the stop-the-world checkpoint n is committed, or
        the savepoint failed. A later barrier's halt stays."""
        for m, going in list(self._held.items()):
            if n is None or m == n:
                going.set()
                if m > self.sent or self.final is not None:  # not reached (or never will be): nothing waits on it
                    del self._held[m]

    def end(self, feeder) -> None:
        self.final = feeder.snapshot(self.step_id).meta
        for n in self._numbers:  # requested while its last records went out: after them, as its end
            self.positions[n] = self.final
        self._numbers.clear()


def source_positions(barriers, n: int) -> dict:
    """Checkpoint n's source positions as its manifest keeps them, taken out of `barriers`
    (SourceBarriers): {source step: {executor (a string): its feeder state's meta}}."""
    positions: dict[str, dict] = {}
    for source in barriers:
        positions.setdefault(source.step_id, {})[str(source.executor)] = source.positions.pop(n)
    return positions


def source_position(meta: dict, step_id: str, executor: int) -> dict | None:
    """Where source `step_id` on `executor` resumes, from a manifest's meta (None: not there)."""
    per_executor = meta.get("sources", {}).get(step_id)
    if per_executor is not None and "kind" in per_executor:  # before positions were per executor
        per_executor = {str(EXECUTOR): per_executor}
    return (per_executor or {}).get(str(executor))


class Checkpointing:
    """The checkpoints of one executor's run (see the module doc): made before the run, with the
    checkpoint to resume from already loaded (`restored`)."""

    def __init__(self, plan, config: CheckpointConfig, store: SnapshotStore, restored: Checkpoint | None, stop=None,
                 executor: int = EXECUTOR, first: int | None = None):
        """`first`: the first checkpoint number to use (`slashrt.snapshot.published.check_run`;
        None: the store's next)."""
        self.executor = executor  # whose parts and source positions these are
        self.plan = plan
        self.stop = stop  # a StopHandle, or None
        self.savepoint: int | None = None  # the run stopped with this savepoint
        self._kinds: dict[int, str] = {}  # savepoint and final checkpoints (in their manifest's meta)
        self._halting = False  # a stop's savepoint is asked, and has not failed: its snapshot halts the executor
        self.config = config
        self.store = store
        self.restored = restored
        self.nodes = stateful_nodes(plan)
        self.sinks = [
            node.sink for node in plan.sinks
            if getattr(node.sink, "transactional", False) and isinstance(node.sink, TwoPhaseCommit)
        ]
        self.sources = {step_id: SourceBarriers(step_id, executor) for step_id in plan.sources}
        # transactional sinks whose pending output only memory holds (a transactional Collect)
        self._in_memory = {id(node.sink) for node in plan.sinks if node._pending_records() is not None}
        self._world: StopTheWorld | None = None  # mode "sync": the checkpoint stopping the world
        feedbacks = loop_feedbacks(plan)
        self.loops = BackEdgeLog(feedbacks, list(plan.sources), time.perf_counter) if feedbacks else None
        steps = list(self.nodes) + (self.loops.steps if self.loops else []) or ["executor"]
        self.coordinator = CheckpointCoordinator.for_steps(
            steps, [EXECUTOR], config, clock=trio.current_time, first=first or store.next_checkpoint()
        )
        # a loop head logs its back edges while the run goes on; stop-the-world takes what they hold
        if self.loops is not None and config.mode != "sync":
            self.aligner = self.loops.head
        else:
            self.aligner = BarrierAligner(list(plan.sources), clock=time.perf_counter)
        self._taken: set[int] = set()
        self._writing: set[int] = set()  # checkpoints whose parts, manifest or commit are under way
        self._storing = trio.Lock()  # one manifest (and its retention) at a time
        self._changed = trio.Event()  # set when a checkpoint ends (completed or aborted)
        self._nursery: trio.Nursery | None = None
        self._replay: list = []  # restored back-edge logs, delivered by `replay`
        self._after_end: list[int] = []  # checkpoints triggered once every input had ended (loops still run)
        self._overtaking: list[int] = []  # checkpoints past their alignment timeout: taken unaligned between two batches
        self._executor = None  # the Executor whose inputs these are (`attach`)
        self._unaligned: set[int] = set()  # checkpoints taken unaligned (their manifests say so)
        self._channels: dict[int, dict] = {}  # an unaligned checkpoint's channel states, for `_take`
        # resuming a checkpoint of another executor count: this executor's states, reassigned
        # (`slashrt.snapshot.rescale.reassigned`); sources start afresh on their new shares
        self.rescaled: dict | None = None
        # and the rows in flight between old executors whose keys this one now owns
        # (`rescale.graph_in_flight`): counted in flight at the restore, taken by `replay`
        self.adopted: dict = {}
        self.reshared: list = []  # the rescalings the sources' shares come from (`rescale.resumed_inputs`)

    # -- recovery --------------------------------------------------------------------------------
    def position(self, step_id: str) -> State | None:
        """Where source `step_id` on this executor resumes (a feeder state), or None: from its start."""
        if self.restored is None or self.rescaled is not None:
            return None
        executor = self.executor
        position = source_position(self.restored.meta, step_id, executor)
        taken = sorted(self.restored.meta.get("sources", {}).get(step_id) or {})
        if position is None and taken and "kind" not in taken:
            raise SnapshotError(
                f"checkpoint {self.restored.number} holds positions of source {step_id!r} for executors "
                f"{', '.join(taken)}, not {executor}: resume it on as many executors as it was taken on"
            )
        if position is None:
            raise SnapshotError(
                f"checkpoint {self.restored.number} holds no position for source {step_id!r} on executor {executor}: "
                "it was written by another dataflow; resume it with the dataflow that wrote it"
            )
        return State({}, position)

    async def restore(self, progress=None) -> None:
        """After the sinks opened: every stateful node from the restored checkpoint, and every
        2PC sink's pending output settled (committed up to it, aborted after it; a broker's
        sink from its worker thread). `progress` (pointstamp progress) counts what the
        restored nodes hold."""
        number = None
        if self.loops is not None:
            self.loops.attach(progress)
        if self.rescaled is not None:
            await self._restore_rescaled(progress)
            return
        if self.restored is not None:
            number = self.restored.number
            states = {step: state for (step, _), state in self.restored.states.items()}
            logs = {step: states.pop(step) for step in list(states) if _kind(states[step]) == LOG_KIND}
            for step in [step for step in states if _kind(states[step]) == channel_state.CHANNEL_KIND]:
                self._restore_channel(number, *channel_state.restored(states.pop(step), step))
            if logs and self.loops is None:
                raise SnapshotError(
                    f"checkpoint {number} holds back-edge logs of loops ({', '.join(sorted(logs))}) but this dataflow "
                    "has no loop: restore it into the dataflow that wrote it"
                )
            self._replay = self.loops.restored(logs) if self.loops is not None else []
            restore_plan(self.plan, states)
            if progress is not None:
                progress.recount()
            log.info("checkpoint restored", checkpoint=number)
        for sink in self.sinks:
            await recover_async(sink, number)

    def _restore_channel(self, number: int, channel: str, segments: list) -> None:
        """What an unaligned checkpoint held in flight on `channel` (a source's: its feeder posts
        it first)."""
        if channel not in self.sources:
            raise SnapshotError(
                f"checkpoint {number} holds in-flight records of source {channel!r}, which this dataflow does not "
                "have: restore it into the dataflow that wrote it"
            )
        self.sources[channel].in_flight = segments

    async def replay_input(self, inp) -> None:
        """Before the executor computes anything of input `inp`: what a restored checkpoint held
        in flight on it, if it is not posted into its ring again (a peer's channel, on a cluster)."""

    async def _restore_rescaled(self, progress) -> None:
        number = self.restored.number
        logs = {step: self.rescaled.pop(step) for step in list(self.rescaled) if _kind(self.rescaled[step]) == LOG_KIND}
        if self.loops is not None:  # what was going round the loops: replayed before any new input
            self._replay = self.loops.restored(logs)
        for step_id, node in self.nodes.items():  # sources start afresh on their new shares
            if step_id in self.rescaled:
                check(self.rescaled[step_id], step_id, node.STATE_KIND, node.STATE_VERSION)
                node.restore(self.rescaled[step_id])
        from slashrt.ops.route import shipped_times

        for step_id, rows in self.adopted.items():  # (taken first by `replay`)
            node = self.plan.steps[step_id]
            for at, count in shipped_times(rows).items():
                progress.in_flight(node, at, count)
        if progress is not None:
            progress.recount()
        for sink in self.sinks:
            await recover_async(sink, number)
        log.info("checkpoint restored", checkpoint=number, rescaled_from=self.restored.meta.get("executors", 1))

    async def replay(self) -> None:
        """After `restore`, before any new input: the batches the back edges of loops held; after
        a rescaled one, the rows in flight between old executors this executor now owns."""
        replay, self._replay = self._replay, []
        if replay:
            await self.loops.replay(replay)
        adopted, self.adopted = self.adopted, {}
        if adopted:
            from slashrt.ssb.graph_window import adopt_in_flight

            for step_id, rows in adopted.items():
                await adopt_in_flight(self.plan.steps[step_id], rows)

    # -- running ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self):
        """Around the executor's run: triggers checkpoints while it runs, then takes the final one
        and waits until every checkpoint is written and committed."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    triggers = await nursery.start(self._trigger)
                    with trio.CancelScope() as body:
                        stopping = await nursery.start(self._stop_when_asked, body) if self.stop is not None else None
                        yield
                    triggers.cancel()
                    if stopping is not None:
                        stopping.cancel()
                    if self.savepoint is None:
                        await self._finish()
                except BaseException:
                    # failing: nothing starts while the nursery cancels its tasks, nor once it
                    # closed and before this task resumes (another task may run in between)
                    self._nursery = None
                    raise
        finally:
            self._nursery = None  # the run ended (or failed): `_spawn` starts nothing more

    def _spawn(self, fn, *args) -> bool:
        """Start `fn(*args)` beside the run; nothing once the run ended: a coordinator's message
        handled while the run fails (an operator's error) must not replace that error with
        trio's "Nursery is closed". Returns whether it started."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(fn, *args)
        return True

    async def _stop_when_asked(self, body: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Stop with a savepoint when `stop` asks: the coordinator's final checkpoint at every source;
        once it is written and committed, cancel the executor's run (`body`)."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await self.stop.wait()
            while self.config.mode == "sync" and (self.coordinator.pending or self._writing):
                await self._changed.wait()  # stop-the-world: one checkpoint stops the world at a time
            n = self.coordinator.stop_with_savepoint().checkpoint
            self._kinds[n], self._halting = "savepoint", True
            log.info("stopping with a savepoint", checkpoint=n)
            self._request(n, stop=True)
            while self.coordinator.state == "stopping" or n in self._writing:
                await self._changed.wait()
            if self.coordinator.state == "stopped":
                self.savepoint = n
                body.cancel()
                return
            log.warning("stop with a savepoint failed", reason=self.coordinator.stop_failure)
            self._go_on()

    def _go_on(self) -> None:
        """A stop's savepoint failed: the sources feed on, the executor computes again (or, if
        the failure came before its snapshot, goes on computing at it)."""
        self._halting = False
        for source in self.sources.values():
            source.go_on()
        if self._executor is not None:
            self._executor.go_on()

    async def _trigger(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while (due := self.coordinator.next_due()) is not None or self.coordinator.state == "stopping":
                if due is None:  # a stop's savepoint pending: none starts; if it fails, the job goes on
                    await self._changed.wait()
                    continue
                await trio.sleep_until(due)
                record = self.coordinator.maybe_trigger()
                if record is None:  # max_in_flight pending: wait for one to end
                    await self._changed.wait()
                    continue
                log.debug("checkpoint triggered", checkpoint=record.checkpoint)
                self._request(record.checkpoint)
                if (after := self.config.unaligned_after) is not None:
                    self._spawn(self._overtake_after, record.checkpoint, after)

    async def _overtake_after(self, n: int, seconds: float) -> None:
        """The alignment timeout: n, still aligning `seconds` after its trigger, is taken
        unaligned at the executor's next turn (`between`)."""
        await trio.sleep(seconds)
        if self._still_aligning(n) and self._executor is not None:
            self._overtaking.append(n)
            self._executor.wake()

    def _still_aligning(self, n: int) -> bool:
        return n in self.coordinator.pending and n not in self._taken

    def _request(self, n: int, stop: bool = False) -> None:
        """Barrier n at every source (`stop`, and always in stop-the-world: each halts after
        sending it, until `go_on`)."""
        if self.config.mode == "sync":
            instances = [(step_id, self.executor) for step_id in self.sources]
            self._world = StopTheWorld(n, instances, [("executor", self.executor)], clock=time.perf_counter)
            stop = True
        for source in self.sources.values():
            source.stop(n) if stop else source.request(n)
        if isinstance(self.aligner, LoopHead) and self.aligner.channels.ended == set(self.aligner.channels.inputs):
            self._after_end.append(n)  # no barrier comes: loops snapshot between two fed-back batches

    async def _finish(self) -> None:
        """Every input ended: a checkpoint requested after the executor saw every end gets no
        barrier (ended inputs deliver every barrier); take those now, then the final one."""
        if self.loops is not None:
            self.loops.ended()
        for n in sorted(self.coordinator.pending):
            if n not in self._taken:
                self._take(n, AlignmentStats(n, time.perf_counter(), time.perf_counter()))
        while self._writing:
            await self._changed.wait()
        if self.coordinator.state != "running":  # a stop's savepoint came with the end: it is the final one
            return
        final = self.coordinator.trigger_savepoint().checkpoint
        self._kinds[final] = "final"
        self._request(final)
        self._take(final, AlignmentStats(final, time.perf_counter(), time.perf_counter()))
        while self._writing:
            await self._changed.wait()

    # -- the executor's side (Executor.checkpoints) ------------------------------------------------
    def attach(self, executor) -> None:
        """The executor running this plan (its inputs' unconsumed buffers are an unaligned
        checkpoint's channel state)."""
        self._executor = executor

    async def on_barrier(self, executor, inp, n: int) -> None:
        await self._obey(executor, self.aligner.barrier(inp.name, n))

    async def on_end(self, executor, inp) -> None:
        await self._obey(executor, self.aligner.end(inp.name))

    def between(self) -> None:
        """The executor is between two batches (its compute loop calls it every turn):
        checkpoints past their alignment timeout are taken unaligned, those triggered after every
        input ended snapshot now (the loops log their back edges as after a barrier)."""
        later = []
        while self._overtaking:
            n = self._overtaking.pop(0)
            if n not in self.coordinator.pending or n in self._taken:
                continue
            if all((s.feeder is not None and s.feeder.positioned) or n in s.positions for s in self.sources.values()):
                self._take_unaligned(n)
            else:  # a source has not begun feeding: it has no position to take yet
                later.append(n)
        self._overtaking = later
        while self._after_end:
            for outcome in self.aligner.trigger(self._after_end.pop(0)):
                if isinstance(outcome, Snapshot) and outcome.checkpoint not in self._taken:
                    self._take(outcome.checkpoint, outcome.stats, running=True)

    async def _obey(self, executor, outcomes) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Abort):
                self._decline(outcome)
            elif isinstance(outcome, Snapshot) and self.config.mode == "sync":
                await self._stop_the_world(outcome.checkpoint, outcome.stats)
            elif isinstance(outcome, Snapshot):
                self._take(outcome.checkpoint, outcome.stats, running=True)
        self._block(executor)

    def _decline(self, outcome: Abort) -> None:
        if self.coordinator.decline(outcome.checkpoint, self._instances()[0], outcome.reason) is not None:
            self._signal()

    def _block(self, executor) -> None:
        """Block exactly the inputs the aligner holds behind a barrier: an abort releases the
        inputs of the aborted alignment even when the next one holds another input at once (one
        left blocked would never deliver the barrier the new alignment waits for)."""
        blocked = self.aligner.channels.blocked
        for inp in executor.inputs:
            if inp.name in blocked:
                if inp.blocked is None:
                    executor.block(inp)
            elif inp.blocked is not None:
                executor.unblock(inp)

    async def _stop_the_world(self, n: int, alignment: AlignmentStats) -> None:
        """The synchronous baseline: every source halted after barrier n (each sent it, so the
        aligner gave its snapshot, and feeds nothing after it: `SourceBarriers.stop`), everything
        before it is computed (drained); snapshot and write while nothing runs, then `_resume`."""
        world = self._world  # a next checkpoint may start once n is acked
        for step_id in self.sources:
            world.halted((step_id, self.executor))
        world.drained(("executor", self.executor))
        self._take(n, alignment)
        while n in self._writing:  # written and acked: on one executor, complete and committed too
            await self._changed.wait()
        world.snapshotted(("executor", self.executor))
        self._resume(n, world)

    def _resume(self, n: int, world: StopTheWorld) -> None:
        """Checkpoint n is committed: the sources feed on (a savepoint's stay halted: the run ends there)."""
        if self._kinds.get(n) == "savepoint":
            return
        for step_id, source in self.sources.items():
            source.go_on(n)
            world.resumed((step_id, self.executor))

    def _take_unaligned(self, n: int) -> None:
        """Checkpoint n now, between two batches, without waiting for barrier n to pass the
        buffers in front of it (`slashrt.snapshot.channel_state`): an input that delivered n
        holds nothing of n in flight; another one's unconsumed buffers up to barrier n (all of
        them if its source has not posted it: its position is then taken now) are n's channel
        state. Loops: their back edges' queue is what is in flight there (`BackEdgeLog.take`)."""
        executor, channels = self._executor, self.aligner.channels
        channel = {}
        for inp in executor.inputs:
            if channels.last.get(inp.name, -1) >= n or inp.name not in self.sources:
                continue  # delivered n: the state holds everything before it
            segments, reached = channel_state.capture(executor.unconsumed(inp), inp.receiver, inp.dtype, n)
            if not reached:
                segments += self.sources[inp.name].overtaken(n)
            if segments:
                channel[inp.name] = channel_state.to_state(inp.name, n, segments, inp.dtype)
        alignment = self.aligner.overtake(n, time.perf_counter())
        self._block(executor)  # what waited behind an earlier barrier n goes on
        self._unaligned.add(n)
        log.debug("checkpoint taken unaligned", checkpoint=n, channels=sorted(channel),
                  in_flight=sum(len(c.arrays["records"]) for c in channel.values()))
        self._channels[n] = channel
        self._take(n, alignment)

    def _instances(self):
        return sorted(self.coordinator.instances)

    def _take(self, n: int, alignment: AlignmentStats, running: bool = False) -> None:
        """The synchronous part of checkpoint n, between two batches: pre-commit the sinks, copy
        every node's state; the writing goes on in the background. A broker's sink pre-commits
        in its worker thread: begun here, so after every write before the barrier and before any
        after it, and finished in the background before n is acked (`_write`). Loops: barrier n
        goes round them while the run goes on (`running`, asynchronous snapshots), else the log
        is what their back edges hold now. A stop's savepoint: the log is what they hold now, and
        the executor computes nothing more (`Executor.halt`) until the run stops, else what it
        fired or iterated after the snapshot the resumed run would again: twice, into a sink
        that is not transactional (a transactional one aborts it with n + 1)."""
        stopping = self._kinds.get(n) == "savepoint"
        running = running and not stopping
        self._taken.add(n)
        self._writing.add(n)
        started = time.perf_counter()
        pre_commits = []  # a broker's sinks' pre-commits, under way in their worker threads
        for sink in self.sinks:
            if (pre_commit := begin(sink, "pre_commit", n)) is not None:
                pre_commits.append(pre_commit)
            if self._kinds.get(n) == "savepoint" and id(sink) in self._in_memory:
                # the stopping run returns it now, so its snapshot holds nothing for a resume to
                # publish again; were this process to die first, its memory would be gone anyway
                sink.commit(n)
        # channel state first: its parts are written before the acks that may complete n
        states = {channel_state.part_name(source): state for source, state in self._channels.pop(n, {}).items()}
        sync = dict.fromkeys(states, 0.0)
        for step_id, node in self.nodes.items():
            t0 = time.perf_counter()
            states[step_id] = node.snapshot()
            sync[step_id] = time.perf_counter() - t0
        if self.loops is not None:
            self.loops.open(n) if running else self.loops.take(n)
        positions = source_positions(self.sources.values(), n)
        if stopping and self._halting and self._executor is not None:
            self._executor.halt()
        log.debug("checkpoint snapshot", checkpoint=n, sync_s=time.perf_counter() - started)
        if not self._spawn(self._write, n, states, sync, positions, alignment.seconds, pre_commits):
            for pre_commit in pre_commits:  # the run ended: nothing awaits them
                pre_commit.close()

    async def _write(self, n: int, states: dict, sync: dict, positions: dict, alignment_s: float,
                     pre_commits=()) -> None:
        try:
            if self.loops is not None:  # the log is part of n once barrier n came back round every loop
                logs = await self.loops.states(n)
                states.update(logs)
                sync.update(dict.fromkeys(logs, 0.0))
            if not await self._pre_committed(n, pre_commits):  # (the loops' log of n taken first: not left behind)
                return
            await self._write_parts(n, states, sync, positions, alignment_s)
        finally:
            self._writing.discard(n)
            self._signal()

    async def _pre_committed(self, n: int, pre_commits) -> bool:
        """Wait for the pre-commits of n begun in broker sinks' worker threads: they are part of
        n's snapshot, so n is acked only after them. One that failed (its broker away, or hung
        past its timeout) fails n as a part that cannot be written does (`_pre_commit_failed`);
        returns whether all succeeded."""
        failed = None
        for pre_commit in pre_commits:  # every one awaited: none is left queued unawaited
            try:
                await pre_commit
            except ConnectorError as exc:
                failed = failed or exc
        if failed is not None:
            await self._pre_commit_failed(n, failed)
        return failed is None

    async def _pre_commit_failed(self, n: int, exc: ConnectorError) -> None:
        """A sink could not pre-commit n: n is declined, counted as a failed checkpoint (nothing
        of it was written yet); its pending output, if the broker took it after all, is
        published with the next checkpoint that completes, or aborted by a recovery."""
        self.coordinator.decline(n, self._instances()[0], str(exc), failed=True)
        self._check_failure(n, exc)

    async def _write_parts(self, n: int, states: dict, sync: dict, positions: dict, alignment_s: float) -> None:
        try:
            await self._store(n, states, sync, positions, alignment_s)
        except SnapshotWriteError as exc:  # a full disk: n is declined, the run goes on (up to the tolerated)
            if self.coordinator.decline(n, self._instances()[0], str(exc), failed=True) is None:
                self.coordinator.unwritten(n, str(exc))  # its manifest failed
            async with self._storing:
                with contextlib.suppress(OSError):
                    await trio.to_thread.run_sync(self.store.discard, n)
            self._check_failure(n, exc)

    def _check_failure(self, n: int, exc: SnapshotWriteError | ConnectorError) -> None:
        """Checkpoint n failed to write (or a sink to pre-commit it): the job fails, in one
        sentence, if it was the run's last one (final, or a stop's savepoint: no later checkpoint
        takes its place) or one failure too many in a row; else it is declined and the next one
        is tried. A broker's failure stays one (a restart strategy retries it)."""
        broker = isinstance(exc, ConnectorError)
        sentence = self.coordinator.failing(str(exc), self._kinds.get(n), broker=broker)
        if sentence is not None:
            raise (type(exc) if broker else SnapshotError)(sentence)
        log.warning("checkpoint declined", checkpoint=n, reason=str(exc), failures_in_a_row=self.coordinator.failures,
                    tolerated=self.config.tolerable_failures)

    async def _store(self, n: int, states: dict, sync: dict, positions: dict, alignment_s: float) -> None:
        completed, extra = None, 0
        # no stateful step: the executor acks, once its parts (channel state) are written
        stateless = not set(states) & {step for step, _ in self.coordinator.instances}
        # one store operation at a time: a manifest's retention removes the directories of older
        # checkpoints (this one, once a newer one subsumed it) and must not meet a write. Every
        # part in one worker-thread call: a busy event loop (a slow step) resumes this task only
        # now and then, so each hop back to it would add to the checkpoint's duration
        async with self._storing:
            if n in self.coordinator.pending:  # else subsumed by a newer checkpoint: discarded below
                t0 = time.perf_counter()
                parts = await trio.to_thread.run_sync(self._write_all, n, states) if states else []
                written = time.perf_counter() - t0
                for step_id, part in zip(states, parts):
                    if (step_id, EXECUTOR) not in self.coordinator.instances:  # channel state: no instance of its own
                        extra += part.size
                        continue
                    stats = AckStats(alignment_s, sync[step_id], written, part.size + extra)
                    extra = 0
                    completed = self.coordinator.ack(n, (step_id, EXECUTOR), stats) or completed
                if stateless:
                    completed = self.coordinator.ack(n, ("executor", EXECUTOR), AckStats(alignment_s, 0.0, written, extra))
            if completed is None:  # aborted meanwhile (a newer barrier overtook it)
                await trio.to_thread.run_sync(self.store.discard, n)
                return
            meta = {"sources": positions, "executors": 1, "kind": self._kinds.get(n, "checkpoint")}
            if n in self._unaligned:
                meta["unaligned"] = completed.unaligned = True
            if self.reshared:  # what the sources' positions are positions in
                meta["reshared"] = self.reshared
            await self.store.acomplete(n, meta)
            for sink in self.sinks:
                await commit_async(sink, n)
        log.info("checkpoint completed", checkpoint=n, bytes=completed.bytes)

    def _write_all(self, n: int, states: dict) -> list:
        return [self.store.write_part(n, step_id, EXECUTOR, state.arrays, state.meta) for step_id, state in states.items()]

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def report(self) -> list[dict]:
        """Per checkpoint: status, seconds, bytes, and the slowest instance's alignment, sync and async seconds."""
        return self.coordinator.report()


def _kind(state: State):
    return state.meta.get("kind") if isinstance(state.meta, dict) else None


def load_restored(store: SnapshotStore, resume_from, executor: int | None = EXECUTOR) -> Checkpoint | None:
    """The checkpoint `resume_from` names: None (start afresh), "latest" (the newest that
    verifies; none at all: start afresh) or a checkpoint number; `executor`'s parts read (every
    one checked present; None: all read)."""
    if resume_from is None:
        return None
    if resume_from == "latest":
        return store.latest(executor=executor)
    if isinstance(resume_from, (int, np.integer)) and not isinstance(resume_from, bool):
        return store.load(int(resume_from), executor=executor)
    raise OptionError(f"run(): resume_from must be None, 'latest' or a checkpoint number, got {resume_from!r}")
