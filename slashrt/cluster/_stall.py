"""An agent's stall watch: a thread that speaks for the executor while its event loop is stuck.

Heartbeats go out from the event loop, which turns at least every few ms however the user's
operators split their work (`slashrt.scheduler._budget.pace`). When it does not turn (one
user call runs long, or anything else that holds the loop), the loop's own heartbeats stop;
left at that, the coordinator would call the executor frozen, and could not say why. So:

::

    event loop: tick task ──> BUSY.turned = now, every `tick` s
    watch thread, every `tick` s: stuck = now - BUSY.turned
        stuck > 2 tick ──> heartbeat {"stalled_s": stuck, "step": BUSY.step, "what": BUSY.what}
                           on the control link, between the loop's messages (`Link.send_from_thread`)
    coordinator: stalled_s >= heartbeat_timeout ──> PeerStalled: "one on_batch() call of step
                           'x' has run for 5.1 s, longer than the heartbeat timeout ..."

The thread runs whenever the interpreter switches threads (every 5 ms of pure Python; a C
call that holds the GIL holds the thread too, and is then seen as silence). A stopped process
sends nothing at all: the coordinator's silence timeout still finds it.
"""

from __future__ import annotations

import contextlib
import threading
import time

import trio

from slashrt.cluster._liveness import HEARTBEAT, Link
from slashrt.scheduler._budget import BUSY

__all__ = ["stall_watch"]


@contextlib.asynccontextmanager
async def stall_watch(link: Link, nursery):
    """Watch this process's event loop while the block runs; report a stuck one on `link`."""
    tick = min(link.interval, link.timeout / 8)
    stop, scope = threading.Event(), trio.CancelScope()

    async def ticker() -> None:
        with scope:
            while True:
                BUSY.turned = time.monotonic()
                await trio.sleep(tick)

    def watch() -> None:
        while not stop.wait(tick):
            stuck = time.monotonic() - BUSY.turned
            if stuck > 2 * tick:
                link.send_from_thread(HEARTBEAT, {"stalled_s": stuck, "step": BUSY.step, "what": BUSY.what})

    thread = threading.Thread(target=watch, name="slashrt-stall-watch", daemon=True)
    BUSY.turned = time.monotonic()  # (the ticker's first turn is still to come)
    nursery.start_soon(ticker)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        scope.cancel()
