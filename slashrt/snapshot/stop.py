"""Stop with a savepoint: the handle a user gives `run(..., stop=)` and asks through.

`StopHandle.request()` may be called from anywhere: a task of the run's own trio run, another
thread, or a signal handler (it only sets a flag and, once the run has bound the handle, asks
trio's run to wake it: `TrioToken.run_sync_soon` is thread- and signal-safe). The run waits on
`wait()`; what it then does (a final savepoint, sources stopped after its barrier, the sinks
committed) is `slashrt.snapshot.runtime.Checkpointing`'s.
"""

from __future__ import annotations

import trio

__all__ = ["StopHandle", "check_checkpoint_options"]


class StopHandle:
    """Ask a checkpointed run to stop with a savepoint: `run(..., checkpoint_dir=D, stop=handle)`,
    then `handle.request()`. A request made before the run starts stops it at its first barrier."""

    def __init__(self):
        self.requested = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._event: trio.Event | None = None

    def request(self) -> None:
        """Stop the run with a savepoint (again: nothing more); safe from any thread or signal handler."""
        self.requested = True
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._wake, idempotent=True)
            except trio.RunFinishedError:  # the run has ended meanwhile: nothing left to stop
                pass

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Inside the run: returns once a stop is requested (also one requested before)."""
        if self._event is not None:
            raise RuntimeError("a StopHandle serves one run at a time")
        self._event = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        try:
            if self.requested:  # asked before the token was there to wake us
                self._event.set()
            await self._event.wait()
        finally:
            self._event = self._token = None


def check_checkpoint_options(checkpoint_dir, checkpoint, resume_from, stop) -> None:
    """`run()`'s checkpoint options, on one executor or several: refuse, in one sentence, any of
    them without a `checkpoint_dir`, and a `stop` that is not a StopHandle."""
    from slashrt.errors import OptionError

    if checkpoint_dir is None and (checkpoint is not None or resume_from is not None or stop is not None):
        raise OptionError(
            "run(): checkpoint=, resume_from= and stop= need checkpoint_dir= (a directory or fsspec URL for the checkpoints)"
        )
    if stop is not None and not isinstance(stop, StopHandle):
        raise OptionError(f"run(): stop= takes a slashrt.StopHandle, got {type(stop).__name__}")
