"""A window step inside a loop: one window per iteration, each firing on its iteration's frontier.

Inside a loop a batch's logical time is ``(epoch, counters)``: the epoch is event time (the
watermark it was read at, or the end of the window that produced it) and the counters are the
loop iterations, innermost last. Timely-dataflow users expect a window there to aggregate
every iteration apart, so `LoopWindow` keeps one `WindowAggregate` per counters, made at the
iteration's first record, and routes each batch by the counters of its time.

Firing. Window ``[s, e)`` of iteration ``c`` fires once no record of event time < e at that
iteration or an earlier one can still arrive: the frontier at the step's input holds no time
``f <= (e - 1, c)`` in the timestamps' order (``f.epoch < e`` and ``f.counters <= c``
lexicographically). For iteration c that is the usual rule (``end <= watermark``) with the
watermark ``E_c = min(f.epoch for f in frontier if f.counters <= c)``; no such f (None) means
nothing can reach iteration c any more: its windows all fire and the iteration is forgotten
(its late count kept). Frontiers only advance, so a forgotten iteration never comes back.

Time of the results. Window ``[s, e)`` of iteration c emits at ``(e, c)``; each iteration's
window holds a capability at ``(end of its earliest window still to fire, c)`` (`holds`), which
is never below the frontier: a window that has not fired has a frontier time ``f <= (e - 1, c)``
at its input. A step after the window inside the loop should give the records it feeds back an
event time of at least e (e.g. `window_end`): a record whose event time lies below its
epoch is behind the watermark and may find its window fired.

Lateness is judged on the frontier as outside loops: a record is late exactly when its window
at its iteration has fired (counted, sent to the `late` sink, never dropped silently). A new
iteration's window starts where the frontier already stands (`fired_until` from ``E_c``), so it
judges a record exactly as a window that had seen every frontier move.
"""

from __future__ import annotations

from slashrt._batch import Batch
from slashrt._dataflow import WindowAggSpec
from slashrt.ops._node import Node
from slashrt.ops.window import WindowAggregate
from slashrt.progress.timestamp import Timestamp

__all__ = ["LoopWindow", "iteration_watermark"]


def iteration_watermark(frontier, counters: tuple[int, ...]) -> int | None:
    """The least epoch of the frontier's times at iteration `counters` or an earlier one (None:
    nothing can arrive there any more)."""
    return min((f.epoch for f in frontier if f.counters <= counters), default=None)


class LoopWindow(Node):
    """Keyed windowed aggregate inside a loop: a `WindowAggregate` per iteration (pointstamp
    progress only: graph flows run on it)."""

    def __init__(self, spec: WindowAggSpec, late_node: Node | None = None):
        super().__init__(spec.step_id)
        self.spec = spec
        self.size, self.slide = spec.assigner.size, spec.assigner.slide
        self.late_node = late_node
        self.windows: dict[tuple[int, ...], WindowAggregate] = {}  # counters -> that iteration's window
        self.frontier = None  # the input's frontier as last told (None: not told yet)
        self._forgotten_late = 0  # late records of iterations forgotten

    @property
    def late_records(self) -> int:
        return self._forgotten_late + sum(w.late_records for w in self.windows.values())

    async def push(self, batch: Batch) -> None:
        counters = self.clock.now.counters
        window = self.windows.get(counters)
        if window is None:
            window = self._window(counters)
            if self.frontier is not None:  # it starts where the frontier stands (nothing to fire yet)
                await window.on_frontier(iteration_watermark(self.frontier, counters))
        await window.push(batch)

    def _window(self, counters: tuple[int, ...]) -> WindowAggregate:
        """A new window for iteration `counters`, emitting to this step's children."""
        window = self.windows[counters] = WindowAggregate(self.spec, self.late_node)
        window.counters, window.clock, window.children = counters, self.clock, self.children
        return window

    async def on_frontier(self, frontier) -> None:
        """The input's frontier moved: every iteration fires what its watermark passed, in
        iteration order; an iteration nothing can reach any more fires all and is forgotten."""
        self.frontier = frontier
        for counters in sorted(self.windows):
            window = self.windows[counters]
            watermark = iteration_watermark(frontier, counters)
            await window.on_frontier(watermark)
            if watermark is None and not window.slices:
                self._forgotten_late += window.late_records
                del self.windows[counters]

    def holds(self) -> frozenset[Timestamp]:
        """The capabilities it holds: per iteration with state, the end of its earliest window
        still to fire at that iteration's counters."""
        held = ((w.held(), counters) for counters, w in self.windows.items())
        return frozenset(Timestamp(end, counters) for end, counters in held if end is not None)
