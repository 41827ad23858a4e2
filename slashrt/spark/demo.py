"""`slashrt spark-demo`: the whole pipeline on local Spark, checked.

Spark generates YSB events (`generators.spark_stream`, `spark.range` plus an Arrow UDF), and
`ingest` pushes them into a 2-executor slashrt cluster (`IngestCluster`: two executor
processes over tcp, one ingest endpoint each; partition p goes to executor p mod 2); the
cluster runs the YSB query with its window state on the shared state backend. The result is
compared with `slashrt.bench.ysb.reference` over the same records made without Spark.

Timing starts when the ingest starts (the Spark session, its Python workers (a small
warm-up job) and the cluster are up) and stops when the cluster has its result. The time is split three ways:

- **transfer**: inside the Spark tasks, converting Arrow batches to records and sending them
  (which includes waiting for the endpoints' credits, i.e. the endpoints staging them), summed
  over tasks and divided by the number of tasks running at once; plus the driver's commit;
- **slashrt**: after the commit, until the cluster's result (the committed data is forwarded
  into the executors' sources and processed; windows fire; results are gathered);
- **spark**: the rest: planning, scheduling, Python workers, generating the rows and handing
  them to the ingest UDF as Arrow batches (the tasks' wait for their next batch).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import structlog

import slashrt
from slashrt.bench import ysb
from slashrt.spark import generators
from slashrt.spark._cluster import IngestCluster
from slashrt.spark._ingest import ingest

__all__ = ["run_demo", "local_session"]

log = structlog.get_logger("slashrt.spark.demo")


def local_session(master: str = "local[2]", *, app: str = "slashrt-spark-demo", driver_memory: str = "2g", conf=None):
    """The active SparkSession, else a new local one whose Python workers import this slashrt
    with this interpreter (no UI, no progress bars, log level ERROR; `conf` adds settings).
    Returns (session, created)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    root = str(Path(slashrt.__file__).resolve().parents[1])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def run_demo(
    *, events: int = 2_000_000, campaigns: int = 1000, executors: int = 2, partitions: int | None = None,
    seed: int = 42, spark=None,
) -> tuple[dict, np.ndarray]:
    """Run the pipeline; return (report, result rows). Uses `spark` or the active session, else
    starts (and stops) a local[2] one."""
    created = False
    if spark is None:
        spark, created = local_session()
    try:
        return _run(spark, events, campaigns, executors, partitions, seed)
    finally:
        if created:
            spark.stop()


def _run(spark, events, campaigns, executors, partitions, seed) -> tuple[dict, np.ndarray]:
    ads = ysb.campaign_map(campaigns)
    sink = slashrt.sinks.Collect()
    flow = ysb.dataflow(ads, sink)
    partitions = partitions or max(spark.sparkContext.defaultParallelism, executors)
    df = generators.spark_stream(spark, "ysb", events, partitions=partitions, seed=seed, campaigns=campaigns)
    concurrent = min(partitions, spark.sparkContext.defaultParallelism)
    # a small job first, so that the timed one does not also measure starting Python workers
    warm = time.perf_counter()
    generators.spark_stream(spark, "ysb", 1000 * partitions, partitions=partitions, seed=seed).count()
    warmup = time.perf_counter() - warm
    with IngestCluster(flow, executors=executors, transport="tcp") as cluster:
        started = time.perf_counter()
        # the generator's values fit their fields by construction: the tasks check, no extra pass
        report = ingest(df, cluster.targets("events"), secret=cluster.secret, defaults=generators.STREAMS["ysb"].defaults,
                        check="tasks", end=True)
        committed = time.perf_counter()
        result = cluster.result()
        finished = time.perf_counter()
    rows = ysb.to_result(sink.records)
    expected = ysb.reference(generators.records("ysb", 0, events, seed, campaigns=campaigns), ads)
    correct = bool(np.array_equal(rows, expected)) and report.rows == events

    seconds = finished - started
    task = report.task_seconds()
    wait = report.task_seconds("wait_seconds")
    convert = report.task_seconds("convert_seconds")
    send = max(task - wait - convert, 0.0)
    transfer = (convert + send) / concurrent + report.commit_seconds
    slashrt_s = finished - committed
    spark_s = max(seconds - transfer - slashrt_s, 0.0)
    out = {
        "query": "spark-demo-ysb",
        "rows_ingested": report.rows,
        "rows_per_s": round(report.rows / seconds, 1),
        "seconds": round(seconds, 6),
        "correct": correct,
        "executors": executors,
        "transport": "tcp",
        "spark_master": spark.sparkContext.master,
        "spark_partitions": partitions,
        "bytes_ingested": report.bytes,
        "fraction_spark": round(spark_s / seconds, 4),
        "fraction_transfer": round(transfer / seconds, 4),
        "fraction_slashrt": round(slashrt_s / seconds, 4),
        "spark_seconds": round(spark_s, 6),
        "transfer_seconds": round(transfer, 6),
        "slashrt_seconds": round(slashrt_s, 6),
        "spark_job_seconds": round(report.job_seconds, 6),
        "commit_seconds": round(report.commit_seconds, 6),
        "task_seconds": round(task, 6),
        "task_wait_seconds": round(wait, 6),
        "task_convert_seconds": round(convert, 6),
        "task_send_seconds": round(send, 6),
        "warmup_seconds": round(warmup, 6),
        "windows": int(len(rows)),
        "late_records": int(sum(result.late_records.values())),
    }
    log.info("spark demo finished", **{k: out[k] for k in ("rows_ingested", "seconds", "correct")})
    return out, rows
