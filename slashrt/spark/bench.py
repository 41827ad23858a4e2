"""`slashrt bench spark-convert`: Arrow batches to slashrt records, the conversion alone.

The input is what the Spark YSB generator hands the ingest UDF: Arrow record batches of
`spark.sql.execution.arrow.maxRecordsPerBatch` rows (10,000 by default) with the generator's
Spark types (seven columns: longs, bytes; the 40-byte filler is a default). The batches are
made before the clock starts; the timed part is `ArrowConverter.convert` over all of them,
including the range checks the narrowing columns need. The output is checked against
`generators.records`, made without the converter. No JVM is needed.
"""

from __future__ import annotations

import time

import numpy as np

from slashrt.spark import generators
from slashrt.spark._convert import ArrowConverter
from slashrt.spark._mapping import plan_columns

__all__ = ["convert_bench"]


def convert_bench(*, rows: int = 10_000_000, batch_rows: int = 10_000, repeat: int = 3, stream: str = "ysb", seed: int = 42) -> dict:
    spec = generators.STREAMS[stream]
    batches = [
        generators.arrow_batch(stream, np.arange(a, min(rows, a + batch_rows), dtype=np.int64), seed)
        for a in range(0, rows, batch_rows)
    ]
    plan = plan_columns(spec.spark_schema(), spec.schema, defaults=spec.defaults, source=stream)
    converter = ArrowConverter(plan)
    best = None
    for _ in range(repeat):
        started = time.perf_counter()
        for batch in batches:
            for _block in converter.convert(batch):
                pass
        seconds = time.perf_counter() - started
        best = seconds if best is None else min(best, seconds)
    # check: every batch converts to the reference records (done after timing, on all of them)
    correct = True
    size = spec.schema.record_size
    for i, batch in enumerate(batches):
        want = generators.records(stream, i * batch_rows, i * batch_rows + batch.num_rows, seed)
        got = b"".join(block.tobytes() for block in converter.convert(batch))
        correct = correct and got == want.tobytes()
    return {
        "query": f"spark-convert-{stream}",
        "events": rows,
        "executors": 1,
        "transport": "none",
        "seconds": round(best, 6),
        "records_per_s": round(rows / best, 1),
        "bytes_per_s": round(rows * size / best, 1),
        "record_size": size,
        "batch_rows": batch_rows,
        "columns": len(plan.columns),
        "repeat": repeat,
        "correct": bool(correct),
    }
