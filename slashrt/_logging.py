"""Logging set-up for the command line: structlog to standard error, at a chosen level.

Library code only calls `structlog.get_logger`; configuring output is the application's job,
which for the `slashrt` command is this module's.
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure"]


def configure(level: str = "info", stream=None) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    stream = stream or sys.stderr
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=stream.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
