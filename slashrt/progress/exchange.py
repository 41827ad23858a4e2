"""The distributed progress protocol, as a pure state machine per executor (Naiad section 3.3).

Every executor runs an instance of every operator. It tracks its part of the physical graph
but counts pointstamps of the logical graph: an update names the operator's port, not the
instance (the projection: `project` sums physical updates onto logical locations), so the
counts of all instances of a port add up in one pointstamp.

Each executor keeps a local view of the global counts (a `Tracker`: the sum of every update it
has received, its own included) and a buffer of its own updates not yet sent. Its updates go to
every other executor by FIFO broadcast (one FIFO channel per ordered pair; the caller moves the
messages, this module never does I/O). The seed's accumulation: an update (p, delta) may stay
in the buffer while

    (1) the local frontier could-result-in p (some pointstamp of the view could-result-in p), and
    (2) its net count, the view's count of p plus the buffered delta, is strictly positive;

as soon as one buffered update breaks a rule (after `record` or `receive`), the whole buffer is
sent as one message, positive changes before negative ones (so a receiver that applies a
message in pieces never sees a retirement before what it caused), and applied to the own view
at once. `flush()` sends the buffer unconditionally (call it when the executor goes idle, so
held updates cannot wait forever).

Why holding is safe: the buffer leaves whole, so a held +1 always travels with (or before) the
-1 of the cause that could-result-in it; holding a -1 only makes others more conservative. The
two rules decide only when to send: a -1 that would empty a pointstamp is what moves frontiers
(rule 2), and a +1 no pointstamp of the view could-result-in is news (rule 1). The property
test checks that sending part of the buffer instead breaks safety.

The contract callers keep: an executor records a +1 only for a pointstamp that something it
holds (a capability, or the record it consumes in the same batch) could-result-in, and records
the -1 of that cause in the same batch or a later one.

Laws (tests/progress/test_exchange.py, random FIFO-per-pair interleavings, 2-4 executors):
- safety: no executor's local frontier is ever ahead of the global frontier (the frontier of
  every update recorded so far, sent or buffered);
- liveness: once every executor has flushed and every message is delivered, every view equals
  the global counts, so every notification is eventually delivered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from slashrt.progress.antichain import ChangeBatch
from slashrt.progress.reachability import Location, Reachability
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Pointstamp, Tracker

__all__ = ["ProgressExchange", "Message", "project"]

Message = tuple[tuple[Pointstamp, int], ...]
"""One broadcast: (pointstamp, delta) pairs, every positive delta before every negative one."""


def project(updates: Iterable[tuple[tuple[object, Timestamp], int]], logical: Callable[[object], Location]) -> ChangeBatch:
    """Sum updates of physical locations (e.g. (executor, location) pairs) onto the logical
    locations `logical` maps them to."""
    batch = ChangeBatch()
    for (physical, time), delta in updates:
        batch.update((logical(physical), time), delta)
    return batch


class ProgressExchange:
    """One executor's side of the protocol: a view of the global counts and a send buffer."""

    def __init__(self, graph: Reachability, initial: Iterable[tuple[Pointstamp, int]] = ()):
        """`initial`: the pointstamps every executor starts with (e.g. every source instance's
        first capability, counted once per instance), known to all without a message."""
        self.view = Tracker(graph)
        self.view.update_iter(initial)
        self._buffer = ChangeBatch()
        self.sent = 0  # messages broadcast, for tests and metrics

    def record(self, updates: Iterable[tuple[Pointstamp, int]]) -> list[Message]:
        """Local events (projected pointstamps and deltas); returns the messages to broadcast."""
        self._buffer.extend(updates)
        return self._settle()

    def receive(self, message: Message) -> list[Message]:
        """Another executor's broadcast, in FIFO order per sender; returns messages to broadcast
        (the view moved, so a held update may have to go now)."""
        self.view.update_iter(message)
        return self._settle()

    def flush(self) -> list[Message]:
        """Send whatever is buffered."""
        return [self._send()] if not self._buffer.is_empty() else []

    def holds_nothing(self) -> bool:
        return self._buffer.is_empty()

    @property
    def buffered(self) -> list[tuple[Pointstamp, int]]:
        return self._buffer.items()

    def _settle(self) -> list[Message]:
        may_hold = self._may_hold
        for pointstamp, delta in self._buffer.items():
            if not may_hold(pointstamp, delta):
                return [self._send()]
        return []

    def _may_hold(self, pointstamp: Pointstamp, delta: int) -> bool:
        location, time = pointstamp
        view = self.view
        return view.count(location, time) + delta > 0 and not view.is_complete(location, time)

    def _send(self) -> Message:
        updates = self._buffer.drain()
        message = tuple([u for u in updates if u[1] > 0] + [u for u in updates if u[1] < 0])
        self.view.update_iter(message)
        self.sent += 1
        return message
