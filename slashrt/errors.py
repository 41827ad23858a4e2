"""The exceptions slashrt raises; every one derives from SlashError."""

__all__ = [
    "SlashError",
    "SchemaError",
    "MalformedBuffer",
    "ChannelClosed",
    "OperatorError",
    "DataflowError",
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


class OperatorError(SlashError):
    """A user operator raised or returned something it must not; names the step."""

    def __init__(self, step_id: str, message: str):
        super().__init__(f"step {step_id!r}: {message}")
        self.step_id = step_id
