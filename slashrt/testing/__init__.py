"""Public test helpers for slashrt, its transports and its operators.

- `check_channel(open_pair)`: the transport conformance kit. A backend supplies only a factory
  ``open_pair(spec) -> async context manager of (sender, receiver)``; the kit runs every generic
  check of the channel protocol (FIFO, credits, parking, control messages, malformed footers,
  `send_records`) on fresh pairs and raises AssertionError naming the first check that fails.
  `open_inproc_pair` is the reference factory, the in-process backend.
- `check_exchanges(transport, mode, executors=2)`: the same for a medium under the cluster
  runtime: one job per exchange mode (`EXCHANGE_MODES`: SSB fragments, SSB direct, UpPar) over
  exchange rings of 4 slots x 4 KiB that every channel must wrap at least `WRAPS` (100) times,
  compared exactly with a single-executor run, within a deadline (a stall fails, never hangs).
- `check_progress_bus(transport, executors=3)`: the same for the distributed progress protocol:
  2-4 real executor processes with progress buses over the medium (rings of 4 small slots each
  wraps at least 10 times) run a seeded workload; every view must end idle, and the processes'
  real order of events, replayed through the pure protocol, must be FIFO, lose nothing, match
  what each bus sent, and never put a frontier ahead of the global one.
- `MockClock`: trio's virtual clock. ``MockClock(autojump_threshold=0)`` (pytest-trio's
  ``autojump_clock`` fixture) jumps time forward whenever every task is parked, so timeouts,
  epochs and window timers run instantly and deterministically.
- `wait_all_tasks_blocked()`: returns once every other task is parked. Prove that something
  blocks by starting it in a task, awaiting this, and asserting it has not finished; never sleep.
- `hostile_connections(address, n)`: strangers without the cluster secret (idle, garbage, wrong
  secret, slowloris) connected to a listener while a block runs: a listener must not let them
  stall or break the real peers.
- `Sequencer`: forces an interleaving across tasks: ``async with seq(0): ...`` in one task runs
  before ``async with seq(1): ...`` in another, whatever the scheduler would have chosen.
- `redis_server()`: a real, throw-away redis-server (free loopback port, nothing on disk) for
  testing flows with `slashrt.connectors`; killed and reaped on exit (`RedisServer.kill()`
  makes it vanish mid-test).
"""

from trio.testing import MockClock, Sequencer, wait_all_tasks_blocked

from slashrt.testing._check_channels import OpenPair, check_channel, open_inproc_pair
from slashrt.testing._check_exchanges import EXCHANGE_MODES, WRAPS, check_exchanges
from slashrt.testing._check_progress import check_progress_bus
from slashrt.testing._hostile import HOSTILE_KINDS, Strangers, hostile_connections
from slashrt.testing._redis import RedisServer, redis_server

__all__ = [
    "EXCHANGE_MODES",
    "HOSTILE_KINDS",
    "MockClock",
    "OpenPair",
    "RedisServer",
    "Sequencer",
    "Strangers",
    "WRAPS",
    "check_channel",
    "check_exchanges",
    "check_progress_bus",
    "hostile_connections",
    "open_inproc_pair",
    "redis_server",
    "wait_all_tasks_blocked",
]
