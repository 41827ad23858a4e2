"""Turn a Dataflow's step specs into runtime nodes wired as its graph: one node per step, fused
into a pipeline where a step has one reader, reached through a `Port` where it has several.

Every flow is a dataflow graph (a linear one is a graph without fan-in) whose operators learn
that a time is complete from one pointstamp tracker (`slashrt.scheduler._pointstamp`). In a
multi-executor run (`ClusterRole` given) a keyed window becomes an *exchange*: mode "slash"
folds its records into fragments shipped to the keys' owners as partial states (`SsbRoute`,
the Slash State Backend), mode "uppar" routes the records to their key's owner (`WindowRoute`
in front of the window); inside a loop one window per iteration. An `exchange(key=)` step
routes records by key (`ExchangeNode`). Exchanges talk to the other executors through
channels that the cluster runtime wires with `add_peer` and `inbound`.
"""

from __future__ import annotations

import attrs

from slashrt._dataflow import (
    ApplySpec,
    Dataflow,
    EnterSpec,
    ExchangeSpec,
    FeedbackSpec,
    FilterSpec,
    LeaveSpec,
    OperatorSpec,
    UnionSpec,
    ProjectSpec,
    SinkSpec,
    SourceSpec,
    WindowAggSpec,
    WithColumnSpec,
)
from slashrt.errors import DataflowError
from slashrt.ops._node import Node
from slashrt.ops.event_time import SourceNode
from slashrt.ops.loop_window import LoopWindow
from slashrt.ops.operator import EnterNode, FeedbackNode, LeaveNode, OperatorNode, Port, UnionNode
from slashrt.ops.route import ExchangeNode, WindowRoute
from slashrt.ops.sinks import SinkNode
from slashrt.ops.stateless import ApplyNode, FilterNode, ProjectNode, WithColumnNode
from slashrt.ssb.graph_window import SsbRoute
from slashrt.ops.window import WindowAggregate
from slashrt.scheduler._pointstamp import progress_graph
from slashrt.ssb.partitions import Partitioning

__all__ = ["Plan", "build_plan", "check_cluster_flow", "ClusterRole", "MODES", "per_source"]

MODES = ("slash", "uppar")


@attrs.frozen
class ClusterRole:
    """This executor's place in a multi-executor run."""

    index: int
    partitioning: Partitioning
    mode: str = "slash"
    epoch_bytes: int = 64 << 20
    ssb_routing: str = "auto"  # the SSB windows' routing (`SsbRoute`): auto, fragments or direct

    def __attrs_post_init__(self):
        if self.mode not in MODES:
            raise DataflowError(f"unknown mode {self.mode!r}; choose one of {list(MODES)}")

    def exchange(self, spec: ExchangeSpec) -> ExchangeNode:
        return ExchangeNode(spec, index=self.index, partitioning=self.partitioning)

    def on_fragments(self, spec: WindowAggSpec, up) -> bool:
        """Does this keyed window run on the state backend (`SsbRoute`)? In mode "slash", where
        its records need a route."""
        routed = isinstance(up, ExchangeSpec) and up.key == spec.key
        return self.mode == "slash" and self.partitioning.executors > 1 and not routed

    def window(self, spec: WindowAggSpec, late: SinkNode | None, up) -> Node:
        """A keyed window, firing on the distributed pointstamp frontier. In
        mode "uppar" its rows go to their key's owner (`WindowRoute`), whose window (a plain
        one, or inside a loop a `LoopWindow`: one per iteration, the rows' times with their
        loop counters travel with them) takes them; in mode "slash" every executor folds them
        into fragments shipped to the owners as partial states (`SsbRoute`). No route where
        they arrive routed by that key already (`exchange(key=)` of the window's key just before)."""
        if self.partitioning.executors == 1 or (isinstance(up, ExchangeSpec) and up.key == spec.key):
            return LoopWindow(spec, late) if spec.scope else WindowAggregate(spec, late)
        if self.on_fragments(spec, up):
            return SsbRoute(spec, late, index=self.index, partitioning=self.partitioning, epoch_bytes=self.epoch_bytes,
                            routing=self.ssb_routing)
        window = LoopWindow(spec, late) if spec.scope else WindowAggregate(spec, late)
        return WindowRoute(spec, window, index=self.index, partitioning=self.partitioning)


class Plan:
    def __init__(
        self, roots: dict[str, Node], sources: dict[str, SourceSpec], sinks: list[SinkNode], flow: Dataflow | None = None,
        steps: dict[str, Node] | None = None, graph=None,
    ):
        self.roots = roots  # source step id -> pipeline root
        self.sources = sources
        self.sinks = sinks
        self.flow = flow
        self.steps = steps or {}  # step id -> its node (every step once, in the flow's order)
        self.graph = graph  # the progress graph (a Reachability), checked

    def nodes(self):
        """Every runtime node reachable from a source, once (a node read by several steps is
        reached on several paths)."""
        seen = set()
        for root in self.roots.values():
            for node in root.walk():
                if id(node) not in seen:
                    seen.add(id(node))
                    yield node

    def windows(self) -> list[WindowAggregate | LoopWindow]:
        return [n for n in self.nodes() if isinstance(n, (WindowAggregate, LoopWindow))]

    def exchanges(self) -> list[ExchangeNode]:
        """The operators that exchange state or records with other executors."""
        return [n for n in self.nodes() if isinstance(n, ExchangeNode) and n.partitioning]


def build_plan(flow: Dataflow, cluster: ClusterRole | None = None) -> Plan:
    sources = {s.step_id: s for s in flow.sources()}
    if not sources:
        raise DataflowError(f"dataflow {flow.name!r} has no source")
    sinks: list[SinkNode] = []

    def build(spec) -> Node:
        if isinstance(spec, UnionSpec):
            return UnionNode(spec.step_id)
        if isinstance(spec, OperatorSpec):
            return OperatorNode(spec)
        if isinstance(spec, EnterSpec):
            return EnterNode(spec.step_id)
        if isinstance(spec, LeaveSpec):
            return LeaveNode(spec.step_id)
        if isinstance(spec, FeedbackSpec):
            return FeedbackNode(spec, None)  # its entry is wired below
        if isinstance(spec, ExchangeSpec):
            return ExchangeNode(spec) if cluster is None else cluster.exchange(spec)
        if isinstance(spec, SourceSpec):
            node = SourceNode(spec.step_id, spec.time, spec.max_delay)
        elif isinstance(spec, ApplySpec):
            node = ApplyNode(spec)
        elif isinstance(spec, FilterSpec):
            node = FilterNode(spec)
        elif isinstance(spec, WithColumnSpec):
            node = WithColumnNode(spec)
        elif isinstance(spec, ProjectSpec):
            node = ProjectNode(spec)
        elif isinstance(spec, WindowAggSpec):
            late = None
            if spec.late is not None:
                late = SinkNode(f"{spec.step_id}.late", spec.late, spec.late_dtype)
                sinks.append(late)
            if cluster is not None:
                node = cluster.window(spec, late, flow.steps.get(spec.up))
            elif spec.scope:  # inside a loop: a window per iteration
                node = LoopWindow(spec, late)
            else:
                node = WindowAggregate(spec, late)
        elif isinstance(spec, SinkSpec):
            node = SinkNode(spec.step_id, spec.sink, spec.dtype)
            sinks.append(node)
        else:  # pragma: no cover - every spec type is listed above
            raise DataflowError(f"unknown step {spec!r}")
        return node

    # a graph (loops, several inputs) is checked before it is wired: a cycle without a
    # feedback is refused naming its steps
    fragments = frozenset(
        s.step_id for s in flow.steps.values()
        if isinstance(s, WindowAggSpec) and cluster is not None and cluster.on_fragments(s, flow.steps.get(s.up))
    )
    graph = progress_graph(flow, fragments)
    # every step once; a step read by several (a union, a two-input operator, a loop's entry)
    # is reached through a Port naming the input, so it is called synchronously from each
    steps = {step_id: build(spec) for step_id, spec in flow.steps.items()}
    for step_id, node in steps.items():
        spec = flow.steps[step_id]
        if isinstance(spec, FeedbackSpec):
            node.enter = steps[spec.into]  # its batches go back through the executor's queue
            continue
        node.children = [
            Port(steps[child.step_id], port) if hasattr(steps[child.step_id], "push_port") else steps[child.step_id]
            for child, port in flow.consumers(step_id)
        ]
    roots = {step_id: steps[step_id] for step_id in sources}
    for root in roots.values():
        root.watch()
    if not sinks:
        raise DataflowError(f"dataflow {flow.name!r} has no sink: nothing would see its results")
    return Plan(roots, sources, sinks, flow, steps, graph)


def check_cluster_flow(flow: Dataflow) -> None:
    """What a multi-executor run needs beyond a local one, checked before any executor starts:
    the type of every column an exchange step ships, and of every aggregated column, is known
    (executors exchange them in fixed-size rows)."""
    untyped = [s.step_id for s in flow.steps.values() if isinstance(s, ExchangeSpec) and s.dtype is None]
    if untyped:
        raise DataflowError(
            f"dataflow {flow.name!r}: exchange steps {untyped} ship records between executors, so every column's "
            "type must be known when the dataflow is built (give apply/operator a schema=, with_column a dtype=)"
        )
    for spec in flow.steps.values():
        if isinstance(spec, WindowAggSpec):  # the sentence its node says when planned, naming the with_column
            spec.shared_value_dtype(flow.steps)


def per_source(plan, given: dict, what: str):
    """(step id, spec, value) for every source of the plan, the value looked up by the source's
    name or step id in `given`; anything missing or left over is an error naming it."""
    by_name = {sid.split(".", 1)[1]: sid for sid in plan.sources}
    unknown = set(given) - set(by_name) - set(plan.sources)
    if unknown:
        raise DataflowError(f"{what}s for unknown sources {sorted(unknown)}; the sources are {sorted(by_name)}")
    for name, step_id in by_name.items():
        value = given.get(name, given.get(step_id))
        if value is None:
            raise DataflowError(f"no {what} given for source {name!r}")
        yield step_id, plan.sources[step_id], value
