"""Pointstamp progress on one executor: the plan's graph, its tracker, the feedback queue.

::

    source ──> filter ──> enter(in0) ──> op ──> leave ──> window ──> sink
                          enter(in1) <── feedback <─┘
       capability            ^ queued batches     ^ notification requests   ^ capability
       (its watermark)       (+1 queued, -1 delivered)  (+1 until on_notify)   (earliest end to fire)

Every step of the flow is a node of a `Reachability` (its ports and summaries: ingress appends
a loop counter, feedback adds one, egress drops it). The `Tracker` counts what may still
produce data: sources' capabilities (at their last announced watermark, dropped at the end of
their input), operators' notification requests, windows' capabilities (the end of the
earliest window they still have to fire; inside a loop one per iteration, at its counters) and
batches queued on feedback edges. Synchronous
pushes inside a call tree need no counts: the capability of whoever started the tree (a
source, the queue, a notification) covers them.

`settle()` runs after every event that changed a count: propagate the tracker, hand each node
whose input frontier moved its frontier (a window fires what it passed, a sink forwards it),
deliver every requested notification complete at all inputs of its operator (in timestamp
order), and repeat until nothing changes. `now` is the logical time of the batch being pushed
(see `slashrt.ops.operator`). The executor settles once before its first input: a frontier is
delivered when it changes, and the tracker consolidates what it has not propagated yet.

Checkpoints: after the nodes' state was restored, `recount()` counts what they hold again
(sources' capabilities at their restored watermarks, operators' notification requests,
windows' capabilities, per iteration inside loops); a
loop head's barrier travels the feedback queue behind the batches queued before it
(`enqueue_barrier`), and `back_edges` (`slashrt.snapshot.loops.BackEdgeLog`) sees every
batch and barrier the queue delivers. On several executors a checkpoint holds every delivery (`hold_deliveries`)
from forwarding its barrier to peers until its snapshot (`slashrt.snapshot.cluster`).

On several executors (`bus` given) every executor runs every step on its share of the input;
the counts are the cluster's (`BusCounts`): updates go to the progress bus, frontiers come
from its view, and a peer's message that moves a frontier marks the tracker dirty and wakes
the executor (`wake`), which settles it like a local event. A source's capability moves wait
in the bus's buffer without a settle (no frontier moves before they are recorded); the executor
publishes them at once when its own notifications or windows wait for them (`BusCounts`,
`_waits`), else when it goes idle (`quiet`: while its inputs stream, once it stayed idle for a
grace), and runs until every executor's work is done (`waiting`).
"""

from __future__ import annotations

import collections

import structlog
import trio

from slashrt._logging import level_name
from slashrt._dataflow import EnterSpec, FeedbackSpec, LeaveSpec, OperatorSpec, SinkSpec, SourceSpec, UnionSpec, inputs_of
from slashrt.errors import DataflowError, SlashError
from slashrt.ops._node import Node
from slashrt.ops.event_time import SourceNode
from slashrt.ops.loop_window import LoopWindow
from slashrt.ops.operator import (
    GROUPED, EnterNode, FeedbackNode, LeaveNode, OperatorNode, Port, UnionNode,
)
from slashrt.ops.stateless import FilterNode, ProjectNode, WithColumnNode
from slashrt.ops.route import ExchangeNode, WindowRoute
from slashrt.ssb.graph_window import SsbRoute
from slashrt.ops.sinks import SinkNode
from slashrt.ops.window import WindowAggregate
from slashrt.progress import (
    IDENTITY, INGRESS, Builder, ChangeBatch, Location, Reachability, Timestamp, Tracker, move_capability,
)
from slashrt.progress.timestamp import MIN_EPOCH
from slashrt.progress.waiters import Waits
from slashrt.scheduler._bus_counts import BusCounts

__all__ = ["PointstampProgress", "progress_graph"]

log = structlog.get_logger("slashrt.progress")


def progress_graph(flow, fragments: frozenset[str] = frozenset()) -> Reachability:
    """The flow's steps as a progress graph (node i is the flow's i-th step, named by its step
    id), checked: a cycle that does not pass a feedback is refused naming its steps. The keyed
    windows named in `fragments` run on the state backend (`SsbRoute`): a second input port,
    which no edge feeds, holds their fragments' capabilities."""
    index = {step_id: i for i, step_id in enumerate(flow.steps)}
    builder = Builder()
    for step_id, spec in flow.steps.items():
        ins = len(inputs_of(spec))
        if isinstance(spec, SourceSpec):
            builder.add_node(step_id, 0, 1)
        elif isinstance(spec, SinkSpec):
            builder.add_node(step_id, 1, 0)
        elif isinstance(spec, (UnionSpec, OperatorSpec)):
            builder.add_node(step_id, ins, 1)
        elif step_id in fragments:
            builder.add_node(step_id, 2, 1)
        elif isinstance(spec, EnterSpec):
            builder.add_node(step_id, 2, 1, {(0, 0): INGRESS, (1, 0): IDENTITY})
        elif isinstance(spec, FeedbackSpec):
            builder.add_feedback(step_id)
        elif isinstance(spec, LeaveSpec):
            builder.add_egress(step_id)
        else:
            builder.add_node(step_id, 1, 1)
    for step_id, spec in flow.steps.items():
        for port, up in enumerate(inputs_of(spec)):
            if up not in index:
                raise DataflowError(f"dataflow {flow.name!r}: step {step_id!r} reads {up!r}, which is no step")
            builder.connect(index[up], 0, index[step_id], port)
        if isinstance(spec, FeedbackSpec):
            builder.connect(index[step_id], 0, index[spec.into], 1)
    try:
        return builder.build()
    except DataflowError as exc:
        raise DataflowError(
            f"dataflow {flow.name!r}: {str(exc).removeprefix('progress graph: ')} (close a loop only with "
            "loop.feed_back())"
        ) from None


class PointstampProgress:
    """The tracker of one executor running `plan`, and the nodes it drives."""

    def __init__(self, plan, bus=None):
        """`bus`: the executor's `ProgressBus` in a multi-executor run (its view starts with
        every source instance's capability, `initial_capabilities`)."""
        flow = plan.flow
        self.steps: list[str] = list(flow.steps)
        self.nodes: list[Node] = [plan.steps[s] for s in self.steps]
        index = {step_id: i for i, step_id in enumerate(self.steps)}
        self.graph = plan.graph
        self.wake = lambda: None  # the executor's compute wakes up to settle a peer's news
        if bus is None:
            self.tracker = Tracker(self.graph)
        else:
            waits = self._waits()
            self.tracker = BusCounts(bus, self._news, waits, self._silent(waits))
        self.bus = bus
        self.released: set[int] = set()  # sources whose input ended: they hold no capability
        self.index = {id(node): i for i, node in enumerate(self.nodes)}
        self.now = Timestamp(MIN_EPOCH)
        self.queue: collections.deque = collections.deque()  # (feedback node, batch, time, location)
        self.back_edges = None  # checkpoints of loops: told of every batch and barrier the queue delivers
        self.ops: list[tuple[int, OperatorNode]] = []
        self.windows: list[tuple[int, WindowAggregate | LoopWindow]] = []
        self.held: dict[int, frozenset[Timestamp]] = {}  # window node -> the capabilities it holds
        self.feedbacks_into: dict[int, list[str]] = collections.defaultdict(list)
        self._dirty = False
        self._settling = False
        self._stale: set[int] = set()  # operators whose due notifications may have changed
        self._held = False  # `hold_deliveries`: frontier changes wait in `_deferred` until resumed
        self._deferred: set[int] = set()
        # debug lines (a frontier change, an idle executor's holds) cost a loop iteration's time:
        # computed only at debug level
        self.debug = level_name() == "debug"
        self._idle_holds: dict | None = None  # what `idle_holds` last returned
        self._moved_uncounted = False  # `advance` buffered a source's move; the holds were not recounted since
        self.grace: float | None = None  # `quiet`
        for i, (step_id, node) in enumerate(zip(self.steps, self.nodes)):
            node.clock = self
            spec = flow.steps[step_id]
            window = _window_of(node)
            if window is not None:
                window.clock = self  # (a routed window's: the route stands for it in the graph)
                self.windows.append((i, window))
            if isinstance(node, SourceNode):
                node.now = self.now
                below = list(_downstream(node))
                node.every_batch = any(isinstance(n, (OperatorNode, EnterNode)) for n, _, _ in below)
                # user operators that read records' own times: each below a window reads its
                # ends; one with per_time True, or GROUPED behind a step that makes new
                # records (whose times slashrt cannot know), needs the batches cut per time;
                # GROUPED ones reached only through steps keeping rows get `Batch.times`
                ops = [(n.op.per_time, carried) for n, timed, carried in below if isinstance(n, OperatorNode) and not timed]
                node.exact = any(p is True or (p == GROUPED and not carried) for p, carried in ops)
                node.record_times = not node.exact and any(p == GROUPED for p, _ in ops)
                if bus is None:  # else counted once per instance in the bus's initial view
                    self.tracker.update(Location.output(i, 0), self.now, 1)
                self._dirty = True
            elif isinstance(node, OperatorNode):
                self.ops.append((i, node))
            if isinstance(spec, FeedbackSpec):
                self.feedbacks_into[index[spec.into]].append(step_id)
        self._listeners = {
            i for i, node in enumerate(self.nodes) if isinstance(node, (WindowAggregate, LoopWindow, SinkNode, ExchangeNode))
        }
        # an SSB window's route ships its fragments as the records' frontier passes their windows
        # (the frontier at the output of the step before it: `SsbRoute.on_upstream`), and its
        # window fires on the frontiers at both its inputs (the second holds its fragments'
        # capabilities)
        self._upstream = {
            i: Location.output(index[node.upstream], 0) for i, node in enumerate(self.nodes) if isinstance(node, SsbRoute)
        }
        self._watched: dict[Location, list[int]] = collections.defaultdict(list)
        for i, location in self._upstream.items():
            self._watched[location].append(i)
        self.fragments: dict[int, frozenset[Timestamp]] = {}  # SSB route -> its fragments' capabilities

    # --- what nodes call -----------------------------------------------------------------
    @staticmethod
    def at(epoch: int, counters: tuple[int, ...] = ()) -> Timestamp:
        return Timestamp(epoch, counters)

    async def advance(self, source: Node, old: Timestamp, new: Timestamp) -> None:
        """A source's watermark moved: its capability follows. On several executors the move
        waits in `BusCounts`' buffer, and no frontier moves, unless someone waits for it."""
        self.tracker.update_iter(move_capability(Location.output(self.index[id(source)], 0), old, new))
        if self.bus is not None and not self.tracker.must_settle():
            self._moved_uncounted = True
            return
        self._dirty = True
        await self.settle()

    async def release(self, source: Node, time: Timestamp) -> None:
        """A source's input ended: it drops its capability."""
        self.released.add(self.index[id(source)])
        self.tracker.update(Location.output(self.index[id(source)], 0), time, -1)
        self._dirty = True
        await self.settle()

    def request(self, node: OperatorNode, time: Timestamp) -> None:
        if time in node.requested:
            return  # one notification per time, however often it was asked for
        node.requested.add(time)
        i = self.index[id(node)]
        self.tracker.update(Location.output(i, 0), time, 1)
        self._stale.add(i)
        self._dirty = True

    def in_flight(self, exchange: ExchangeNode, time: Timestamp, delta: int) -> None:
        """Records at `time` shipped to (+n) or arrived from (-n) other executors."""
        self.tracker.update(Location.input(self.index[id(exchange)], 0), time, delta)
        self._dirty = True

    def enqueue(self, feedback, batch, time: Timestamp) -> None:
        location = Location.input(self.index[id(feedback.enter)], 1)
        self.tracker.update(location, time, 1)
        self.queue.append((feedback, batch, time, location))
        self._dirty = True

    def enqueue_barrier(self, feedback, n: int) -> None:
        """Checkpoint barrier n on the back edge of `feedback`, behind every batch it queued so
        far (not counted: it is no data)."""
        self.queue.append((feedback, n, None, None))

    def recount(self) -> None:
        """The nodes' state was restored (a checkpoint): count what they hold again, each
        source's capability at its restored watermark, each operator's requests and each
        window's capabilities (inside loops one per iteration)."""
        for i, node in enumerate(self.nodes):
            if isinstance(node, SourceNode):
                new = Timestamp(node.announced)
                if new != node.now:
                    self.tracker.update_iter(move_capability(Location.output(i, 0), node.now, new))
                    node.now = new
            elif isinstance(node, OperatorNode):
                for time in node.requested:
                    self.tracker.update(Location.output(i, 0), time, 1)
                self._stale.add(i)
        self._refresh_holds()
        self._dirty = True

    # --- what the executor calls -----------------------------------------------------------
    async def run_queued(self) -> None:
        """Deliver the oldest batch queued on a feedback edge to its loop's entry."""
        feedback, batch, time, location = self.queue.popleft()
        if location is None:  # a checkpoint's barrier came back round the loop
            self.back_edges.returned(feedback.step_id, batch)
            return
        if self.back_edges is not None:
            self.back_edges.record(feedback.step_id, batch, time)
        before, self.now = self.now, time
        try:
            await feedback.enter.push_port(batch, 1)
        finally:
            self.now = before
        self.tracker.update(location, time, -1)
        self._dirty = True
        await self.settle()

    @property
    def unsettled(self) -> bool:
        """Would `settle` do anything now? (The executor asks after every batch, before it
        awaits `settle`.)"""
        return self._dirty and not self._settling

    async def settle(self) -> None:
        """Propagate counts and deliver what they make due, until nothing changes."""
        if not self.unsettled:
            return  # (a settle further up the stack goes on until nothing changes)
        self._settling = True
        now = self.now
        try:
            while self._dirty:
                self._dirty = False
                self._refresh_holds()
                changes = self.tracker.propagate()
                moved = {loc.node for loc, _, _ in changes if loc.kind == "in"}
                if self._watched:
                    moved.update(i for loc, _, _ in changes if loc in self._watched for i in self._watched[loc])
                self._stale.update(moved)
                if self._held:  # a checkpoint's barrier went to peers: nothing fires before its snapshot
                    self._deferred.update(moved)
                    continue
                moved, self._deferred = sorted(moved | self._deferred), set()
                for i in moved:
                    if self.debug:
                        log.debug("frontier moved", step=self.steps[i], frontiers=self._input_frontiers(i))
                    if i in self._upstream:
                        await self.nodes[i].on_upstream(self.tracker.frontier(self._upstream[i]))
                        self._dirty = True  # its holds may have moved
                    if i in self._listeners:
                        frontier = self.tracker.frontier(Location.input(i, 0))
                        if i in self._upstream:  # and the fragments on their way, at its second port
                            frontier = [*frontier, *self.tracker.frontier(Location.input(i, 1))]
                        await self._frontier_moved(self.nodes[i], frontier)
                await self._notify()
        finally:
            self._settling = False
            self.now = now
        if self.bus is not None and self.tracker.published:
            # a busy executor just told its peers what they wait for: let the channels' tasks
            # run once (a tcp drive reads their answers only then; `propagate` polls them next)
            self.tracker.published = False
            await trio.lowlevel.checkpoint()

    def hold_deliveries(self) -> None:
        """Deliver no frontier change (no window fires, no notification, no end) until
        `resume_deliveries`: counts go on. A cluster checkpoint holds them between forwarding its barrier
        to peers and its snapshot, so what fires lands in one consistent side of the cut."""
        self._held = True

    def resume_deliveries(self) -> None:
        self._held = False
        if self._deferred or self._stale:
            self._dirty = True
            self.wake()

    def idle(self) -> bool:
        return not self.queue and self.tracker.is_idle()

    def waiting(self) -> bool:
        """Its own input is done, but may other executors' work still reach it, or is there
        news not settled yet? (The peer's message that makes the view idle also empties
        frontiers: a route hears from it that nothing can send more, and ends its channels.)"""
        return self.bus is not None and (self._dirty or not self.tracker.is_idle())

    def quiet(self, streaming: bool = False) -> bool:
        """The executor has nothing to do: True if there is news to settle before it may
        sleep. While its inputs still stream (more is coming) and the flow has no loop, `grace`
        says how long it may sleep before it calls `publish` (None: as long as nothing wakes
        it); else it publishes at once (a loop's rounds, a run's end: someone elsewhere waits
        for it)."""
        self.grace = None
        if self.bus is not None:
            if self._moved_uncounted:  # (a source's move was buffered without: `advance`)
                self._refresh_holds()
            if streaming and not self.feedbacks_into:  # (a loop's rounds: peers wait for each)
                self.grace = self.tracker.idle()
            else:
                self.tracker.flush()
        return self._dirty

    def publish(self) -> None:
        """The executor stayed idle for its `grace`: send what the bus holds back."""
        self.tracker.flush()

    def _news(self) -> None:
        self._dirty = True
        self.wake()

    # --- internals -------------------------------------------------------------------------
    def _waits(self) -> Waits:
        """Where pointstamps stand for someone waiting (`slashrt.progress.waiters`): operators'
        notification requests (at every input, up to their time) and windows' capabilities
        outside loops (at the input, before the window's end; a routed window's too, and an
        SSB window's at both its inputs), and an SSB window's fragments (at its second input,
        up to their time: they ship when the records' frontier passes it)."""
        waits = {}
        for i, node in enumerate(self.nodes):
            if isinstance(node, OperatorNode):
                waits[Location.output(i, 0)] = (tuple(Location.input(i, p) for p in range(node.inputs)), False)
            elif isinstance(_window_of(node), WindowAggregate) and self.graph.depths[Location.input(i, 0)] == 0:
                ssb = isinstance(node, SsbRoute)
                waits[Location.output(i, 0)] = ((Location.input(i, 0), *([Location.input(i, 1)] if ssb else [])), True)
                if ssb:
                    waits[Location.input(i, 1)] = ((Location.input(i, 0),), False)
        return waits

    async def _frontier_moved(self, node: Node, frontier) -> None:
        if isinstance(_window_of(node), LoopWindow):  # per iteration: the frontier's times at its counters or below
            await node.on_frontier(frontier)
            self._dirty = True
            return
        epoch = min((t.epoch for t in frontier), default=None)
        if _window_of(node) is not None:
            await node.on_frontier(epoch)
            self._dirty = True  # it may hold another capability now
        elif epoch is None:
            await node.on_end()
        elif epoch != MIN_EPOCH:
            await node.on_watermark(epoch)

    def _silent(self, waits) -> frozenset[Location]:
        """The locations whose pointstamps no executor needs promptly: no input that waits
        (`waits`) or that passes watermarks on (a sink's) is reachable from them, e.g. a window's
        capability above a plain sink. An idle executor publishes their updates with its next
        news, not after a grace of its own (`BusCounts.idle`)."""
        prompt = {x for inputs, _ in waits.values() for x in inputs}
        prompt.update(Location.input(i, 0) for i, node in enumerate(self.nodes) if getattr(node, "forwards_watermarks", False))
        return frozenset(loc for loc in self.graph.locations if prompt.isdisjoint(self.graph.reachable_from(loc)))

    def _refresh_holds(self) -> None:
        """Count the capabilities windows hold (at their output) and SSB routes' fragments hold
        (at their second input port) as they are now. (Between two counts the capability of
        the source whose records they took covers them: it has not moved past them uncounted,
        `_moved_uncounted`.)"""
        self._moved_uncounted = False
        for i in self._upstream:
            self._recount(self.fragments, i, Location.input(i, 1), self.nodes[i].window.fragment_holds())
        for i, window in self.windows:
            self._recount(self.held, i, Location.output(i, 0), _holds(window))

    def _recount(self, counted: dict, i: int, location: Location, new: frozenset[Timestamp]) -> None:
        """Move node i's capabilities at `location` from those in `counted` to `new`."""
        old = counted.get(i, frozenset())
        if new == old:
            return
        for time in new - old:
            self.tracker.update(location, time, 1)
        for time in old - new:
            self.tracker.update(location, time, -1)
        if new:
            counted[i] = new
        else:
            del counted[i]

    async def _notify(self) -> None:
        if not self._stale:
            return
        stale, self._stale = self._stale, set()
        for i, node in self.ops:
            if i not in stale or not node.requested:
                continue
            frontiers = [self.tracker.frontier(Location.input(i, p)) for p in range(node.inputs)]
            due = sorted(
                (t for t in node.requested if not any(f.less_equal(t) for f in frontiers)), key=Timestamp.sort_key
            )
            for time in due:
                node.requested.discard(time)
                await node.notify(time)
                self.tracker.update(Location.output(i, 0), time, -1)
                self._dirty = True

    def _input_frontiers(self, i: int) -> list[list[list[int]]]:
        ports = sum(1 for loc in self.graph.locations if loc.node == i and loc.kind == "in")
        return [[_plain(t) for t in self.tracker.frontier(Location.input(i, p))] for p in range(ports)]

    # --- where is it stuck -----------------------------------------------------------------
    def frontiers(self) -> dict[str, list[Timestamp]]:
        """Every step input -> its frontier (the least times that may still arrive there)."""
        return {
            self.graph.name(loc): sorted(self.tracker.frontier(loc), key=Timestamp.sort_key)
            for loc in self.graph.locations
            if loc.kind == "in"
        }

    def report(self) -> dict:
        """JSON-able: every input's frontier, every outstanding pointstamp (where and what),
        and for each input with a frontier the pointstamps holding it back: those whose image
        there under a least path summary is an element of the frontier. Each of those names
        in "held_by" this executor if it holds it itself (`own`, listed in "own_pointstamps"):
        on one executor always; on several `combine` names every executor holding it."""
        outstanding = list(self.tracker.pointstamps())
        own = self.own()
        mine = {pointstamp for pointstamp, _ in own}
        executor = 0 if self.bus is None else self.bus.index

        def entry(at: Location, time: Timestamp, **count) -> dict:
            return {"at": self.graph.name(at), "time": _plain(time), **count, "what": self._what(at)}

        def held(at: Location, time: Timestamp, **count) -> dict:
            return {**entry(at, time, **count), "held_by": [executor] if (at, time) in mine else []}

        holding = {}
        for loc in self.graph.locations:
            frontier = self.tracker.frontier(loc) if loc.kind == "in" else ()
            if not frontier:
                continue
            holding[self.graph.name(loc)] = [
                held(at, time)
                for (at, time), _ in outstanding
                if any(s.apply(time) in frontier for s in self.graph.summaries(at, loc))
            ]
        return {
            "frontiers": {name: [_plain(t) for t in ts] for name, ts in self.frontiers().items()},
            "pointstamps": _in_order(held(at, time, count=count) for (at, time), count in outstanding),
            "holding": holding,
            "queued_batches": sum(1 for item in self.queue if item[3] is not None),  # not barriers
            "own_pointstamps": _in_order(entry(at, time, count=count) for (at, time), count in own),
        }

    def own(self) -> list[tuple[tuple[Location, Timestamp], int]]:
        """The pointstamps this executor holds itself, with their counts: its sources'
        capabilities (until their input ends), its operators' notification requests, its
        windows' and SSB fragments' capabilities, the batches on its feedback queues, and the
        records its exchanges queued for peers and not yet handed to a channel (once on a
        channel, their receiver's view takes them off; no executor knows they are there
        until then). On several executors, as the views know them: what it counted and has
        not published yet (`BusCounts.unpublished`) stays at the time it was published at."""
        mine = ChangeBatch()
        for i, node in enumerate(self.nodes):
            if isinstance(node, SourceNode) and i not in self.released:
                mine.update((Location.output(i, 0), node.now), 1)
            elif isinstance(node, OperatorNode):
                mine.extend(((Location.output(i, 0), time), 1) for time in node.requested)
        for i, times in self.held.items():
            mine.extend(((Location.output(i, 0), time), 1) for time in times)
        for i, times in self.fragments.items():
            mine.extend(((Location.input(i, 1), time), 1) for time in times)
        mine.extend(((location, time), 1) for _, _, time, location in self.queue if location is not None)
        exchanges = {i for i, node in enumerate(self.nodes) if isinstance(node, ExchangeNode)}
        if self.bus is not None:
            # (records in flight are counted +n by their sender, -n by their receiver: not
            # what either holds; its queues say what the sender still holds)
            mine.extend(
                ((location, time), -delta) for (location, time), delta in self.tracker.unpublished()
                if not (location.kind == "in" and location.port == 0 and location.node in exchanges)
            )
        for i in exchanges:
            mine.extend(((Location.input(i, 0), time), n) for time, n in self.nodes[i].queued_times().items())
        return [(pointstamp, count) for pointstamp, count in mine.items() if count > 0]

    def _what(self, location: Location) -> str:
        node, step = self.nodes[location.node], self.steps[location.node]
        if location.kind == "in" and location.port == 1 and isinstance(node, SsbRoute):
            return f"fragments of window {step} not shipped yet"
        if location.kind == "in" and isinstance(node, ExchangeNode):
            return f"records on their way between executors through {step}"
        if location.kind == "in":
            return f"batches queued on feedback {', '.join(self.feedbacks_into[location.node])}"
        if isinstance(node, SourceNode):
            return f"capability of source {step} (its watermark)"
        if isinstance(node, OperatorNode):
            return f"notification requested by {step}"
        if _window_of(node) is not None:
            return f"capability of window {step} (a window still to fire)"
        return f"capability of step {step}"

    def idle_holds(self) -> dict | None:
        """The executor has nothing to do and parks (call it at debug level only: it builds a
        `report`): every input whose frontier is not at the end -> its frontier and the
        pointstamps holding it back, if that changed since the executor last parked, else
        None (a job waiting for its input parks often, held by the same pointstamps)."""
        report = self.report()
        holds = {  # (each hold's own "held_by", whether this executor holds it, left out)
            name: {"frontier": report["frontiers"][name], "held_by": [
                {k: v for k, v in h.items() if k != "held_by"} for h in holding
            ]}
            for name, holding in report["holding"].items()
        }
        if holds == self._idle_holds:
            return None
        self._idle_holds = holds
        return holds or None

    def stuck(self) -> SlashError:
        return SlashError(f"pointstamp progress: the run ended with work outstanding: {self.report()['pointstamps']}")


# steps that pass records on as they are, or a subset, or with columns added: each row keeps
# its `Batch.times` (an exchange ships them); any other step makes new records
_KEEP_ROWS = (SourceNode, FilterNode, WithColumnNode, ProjectNode, Port, UnionNode, EnterNode, LeaveNode, FeedbackNode)


def _downstream(root: Node):
    """Every node below `root` once, each with whether a window lies between them (a window's
    results are at their window's end, whatever the times of the batches it read) and
    whether every step between keeps the rows' own times (`_KEEP_ROWS`)."""
    stack, seen = [(root, False, True)], set()
    while stack:
        node, timed, carried = stack.pop()
        if (id(node), timed, carried) in seen:
            continue
        seen.add((id(node), timed, carried))
        yield node, timed, carried
        timed = timed or isinstance(node, (WindowAggregate, LoopWindow))
        carried = carried and (
            isinstance(node, _KEEP_ROWS) or (isinstance(node, ExchangeNode) and node.carries_times)
        )
        children = [node.target] if isinstance(node, Port) else node.children
        stack.extend((child, timed, carried) for child in children)


def _holds(window: WindowAggregate | LoopWindow) -> frozenset[Timestamp]:
    if isinstance(window, LoopWindow):
        return window.holds()
    end = window.held()
    return frozenset() if end is None else frozenset((Timestamp(end),))


def _window_of(node: Node) -> WindowAggregate | LoopWindow | None:
    """The window a step runs: the node itself, or the window behind a route
    of a keyed window on several executors (`WindowRoute`)."""
    if isinstance(node, (WindowAggregate, LoopWindow)):
        return node
    return node.window if isinstance(node, WindowRoute) else None


def _in_order(entries) -> list[dict]:
    return sorted(entries, key=lambda e: (e["at"], e["time"]))


def _plain(time: Timestamp) -> list[int]:
    return [time.epoch, *time.counters]
