"""Barrier alignment: when may an operator instance consume from an input, and when must it snapshot?

A pure state machine per operator instance (no I/O, no trio: the runtime feeds it events and
obeys its answers, as Flink's `checkpointing/` handlers are driven by the input gate). An
instance has N inputs (the channels from upstream steps and from peer executors). Events:

- `barrier(input, n)`: barrier n arrived on `input` (in band, after every record before it);
- `may_consume(input)`: the data query: may the instance take the next record of `input` now?
- `end(input)`: the input ended; an ended input counts as having delivered every later barrier;
- `blocked(input, nbytes)`: the caller tells how many bytes wait behind a barrier (for stats).

The runtime asks per batch (a ring slot), never per record, so none of this is on a hot path.

After barrier n on input i, i is blocked (the records behind the barrier wait in its ring, and
credits give backpressure) until every open input delivered n. Then the event's answer holds
`Snapshot(n)`: "snapshot now and forward barrier n on every output", exactly once, and every
input is open again.

A barrier m > n on an input while n is aligning: that input never delivered n (a blocked input
cannot deliver anything), so n cannot complete here. Flink's rule: n is aborted (the answer
holds `Abort(n)`, which the runtime reports to the coordinator as a decline), every input is
unblocked and m starts aligning with this input blocked. Queuing m behind n would wait forever.
A barrier below the current id (an aborted or already completed checkpoint) is stale: ignored
and counted in `stale`. A barrier on a blocked or ended input, or ids that do not increase on
one input, break the channel protocol: `BarrierError`.

Per checkpoint, `AlignmentStats` (returned with `Snapshot` and `Abort`): start and end times
from the injected clock, the input whose barrier came last, and the bytes reported blocked.

Laws (tests/snapshot/test_alignment.py, random interleavings of records and barriers on 1-4
inputs):
- consistency: the state at `Snapshot(n)` holds exactly the records before barrier n on every
  input (all of an input that ended before it), nothing after a barrier;
- liveness: once every open input delivered n, `Snapshot(n)` is answered and no input is blocked;
  a checkpoint whose barrier every input carries completes exactly once, in increasing order.

Cycles (the seed's algorithm 2) are `LoopHead`: alignment over the regular inputs only, then a
log of every record arriving on a back edge until barrier n returns on it; `back_edges` finds the
back edges of a graph.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
import time

from slashrt.errors import DataflowError, SlashError

__all__ = [
    "Abort",
    "AlignmentStats",
    "BarrierAligner",
    "BarrierError",
    "LogComplete",
    "LoopHead",
    "LoopLog",
    "Outcome",
    "Snapshot",
    "back_edges",
    "back_edges_of",
]

Input = Hashable
Clock = Callable[[], float]


class BarrierError(SlashError):
    """A channel broke the barrier protocol (a barrier on a blocked or ended input, or barrier
    ids that do not increase on one input): a bug of the sender or a corrupt channel."""


@dataclass
class AlignmentStats:
    """One checkpoint's alignment at one operator instance."""

    checkpoint: int
    started: float  # clock time of the first barrier n
    ended: float | None = None  # clock time of the last one (or of the abort)
    last_input: Input | None = None  # the input whose barrier completed the alignment
    blocked_bytes: int = 0  # bytes the caller reported waiting behind barrier n

    @property
    def seconds(self) -> float:
        return 0.0 if self.ended is None else self.ended - self.started


@dataclass(frozen=True)
class Snapshot:
    """Snapshot now, then forward barrier `checkpoint` on every output (answered once per n)."""

    checkpoint: int
    stats: AlignmentStats


@dataclass(frozen=True)
class Abort:
    """Checkpoint `checkpoint` cannot complete at this instance (subsumed by a newer barrier):
    decline it to the coordinator; do not snapshot it."""

    checkpoint: int
    stats: AlignmentStats
    reason: str


Outcome = Snapshot | Abort


@dataclass
class _Channels:
    """Which inputs are blocked or ended, and the last barrier each delivered."""

    inputs: tuple[Input, ...]
    blocked: set[Input] = field(default_factory=set)
    ended: set[Input] = field(default_factory=set)
    last: dict[Input, int] = field(default_factory=dict)

    def check(self, input: Input, n: int | None) -> None:
        if input not in self.inputs:
            raise BarrierError(f"alignment: {input!r} is not an input of this instance (inputs {list(self.inputs)})")
        if input in self.ended:
            raise BarrierError(f"alignment: input {input!r} delivered {'a barrier' if n is not None else 'end'} after it ended")
        if input in self.blocked:
            raise BarrierError(f"alignment: input {input!r} is blocked behind barrier {self.last[input]} yet delivered more")
        if n is not None and n <= self.last.get(input, -1):
            raise BarrierError(f"alignment: barrier {n} on input {input!r} after barrier {self.last[input]}; ids must increase")

    def all_delivered(self, n: int) -> bool:
        return all(i in self.ended or self.last.get(i, -1) >= n for i in self.inputs)


class _Idle:
    """No alignment in progress; `latest` is the newest checkpoint started here."""

    def __init__(self, latest: int):
        self.latest = latest

    def barrier(self, aligner: BarrierAligner, input: Input, n: int) -> _Idle | _Aligning:
        if n <= self.latest:
            aligner.stale += 1
            return self
        return _Aligning(n, AlignmentStats(n, aligner.clock())).barrier(aligner, input, n)

    def end(self, aligner: BarrierAligner, input: Input) -> _Idle:
        return self


class _Aligning:
    """Checkpoint n started; inputs that delivered it are blocked until all open ones have."""

    def __init__(self, n: int, stats: AlignmentStats):
        self.latest = n
        self.stats = stats

    def barrier(self, aligner: BarrierAligner, input: Input, n: int) -> _Idle | _Aligning:
        if n < self.latest:
            aligner.stale += 1
            return self
        if n > self.latest:  # this input skipped self.latest: it cannot complete (Flink's rule)
            aborted = self._finish(aligner, input)
            aligner.outcomes.append(Abort(self.latest, aborted, f"barrier {n} arrived on {input!r} before barrier {self.latest}"))
            return _Idle(self.latest).barrier(aligner, input, n)
        aligner.channels.blocked.add(input)
        return self._complete_if_aligned(aligner, input)

    def end(self, aligner: BarrierAligner, input: Input) -> _Idle | _Aligning:
        return self._complete_if_aligned(aligner, input)

    def _complete_if_aligned(self, aligner: BarrierAligner, input: Input) -> _Idle | _Aligning:
        if not aligner.channels.all_delivered(self.latest):
            return self
        aligner.outcomes.append(Snapshot(self.latest, self._finish(aligner, input)))
        return _Idle(self.latest)

    def _finish(self, aligner: BarrierAligner, last: Input) -> AlignmentStats:
        aligner.channels.blocked.clear()
        self.stats.ended = aligner.clock()
        self.stats.last_input = last
        return self.stats


class BarrierAligner:
    """Barrier alignment over `inputs` (their names: any hashable values) of one operator
    instance; `clock` (seconds, injected) times the alignments. See the module docstring."""

    def __init__(self, inputs: Iterable[Input], clock: Clock = time.monotonic):
        self.channels = _Channels(tuple(inputs))
        if not self.channels.inputs or len(set(self.channels.inputs)) != len(self.channels.inputs):
            raise BarrierError(f"alignment: an instance needs distinct inputs, got {list(self.channels.inputs)}")
        self.clock = clock
        self.stale = 0  # barriers below the current checkpoint id, ignored
        self.outcomes: list[Outcome] = []  # scratch of the event being handled
        self._state: _Idle | _Aligning = _Idle(-1)
        self._overtaken: dict[Input, int] = {}  # input -> barrier it delivered early (`overtake_inputs`)

    # --- events ----------------------------------------------------------------------------
    def barrier(self, input: Input, n: int) -> list[Outcome]:
        """Barrier n arrived on `input`: what to do now (in this order): `Abort`s, `Snapshot`s."""
        if n <= self._overtaken.get(input, -1):  # `overtake_inputs` counted it delivered already
            if n == self._overtaken[input]:
                del self._overtaken[input]
            self.stale += 1
            return []
        self.channels.check(input, n)
        self.channels.last[input] = n
        return self._run(lambda state: state.barrier(self, input, n))

    def end(self, input: Input) -> list[Outcome]:
        """`input` ended: it counts as having delivered every later barrier."""
        self.channels.check(input, None)
        self.channels.ended.add(input)
        return self._run(lambda state: state.end(self, input))

    def blocked(self, input: Input, nbytes: int) -> None:
        """`nbytes` more wait behind the barrier on `input` (counted into the alignment's stats)."""
        if isinstance(self._state, _Aligning) and input in self.channels.blocked:
            self._state.stats.blocked_bytes += nbytes

    def overtake(self, n: int, now: float) -> AlignmentStats:
        """Checkpoint n is taken unaligned now (its barriers overtook the records in front of
        them): every input is open again, barrier n (and older ones) still to come are stale.
        Returns n's stats (started at its first barrier here, or now)."""
        stats = self._state.stats if isinstance(self._state, _Aligning) and self._state.latest == n else None
        if isinstance(self._state, _Aligning) and self._state.latest <= n:
            self.channels.blocked.clear()
        if n > self._state.latest or stats is not None:
            self._state = _Idle(n)
        stats = stats or AlignmentStats(n, now)
        stats.ended = now
        return stats

    def overtake_inputs(self, inputs: Iterable[Input], n: int) -> list[Outcome]:
        """Barrier n overtakes what is in flight on `inputs` (the caller keeps it as their channel
        state): each counts as having delivered n now (blocked until the snapshot, as after its
        barrier), and barrier n (or an older one) arriving on it later is stale. The rest align
        as usual (an executor of a cluster overtakes its sources' rings only)."""
        outcomes = []
        for input in inputs:
            outcomes += self.barrier(input, n)
            self._overtaken[input] = n
        return outcomes

    # --- queries ---------------------------------------------------------------------------
    def may_consume(self, input: Input) -> bool:
        """May the instance take the next record (or barrier) of `input` now?"""
        return input not in self.channels.blocked and input not in self.channels.ended

    @property
    def aligning(self) -> int | None:
        """The checkpoint being aligned, or None."""
        return self._state.latest if isinstance(self._state, _Aligning) else None

    @property
    def latest(self) -> int:
        """The newest checkpoint id this instance has seen start (-1: none yet)."""
        return self._state.latest

    def _run(self, event) -> list[Outcome]:
        self.outcomes = []
        self._state = event(self._state)
        return self.outcomes


# --- cycles: the seed's algorithm 2 ---------------------------------------------------------


@dataclass(frozen=True)
class LoopLog:
    """What arrived on the back edges of a loop head between its snapshot n and the return of
    barrier n on each of them, in arrival order: part of snapshot n."""

    checkpoint: int
    entries: tuple[tuple[Input, object], ...]  # (back-edge input, batch)

    def replay(self):
        """On recovery, after restoring the state: feed each (input, batch), in this order, to
        the operator as if it had just arrived on that back edge, before any new input."""
        return iter(self.entries)


@dataclass(frozen=True)
class LogComplete:
    """Barrier `log.checkpoint` returned on every back edge: the snapshot taken at `Snapshot(n)`
    plus `log` is this instance's part of checkpoint n (acknowledge it now)."""

    log: LoopLog


class LoopHead:
    """Alignment for an instance with back-edge inputs (a loop head, the seed's algorithm 2).

    Barriers are aligned over the regular inputs only (waiting on a back edge would deadlock:
    barrier n comes back around the loop only after this instance forwards it). At `Snapshot(n)`
    the instance copies its state and forwards barrier n; from then on every batch arriving on
    a back edge is processed as usual and also logged (`record`), until barrier n returns on
    that edge; once it returned on all of them the answer holds `LogComplete(n)`. Back edges are
    never blocked. Several logs may be open at once (barrier n+1 aligned before n came back);
    a batch goes to every log still waiting on its edge.

    Law (tests/snapshot/test_alignment.py, random interleavings on a loop): the state copied at
    `Snapshot(n)`, with its log replayed and the loop run to quiescence, equals what a
    stop-the-world snapshot would hold: the records before barrier n on every regular input,
    run to quiescence.
    """

    def __init__(self, regular: Iterable[Input], back: Iterable[Input], clock: Clock = time.monotonic):
        self.aligner = BarrierAligner(regular, clock)
        self.back = tuple(back)
        if not self.back or set(self.back) & set(self.aligner.channels.inputs):
            raise BarrierError(f"loop head: needs back-edge inputs distinct from its regular ones, got {list(self.back)}")
        self.stale = 0  # barriers on back edges of checkpoints that were not logged here
        self._last_back: dict[Input, int] = {}
        self._ended_back: set[Input] = set()
        self._open: dict[int, tuple[set[Input], list[tuple[Input, object]]]] = {}  # n -> (waiting edges, log)

    def barrier(self, input: Input, n: int) -> list[Outcome | LogComplete]:
        if input not in self.back:
            return self._opening(self.aligner.barrier(input, n))
        self._check_back(input, n)
        self._last_back[input] = n
        if n not in self._open:
            self.stale += 1
            return []
        self._open[n][0].discard(input)
        return self._close_returned(n)

    def overtake(self, n: int, now: float) -> AlignmentStats:
        """Checkpoint n taken unaligned over the regular inputs (see `BarrierAligner.overtake`);
        the back edges' queue at that moment is its log (the caller takes it)."""
        return self.aligner.overtake(n, now)

    def trigger(self, n: int) -> list[Outcome | LogComplete]:
        """Checkpoint n was triggered after every regular input ended (they count as having
        delivered it): `Snapshot(n)` now, between two batches of the back edges, and its log
        opens, as if barrier n had just arrived on the last regular input."""
        channels = self.aligner.channels
        if set(channels.inputs) - channels.ended:
            raise BarrierError(f"loop head: checkpoint {n} triggered while regular inputs are open; their barriers align it")
        if n <= self.aligner.latest or n in self._open:
            self.stale += 1
            return []
        self.aligner._state = _Idle(n)
        now = self.aligner.clock()
        return self._opening([Snapshot(n, AlignmentStats(n, now, now))])

    def taken(self, n: int) -> None:
        """n's log was taken whole, as the back edges held it at the snapshot (a stop's
        savepoint: nothing runs after it): no barrier n is sent round, none is waited for."""
        self._open.pop(n, None)

    def record(self, input: Input, batch: object) -> None:
        """`batch` arrived on `input`; logged if it is a back edge that a log waits on. The log
        keeps `batch` itself: pass one the ring will not overwrite (a copy of the slot)."""
        for waiting, log in self._open.values():
            if input in waiting:
                log.append((input, batch))

    def end(self, input: Input) -> list[Outcome | LogComplete]:
        if input not in self.back:  # the last open regular input ending completes an alignment too
            return self._opening(self.aligner.end(input))
        self._check_back(input, None)
        self._ended_back.add(input)
        outcomes: list[Outcome | LogComplete] = []
        for n in sorted(self._open):
            self._open[n][0].discard(input)
            outcomes += self._close_returned(n)
        return outcomes

    def may_consume(self, input: Input) -> bool:
        return input in self.back or self.aligner.may_consume(input)

    @property
    def channels(self) -> _Channels:
        """The regular inputs: which are blocked or ended (back edges are never blocked)."""
        return self.aligner.channels

    @property
    def logging(self) -> list[int]:
        """Checkpoints whose back-edge log is still open."""
        return sorted(self._open)

    def _opening(self, outcomes: list[Outcome]) -> list[Outcome | LogComplete]:
        """The aligner's answer to a regular input's event, each `Snapshot(n)` opening n's log."""
        answer: list[Outcome | LogComplete] = []
        for outcome in outcomes:
            answer.append(outcome)
            if isinstance(outcome, Snapshot):
                self._open[outcome.checkpoint] = (set(self.back) - self._ended_back, [])
                answer += self._close_returned(outcome.checkpoint)
        return answer

    def _close_returned(self, n: int) -> list[LogComplete]:
        waiting, log = self._open[n]
        if waiting:
            return []
        del self._open[n]
        return [LogComplete(LoopLog(n, tuple(log)))]

    def _check_back(self, input: Input, n: int | None) -> None:
        if input in self._ended_back:
            raise BarrierError(f"loop head: back edge {input!r} delivered more after it ended")
        if n is not None and n <= self._last_back.get(input, -1):
            raise BarrierError(f"loop head: barrier {n} on back edge {input!r} after barrier {self._last_back[input]}; ids must increase")


def back_edges(edges: Iterable[tuple[Hashable, Hashable]], feedback: Iterable[Hashable] = (), node: Callable[[Hashable], Hashable] = lambda end: end) -> list[tuple[Hashable, Hashable]]:
    """The back edges L of a graph (the seed's static analysis): removing them leaves a DAG, on
    which plain alignment terminates; a loop head logs what arrives on them.

    `edges` are (from, to) pairs of endpoints (nodes, or ports that `node` maps to their node).
    With `feedback` markers (the nodes that close loops), the back edges are exactly the edges
    leaving a feedback node, and a cycle through no feedback node is a DataflowError naming it.
    Without markers, a depth-first search from the nodes without inputs (then any node left, in
    order of appearance) takes as back edges the edges into a node on the search stack."""
    edges = list(edges)
    feedback = set(feedback)
    order: dict[Hashable, None] = {}
    out: dict[Hashable, list[tuple[Hashable, Hashable]]] = {}
    for edge in edges:
        a, b = node(edge[0]), node(edge[1])
        order.setdefault(a)
        order.setdefault(b)
        out.setdefault(a, []).append(edge)
    targets = {node(edge[1]) for edge in edges}
    roots = [n for n in order if n not in targets] + list(order)
    back: list[tuple[Hashable, Hashable]] = []
    state: dict[Hashable, int] = {}  # 1: on the stack, 2: done
    for root in roots:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(out.get(root, ())))]
        while stack:
            here, todo = stack[-1]
            edge = next(todo, None)
            if edge is None:
                state[here] = 2
                stack.pop()
                continue
            if feedback and here in feedback:
                back.append(edge)
                continue
            there = node(edge[1])
            if state.get(there) == 1:
                if feedback:
                    cycle = [n for n, _ in stack[[n for n, _ in stack].index(there):]]
                    names = " -> ".join(map(str, cycle + [there]))
                    raise DataflowError(f"graph: the cycle {names} passes through no feedback node; close every loop with one")
                back.append(edge)
            elif there not in state:
                state[there] = 1
                stack.append((there, iter(out.get(there, ()))))
    return back


def back_edges_of(reachability) -> list[tuple[Hashable, Hashable]]:
    """The back edges of a progress graph (`slashrt.progress.reachability.Reachability`), as
    (output Location, input Location) pairs: the edges leaving its feedback nodes."""
    edges = [
        (location, target)
        for location in reachability.locations
        if location.kind == "out"
        for target, _ in reachability.steps(location)
    ]
    feedback = {
        location.node
        for location in reachability.locations
        if location.kind == "in"
        for _, summaries in reachability.steps(location)
        for s in summaries
        if s.advance and not s.pop and not s.push
    }
    return back_edges(edges, feedback, node=lambda location: location.node)
