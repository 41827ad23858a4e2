"""What transactional sinks published before a run, and the rules a run keeps with it.

A transactional sink's published output is final: a reader may already have taken it. So,
before anything starts (`check_run`, on one executor and in a cluster's coordinator):

* a run without a `checkpoint_dir` is refused when it has a transactional sink: nothing would
  ever commit its output (one executor's end is not the job's end, so it cannot commit alone);
  a `checkpoint_dir` without an interval takes one final checkpoint, which publishes it all;
* a resume never publishes again what a sink published: resuming from checkpoint r (or, asked
  for "latest" or a number, from nothing: no checkpoint verifies) while a sink already published
  the output of a checkpoint p > r is refused, naming the checkpoints, the sink and what to do.
  Replaying from r produces p's rows again, cut at other barriers where timing differs, so the
  sink cannot tell which of them it already holds: exact output is not possible, refusal is.
  (This happens only when the store lost or damaged checkpoint p: a sink publishes p only once
  p's manifest is written, and `latest()` skips only what does not verify.)
* no checkpoint number is used twice: the run numbers its checkpoints after both the store's
  highest (`SnapshotStore.next_checkpoint`, which remembers the numbers of lost directories) and
  every sink's highest published one, so no published part file is named again (a Redis sink
  would even drop a commit numbered at or below its marker).

A sink tells what it published through `published()`: the highest checkpoint whose output it
published, of any executor, or None (`PartFiles`: its directory's part names; `RedisStreamSink`:
its commit marker). A transactional sink without it (`Collect`: its records went to the runs
that committed them) is judged by the store's highest completed checkpoint
(`SnapshotStore.highest`): "latest" falling back below it is refused too, while an explicit
older `resume_from=n` is how a user takes that output again knowingly (a Collect's output is
per run; a directory's or stream's is one shared place, so there even an explicit one is
refused). In one run's recovery loop this refusal also stops a recovery that `Committed` would
have made exact (it drops what it kept of the newer checkpoints): that needs a damaged store
during the run.
"""

from __future__ import annotations

from slashrt.errors import DataflowError, SnapshotError

__all__ = ["check_run"]


def transactional(plan) -> list[tuple[str, object]]:
    """(step id, sink) of every sink of `plan` made with `transactional=True`."""
    return [(node.step_id, node.sink) for node in plan.sinks if getattr(node.sink, "transactional", False) is True]


def check_run(plan, store, resume_from, restored) -> int | None:
    """Refuse (one sentence) what the rules above forbid; returns the first checkpoint number
    the run may use (None without a store: a run without checkpoints)."""
    sinks = transactional(plan)
    if store is None:
        for step_id, sink in sinks:
            raise DataflowError(
                f"run(): sink {step_id!r} ({sink!r}) is transactional: it publishes only what a checkpoint commits, and "
                "this run takes none; give checkpoint_dir= (without checkpoint=, one final checkpoint publishes all of "
                "it at the end of the run), or make the sink without transactional=True"
            )
        return None
    published = {}
    for step_id, sink in sinks:
        tell = getattr(sink, "published", None)
        if callable(tell) and (p := tell()) is not None:
            published[step_id] = (sink, p)
    first = max([store.next_checkpoint(), *(p + 1 for _, p in published.values())])
    if resume_from is None:  # starting afresh, as asked: numbered after what was published
        return first
    r = None if restored is None else restored.number
    for step_id, (sink, p) in sorted(published.items(), key=lambda item: -item[1][1]):
        if r is None or p > r:
            raise SnapshotError(_refusal(store, step_id, sink, p, r))
    highest = store.highest()
    if resume_from == "latest" and highest is not None and (r is None or highest > r):
        for step_id, sink in sinks:  # a sink that cannot tell (Collect): "latest" fell back past `highest`
            if step_id not in published and not callable(getattr(sink, "published", None)):
                raise SnapshotError(_fell_back(store, step_id, sink, highest, r))
    return first


def _span(r: int, p: int) -> str:
    return f"checkpoint {p}'s" if p == r + 1 else f"checkpoints {r + 1} to {p}'s"


def _why(store) -> str:
    return "; ".join(f"checkpoint {s.checkpoint}: {s.reason}" for s in store.skipped)


def _fell_back(store, step_id: str, sink, highest: int, r: int | None) -> str:
    """A sink without `published()` (Collect): what it committed up to `highest` went to the runs
    that took those checkpoints; an explicit resume_from=r takes it again, knowingly."""
    why = _why(store) or f"checkpoint {highest} is gone from {store.directory}"
    if r is None:
        return (f"sink {step_id!r} ({sink!r}) returned the output of checkpoints up to {highest} to the runs that took "
                f"them, but no checkpoint in {store.directory} verifies ({why}), so starting afresh would return it "
                f"again: restore checkpoint {highest} there, or run without resume_from to start afresh knowingly")
    return (f"sink {step_id!r} ({sink!r}) returned the output of checkpoints up to {highest} to the runs that took them, "
            f"but the newest checkpoint that verifies is {r} ({why}), so this run would return {_span(r, highest)} "
            f"output again: restore checkpoint {highest} in {store.directory}, or give resume_from={r} to "
            "take it again knowingly")


def _refusal(store, step_id: str, sink, p: int, r: int | None) -> str:
    why = _why(store)
    kept = set(store.checkpoints())
    gone = [n for n in range(p, r or 0, -1) if n not in kept]
    if not why and gone:
        why = f"checkpoint {gone[0]} is gone from {store.directory}"
    because = f" ({why})" if why else ""
    if r is None:
        return (
            f"sink {step_id!r} ({sink!r}) already published the output of checkpoints up to {p}, but no checkpoint in "
            f"{store.directory} verifies{because}, so starting afresh would publish it again: restore checkpoint {p} "
            "there, or point the sink at a new directory (or stream) and run without resume_from"
        )
    return (
        f"sink {step_id!r} ({sink!r}) already published the output of checkpoints up to {p}, but the checkpoint to "
        f"resume from is {r}{because}, so the replay would publish {_span(r, p)} output again: restore "
        f"checkpoint {p} in {store.directory}, or point the sink at a new directory (or stream) and resume"
    )
