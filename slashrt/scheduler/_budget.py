"""How long the executor's event loop may go without turning, and what it is doing meanwhile.

A pipeline call is synchronous Python: the compute coroutine yields to trio only between
calls (`Executor.yield_every`), so a call that runs many user operator calls in a row (a
source cut into many pieces, a notification per time) would starve the loop's other tasks:
the control link's heartbeats, progress reports, pollers. `pace()`, awaited after every user
operator call, yields once the loop has not turned for `BUDGET_S`, so their period holds
whatever the operators do, short of one call that itself runs long.

`BUSY` says which user call runs now and since when it has not let the loop turn; an agent's
stall watch (`slashrt.cluster._stall`) reads it from another thread to name the step when one
call exceeds the heartbeat timeout.
"""

from __future__ import annotations

import time

import trio

__all__ = ["BUDGET_S", "BUSY", "pace", "calling"]

# yielding costs ~10 us; every 20 ms keeps heartbeats and reports to their period at ~0.05 %
BUDGET_S = 0.02


class _Busy:
    """The loop's last turn seen here, and the user call running now (None: none)."""

    __slots__ = ("turned", "step", "what")

    def __init__(self):
        self.turned = time.monotonic()
        self.step: str | None = None
        self.what = ""


BUSY = _Busy()


async def pace() -> None:
    """Let the event loop turn if it has not for `BUDGET_S`."""
    now = time.monotonic()
    if now - BUSY.turned >= BUDGET_S:
        await trio.lowlevel.checkpoint()
        BUSY.turned = time.monotonic()


class calling:
    """`with calling(step, "on_batch"):` around a user call: the stall watch names it, and
    restores the call it interrupted (an operator's emit runs the steps below it)."""

    __slots__ = ("step", "what", "_before")

    def __init__(self, step: str, what: str):
        self.step, self.what = step, what

    def __enter__(self):
        self._before = (BUSY.step, BUSY.what)
        BUSY.step, BUSY.what = self.step, self.what
        return self

    def __exit__(self, *exc):
        BUSY.step, BUSY.what = self._before
        return False
