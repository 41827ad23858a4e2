"""Shared fixtures: every test starts with structlog's default configuration."""

import pytest
import structlog


@pytest.fixture(autouse=True)
def _reset_structlog():
    # the CLI configures logging globally; don't let one test's configuration leak into others
    yield
    structlog.reset_defaults()
    from slashrt._logging import configure_logging

    configure_logging("warning")  # what importing slashrt sets up: its events to stderr, warnings up
