"""The Polars side of `slashrt bench peers`, in a process of its own: Polars reads its thread
count (`POLARS_MAX_THREADS`) once, when it is imported.

    python -m slashrt.bench._polars_ysb DIR ADS.npy REPEAT OUT.npy

YSB over the Parquet files in DIR with Polars' streaming engine (a lazy scan: only the three
columns the query reads), the ad -> campaign mapping joined from ADS.npy; the best of REPEAT
runs' seconds on standard output as JSON, the result rows (window_start_ms, campaign_id,
count) in OUT.npy.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def query(directory: str, ads: np.ndarray):
    import polars as pl

    from slashrt.bench.ysb import VIEW, WINDOW_MS

    campaigns = pl.DataFrame({"ad_id": np.arange(len(ads), dtype=np.int64), "campaign_id": ads})
    return (
        pl.scan_parquet(f"{directory}/*.parquet")
        .filter(pl.col("event_type") == VIEW)
        .join(campaigns.lazy(), on="ad_id")
        .group_by((pl.col("event_time") // WINDOW_MS * WINDOW_MS).alias("window_start_ms"), "campaign_id")
        .agg(pl.len().alias("count"))
    )


def main(argv: list[str]) -> None:
    import polars as pl

    from slashrt.bench.ysb import RESULT_DTYPE

    directory, ads, repeat, out = argv[0], np.load(argv[1]), int(argv[2]), argv[3]
    best, frame = None, None
    for _ in range(repeat):
        start = time.perf_counter()
        frame = query(directory, ads).collect(engine="streaming")
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    rows = np.empty(frame.height, RESULT_DTYPE)
    for name in RESULT_DTYPE.names:
        rows[name] = frame[name].to_numpy()
    np.save(out, rows)
    print(json.dumps({"seconds": best, "version": pl.__version__, "threads": pl.thread_pool_size()}))


if __name__ == "__main__":
    main(sys.argv[1:])
