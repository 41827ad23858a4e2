"""The checkpoint coordinator's decisions, as a pure state object (no I/O: the cluster coordinator,
or a single executor, feeds it events and does what it answers).

Lifecycle of checkpoint n (docs/architecture.md, "Barrier snapshots"):

    trigger n -> sources record positions, emit barrier n -> every instance aligns, copies its
    state (sync), writes it (async), acks n -> all acked: complete -> sinks commit n

- Triggering (`maybe_trigger`, by the injected clock): only with an `interval` (off by default),
  at most `max_in_flight` pending, at least `interval` after the previous trigger (or the
  start) and `min_pause` after the previous checkpoint ended. `next_due` says when to ask again.
  `trigger_savepoint` starts one now, whatever the timing.
- Acknowledgements: every (operator step id, executor) instance must `ack(n, who, stats)`;
  the last one completes n and returns it (`CheckpointRecord`, status "completed"), which the sinks'
  two-phase commit and recovery use; completing n subsumes every older pending checkpoint.
- Aborts: `decline(n, who, reason)`, `expire()` (older than `timeout`), `executor_lost(e)`.
  An ack or decline for an aborted, subsumed or completed checkpoint is ignored (`ignored`).
- Failures: `decline(..., failed=True)` (its state could not be written: a full disk; or a
  sink could not pre-commit it: its broker away or hung), or
  `unwritten(n)` (every instance acked, its manifest could not be written) counts in `failures`, the failed checkpoints in a row; a completed one resets it. Once `failures` exceeds
  `tolerable_failures` (Flink's tolerable failed checkpoints), `failing` gives the sentence the
  job fails with; up to then a failed checkpoint is only declined and the next one is tried.
- `stop_with_savepoint()`: a final savepoint; when it completes the state is "stopped" (the
  job stops, `savepoint` is its checkpoint); if it aborts, "running" again (`stop_failure`).
- `StopTheWorld`: the synchronous baseline's phases for one checkpoint (halt, drain, snapshot,
  resume), Naiad's way, for the overhead comparison.

Laws (tests/snapshot/test_coordinator.py, random event sequences):
- a checkpoint completes iff every expected instance acked it before it was aborted, subsumed
  or timed out, and completions come in increasing order;
- never more than `max_in_flight` pending; triggers respect `interval` and `min_pause`;
- every trigger ends exactly once (completed or aborted), and `history` reports it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
import math
import time

from slashrt.errors import OptionError, SlashError
from slashrt.snapshot.restart import parse_seconds

__all__ = [
    "MODES",
    "AckStats",
    "CheckpointRecord",
    "CheckpointConfig",
    "CheckpointCoordinator",
    "CheckpointError",
    "StopTheWorld",
]

Instance = tuple[str, Hashable]  # (operator step id, executor)
MODES = ("abs", "sync")
AUTO = "auto"  # the alignment timeout's default: half the interval
Clock = Callable[[], float]
# failed checkpoints in a row a job survives: a disk filled for a few intervals (a log rotation,
# another job's spill) costs only the checkpoints it declined; one that stays full fails the job
TOLERABLE_FAILURES = 3


class CheckpointError(SlashError):
    """An event the checkpoint protocol does not allow (an ack from an instance that is not
    expected, twice, or for a checkpoint never triggered): a runtime bug, not user input."""


@dataclass(frozen=True)
class CheckpointConfig:
    """When and how to checkpoint. `interval` None: off (the default); seconds otherwise.
    `mode` "abs" (barriers, the default) or "sync" (the stop-the-world baseline).
    `tolerable_failures`: checkpoints in a row whose state could not be written (a full disk)
    that are only declined; one more fails the job (a completed checkpoint resets the count).
    `alignment_timeout`: a periodic checkpoint still aligning that long after its trigger is
    taken unaligned (seconds, 0: unaligned at once; None: always aligned; "auto", the default:
    half the interval; see `unaligned_after`, docs/architecture.md "Unaligned checkpoints")."""

    interval: float | None = None
    min_pause: float = 0.0
    max_in_flight: int = 1
    timeout: float = 600.0  # Flink's default, 10 min
    mode: str = "abs"
    tolerable_failures: int = TOLERABLE_FAILURES
    alignment_timeout: float | str | None = AUTO

    @property
    def unaligned_after(self) -> float | None:
        """Seconds after its trigger from which a periodic checkpoint is taken unaligned, or None.
        "auto" is half the interval: a job that keeps up aligns in far less and writes no
        in-flight data; a backpressured one's checkpoint completes within half an interval plus
        its write, so the next one triggers on time (the cadence holds)."""
        if self.mode == "sync" or self.interval is None or self.alignment_timeout is None:
            return None
        return self.interval / 2 if self.alignment_timeout == AUTO else self.alignment_timeout

    @classmethod
    def from_options(cls, interval=None, min_pause=0.0, max_in_flight=1, timeout=600.0, mode="abs",
                     tolerable_failures=None, alignment_timeout=AUTO) -> CheckpointConfig:
        """From user options (numbers of seconds or strings like '500ms'); OptionError if bad."""
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise OptionError(f"checkpoint max_in_flight must be a whole number >= 1, got {max_in_flight!r}")
        if tolerable_failures is None:
            tolerable_failures = TOLERABLE_FAILURES
        if isinstance(tolerable_failures, bool) or not isinstance(tolerable_failures, int) or tolerable_failures < 0:
            raise OptionError(f"checkpoint tolerable_failures must be a whole number >= 0, got {tolerable_failures!r}")
        if mode not in MODES:
            raise OptionError(f"checkpoint mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "sync" and max_in_flight != 1:
            raise OptionError(f"checkpoint mode 'sync' stops the world for one checkpoint at a time; max_in_flight must be 1, got {max_in_flight}")
        return cls(
            None if interval is None else parse_seconds(interval, "checkpoint interval", positive=True),
            parse_seconds(min_pause, "checkpoint min_pause"),
            max_in_flight,
            parse_seconds(timeout, "checkpoint timeout", positive=True),
            mode,
            tolerable_failures,
            alignment_timeout if alignment_timeout in (None, AUTO)
            else parse_seconds(alignment_timeout, "checkpoint alignment_timeout"),
        )


@dataclass(frozen=True)
class AckStats:
    """What one instance reports with its ack."""

    alignment_s: float = 0.0
    sync_s: float = 0.0
    async_s: float = 0.0
    bytes: int = 0


@dataclass
class CheckpointRecord:
    """The coordinator's record of one checkpoint: pending, then completed or aborted (with the
    reason). What a completed one wrote is in the snapshot store, not here."""

    checkpoint: int
    triggered: float
    savepoint: bool = False
    status: str = "pending"  # "pending", "completed", "aborted"
    ended: float | None = None
    reason: str | None = None
    acks: dict[Instance, AckStats] = field(default_factory=dict)
    unaligned: bool = False  # completed with records in flight (an unaligned checkpoint's channel state)

    @property
    def seconds(self) -> float:
        return math.nan if self.ended is None else self.ended - self.triggered

    @property
    def bytes(self) -> int:
        return sum(a.bytes for a in self.acks.values())

    def report(self) -> dict:
        """The per-checkpoint stats: duration, bytes, and the slowest instance's phases."""
        return {
            "checkpoint": self.checkpoint,
            "status": self.status,
            "savepoint": self.savepoint,
            "seconds": self.seconds,
            "bytes": self.bytes,
            "acks": len(self.acks),
            "max_alignment_s": max((a.alignment_s for a in self.acks.values()), default=0.0),
            "max_sync_s": max((a.sync_s for a in self.acks.values()), default=0.0),
            "max_async_s": max((a.async_s for a in self.acks.values()), default=0.0),
            "reason": self.reason,
            "unaligned": self.unaligned,
        }


class CheckpointCoordinator:
    """Decides when checkpoints start and when they are complete; see the module docstring.
    `instances`: every (step id, executor) that must acknowledge (`for_steps` builds them)."""

    def __init__(self, instances: Iterable[Instance], config: CheckpointConfig = CheckpointConfig(), clock: Clock = time.monotonic, first: int = 1, history: int = 100):
        self.instances = frozenset(instances)
        if not self.instances:
            raise CheckpointError("checkpoint coordinator: no operator instances to acknowledge checkpoints")
        self.config = config
        self.clock = clock
        self.state = "running"  # "stopping" (a stop-with-savepoint pending), "stopped"
        self.pending: dict[int, CheckpointRecord] = {}
        self.history: deque[CheckpointRecord] = deque(maxlen=history)  # the last ended ones, in order (bounded: a job runs for long)
        self.latest_completed: CheckpointRecord | None = None
        self.savepoint: CheckpointRecord | None = None  # the final one of a stop-with-savepoint
        self.stop_failure: str | None = None
        self.ignored = 0  # acks and declines for checkpoints no longer pending
        self.failures = 0  # checkpoints in a row that failed (`decline(failed=True)`, `unwritten`)
        self._streak = 0  # `failures` before the latest completion
        self._next = first  # after a recovery: one more than the checkpoint restored
        self._stop_at: int | None = None
        self._last_trigger = clock()  # the first periodic checkpoint comes one interval in
        self._last_end = -math.inf

    @classmethod
    def for_steps(cls, steps: Iterable[str], executors: Iterable[Hashable], config: CheckpointConfig = CheckpointConfig(), clock: Clock = time.monotonic, first: int = 1) -> CheckpointCoordinator:
        """A coordinator expecting an ack from every step on every executor."""
        executors = list(executors)
        return cls([(step, executor) for step in steps for executor in executors], config, clock, first)

    # --- triggering --------------------------------------------------------------------------
    def next_due(self) -> float | None:
        """The clock time from which `maybe_trigger` may start one (None: periodic checkpoints
        are off or stopped); it may still wait for a slot if `max_in_flight` are pending."""
        if self.config.interval is None or self.state != "running":
            return None
        return max(self._last_trigger + self.config.interval, self._last_end + self.config.min_pause)

    def maybe_trigger(self) -> CheckpointRecord | None:
        """Start the next periodic checkpoint if it is due (its barrier goes to the sources)."""
        due = self.next_due()
        if due is None or self.clock() < due or len(self.pending) >= self.config.max_in_flight:
            return None
        return self._trigger(savepoint=False)

    def trigger_savepoint(self) -> CheckpointRecord:
        """Start a savepoint now (user asked: it ignores interval, pause and the in-flight limit)."""
        if self.state != "running":  # stopping: the final savepoint is the last checkpoint
            raise CheckpointError(f"checkpoint coordinator: no savepoint can start while {self.state}")
        return self._trigger(savepoint=True)

    def stop_with_savepoint(self) -> CheckpointRecord:
        """Take a final savepoint, then stop: no periodic checkpoint starts meanwhile."""
        if self.state != "running":
            raise CheckpointError(f"checkpoint coordinator: cannot stop with a savepoint while {self.state}")
        self.state = "stopping"
        self.stop_failure = None
        checkpoint = self._trigger(savepoint=True)
        self._stop_at = checkpoint.checkpoint
        return checkpoint

    def _trigger(self, savepoint: bool) -> CheckpointRecord:
        now = self.clock()
        checkpoint = CheckpointRecord(self._next, now, savepoint)
        self._next += 1
        self._last_trigger = now
        self.pending[checkpoint.checkpoint] = checkpoint
        return checkpoint

    # --- acknowledgements and aborts -------------------------------------------------------------
    def ack(self, n: int, who: Instance, stats: AckStats = AckStats()) -> CheckpointRecord | None:
        """`who` has snapshotted checkpoint n; returns n if this completed it."""
        checkpoint = self._pending(n, who)
        if checkpoint is None:
            return None
        if who in checkpoint.acks:
            raise CheckpointError(f"checkpoint {n}: instance {who!r} acknowledged it twice")
        checkpoint.acks[who] = stats
        if len(checkpoint.acks) < len(self.instances):
            return None
        for older in [m for m in self.pending if m < n]:
            self._end(older, "aborted", f"subsumed by checkpoint {n}")
        self._end(n, "completed", None)
        self.latest_completed = checkpoint
        self._streak, self.failures = self.failures, 0  # (`unwritten` takes the streak back up)
        if self.state == "stopping" and n == self._stop_at:
            self.state = "stopped"
            self.savepoint = checkpoint
        return checkpoint

    def decline(self, n: int, who: Instance, reason: str, failed: bool = False) -> CheckpointRecord | None:
        """`who` cannot take checkpoint n (e.g. its alignment was subsumed): n is aborted.
        `failed`: its state could not be written, which counts in `failures`."""
        if self._pending(n, who) is None:
            return None
        if failed:
            self.failures = self._streak = self.failures + 1
        return self._end(n, "aborted", f"declined by {who!r}: {reason}")

    def unwritten(self, n: int, reason: str) -> CheckpointRecord | None:
        """Checkpoint n completed (every instance acked) but its manifest could not be written:
        it is aborted after all (nothing commits it) and counts as failed."""
        record = next((c for c in reversed(self.history) if c.checkpoint == n and c.status == "completed"), None)
        if record is None:
            return None
        record.status, record.reason = "aborted", reason
        if self.latest_completed is record:
            self.latest_completed = next((c for c in reversed(self.history) if c.status == "completed"), None)
        self.failures = self._streak = self._streak + 1
        return record

    def failing(self, cause: str, kind: str | None = None, broker: bool = False) -> str | None:
        """After a failed checkpoint (`cause`: the store's sentence naming it and its path, or
        with `broker` a sink's naming the broker that failed its pre-commit): the sentence the
        job fails with, or None (it is only declined, the next one is tried). A run's last
        checkpoint (`kind` "final" or "savepoint") has no next one: it always fails."""
        what = ("once the broker answers again, resume from the latest checkpoint (a restart strategy does so itself)"
                if broker else "free space there or checkpoint elsewhere, then resume from the latest checkpoint")
        if kind is not None:
            return f"{cause}; it was the run's {'savepoint' if kind == 'savepoint' else 'final checkpoint'}, so the job fails: {what}"
        if self.failures > self.config.tolerable_failures:
            return (f"{cause} ({self.failures} checkpoint{'s' if self.failures != 1 else ''} in a row failed, more than the "
                    f"{self.config.tolerable_failures} tolerated), so the job fails: {what}")
        return None

    def expire(self) -> list[CheckpointRecord]:
        """Abort the pending checkpoints older than the timeout."""
        now = self.clock()
        late = [n for n, c in self.pending.items() if now - c.triggered >= self.config.timeout]
        return [self._end(n, "aborted", f"timed out after {self.config.timeout:g} s") for n in late]

    def executor_lost(self, executor: Hashable) -> list[CheckpointRecord]:
        """An executor died: every pending checkpoint is aborted (recovery takes over)."""
        return [self._end(n, "aborted", f"executor {executor!r} was lost") for n in sorted(self.pending)]

    def report(self) -> list[dict]:
        """Per-checkpoint stats of the last `history` ended checkpoints."""
        return [c.report() for c in self.history]

    def _pending(self, n: int, who: Instance) -> CheckpointRecord | None:
        if who not in self.instances:
            raise CheckpointError(f"checkpoint {n}: {who!r} is not an operator instance of this job")
        if n >= self._next:
            raise CheckpointError(f"checkpoint {n}: acknowledged by {who!r} but never triggered")
        checkpoint = self.pending.get(n)
        if checkpoint is None:
            self.ignored += 1
        return checkpoint

    def _end(self, n: int, status: str, reason: str | None) -> CheckpointRecord:
        checkpoint = self.pending.pop(n)
        checkpoint.status, checkpoint.reason, checkpoint.ended = status, reason, self.clock()
        self._last_end = checkpoint.ended
        self.history.append(checkpoint)
        if status == "aborted" and self.state == "stopping" and n == self._stop_at:
            self.state = "running"
            self.stop_failure = f"stop-with-savepoint failed: checkpoint {n} was {reason}; the job keeps running"
        return checkpoint


class StopTheWorld:
    """The synchronous baseline for one checkpoint, as Naiad takes it: halt every source, drain
    (every instance has processed everything in flight), snapshot every instance, resume the
    sources. Each report returns the next command for everyone ("drain", "snapshot", "resume",
    "done") once the phase is complete, else None; a report out of phase is a CheckpointError.
    `phases` holds each phase's seconds. The coordinator triggers and completes the checkpoint as
    in ABS (`mode="sync"`): each instance acks it when it reports `snapshotted`."""

    ORDER = ("halt", "drain", "snapshot", "resume", "done")

    def __init__(self, checkpoint: int, sources: Iterable[Instance], instances: Iterable[Instance], clock: Clock = time.monotonic):
        self.checkpoint = checkpoint
        self.sources = frozenset(sources)
        self.instances = frozenset(instances)
        self.clock = clock
        self.phase = "halt"
        self.phases: dict[str, float] = {}
        self.acks: dict[Instance, AckStats] = {}
        self._waiting = set(self.sources)
        self._began = clock()

    def halted(self, source: Instance) -> str | None:
        return self._report("halt", source)

    def drained(self, instance: Instance) -> str | None:
        return self._report("drain", instance)

    def snapshotted(self, instance: Instance, stats: AckStats = AckStats()) -> str | None:
        command = self._report("snapshot", instance)
        self.acks[instance] = stats
        return command

    def resumed(self, source: Instance) -> str | None:
        return self._report("resume", source)

    def _report(self, phase: str, who: Instance) -> str | None:
        if phase != self.phase:
            raise CheckpointError(f"stop-the-world checkpoint {self.checkpoint}: {who!r} reported {phase} during {self.phase}")
        if who not in self._waiting:
            raise CheckpointError(f"stop-the-world checkpoint {self.checkpoint}: {who!r} reported {phase} twice or is not part of it")
        self._waiting.discard(who)
        if self._waiting:
            return None
        now = self.clock()
        self.phases[phase] = now - self._began
        self._began = now
        self.phase = self.ORDER[self.ORDER.index(phase) + 1]
        self._waiting = set(self.sources if self.phase == "resume" else self.instances)
        return self.phase
