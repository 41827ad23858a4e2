"""`slashrt bench peers`: slashrt and Polars side by side on YSB read from the same Parquet files.

The generated events (every YSB column) are written as `parts` Parquet files into a temporary
directory, removed after. slashrt reads them with `FileSource` under the schema of the three
columns the query reads (`ysb.READ_SCHEMA`), on one executor and on two over shared memory (each
executor reads its own files: file k by executor k mod 2); Polars runs the same query with its
streaming engine on one thread and on two (`POLARS_MAX_THREADS`, in a process of its own:
`_polars_ysb`). Every run's result must equal the numpy reference.

Each figure is the best of `repeat` rounds, the four variants taking turns within a round (a
loaded machine weighs on each alike), the files warm in the page cache after the first. Each
counts its query from reading the files to the result, not starting its processes (slashrt's
executors: `startup_s`; Polars: its import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from slashrt.bench import ysb
from slashrt.bench._common import throughput_fields
from slashrt.bench.files import write_parts

__all__ = ["bench"]

THREADS = (1, 2)


def bench(*, events: int, campaigns: int = 1000, parts: int = 4, repeat: int = 3, **options) -> dict:
    from slashrt import sinks
    from slashrt._run import run
    from slashrt.connectors import FileSource

    records = ysb.generate(events, campaigns)
    ads = ysb.campaign_map(campaigns)
    expected = ysb.reference(records, ads)
    checks: dict[str, bool] = {}
    best: dict[tuple[str, int], float] = {}
    first = None  # slashrt's run on one executor (the common fields)

    def slashrt_once(directory: Path, threads: int):
        out = sinks.Collect()
        cluster = {} if threads == 1 else {"executors": threads, "transport": "shm"}
        result = run(ysb.dataflow(ads, out, schema=ysb.READ_SCHEMA), {"events": FileSource(directory)}, **options,
                     **cluster)
        checks[f"slashrt_{threads}t"] = checks.get(f"slashrt_{threads}t", True) and np.array_equal(
            ysb.to_result(out.records), expected)
        return result

    def polars_once(directory: Path, threads: int, root: Path) -> dict:
        out = root / "polars.npy"
        done = subprocess.run(
            [sys.executable, "-m", "slashrt.bench._polars_ysb", str(directory), str(root / "ads.npy"), "1", str(out)],
            env={**os.environ, "POLARS_MAX_THREADS": str(threads)}, capture_output=True, text=True,
        )
        if done.returncode:
            raise RuntimeError(f"the Polars query failed: {done.stderr.strip().splitlines()[-1:]}")
        report = json.loads(done.stdout)
        if report["threads"] != threads:  # (a POLARS_MAX_THREADS that Polars did not take)
            raise RuntimeError(f"Polars ran on {report['threads']} threads, not {threads}")
        checks[f"polars_{threads}t"] = checks.get(f"polars_{threads}t", True) and np.array_equal(
            ysb.sort_rows(np.load(out), "window_start_ms", "campaign_id"), expected)
        return report

    with tempfile.TemporaryDirectory(prefix="slashrt-bench-peers-") as tmp:
        root = Path(tmp)
        directory = root / "events"
        write_parts(records, directory, parts, "parquet")
        np.save(root / "ads.npy", ads)
        for _ in range(repeat):
            for threads in THREADS:
                result = slashrt_once(directory, threads)
                if threads == 1 and (first is None or result.seconds < first.seconds):
                    first = result
                best[("slashrt", threads)] = min(best.get(("slashrt", threads), float("inf")), result.seconds)
                report = polars_once(directory, threads, root)
                best[("polars", threads)] = min(best.get(("polars", threads), float("inf")), report["seconds"])
        file_bytes = sum(p.stat().st_size for p in directory.iterdir())
    fields: dict = {}
    for threads in THREADS:
        ours, theirs = events / best[("slashrt", threads)], events / best[("polars", threads)]
        fields[f"slashrt_records_per_s_{threads}t"] = round(ours, 1)
        fields[f"polars_records_per_s_{threads}t"] = round(theirs, 1)
        fields[f"slashrt_over_polars_{threads}t"] = round(ours / theirs, 3)
    fields["slashrt_2t_over_1t"] = round(best[("slashrt", 1)] / best[("slashrt", 2)], 3)
    fields["polars_2t_over_1t"] = round(best[("polars", 1)] / best[("polars", 2)], 3)
    return throughput_fields(
        "peers-ysb", events, first, correct=all(checks.values()), checks=checks, campaigns=campaigns, parts=parts,
        repeat=repeat, parquet_bytes=file_bytes, polars_version=report["version"], **fields,
    )
