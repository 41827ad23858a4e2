"""Logging set-up for the command line: structlog to standard error, at a chosen level.

Library code only calls `structlog.get_logger`; configuring output is the application's job,
which for the `slashrt` command is this module's.
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure"]


class _StderrLogger(structlog.PrintLogger):
    """Prints to whatever `sys.stderr` is at the time of each message (it may be replaced,
    e.g. by a test harness capturing output), not the stream seen at configuration."""

    @property
    def _file(self):
        return sys.stderr

    @_file.setter
    def _file(self, value):
        pass


def configure(level: str = "info") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *args: _StderrLogger(),
        cache_logger_on_first_use=False,
    )
