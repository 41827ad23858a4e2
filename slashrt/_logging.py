"""Where slashrt's log events go: standard error, quiet by default, at a level the user sets.

Library code only calls `structlog.get_logger("slashrt.<part>")`. What happens to those events:

* If the application configured structlog before importing slashrt, its configuration decides,
  as for any other library's events: slashrt never replaces it.
* Otherwise importing slashrt installs structlog's own defaults (so the application's loggers
  behave as if slashrt were not there) plus two things for loggers named ``slashrt...``:
  they print to standard error (standard output belongs to the program's results), and
  events below slashrt's level are dropped. The level is `configure_logging(level)`, else
  $SLASHRT_LOG_LEVEL, else ``warning``. An application configuring structlog later replaces
  what it passes, as usual.
* Processes slashrt starts (local executor agents, benchmark producers) get the level of the
  process that starts them (`level_name`).
* A channel's fault is logged at `fault_level(exc)`: bad bytes (`MalformedBuffer`) are a cause,
  at error wherever they come. A vanished peer is a cause too, except in a cluster's executor
  (`peer_losses_are_echoes`): there it follows a failure elsewhere, which the coordinator names
  once, so the executors' echoes ("channel lost", "job failed: ChannelClosed") go at debug.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

from slashrt.errors import OptionError, SlashError

__all__ = ["configure_logging", "level_name", "LEVELS", "ENV_VAR", "install", "fault_level", "peer_losses_are_echoes"]

LEVELS = ("debug", "info", "warning", "error")
ENV_VAR = "SLASHRT_LOG_LEVEL"
_DEFAULT = "warning"
_METHOD_LEVEL = {
    "debug": logging.DEBUG, "info": logging.INFO, "msg": logging.INFO, "warning": logging.WARNING,
    "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
_state = {"level": _DEFAULT, "peer_loss": None}


class _StderrLogger(structlog.PrintLogger):
    """A slashrt logger's output: whatever `sys.stderr` is at the time of each message (it may
    be replaced, e.g. by a test harness capturing output), not the stream seen at creation."""

    @property
    def _file(self):
        return sys.stderr

    @_file.setter
    def _file(self, value):
        pass


def _logger_factory(*args):
    name = args[0] if args else None
    if isinstance(name, str) and (name == "slashrt" or name.startswith("slashrt.")):
        return _StderrLogger()
    return structlog.PrintLogger()  # structlog's default for everyone else


def _drop_below_level(logger, method_name: str, event_dict):
    if isinstance(logger, _StderrLogger) and _METHOD_LEVEL.get(method_name, logging.INFO) < _METHOD_LEVEL[_state["level"]]:
        raise structlog.DropEvent
    return event_dict


def _parse(level, source: str) -> str:
    text = level.strip().lower() if isinstance(level, str) else level
    if text not in LEVELS:
        raise OptionError(f"{source} must be one of {', '.join(LEVELS)}, got {level!r}")
    return text


def install() -> None:
    """Route slashrt's events as the module docstring says, unless structlog is configured."""
    if structlog.is_configured():
        return
    defaults = structlog.get_config()["processors"]  # unconfigured: structlog's built-in defaults
    structlog.configure(processors=[_drop_below_level, *defaults], logger_factory=_logger_factory)


def configure_logging(level: str | None = None) -> None:
    """Set the level of slashrt's log events: "debug", "info", "warning" or "error"; None means
    $SLASHRT_LOG_LEVEL, else "warning". Raises SlashError for anything else. Events go to
    standard error unless your application configured structlog itself (see slashrt._logging)."""
    if level is None:
        env = os.environ.get(ENV_VAR)
        _state["level"] = _parse(env, f"${ENV_VAR}") if env else _DEFAULT
    else:
        _state["level"] = _parse(level, "the log level")
    install()


def level_name() -> str:
    """slashrt's current level, as handed to the processes it starts."""
    return _state["level"]


def _configure_from_environment() -> None:
    """At import: $SLASHRT_LOG_LEVEL if it is valid. A bad value must not break importing
    slashrt; the level stays "warning", and `configure_logging()` (the command line, agents)
    reports it."""
    try:
        configure_logging()
    except SlashError:
        configure_logging(_DEFAULT)


def peer_losses_are_echoes() -> None:
    """This process is one executor of a cluster: a peer's loss is logged at debug (see above)."""
    _state["peer_loss"] = "debug"


def fault_level(exc: BaseException | None, default: str = "error") -> str:
    """The level of a channel fault's log line: `default` for bad bytes (`exc` or one of its
    causes a `MalformedBuffer`) and, outside a cluster's executor, for a vanished peer too."""
    from slashrt.errors import MalformedBuffer

    for _ in range(16):  # (a chain of causes is short; the bound only guards against a cycle)
        if exc is None:
            break
        if isinstance(exc, MalformedBuffer):
            return default
        exc = exc.__cause__ or exc.__context__
    return _state["peer_loss"] or default
