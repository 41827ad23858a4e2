"""The coordinator's plan of a job on N executors and what it sends them, O(N) in time and
memory (after Flink's scheduling of large jobs, seed 001).

Every step of a flow runs on every executor. Between two steps an edge is either pointwise
(within an executor: a pipeline) or all-to-all (an exchange: every executor's instance sends
to every other's). An all-to-all edge is kept as one `AllToAll` group whose producers and
consumers are all N executors, never as its N(N-1) channels, so nothing the coordinator does
walks them: a job of 10,000 executors is as small to plan as one of 10.

Regions. Executors joined by an all-to-all exchange run and fail together: a flow with any
exchange is one region of every executor; a flow without one has a region per executor (its
pipelines never meet). They are derived from the flow's groups, not by a strongly connected
components search over channels: `region_of` is an array, and `restart_set(failed)`, the
executors a failure must restart, is one pass over it.

Descriptors. What executor i needs (`_job.Job`) is its index, its host, its own share of the
inputs, and parts every executor shares: the flow and the run's settings, the inputs every
executor opens alike (a `PerExecutor`, an `Ingest`), and the table of every executor's channel
port (every consumer of an exchange dials every producer: the same N addresses for all, Flink's
"shuffle descriptors"). Each shared part is serialized and compressed once per run
(`_job.JobMessages`, `port_table`) and the same bytes go to every executor; only the own part is
built per executor.
"""

from __future__ import annotations

import attrs
import numpy as np

from slashrt._plan import ClusterRole, build_plan, per_source
from slashrt.errors import DataflowError
from slashrt.ssb.partitions import Partitioning

__all__ = ["AllToAll", "ExecutionPlan"]


@attrs.frozen
class AllToAll:
    """An exchange step's channels: every executor sends to every other (N(N-1) of them,
    counted, never listed)."""

    step_id: str
    executors: int

    @property
    def channels(self) -> int:
        return self.executors * (self.executors - 1)


class ExecutionPlan:
    """A flow planned on `executors`: its logical plan (`logical`, as a local run builds it),
    an executor's plan (`executor`, as every agent builds its own), the exchanges' groups
    (`groups`) and regions (`region_of`)."""

    def __init__(self, flow, executors: int, *, mode: str = "slash", partitions: int = 256,
                 epoch_bytes: int = 64 << 20, ssb_routing: str = "auto"):
        if executors < 1:
            raise DataflowError(f"need at least one executor, got {executors}")
        self.flow = flow
        self.executors = executors
        self.logical = build_plan(flow)
        role = ClusterRole(0, Partitioning(partitions, executors), mode, epoch_bytes, ssb_routing)
        self.executor = build_plan(flow, role)  # executor 0's: every executor's has the same shape
        self.groups = tuple(AllToAll(x.step_id, executors) for x in self.executor.exchanges())
        # one region when any exchange joins the executors, else one each
        self.regions = 1 if self.groups else executors
        self.region_of = np.zeros(executors, np.int32) if self.groups else np.arange(executors, dtype=np.int32)

    def restart_set(self, failed) -> np.ndarray:
        """The executors (sorted) that a failure of `failed` (indexes) must restart: every
        executor of their regions."""
        failed = np.asarray(failed, dtype=np.int64).reshape(-1)
        if failed.size and (failed.min() < 0 or failed.max() >= self.executors):
            raise DataflowError(f"executors {failed.tolist()} are not all among the job's {self.executors}")
        hit = np.zeros(self.executors, bool)  # regions are numbered below N
        hit[self.region_of[failed]] = True
        return np.flatnonzero(hit[self.region_of])

    def channels(self) -> int:
        """The data channels of the job (the progress bus's not counted)."""
        return sum(g.channels for g in self.groups)

    def input_parts(self, inputs: dict, split) -> tuple[dict, list[dict]]:
        """The inputs split between what every executor shares (`PerExecutor`, `Ingest`: the
        same object for all, sent once) and what each executor owns: (common, [own of
        executor i]); `split(step_id, spec, value, executors)` gives the per-executor parts of
        any other input, or None for a common one."""
        common: dict = {}
        own: list[dict] = [{} for _ in range(self.executors)]
        for step_id, spec, value in per_source(self.logical, inputs, "input"):
            name = step_id.split(".", 1)[1]
            parts = split(step_id, spec, value, self.executors)
            if parts is None:
                common[name] = value
                continue
            for i in range(self.executors):
                own[i][name] = parts[i]
        return common, own
