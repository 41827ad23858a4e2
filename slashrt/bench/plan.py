"""The coordinator's side of a large job, without processes (Flink's scheduling of large jobs,
seed 001, measured its 10,000 x 10,000 all-to-all job the same way)::

    slashrt bench plan [--executors 10000] [--hosts-every 32] [--repeat 3] [--json]

The job has two steps joined all-to-all: a generated source (`PerExecutor`) and a keyed window
on the state backend (every executor ships to every other). For N executors and for N/10, it
times, best of `--repeat`:

- `plan_s`: the `ExecutionPlan` (the logical plan, an executor's plan, the exchange's group,
  the regions);
- `descriptors_s`: every executor's descriptor: its "job" message (the shared part built once,
  the own part per executor) and the table of the N channel ports its "peers" message holds
  (built once: the same bytes for all);
- `restart_set_s`: the executors a failure of one of them must restart (all of them: one
  region).

and reports the descriptors' bytes: `descriptor_bytes` (what executor i receives, the mean),
`descriptor_raw_bytes` (the same parts uncompressed) and `compression` (1 - compressed / raw,
over all executors), `port_table_bytes` and its bytes per executor (`port_bytes_per_executor`);
`peak_rss_mb` (this process's peak resident memory, the interpreter and its imports included:
`baseline_rss_mb` is before any planning). The ports are what agents would report: executors
`--hosts-every` to a host, each on an ephemeral port drawn at random (seeded), so regular
numbers do not flatter the compression. `growth` divides each figure at N by its figure at
N/10: about 10 is linear.
"""

from __future__ import annotations

import gc
import resource
import pickle
import time

import numpy as np

__all__ = ["bench"]

SCHEMA = {"t": "i8", "k": "i8", "v": "i8"}
FAILED = 0.5  # where in the job the failed executor is (a fraction of N)


def _events(index: int, executors: int) -> np.ndarray:  # (never called: no executor runs)
    return np.zeros(0, [(name, dtype) for name, dtype in SCHEMA.items()])


def _flow():
    from slashrt import Dataflow, Schema, Tumbling
    from slashrt.ops.sinks import Collect

    flow = Dataflow("plan")
    flow.source("events", Schema(SCHEMA), time="t").window(Tumbling(seconds=10)).count(key="k").sink(Collect())
    return flow


def _ports(executors: int, hosts_every: int, seed: int) -> list[tuple[str, int]]:
    rng = np.random.default_rng(seed)
    hosts = [f"10.{h >> 16 & 255}.{h >> 8 & 255}.{h & 255}" for h in range(-(-executors // hosts_every))]
    ports = rng.integers(32768, 61000, executors).tolist()  # Linux's ephemeral range
    return [(hosts[i // hosts_every], ports[i]) for i in range(executors)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(executors: int, *, hosts_every: int = 32, repeat: int = 3, seed: int = 0) -> dict:
    """The figures of one job size (module docstring)."""
    from slashrt.cluster import PerExecutor
    from slashrt.cluster._execution_plan import ExecutionPlan
    from slashrt.cluster._job import JobMessages, port_table

    flow = _flow()
    inputs = {"events": PerExecutor(_events, deterministic=True)}
    ports = _ports(executors, hosts_every, seed)
    best = {"plan_s": np.inf, "descriptors_s": np.inf, "restart_set_s": np.inf}
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        plan = ExecutionPlan(flow, executors, mode="slash")
        planned = time.perf_counter()
        common, own = plan.input_parts(inputs, lambda *_: None)
        messages = JobMessages(1.0, 10.0, flow=flow, executors=executors, transport="tcp", mode="slash",
                               partitions=256, epoch_bytes=64 << 20, options={}, common_inputs=common, checkpoint=None)
        jobs = [messages.message(i, own[i], ports[i][0]) for i in range(executors)]
        table = port_table(ports)
        described = time.perf_counter()
        restart = plan.restart_set([int(executors * FAILED)])
        restarted = time.perf_counter()
        for name, seconds in (("plan_s", planned - started), ("descriptors_s", described - planned),
                              ("restart_set_s", restarted - described)):
            best[name] = min(best[name], seconds)
    table_raw = len(pickle.dumps(ports, protocol=5))
    own_bytes = sum(len(j["own"]) for j in jobs)
    compressed = executors * (messages.shared_bytes + len(table)) + own_bytes
    raw = executors * (messages.shared_raw_bytes + table_raw) + own_bytes
    return {
        "executors": executors,
        **{k: round(v, 6) for k, v in best.items()},
        "regions": plan.regions,
        "restart_set_size": int(restart.size),
        "channels": plan.channels(),
        "descriptor_bytes": round(compressed / executors),
        "descriptor_raw_bytes": round(raw / executors),
        "compression": round(1 - compressed / raw, 4),
        "shared_bytes": messages.shared_bytes,
        "port_table_bytes": len(table),
        "port_table_raw_bytes": table_raw,
        "port_bytes_per_executor": round(len(table) / executors, 2),
        "check": _check(jobs, table, executors, ports, restart),
    }


def _check(jobs: list, table: bytes, executors: int, ports: list, restart) -> bool:
    """The descriptors give every executor its job and the ports back (a sample of them), and
    the restart set is every executor."""
    from slashrt.cluster._job import job_of, ports_of

    sample = sorted({0, executors // 2, executors - 1})
    ok = all(job_of(jobs[i]).index == i and job_of(jobs[i]).host == ports[i][0] for i in sample)
    return bool(ok and ports_of(table, executors) == [tuple(p) for p in ports] and restart.size == executors)


def bench(executors: int = 10_000, *, hosts_every: int = 32, repeat: int = 3, seed: int = 0) -> dict:
    """Both job sizes (N/10, then N) and the growth between them."""
    baseline = _rss_mb()
    small = measure(max(1, executors // 10), hosts_every=hosts_every, repeat=repeat, seed=seed)
    large = measure(executors, hosts_every=hosts_every, repeat=repeat, seed=seed)
    timed = ("plan_s", "descriptors_s", "restart_set_s", "port_table_bytes", "descriptor_bytes")
    growth = {k: round(large[k] / small[k], 2) if small[k] else None for k in timed}
    return {
        "query": "plan",
        **large,
        "plan_and_descriptors_s": round(large["plan_s"] + large["descriptors_s"], 6),
        "peak_rss_mb": round(_rss_mb(), 1),
        "baseline_rss_mb": round(baseline, 1),
        f"at_{small['executors']}": small,
        "growth": growth,
        "correct": large["check"] and small["check"],
    }
