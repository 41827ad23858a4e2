"""Shared fixtures: every test starts with structlog's default configuration; `redis` is a real redis-server."""

import pytest
import structlog

# Tests that share something across processes run on one worker when the suite runs in several
# (`make test`: pytest-xdist, --dist loadgroup): Spark's session is one JVM per worker, and the
# network-namespace hosts draw their subnets at random from 200
_GROUPS = {"tests/spark/": "spark", "tests/cluster/test_netns.py": "netns"}


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
