"""A checkpointed job that resumes from its checkpoint directory and may SIGKILL itself.

    python _checkpoint_child.py <directory> <kill> [<inputs>]

The job: source "a" out of order beyond its bound (some records are late) into a tumbling-window
sum per key; sources "b" and "c" (within their bound: what is late under a union depends on how
the two interleave) joined by a union into another; the sums and a's late records each into a
transactional sink (out_a, late_a, out_bc); checkpoints every 5 ms into <directory>/chk;
`resume_from="latest"`. <inputs> says where the records come from and where the results go:
"arrays" (the default: in-memory arrays into CSV files under <directory>), "files:<data>"
(FileSources over <data>/a, b, c as `write_inputs` wrote them, into Parquet (out_a) and CSV
files under <directory>) or "redis:<url>" (RedisStreams a, b, c as `write_inputs` wrote them,
into RedisStreamSinks out_a, late_a, out_bc). <kill> is "none", or "<point>:<k>": SIGKILL
this process at the k-th time it reaches <point>: "records" (k thousand records processed),
"pre_commit" (a sink pre-committed, before the state is written), "write_part" (a part
written, before the rest: during the asynchronous write), "complete" (a manifest written,
before the sinks commit) or "commit" (a sink committed: a checkpoint completed, the run goes
on). Until a kill at a checkpoint's point has fired, each batch of source "a" takes 4 ms more,
so that however fast the machine the job cannot end before it (a run at full speed completes
only 5-9 checkpoints). Prints "done" at the end."""

import os
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt.ops.sinks import to_arrow

from tests.snapshot._paced import Paced, behind

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
SIZES = {"a": 200_000, "b": 120_000, "c": 60_000}
DISORDER = {"a": 40, "b": 20, "c": 20}
OUTPUTS = ("out_a", "late_a", "out_bc")
FILES = {"a": ("parquet", 4), "b": ("csv", 3), "c": ("npy", 2)}  # each source's format, and files
# SLASHRT_TEST_ALIGNMENT_TIMEOUT: the checkpoints' alignment_timeout (0: every one unaligned)
ALIGNMENT = {"alignment_timeout": float(os.environ["SLASHRT_TEST_ALIGNMENT_TIMEOUT"])} \
    if "SLASHRT_TEST_ALIGNMENT_TIMEOUT" in os.environ else {}
ENTRY_BYTES = 8192  # a stream entry: 341 records; a source reads 4 entries at a time


def records(name: str) -> np.ndarray:
    """Each source's input, the same in every process."""
    rng = np.random.default_rng(len(name) + ord(name))
    n = SIZES[name]
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 20_000 // n - rng.integers(0, DISORDER[name], n)
    out["k"] = rng.integers(0, 50, n)
    out["v"] = rng.integers(-1000, 1000, n)
    return out


def write_inputs(inputs: str) -> None:
    """Put every source's records where `inputs` ("files:<data>", "redis:<url>") reads them."""
    kind, _, where = inputs.partition(":")
    for name in SIZES:
        if kind == "redis":
            from slashrt.connectors import write_stream

            write_stream(where, name, records(name), entry_bytes=ENTRY_BYTES)
            continue
        fmt, count = FILES[name]
        directory = Path(where) / name
        directory.mkdir(parents=True)
        for i, part in enumerate(np.array_split(records(name), count)):
            path = directory / f"part-{i}.{fmt}"
            if fmt == "npy":
                np.save(path, part)
                continue
            if fmt == "parquet":  # row groups of 7000: a resume seeks into the middle of one
                import pyarrow.parquet as pq

                pq.write_table(to_arrow(part), path, row_group_size=7000)
                continue
            sink = sinks.CsvFile(path)
            sink.open()
            sink.write(part)
            sink.close()


def job_inputs(inputs: str) -> dict:
    kind, _, where = inputs.partition(":")
    if kind == "arrays":
        return {name: records(name) for name in SIZES}
    from slashrt.connectors import FileSource, RedisStream

    if kind == "redis":
        return {name: RedisStream(where, name, count=4) for name in SIZES}
    return {name: FileSource(Path(where) / name, batch_records=5000) for name in SIZES}


def job_sinks(directory: str, inputs: str) -> dict:
    kind, _, where = inputs.partition(":")
    if kind == "redis":
        from slashrt.connectors import RedisStreamSink

        return {name: RedisStreamSink(where, name, transactional=True) for name in OUTPUTS}
    parquet = kind == "files"  # one Parquet sink beside the CSV ones
    return {
        name: (sinks.ParquetFile if parquet and name == "out_a" else sinks.CsvFile)(f"{directory}/{name}", transactional=True)
        for name in OUTPUTS
    }


def flow(out: dict, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind source a (`tests.snapshot._paced.Paced`), or none."""
    job = Dataflow("chaos")
    a, b, c = (job.source(name, SCHEMA, time="t", max_delay=20) for name in SIZES)
    a = behind(a, pace)
    a.window(Tumbling(ms=100), late=out["late_a"]).sum("v", key="k").sink(out["out_a"])
    b.union(c).window(Tumbling(ms=100)).sum("v", key="k").sink(out["out_bc"])
    return job


def main(directory: str, kill: str, inputs: str = "arrays") -> None:
    from _children import kill_at  # run as a script: this directory is on its path
    from slashrt.connectors.redis_sink import RedisTransactions
    from slashrt.snapshot.commit import PartFiles
    from slashrt.snapshot.storage import SnapshotStore

    point, _, k = kill.partition(":")
    on_records = None if point != "records" else lambda n: n >= int(k) * 1000 and os.kill(os.getpid(), signal.SIGKILL)
    transactions = RedisTransactions if inputs.startswith("redis") else PartFiles
    pace = None
    if point not in ("none", "records"):
        marks = tempfile.mkdtemp(prefix="marks-", dir=directory)
        kill_at({"write_part": SnapshotStore, "complete": SnapshotStore}.get(point, transactions), point, int(k),
                marker=f"{marks}/killed")
        pace = Paced(seconds=0.004, until=(marks, 1))
    slashrt.run(
        flow(job_sinks(directory, inputs), pace), job_inputs(inputs), checkpoint={"interval": 0.005, "keep": 2, **ALIGNMENT},
        checkpoint_dir=f"{directory}/chk", resume_from="latest", slots=8, slot_size=2048, on_records=on_records,
        **({"coalesce": 2} if ALIGNMENT else {}),  # unaligned: runs shorter than the ring, which holds records in flight
    )
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
