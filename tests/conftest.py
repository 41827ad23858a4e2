"""Shared fixtures: every test starts with structlog's default configuration; `redis` is a real redis-server.
Once per session (`pytest_configure`): with PYTHONDONTWRITEBYTECODE set, slashrt and tests are
compiled to bytecode; tmp_path is on tmpfs."""

import compileall
import os
import sys
from pathlib import Path

import pytest
import structlog

ROOT = Path(__file__).resolve().parent.parent
SHM, SHM_ROOM = "/dev/shm", 4 << 30  # (a passed test's tmp_path goes at its teardown: pyproject.toml)

# Tests that share something across processes run on one worker when the suite runs in several
# (`make test`: pytest-xdist, --dist loadgroup): Spark's session is one JVM per worker, and the
# network-namespace hosts draw their subnets at random from 200
_GROUPS = {"tests/spark/": "spark", "tests/cluster/test_netns.py": "netns"}


def pytest_configure(config):
    """In the session's first process, before the workers start. Where PYTHONDONTWRITEBYTECODE
    is set, no process keeps the bytecode it compiled, and every process the suite starts (a
    cluster's zygote, a CLI run, a test's child) imports slashrt and often tests' modules: each
    compiled all of them again, about 0.3 s of CPU a process (a third of test_cli.py's), so
    they are compiled once here (into the ignored __pycache__)."""
    if hasattr(config, "workerinput"):
        return
    if sys.dont_write_bytecode:
        for package in ("slashrt", "tests"):
            compileall.compile_dir(ROOT / package, quiet=1)
    # Checkpoints fsync every part and directory they write, and on a virtual disk each fsync
    # waits for the device: tmp_path (where the tests' checkpoints and sinks go) is in memory,
    # on tmpfs, unless told otherwise or /dev/shm is small (a container's 64 MiB). No test
    # depends on a disk (a full one is a small tmpfs of its own: tests/snapshot/test_disk_full.py);
    # the calls are the same.
    if config.option.basetemp is None and "PYTEST_DEBUG_TEMPROOT" not in os.environ and _room(SHM) >= SHM_ROOM:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = SHM


def _room(directory: str) -> int:
    """Bytes this process may still write in `directory` (0: none, or no such directory)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize if os.access(directory, os.W_OK) else 0


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
