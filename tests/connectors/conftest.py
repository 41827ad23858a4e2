"""A real redis-server per test (slashrt.testing.redis_server): never skipped; a machine
without redis-server fails, saying how to install it."""

import pytest

from slashrt.testing import redis_server
from slashrt.testing._redis import NOT_INSTALLED


@pytest.fixture
def redis():
    try:
        server = redis_server()
        running = server.__enter__()
    except FileNotFoundError:
        pytest.fail(NOT_INSTALLED, pytrace=False)
    try:
        yield running
    finally:
        server.__exit__(None, None, None)
