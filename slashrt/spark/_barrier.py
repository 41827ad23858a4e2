"""A slashrt cluster started as one Spark barrier stage: N tasks, one executor agent each.

    result = run_on_spark(spark, flow, {"events": records}, executors=4)

What happens, in every task of ``sc.parallelize(range(N), N).barrier().mapPartitions(...)``
(barrier mode: Spark schedules the N tasks together or not at all):

1. the task starts an executor agent (`python -m slashrt.cluster.agent --once --with-parent`,
   listening on the task's host; the cluster secret in its environment) and reads its address;
2. ``BarrierTaskContext.allGather("host:port")``: every task learns every agent's address;
3. task 0 runs the coordinator (`run_cluster_async(..., executors=addresses, transport="tcp")`)
   and yields the pickled `RunResult`; the other tasks wait for their agent to finish its job;
4. every task stops its agent on the way out, however it leaves (an agent also exits by
   itself when the Python worker that started it dies, and when its coordinator goes away).

The driver unpickles the result and fills the flow's `Collect` sinks as `slashrt.run` does.
A failure anywhere (an operator raising on one executor, an executor dying) fails task 0's
coordinator with a `ClusterError` naming the executor, which fails the barrier stage; Spark
does not retry a failed barrier result stage, and `run_on_spark` raises `ClusterError` with
that message on the driver.

The secret: by default a fresh one per run, shipped to the tasks inside the task's closure
(Spark serialises it into the task binary, which it does not log; the agents get it through
their environment, not their command line). On a cluster whose RPC is not encrypted
(`spark.network.crypto.enabled`), pass `secret_from_env=True` and give every Spark executor
`SLASHRT_SECRET_FILE` (or `SLASHRT_SECRET`) instead: nothing secret then travels with the task.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import tempfile
import time

import cloudpickle
import structlog
import trio

from slashrt._plan import build_plan, check_cluster_flow
from slashrt._plan import per_source
from slashrt._runtime import RunResult
from slashrt.cluster import ClusterError, Ingest, PerExecutor, run_cluster_async
from slashrt.errors import DataflowError
from slashrt.ops.sinks import Collect
from slashrt.ops.sources import validate_input
from slashrt.transport._auth import generate_secret, load_secret

__all__ = ["run_on_spark", "AGENT_START_TIMEOUT"]

log = structlog.get_logger("slashrt.spark.barrier")

AGENT_START_TIMEOUT = 60.0  # for an agent process to start listening
LAST_WORDS_S = 3.0  # a failed executor's task waits this long so that the coordinator's error wins


class _Agent:
    """One executor agent process started by a barrier task."""

    def __init__(self, host: str, secret: bytes, index: int):
        self.index = index
        from slashrt._logging import level_name

        cmd = [sys.executable, "-m", "slashrt.cluster.agent", "--listen", f"{host}:0", "--once", "--with-parent",
               "--log-level", level_name()]
        env = dict(os.environ, SLASHRT_SECRET=secret.hex(),
                   PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        env.pop("SLASHRT_SECRET_FILE", None)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], AGENT_START_TIMEOUT)
        line = self.proc.stdout.readline().decode(errors="replace") if ready else "nothing"
        words = line.split()
        if words[:2] != ["slashrt-agent", "listening"] or len(words) != 4:
            self.stop()
            raise ClusterError(f"executor {index}: its agent said {line!r} instead of its address ({self.last_words()})")
        self.address = f"{words[2]}:{words[3]}"

    def last_words(self, lines: int = 6) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "nothing on stderr"

    def wait(self) -> None:
        """Until the agent has run its job; raise if it failed."""
        code = self.proc.wait()
        if code != 0:
            raise ClusterError(f"executor {self.index}: its agent exited with code {code}: {self.last_words()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()


class _BarrierTask:
    """The mapPartitions function of the barrier stage (pickled to the tasks)."""

    def __init__(self, flow, inputs: dict, host: str | None, secret_hex: str | None, run_options: dict):
        self.flow, self.inputs, self.host, self.secret_hex, self.run_options = flow, inputs, host, secret_hex, run_options

    def __call__(self, _partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        secret = bytes.fromhex(self.secret_hex) if self.secret_hex else load_secret()
        host = self.host or ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
        agent = _Agent(host, secret, index)
        try:
            addresses = ctx.allGather(agent.address)
            if index == 0:
                result = trio.run(lambda: run_cluster_async(
                    self.flow, self.inputs, executors=addresses, transport="tcp", secret=secret, **self.run_options
                ))
                agent.wait()
                yield cloudpickle.dumps(result, protocol=5)
            else:
                try:
                    agent.wait()
                except ClusterError:
                    time.sleep(LAST_WORDS_S)  # let task 0 report the job's failure, naming the root cause
                    raise
        finally:
            agent.stop()


_ERROR = re.compile(r"ClusterError: (.*)")


def _spark_failure(exc: BaseException) -> str:
    """The slashrt error inside a failed Spark job's message (else its first line)."""
    text = str(exc)
    found = _ERROR.findall(text)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("at ")]
    return " ".join(lines[-3:]) if lines else type(exc).__name__


def run_on_spark(
    spark,
    flow,
    inputs: dict,
    *,
    executors: int = 2,
    mode: str = "slash",
    host: str | None = None,
    secret: bytes | None = None,
    secret_from_env: bool = False,
    **options,
) -> RunResult:
    """Run `flow` over `inputs` on `executors` slashrt executors started as the tasks of one
    Spark barrier stage (see the module docstring); return the `RunResult` on the driver.

    `spark` is a SparkSession (or SparkContext). `inputs` are as for `slashrt.run` on a cluster:
    arrays (split across the executors) or `PerExecutor` functions (run on each executor).
    Executors listen on loopback under a local master and on their task's host otherwise
    (`host=` overrides). `mode`, `partitions`, `epoch_bytes`, `slots`, ... as for `slashrt.run`.
    The stage needs `executors` task slots at once."""
    sc = getattr(spark, "sparkContext", spark)
    if executors < 1:
        raise DataflowError(f"need at least one executor, got {executors}")
    slots = sc.defaultParallelism
    if executors > slots:
        raise DataflowError(
            f"{executors} executors need {executors} Spark task slots at once (a barrier stage), and this Spark "
            f"application has {slots} (its default parallelism)"
        )
    if any(isinstance(v, Ingest) for v in inputs.values()):
        raise DataflowError("Ingest inputs are for IngestCluster; a barrier-mode cluster takes arrays or PerExecutor")
    plan = build_plan(flow)  # a bad dataflow or input fails here, not in a task
    check_cluster_flow(flow)
    for step_id, spec, value in per_source(plan, inputs, "input"):
        if not isinstance(value, PerExecutor):
            validate_input(step_id, spec.schema, value)
    if host is None and sc.master.startswith("local"):
        host = "127.0.0.1"
    secret_hex = None if secret_from_env else (secret or generate_secret()).hex()
    options = dict(options, mode=mode)
    task = _BarrierTask(flow, inputs, host, secret_hex, options)
    bound = log.bind(flow=flow.name, executors=executors, mode=mode)
    bound.info("starting a slashrt cluster as a Spark barrier stage")
    sc.setJobDescription(f"slashrt: {flow.name} on {executors} executors")
    try:
        rows = sc.parallelize(range(executors), executors).barrier().mapPartitions(task).collect()
    except Exception as exc:  # the job failed: Py4JJavaError or a PySpark exception carrying the task's
        message = _spark_failure(exc)
        bound.error("the Spark barrier stage failed", error=message)
        raise ClusterError(f"slashrt on Spark ({executors} barrier tasks) failed: {message}") from exc
    finally:
        sc.setJobDescription(None)
    if len(rows) != 1:
        raise ClusterError(f"the barrier stage returned {len(rows)} results, expected one (from task 0)")
    result: RunResult = cloudpickle.loads(rows[0])
    for node in plan.sinks:
        if isinstance(node.sink, Collect):  # the user's own Collect sinks, as a local run fills them
            node.sink.open()
            part = result.outputs.get(node.step_id)
            if part is not None:
                node.sink.write(part)
            node.sink.close()
            result.outputs[node.step_id] = node.sink.records
    bound.info("slashrt cluster on Spark finished", seconds=round(result.seconds, 6), records=result.records)
    return result
