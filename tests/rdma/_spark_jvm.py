"""How the soft-RoCE VM's Spark JVM starts: its options, and the class-data archive that
shortens its start.

Under qemu's emulated CPU the JVM's start (loading and verifying Spark's classes) took about
100 s of the VM suite. A dynamic AppCDS archive of the classes a small local job loads, dumped
on the host once per venv and pyspark version (`python tests/rdma/_spark_jvm.py`, which
scripts/rdma-vm-setup.sh runs), lets the guest's JVM map them instead. The guest sees the
host's files, so the JDK, the jars and the archive are the same ones. A JVM that cannot use the
archive (another JDK, another class path: spark-submit's own launcher JVM) warns on stderr and
starts without it.
"""

import os
import subprocess
import sys
from pathlib import Path

# fewer of the features qemu emulates badly: no AVX code, no C2 compiler
BASE_OPTIONS = ("-XX:UseAVX=0", "-XX:TieredStopAtLevel=1")
DRIVER_MEMORY = "512m"


def archive() -> Path:
    import pyspark

    return Path(sys.prefix) / f"spark-cds-{pyspark.__version__}.jsa"


def java_options(*extra: str) -> str:
    """JAVA_TOOL_OPTIONS for the guest's JVM: the archive's classes where it was dumped, and
    `extra` options."""
    path = archive()
    return " ".join([*BASE_OPTIONS, *([f"-XX:SharedArchiveFile={path}"] if path.exists() else []), *extra])


def session(app: str, *extra_options: str):
    """A new local session (2 task slots) started with `java_options(*extra_options)`."""
    from slashrt.spark.demo import local_session

    os.environ["JAVA_TOOL_OPTIONS"] = java_options(*extra_options)
    return local_session("local[2]", app=app, driver_memory=DRIVER_MEMORY)[0]


def ingest_job(spark, n: int, check_verbs: bool):
    """The guest's Spark job: `n` rows of a DataFrame ingested into a dataflow (over verbs
    where `check_verbs`, else over TCP). Returns the ingest report, the result, the source's
    endpoint stats and the sink."""
    from slashrt.spark import IngestServer, ingest
    from spark.test_endpoint import flow_and_sink  # (tests/ is on sys.path)

    flow, sink = flow_and_sink()
    df = spark.range(0, n, numPartitions=2).selectExpr("id as t", "id % 5 as key")
    with IngestServer(flow) as server:
        target = server.target()
        assert not check_verbs or target.verbs_address is not None
        report = ingest(df, target, secret=server.secret, check="tasks", end=True)
        result = server.result(timeout=120)
        stats = server.endpoints["events"].stats
    return report, result, stats, sink


def _job(dump_option: str) -> None:
    """The classes to archive: the guest's job, over TCP here, in a JVM that dumps them
    (`dump_option`) when it exits."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    spark = session("slashrt-rdma-vm-cds", dump_option)
    report, result, _, _ = ingest_job(spark, 20_000, check_verbs=False)
    assert report.rows == result.records == 20_000, (report.rows, result.records)
    spark.stop()


def dump() -> int:
    """Dump the archive unless it is there: the job runs in a child process, whose JVM writes
    the classes it loaded when it exits (into a temporary name, renamed once complete)."""
    path = archive()
    if path.exists():
        return 0
    partial = path.with_suffix(".partial")
    env = dict(os.environ, SLASHRT_SPARK_CDS_DUMP=f"-XX:ArchiveClassesAtExit={partial}")
    done = subprocess.run([sys.executable, __file__, "--job"], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.exists():
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        print(f"rdma-vm-setup: no Spark class-data archive (the guest's JVM starts without it): {last}")
        partial.unlink(missing_ok=True)
        return 0  # a slower start, not a failure
    partial.rename(path)
    print(f"rdma-vm-setup: Spark class-data archive {path.name} ({path.stat().st_size >> 20} MiB)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--job"]:
        _job(os.environ["SLASHRT_SPARK_CDS_DUMP"])
    else:
        sys.exit(dump())
