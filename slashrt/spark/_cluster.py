"""A slashrt cluster whose sources are fed by ingest endpoints, one per executor, for a Spark
driver program that ingests into it while it runs.

    with IngestCluster(flow, executors=2) as cluster:          # executors ready, endpoints open
        ingest(df, cluster.targets("events"), secret=cluster.secret, end=True)
        result = cluster.result()

The coordinator (`slashrt.cluster.run_cluster_async`) runs in a background thread with an
`Ingest` input for every source; its `on_ready` callback hands over each executor's
`IngestTarget` before the run starts. `ingest` with the list of targets sends partition p to
executor p mod N, and each endpoint commits its own partitions: every executor's source is a
disjoint part of the DataFrame, as with `slashrt.run`'s share of an array, and the executors
merge their window state as in any cluster run.
"""

from __future__ import annotations

import functools

import structlog

from slashrt._runtime import check_rewindable
from slashrt.cluster import Ingest, run_cluster_async
from slashrt.cluster.coordinator import START_TIMEOUT
from slashrt.errors import DataflowError
from slashrt.spark._endpoint import BackgroundRun
from slashrt.spark._protocol import IngestTarget
from slashrt.transport._auth import generate_secret

__all__ = ["IngestCluster"]

log = structlog.get_logger("slashrt.spark.cluster")


class IngestCluster(BackgroundRun):
    """Run `flow` on a slashrt cluster (N local executor processes, or agents' "HOST:PORT"
    addresses) with every source fed by one ingest endpoint per executor.

    `inputs` may give some sources ordinary inputs (arrays, `PerExecutor`); every other source
    is ingested. Leaving the `with` block before the streams ended stops the job (executors
    are stopped, local processes reaped)."""

    thread_name = "slashrt-cluster"
    what = "the cluster"

    def __init__(
        self,
        flow,
        *,
        executors: int | list[str] = 2,
        transport: str = "tcp",
        mode: str = "slash",
        secret: bytes | None = None,
        inputs: dict | None = None,
        **options,
    ):
        super().__init__(flow)
        self.secret = secret or generate_secret()
        names = [spec.step_id.split(".", 1)[1] for spec in flow.sources()]
        given = dict(inputs or {})
        self.inputs = {name: given.pop(name, Ingest()) for name in names}
        if given:
            raise DataflowError(f"inputs for unknown sources {sorted(given)}; the sources are {names}")
        check_rewindable(flow, self.inputs, options)  # ingestion does not replay: refused when made
        self._serve = functools.partial(
            run_cluster_async, flow, self.inputs, executors=executors, transport=transport, mode=mode,
            secret=self.secret, on_ready=self._on_ready, **options,
        )
        self._targets: dict[str, list[IngestTarget]] | None = None

    def _on_ready(self, targets: dict[str, list[IngestTarget]]) -> None:
        self._targets = targets
        self._ready.set()

    def targets(self, source: str | None = None) -> list[IngestTarget]:
        """The source's endpoints, executor 0 first (give the list to `ingest`)."""
        if self._targets is None:
            raise RuntimeError("the cluster is not ready: use `with IngestCluster(...)` or start() first")
        if source is None:
            if len(self._targets) != 1:
                raise DataflowError(f"name the source: this dataflow ingests {sorted(self._targets)}")
            source = next(iter(self._targets))
        try:
            return self._targets[source]
        except KeyError:
            raise DataflowError(f"source {source!r} is not ingested; ingested: {sorted(self._targets)}") from None

    def start(self, timeout: float = START_TIMEOUT + 10) -> IngestCluster:
        """Start the coordinator; return once every executor is ready and its endpoints listen."""
        return super().start(timeout)
