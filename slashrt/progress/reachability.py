"""Reachability: the least path summaries between every pair of locations, and could-result-in.

A graph is nodes with numbered input and output ports. A location is one port: `Location(node,
port, "in")` or `Location(node, port, "out")`. Edges go from an output to an input and keep the
timestamp; inside a node, summaries say how a timestamp at an input may change on its way to an
output (the identity for ordinary operators; ingress, egress and feedback nodes change it).

Worked example (the seed's loop context): a source feeds a loop whose body also reads the
loop's feedback; the body's result leaves the loop.

    source.out0 -> ingress -> body.in0
                              body.out0 -> feedback(+1) -> body.in1
                              body.out0 -> egress -> sink.in0

A record at body.in0 with timestamp (e, <c>) could result in a record at body.in1 with
(e, <c + 1>) (through the feedback) and at sink.in0 with (e) (through the egress). The least
summary from body.in0 to itself is the identity (the empty path); around the cycle it is
feedback(1), which strictly advances, so the cycle is legal. A cycle whose summary does not
strictly advance (no feedback of its loop on it) would let a timestamp wait on itself: `build`
refuses it with a DataflowError naming the cycle's nodes.

`Builder.build()` computes, once, for every location a and every location b the antichain of
least summaries over all paths a -> b (a fixed point over antichains: extend paths one step at
a time, keep a summary only if no kept one is <= it; it terminates because going around a
legal cycle makes a summary strictly larger, and around an illegal one changes it only once). Laws (tests/progress/test_reachability.py):

- `could_result_in(a, ta, b, tb)` iff some path a -> b maps ta to a timestamp <= tb
  (checked against enumerating paths on random graphs);
- every location reaches itself with the identity; could_result_in(a, t, a, t') iff t <= t';
- transitive: a,ta could-result-in b,tb and b,tb could-result-in c,tc => a,ta could-result-in c,tc.

Cost: O(locations * edges * summaries) once, when the plan is built; queries are O(summaries).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from slashrt.errors import DataflowError
from slashrt.progress.antichain import Antichain
from slashrt.progress.summary import EGRESS, IDENTITY, INGRESS, PathSummary, feedback
from slashrt.progress.timestamp import Timestamp

__all__ = ["Location", "Builder", "Reachability"]


class Location(NamedTuple):
    """One port of one node: kind "in" (an input; data in flight on edges waits here) or
    "out" (an output; an operator's capabilities live here)."""

    node: int
    port: int
    kind: str

    @classmethod
    def input(cls, node: int, port: int = 0) -> Location:
        return cls(node, port, "in")

    @classmethod
    def output(cls, node: int, port: int = 0) -> Location:
        return cls(node, port, "out")


class _Node(NamedTuple):
    name: str
    inputs: int
    outputs: int
    summaries: dict[tuple[int, int], Antichain]


class Builder:
    """Nodes and edges of a graph; `build()` checks it and computes its least summaries."""

    def __init__(self) -> None:
        self._nodes: list[_Node] = []
        self._edges: list[tuple[Location, Location]] = []

    def add_node(
        self,
        name: str,
        inputs: int = 1,
        outputs: int = 1,
        summaries: Mapping[tuple[int, int], PathSummary | Iterable[PathSummary]] | None = None,
    ) -> int:
        """A node; `summaries` maps (input port, output port) to the summary (or summaries) of
        that pair; a pair left out has no path. None: the identity from every input to every
        output (an ordinary operator). Returns the node's id."""
        if any(node.name == name for node in self._nodes):
            raise DataflowError(f"progress graph: two nodes are named {name!r}")
        if summaries is None:
            summaries = {(i, o): IDENTITY for i in range(inputs) for o in range(outputs)}
        table: dict[tuple[int, int], Antichain] = {}
        for (i, o), summary in summaries.items():
            if not (0 <= i < inputs and 0 <= o < outputs):
                raise DataflowError(f"progress graph: node {name!r} has no port pair ({i}, {o})")
            table[(i, o)] = Antichain([summary] if isinstance(summary, PathSummary) else summary)
        self._nodes.append(_Node(name, inputs, outputs, table))
        return len(self._nodes) - 1

    def add_ingress(self, name: str) -> int:
        return self.add_node(name, summaries={(0, 0): INGRESS})

    def add_egress(self, name: str) -> int:
        return self.add_node(name, summaries={(0, 0): EGRESS})

    def add_feedback(self, name: str, step: int = 1) -> int:
        return self.add_node(name, summaries={(0, 0): feedback(step)})

    def connect(self, source: int, source_port: int, target: int, target_port: int = 0) -> None:
        """An edge from output `source_port` of `source` to input `target_port` of `target`."""
        for node, port, side in ((source, source_port, "outputs"), (target, target_port, "inputs")):
            if not 0 <= node < len(self._nodes) or not 0 <= port < getattr(self._nodes[node], side):
                raise DataflowError(f"progress graph: an edge names a missing port ({node}, {port})")
        self._edges.append((Location.output(source, source_port), Location.input(target, target_port)))

    def build(self) -> Reachability:
        return Reachability(self._nodes, self._edges)


class Reachability:
    """The least path summaries between all locations of a checked graph."""

    def __init__(self, nodes: list[_Node], edges: list[tuple[Location, Location]]):
        self.names = [node.name for node in nodes]
        self.locations: list[Location] = [
            Location(n, p, kind)
            for n, node in enumerate(nodes)
            for kind, count in (("in", node.inputs), ("out", node.outputs))
            for p in range(count)
        ]
        steps: dict[Location, list[tuple[Location, Antichain]]] = {loc: [] for loc in self.locations}
        for source, target in edges:
            steps[source].append((target, Antichain([IDENTITY])))
        for n, node in enumerate(nodes):
            for (i, o), summaries in node.summaries.items():
                steps[Location.input(n, i)].append((Location.output(n, o), summaries))
        self._steps = steps
        self.depths = self._depths()
        self._paths = {loc: self._least_paths(loc) for loc in self.locations}

    # --- queries -------------------------------------------------------------------------
    def summaries(self, a: Location, b: Location) -> Antichain:
        """The least summaries over all paths a -> b (empty: b is unreachable from a)."""
        return self._paths[a].get(b) or Antichain()

    def steps(self, a: Location) -> list[tuple[Location, Antichain]]:
        """The locations one edge or one node away from a, with that step's summaries."""
        return self._steps[a]

    def reachable_from(self, a: Location) -> dict[Location, Antichain]:
        return self._paths[a]

    def could_result_in(self, a: Location, ta: Timestamp, b: Location, tb: Timestamp) -> bool:
        for summary in self.summaries(a, b):
            result = summary.apply(ta)
            if result is not None and result.less_equal(tb):
                return True
        return False

    def name(self, location: Location) -> str:
        return f"{self.names[location.node]}.{location.kind}{location.port}"

    # --- construction --------------------------------------------------------------------
    def _least_paths(self, start: Location) -> dict[Location, Antichain]:
        """Least summaries of paths start -> b of length >= 1, checked for cycles, then the
        empty path (the identity) to start itself."""
        paths: dict[Location, Antichain] = {}
        witness: dict[tuple[Location, PathSummary], tuple[int, ...]] = {}
        work = deque([(start, IDENTITY, (start.node,))])
        while work:
            location, summary, nodes = work.popleft()
            for target, step in self._steps[location]:
                for s in step:
                    extended = summary.followed_by(s)
                    if paths.setdefault(target, Antichain()).insert(extended):
                        path = nodes if target.node == nodes[-1] else nodes + (target.node,)
                        witness[(target, extended)] = path
                        work.append((target, extended, path))
        for cycle in paths.get(start, ()):
            if not cycle.advances:
                names = " -> ".join(self.names[n] for n in witness[(start, cycle)])
                raise DataflowError(
                    f"progress graph: the cycle {names} does not advance any timestamp "
                    f"(summary {cycle!r}); every cycle must pass through a feedback node of its loop"
                )
        paths.setdefault(start, Antichain()).insert(IDENTITY)
        return paths

    def _depths(self) -> dict[Location, int]:
        """Loop depth of every location reachable from a node without inputs (depth 0); a
        location reached at two depths, or an egress outside any loop, is an error."""
        depths: dict[Location, int] = {}
        with_inputs = {loc.node for loc in self.locations if loc.kind == "in"}
        work = deque()
        for loc in self.locations:
            if loc.kind == "out" and loc.node not in with_inputs:
                depths[loc] = 0
                work.append(loc)
        while work:
            location = work.popleft()
            depth = depths[location]
            for target, step in self._steps[location]:
                for s in step:
                    if not s.applies_at(depth):
                        raise DataflowError(
                            f"progress graph: node {self.names[location.node]!r} leaves or advances a loop "
                            f"its input {location.port} is not in (loop depth {depth}, summary {s!r})"
                        )
                    after = s.depth_after(depth)
                    known = depths.get(target)
                    if known is None:
                        depths[target] = after
                        work.append(target)
                    elif known != after:
                        raise DataflowError(
                            f"progress graph: {self.name(target)} is reached inside {known} and "
                            f"inside {after} loops; a location belongs to one loop context"
                        )
        return depths

