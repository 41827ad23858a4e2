"""Multi-executor runs: a coordinator, executor agents, and how the input is shared.

`slashrt.run(flow, inputs, executors=N)` goes through `run_cluster_async`; `slashrt
executor` (`slashrt.cluster.agent`) is the process that runs one executor on a host; a
`Session` keeps local executors' fork server up between runs.
"""

from slashrt._inputs import Ingest, Paced, PerExecutor, share
from slashrt.cluster._zygote import Session
from slashrt.cluster.coordinator import ClusterError, run_cluster_async

__all__ = ["Ingest", "Paced", "PerExecutor", "Session", "share", "ClusterError", "run_cluster_async"]
