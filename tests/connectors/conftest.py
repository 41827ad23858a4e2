"""A real redis-server per test (slashrt.testing.redis_server), killed and reaped whatever the
test did: never skipped; a machine without redis-server fails, saying how to install it."""

import shutil

import pytest

from slashrt.testing import redis_server
from slashrt.testing._redis import NOT_INSTALLED


@pytest.fixture
def redis():
    if shutil.which("redis-server") is None:
        pytest.fail(NOT_INSTALLED, pytrace=False)
    with redis_server() as server:
        yield server
