"""Checkpoints of a multi-executor run: the protocol, and the cluster coordinator's side (each
agent's: `slashrt.snapshot.cluster_agent`).

    cluster coordinator                          agent i (one executor)
      CheckpointCoordinator over every             sources: record position, barrier n in band
      (stateful step, executor)
      "checkpoint" n  ───────────────────────>     each exchange forwards barrier n once every
                                                   input upstream of it delivered n; once every
                                                   input did: pre-commit sinks, copy state
                                                   (sync), write parts
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
`Executor.halt`), acks, manifest, "commit" n, then "stop" n: each agent cancels its executor's
run (no end of stream: open windows stay in n), stops driving its channels and says "finished"; once all did, "release" lets them close the channels (docs/
architecture.md, "Stop with a savepoint on a cluster"). If n aborts, "go_on": the sources feed on,
the executor computes again.

Stop-the-world (mode "sync", every flow): every checkpoint halts the sources as a savepoint does
(`SourceBarriers.stop`: nothing fed after barrier n); each executor, once aligned (everything fed
before the halt, through every exchange, processed, exchange by exchange, loops included), snapshots and writes while its loop waits, then acks; once all acked (drained
everywhere), manifest, "commit" n, and only then "go_on" n.

Alignment (exchange by exchange, in the order the data flows), loops, unaligned checkpoints
and the agent's part of a stop: `slashrt.snapshot.cluster_agent`.
"""

from __future__ import annotations

import contextlib

import structlog
import trio

from slashrt.errors import ClusterError, SnapshotError, SnapshotWriteError, retryable_report
from slashrt.snapshot import channel_state
from slashrt.snapshot.cluster_agent import NO_STATE
from slashrt.snapshot.coordinator import CheckpointCoordinator
from slashrt.snapshot.rescale import rescale, reshaped, resumed_inputs

__all__ = ["ClusterCheckpoints", "cluster_checkpoints"]

log = structlog.get_logger("slashrt.checkpoint")

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
        self.restarting: set[int] = set()  # executors restarting alone (`lose`): no checkpoint starts meanwhile
        self.finishing = False  # every executor drained: the final checkpoint's turn (no executor restarts alone)

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

    def can_restart_alone(self) -> bool:
        """Whether executors may restart alone now (`lose`): not once the run finishes, nor
        while a stop's savepoint is under way."""
        return self.coordinator is not None and not self.finishing and not self.stopped and \
            self.coordinator.state == "running"

    async def lose(self, executors, reason: str) -> int | None:
        """`executors` died and restart alone (a region of their own: `cluster._execution_plan`).
        Every checkpoint in flight aborts (they will not take it), none starts until
        `rejoined`, and they count as not drained. Returns the checkpoint they restore: the
        newest complete one whose parts of theirs verify (None: none, they start afresh)."""
        self.restarting |= set(executors)
        for n in list(self.coordinator.pending):
            if self.coordinator.decline(n, (self.steps[0], executors[0]), reason) is not None:
                self._acks.pop(n, None)
                log.warning("checkpoint aborted", checkpoint=n, reason=reason)
                await self._go_on(n)
        self._drained -= set(executors)
        while self._completing:  # a manifest being written: it may be the newest
            await self._changed.wait()
        latest = await self.store.alatest(executor=executors[0] if len(executors) == 1 else None)
        return None if latest is None else latest.number

    def rejoined(self) -> None:
        """The executors restarting alone are running again: checkpoints go on."""
        self.restarting = set()
        self._signal()

    async def _stop_when_asked(self, agents) -> None:
        """Stop with a savepoint when `stop` asks: savepoint n at every agent's sources, which feed
        nothing after its barrier; once n is complete and its commit sent, "stop" every agent
        (each ends its executor's run there). If n aborts, the sources feed on ("go_on")."""
        await self.stop.wait()
        while self.restarting:  # (an executor restarting alone takes the savepoint once it runs)
            await self._changed.wait()
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
                if self.restarting:  # an executor restarting alone could not take it
                    await self._changed.wait()
                    continue
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
        self.finishing = True
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
    if loop_feedbacks(role_plan):  # the feedback queues' logs and the exchanges' outboxes (`cluster_agent`)
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
