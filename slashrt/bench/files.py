"""`slashrt bench files`: YSB read from files through `FileSource`, per format.

The generated events are written as `parts` files of each format (Parquet and CSV by our own
`ParquetFile` / `CsvFile` sinks, .npy by np.save) into a temporary directory, removed after;
YSB then reads each format's directory with `FileSource`, and its counts must equal the numpy
reference. It reports each format's throughput (best of `repeat` runs; `records_per_s` is
Parquet's), its bytes on disk, and the same query over the in-memory array for comparison.
With `checkpoint_interval`, the Parquet query also runs checkpointed (a checkpoint every that
many seconds, into a transactional Collect): `records_per_s_checkpointed`,
`checkpointed_over_plain`, `checkpoints_completed`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from slashrt.bench import ysb
from slashrt.bench._common import best_interleaved, checkpoint_fields, checkpointing, throughput_fields

__all__ = ["FORMATS", "bench", "write_parts"]

FORMATS = ("parquet", "csv", "npy")


def write_parts(records: np.ndarray, directory: Path, parts: int, fmt: str) -> None:
    """`records` as `parts` files `part-<i>.<fmt>` of about equal size in a new `directory`:
    Parquet and CSV by our own sinks, .npy by np.save."""
    from slashrt import sinks

    directory.mkdir()
    cuts = np.linspace(0, len(records), parts + 1).astype(np.int64)
    for i in range(parts):
        path, part = directory / f"part-{i}.{fmt}", records[cuts[i] : cuts[i + 1]]
        if fmt == "npy":
            np.save(path, part)
            continue
        sink = (sinks.ParquetFile if fmt == "parquet" else sinks.CsvFile)(path)
        sink.open()
        sink.write(part)
        sink.close()


def bench(*, events: int, campaigns: int = 1000, parts: int = 4, repeat: int = 1, checkpoint_interval: float | None = None,
          **options) -> dict:
    from slashrt import sinks
    from slashrt._run import run
    from slashrt.connectors import FileSource

    records = ysb.generate(events, campaigns)
    ads = ysb.campaign_map(campaigns)
    expected = ysb.reference(records, ads)

    correct = True

    def run_once(source, interval: float | None = None):
        nonlocal correct
        out = sinks.Collect(transactional=interval is not None)
        with checkpointing(interval) as checkpoints:
            result = run(ysb.dataflow(ads, out), {"events": source()}, **options, **checkpoints)
        correct = correct and np.array_equal(ysb.to_result(out.records), expected)
        return result

    fields, results = {}, {}
    with tempfile.TemporaryDirectory(prefix="slashrt-bench-files-") as root:
        for fmt in FORMATS:
            directory = Path(root, fmt)
            write_parts(records, directory, parts, fmt)
            intervals = [None] if fmt != "parquet" or checkpoint_interval is None else [None, checkpoint_interval]
            runs = best_interleaved(repeat, lambda interval, d=directory: run_once(lambda: FileSource(d), interval), intervals)
            results[fmt] = runs[None]
            fields[f"records_per_s_{fmt}"] = round(events / results[fmt].seconds, 1)
            fields[f"bytes_{fmt}"] = sum(p.stat().st_size for p in directory.iterdir())
            if len(intervals) > 1:
                fields.update(checkpoint_fields(events, runs[None], runs[checkpoint_interval]),
                              checkpoint_interval_s=checkpoint_interval)
    array = best_interleaved(repeat, lambda interval: run_once(lambda: records, interval), [None])[None]
    fields["records_per_s_array"] = round(events / array.seconds, 1)
    return throughput_fields("files-ysb", events, results["parquet"], correct=correct, campaigns=campaigns,
                             parts=parts, repeat=repeat, **fields)
