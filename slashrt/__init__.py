"""slashrt: distributed stateful stream processing after the Slash design.

The public surface is this module plus `slashrt.sinks`, `slashrt.testing` and
`slashrt.transport`. Layers depend downwards only::

    slashrt (Dataflow, run)          public API and runtime (_dataflow, _plan, _runtime, _run, cli)
      ├── slashrt.ops                operators: stateless, windows, sources, sinks
      │     └── slashrt.ssb          CRDT partial state (and the shared state backend)
      ├── slashrt.scheduler          the trio executor: compute and polling coroutines
      └── slashrt.transport          the channel protocol and one module per medium
            └── slashrt._buffer      the flat buffer format (payload, footer, flag last)
    slashrt._kernels                 native C kernels (native/) with numpy fallbacks

`transport` imports nothing from `ops` or `ssb`.
"""

from slashrt._logging import _configure_from_environment, configure_logging

_configure_from_environment()  # before anything logs: slashrt's events to stderr, warnings and up

from slashrt._batch import Batch
from slashrt._dataflow import ConnectedStreams, Dataflow, Loop, Stream, WindowedStream
from slashrt._inputs import Paced
from slashrt._latency import LatencyHistogram
from slashrt._run import run
from slashrt._runtime import ChannelFailed, RunResult, run_async
from slashrt._schema import Schema
from slashrt.errors import (
    ChannelClosed,
    DataflowError,
    MalformedBuffer,
    OperatorError,
    SchemaError,
    SlashError,
)
from slashrt.ops.operator import Context, Operator
from slashrt.ops.window import Sliding, Tumbling
from slashrt.progress.timestamp import Timestamp
from slashrt.snapshot.state_format import State
from slashrt.snapshot.stop import StopHandle
from slashrt import sinks
from slashrt import _version

__version__ = _version.__version__

__all__ = [
    "Batch",
    "ChannelClosed",
    "ChannelFailed",
    "ConnectedStreams",
    "Context",
    "DataflowError",
    "Dataflow",
    "LatencyHistogram",
    "Loop",
    "MalformedBuffer",
    "Operator",
    "OperatorError",
    "Paced",
    "RunResult",
    "Schema",
    "SchemaError",
    "SlashError",
    "Sliding",
    "State",
    "StopHandle",
    "Stream",
    "Timestamp",
    "Tumbling",
    "WindowedStream",
    "configure_logging",
    "run",
    "run_async",
    "sinks",
]
