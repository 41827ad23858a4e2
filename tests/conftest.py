"""Shared fixtures: every test starts with structlog's default configuration; `redis` is a real redis-server.
With PYTHONDONTWRITEBYTECODE set, slashrt and tests are compiled to bytecode once per session (`pytest_configure`)."""

import compileall
import sys
from pathlib import Path

import pytest
import structlog

ROOT = Path(__file__).resolve().parent.parent

# Tests that share something across processes run on one worker when the suite runs in several
# (`make test`: pytest-xdist, --dist loadgroup): Spark's session is one JVM per worker, and the
# network-namespace hosts draw their subnets at random from 200
_GROUPS = {"tests/spark/": "spark", "tests/cluster/test_netns.py": "netns"}


def pytest_configure(config):
    """Where PYTHONDONTWRITEBYTECODE is set, no process keeps the bytecode it compiled, and every
    process the suite starts (a cluster's zygote, a CLI run, a test's child) imports slashrt and
    often tests' modules: each compiled all of them again, about 0.3 s of CPU a process (a third
    of test_cli.py's). Compiled once here, before the workers start (into the ignored __pycache__)."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        for package in ("slashrt", "tests"):
            compileall.compile_dir(ROOT / package, quiet=1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for prefix, group in _GROUPS.items():
            if path.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _reset_structlog():
    # the CLI configures logging globally; don't let one test's configuration leak into others
    yield
    structlog.reset_defaults()
    from slashrt._logging import configure_logging

    configure_logging("warning")  # what importing slashrt sets up: its events to stderr, warnings up


@pytest.fixture
def redis():
    """A real redis-server per test (slashrt.testing.redis_server), killed and reaped whatever the
    test did: never skipped; a machine without redis-server fails, saying how to install it."""
    import shutil

    from slashrt.testing import redis_server
    from slashrt.testing._redis import NOT_INSTALLED

    if shutil.which("redis-server") is None:
        pytest.fail(NOT_INSTALLED, pytrace=False)
    with redis_server() as server:
        yield server
