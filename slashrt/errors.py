"""The exceptions slashrt raises; every one derives from SlashError."""

import contextlib

__all__ = [
    "SlashError",
    "SchemaError",
    "MalformedBuffer",
    "ChannelClosed",
    "OperatorError",
    "DataflowError",
    "OptionError",
    "SnapshotError",
    "SnapshotCorrupt",
    "SnapshotVersionError",
    "SnapshotWriteError",
    "ConnectorError",
    "RetryableError",
    "BrokerUnavailable",
    "ClusterError",
    "retryable_report",
    "first_error",
    "unwrap_groups",
]


class SlashError(Exception):
    """Base class of every slashrt error."""


class SchemaError(SlashError, ValueError):
    """A schema, a field name or a record layout does not fit."""


class MalformedBuffer(SlashError):
    """A buffer's footer or payload breaks the buffer format (bad magic, size, kind or sequence)."""


class ChannelClosed(SlashError):
    """The other end of a channel closed it, or it was closed after an error."""


class DataflowError(SlashError, ValueError):
    """The dataflow graph is not valid (unknown step, missing input, bad wiring)."""


class OptionError(SlashError, ValueError):
    """An option (of `run`, the logging set-up or the command line) is out of its range; names it."""


class SnapshotError(SlashError):
    """A snapshot (a checkpoint's state file or manifest) cannot be written or read; names it."""


class SnapshotCorrupt(SnapshotError):
    """A snapshot file or manifest is truncated, corrupt or missing; names the file and what is wrong."""


class SnapshotVersionError(SnapshotError):
    """A snapshot was written in a format this slashrt does not know (by a later slashrt)."""


class SnapshotWriteError(SnapshotError):
    """The store could not write a file of checkpoint `checkpoint` (a full disk, a lost mount):
    names the checkpoint and the `path`; the checkpoint is declined, not the job failed, up to
    the tolerated failures in a row (`CheckpointConfig.tolerable_failures`)."""

    def __init__(self, checkpoint: int, path: str, reason: str):
        super().__init__(f"checkpoint {checkpoint} could not be written to {path}: {reason}")
        self.checkpoint = checkpoint
        self.path = path
        self.reason = reason


class ConnectorError(SlashError):
    """An external system a source or sink talks to (a broker) cannot be reached, failed, or
    holds data the connector cannot read; names the system (its URL) and the item."""


class RetryableError(SlashError):
    """Raised by a user function for a transient failure (a service briefly away): on a cluster
    with a restart strategy (`run(..., restart=)`) the job restarts from its last complete
    checkpoint instead of failing; any other exception is a bug in the job and fails it."""


class BrokerUnavailable(ConnectorError, RetryableError):
    """A broker (its host:port and the step named) could not be reached or did not answer within
    its timeout: transient, like a service briefly away, so a restart strategy restarts the job
    from its last complete checkpoint and the connectors' two-phase commit keeps it exactly once."""


class ClusterError(SlashError):
    """An executor failed, vanished or could not be started; the job has no result.
    `retryable`: the cause was an executor's death (killed, exited, silent, its connection
    lost) or an operator's `RetryableError`, which a restart strategy may recover from; a
    failure in the job itself (a bug in a user function) is not."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


def retryable_report(report: str) -> bool:
    """Whether an executor's failure report (`TypeName: message`, or an OperatorError's text
    quoting its cause's type) is a transient failure: it names RetryableError or a subclass."""
    names, todo = set(), [RetryableError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return any(f"{name}:" in report for name in names)


class OperatorError(SlashError):
    """A user operator raised or returned something it must not; names the step."""

    def __init__(self, step_id: str, message: str):
        super().__init__(f"step {step_id!r}: {message}")
        self.step_id = step_id


def first_error(group: BaseExceptionGroup) -> BaseException | None:
    """The exception a user should see for a failed nursery: the first leaf that is not a
    cancellation (trio wraps even a single failure in an exception group); None if every
    leaf is a cancellation, which must propagate as it is."""
    import trio

    leaves = []

    def walk(exc):
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for exc in leaves:
        if not isinstance(exc, trio.Cancelled):
            return exc
    return None


@contextlib.asynccontextmanager
async def unwrap_groups():
    """Around a nursery: raise the failure itself (an OperatorError, a ChannelClosed), with its
    own cause and traceback, rather than the exception group trio wraps it in."""
    try:
        yield
    except BaseExceptionGroup as group:
        error = first_error(group)
        if error is None:
            raise
        error.__suppress_context__ = True  # the group is trio's wrapping, not a second error
        raise error
