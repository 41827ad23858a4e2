"""The two-phase-commit contract of exactly-once sinks, its recovery rule, and the file sinks' part.

A sink that takes part in checkpoints implements `TwoPhaseCommit`. Its output between two
barriers is one transaction, named by the checkpoint whose barrier closes it:

* `pre_commit(n)`, when barrier n reaches the sink: make the output since the previous barrier
  durable but invisible, as checkpoint n's. It is part of the sink's snapshot: checkpoint n
  completes only after every sink instance pre-committed it.
* `commit(n)`, once checkpoint n is complete: publish checkpoint n's output and any earlier
  pending one (of a checkpoint that was declined after this sink pre-committed it). Idempotent:
  repeating it (after a crash during the first) publishes nothing twice.
  A sink talking to a broker also has `a<call>` for each call (`apre_commit(n)`, `acommit(n)`,
  `aabort(n)`, `apending()`): the call queued in its worker thread when made, and an awaitable
  that finishes it, so the executor's loop goes on while the broker answers and the calls keep
  the order they were made in (`begin`, the one place that chooses; `commit_async`,
  `recover_async`).
* `abort(n)`: drop checkpoint n's pending output.
* `pending()`: the checkpoints pre-committed and not yet committed; a sink with durable pending
  output (files) finds them again in a new process.
* `published()` (optional): the highest checkpoint whose output it published, of any executor,
  None if none; with it a resume from an older checkpoint is refused and checkpoint numbers go
  on past it (`slashrt.snapshot.published`). A published part is never replaced: `commit`
  refuses to rename over one.

Output written after the last barrier belongs to no checkpoint: a recovery replays it, so a
sink drops what a previous run left of it when it opens. `recover(sink, restored)` applies the
rule of ABS recovery: pending output of checkpoints up to the restored one is committed (the
crash came between completion and commit), newer pending output is aborted (the sources rewind
to the restored checkpoint and produce it again). After it, the published output is exactly
what the restored checkpoint's inputs produced, once.

`PartFiles` is that contract for a directory of part files (CsvFile / ParquetFile with
`transactional=True`); `PendingRecords` for records kept in memory (Collect); a built-in sink
made without `transactional=True` has `NotTransactional`, which nothing is pending in and
which refuses the other calls.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from slashrt.errors import SnapshotError
from slashrt.snapshot._durable import fsync_path

__all__ = [
    "TwoPhaseCommit", "recover", "recover_async", "begin", "commit_async", "PartFiles", "PendingRecords",
    "NotTransactional",
]


@runtime_checkable
class TwoPhaseCommit(Protocol):
    """What a sink implements to give exactly-once output (see the module doc)."""

    def pre_commit(self, checkpoint: int) -> None: ...

    def commit(self, checkpoint: int) -> None: ...

    def abort(self, checkpoint: int) -> None: ...

    def pending(self) -> list[int]: ...


def begin(sink, call: str, *args):
    """Begin `sink.<call>(*args)` now. A sink with `a<call>` (a broker's) queues it in its worker
    thread, in the order its calls are begun (a pre-commit begun at the barrier comes after the
    writes before it and before the writes after it), and the awaitable returned finishes it;
    any other sink's call is made here and None is returned."""
    queued = getattr(sink, "a" + call, None)
    if queued is not None:
        return queued(*args)
    getattr(sink, call)(*args)
    return None


async def call_async(sink, call: str, *args):
    """`sink.<call>(*args)`, its result; a broker's sink answers from its worker thread while
    the executor's loop goes on (`begin`)."""
    queued = getattr(sink, "a" + call, None)
    return await queued(*args) if queued is not None else getattr(sink, call)(*args)


async def commit_async(sink: TwoPhaseCommit, checkpoint: int) -> None:
    """`sink.commit(checkpoint)`, off the executor's loop for a broker's sink (`begin`)."""
    await call_async(sink, "commit", checkpoint)


def settle(pending, restored: int | None) -> tuple[list[int], list[int]]:
    """The rule of recovery: of the `pending` checkpoints, those to commit (up to `restored`)
    and those to abort (newer; all of them when nothing is restored)."""
    pending = sorted(pending)
    committed = [n for n in pending if restored is not None and n <= restored]
    return committed, [n for n in pending if n not in committed]


def recover(sink: TwoPhaseCommit, restored: int | None) -> tuple[list[int], list[int]]:
    """Settle a sink's pending output after restoring checkpoint `restored` (None: starting
    afresh, nothing restored): commit pending checkpoints up to it, abort newer ones.
    Returns (committed, aborted) checkpoint numbers."""
    committed, aborted = settle(sink.pending(), restored)
    if committed:
        sink.commit(committed[-1])  # commits every pending one up to it
    for n in aborted:
        sink.abort(n)
    return committed, aborted


async def recover_async(sink: TwoPhaseCommit, restored: int | None) -> tuple[list[int], list[int]]:
    """`recover` from inside a run: a broker's sink settles from its worker thread (`begin`)."""
    committed, aborted = settle(await call_async(sink, "pending"), restored)
    if committed:
        await call_async(sink, "commit", committed[-1])
    for n in aborted:
        await call_async(sink, "abort", n)
    return committed, aborted


class PartFiles:
    """One sink instance's transactions in `directory`, as files named by checkpoint and executor.

        part-open-<executor><suffix>.inprogress   output since the last barrier (no checkpoint yet)
        part-<n>-<executor><suffix>.inprogress    pre-committed for checkpoint n: durable, invisible
        part-<n>-<executor><suffix>               committed: published

    Every step is one rename, made durable by fsyncing the file before and the directory after,
    so a crash at any moment leaves each file whole under one of the three names. Readers take
    the files without `.inprogress`."""

    def __init__(self, directory, executor: int, suffix: str):
        self.directory = Path(directory)
        self.executor = executor
        self.suffix = suffix
        self.open_path = self.directory / f"part-open-{executor}{suffix}.inprogress"
        self._pending_name = re.compile(rf"part-(\d+)-{executor}{re.escape(suffix)}\.inprogress$")
        self._published_name = re.compile(rf"part-(\d+)-\d+{re.escape(suffix)}$")  # of any executor

    def pending_path(self, n: int) -> Path:
        return self.directory / f"part-{n}-{self.executor}{self.suffix}.inprogress"

    def final_path(self, n: int) -> Path:
        return self.directory / f"part-{n}-{self.executor}{self.suffix}"

    def open(self) -> None:
        """Make the directory and drop output a previous run wrote after its last barrier."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.open_path.unlink(missing_ok=True)

    def pending(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        found = (self._pending_name.match(entry.name) for entry in os.scandir(self.directory))
        return sorted(int(m.group(1)) for m in found if m)

    def published(self) -> int | None:
        """The highest checkpoint whose part (of any executor sharing the directory) is published,
        None if none is (`slashrt.snapshot.published`)."""
        if not self.directory.is_dir():
            return None
        found = (self._published_name.match(entry.name) for entry in os.scandir(self.directory))
        return max((int(m.group(1)) for m in found if m), default=None)

    def pre_commit(self, n: int) -> None:
        """The open file (its writer closed by the sink) becomes checkpoint n's pending part;
        no file when nothing was written since the last barrier."""
        if not self.open_path.exists():
            return
        fsync_path(self.open_path)
        os.replace(self.open_path, self.pending_path(n))
        fsync_path(self.directory)

    def commit(self, n: int) -> None:
        published = False
        for c in self.pending():
            if c <= n:
                if self.final_path(c).exists():  # a published file is immutable: never replaced
                    raise SnapshotError(
                        f"checkpoint {c}: {self.final_path(c)} is already published (by an earlier run that numbered a "
                        f"checkpoint {c} too), so this run's part stays unpublished as {self.pending_path(c).name}: "
                        "point the sink at a new directory"
                    )
                os.replace(self.pending_path(c), self.final_path(c))
                published = True
        if published:
            fsync_path(self.directory)

    def abort(self, n: int) -> None:
        self.pending_path(n).unlink(missing_ok=True)


class PendingRecords:
    """The transactions of a sink that keeps records in memory: records since the last barrier,
    and per pre-committed checkpoint its records; `commit` hands over what to publish."""

    def __init__(self):
        self._open: list[np.ndarray] = []
        self._pending: dict[int, list[np.ndarray]] = {}

    def add(self, records: np.ndarray) -> None:
        self._open.append(records)

    def pending(self) -> list[int]:
        return sorted(self._pending)

    def pre_commit(self, n: int) -> None:
        if self._open:
            self._pending.setdefault(n, []).extend(self._open)
            self._open = []

    def commit(self, n: int) -> dict[int, list[np.ndarray]]:
        """The record batches to publish now, per checkpoint in checkpoint order (none when
        repeated): checkpoint n's and every earlier pending one's."""
        return {c: self._pending.pop(c) for c in sorted(c for c in self._pending if c <= n)}

    def abort(self, n: int) -> None:
        self._pending.pop(n, None)

    def pending_records(self) -> dict[int, list[np.ndarray]]:
        """Per pre-committed checkpoint its record batches: the part of a sink's snapshot that
        memory alone holds (files hold theirs)."""
        return {n: list(parts) for n, parts in self._pending.items()}

    def restore_pending(self, pending: dict[int, list[np.ndarray]]) -> None:
        self._open, self._pending = [], {n: list(parts) for n, parts in pending.items()}


class NotTransactional:
    """The transactions of a sink made without `transactional=True`: none pending; a checkpoint
    call says how to make the sink take part."""

    def __init__(self, sink):
        self._sink = sink

    def pending(self) -> list[int]:
        return []

    def _refuse(self, checkpoint: int):
        name = type(self._sink).__name__
        raise SnapshotError(
            f"checkpoint {checkpoint}: this {name} sink is not transactional; "
            f"make it with {name}(..., transactional=True) for exactly-once output"
        )

    pre_commit = commit = abort = _refuse
