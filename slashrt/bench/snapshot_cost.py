"""What snapshotting a YSB window costs: the synchronous copy, the bytes, writing and restoring.

The YSB query's window (count per campaign, 10 s tumbling) is given `keys` campaigns in each
of `windows` open windows (the state a checkpoint meets when windows wait for the watermark),
then its state is taken (`snapshot()`: the synchronous part, the executor's loop is blocked
for it), encoded in the snapshot format (the asynchronous part, done off the loop), and
restored into a new operator, which must give the state back.

    python -m slashrt.bench.snapshot_cost [--keys N] [--windows W] [--repeat R]
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
import trio

from slashrt._batch import Batch
from slashrt._plan import build_plan
from slashrt.bench import ysb
from slashrt.ops.sinks import Collect
from slashrt.snapshot.state_format import decode_state, write_state

__all__ = ["bench"]


def _window():
    (window,) = build_plan(ysb.dataflow(ysb.campaign_map(1), Collect())).windows()
    return window


def bench(*, keys: int = 1_000_000, windows: int = 2, repeat: int = 3) -> dict:
    window = _window()
    rows = np.zeros(keys, [("event_time", "<i8"), ("campaign_id", "<i8")])
    rows["campaign_id"] = np.random.default_rng(1).permutation(keys)

    async def fill():
        for w in range(windows):
            rows["event_time"] = w * ysb.WINDOW_MS
            await window.push(Batch(rows))

    trio.run(fill)
    sync = []
    for _ in range(repeat):
        start = time.perf_counter()
        state = window.snapshot()
        sync.append(time.perf_counter() - start)
    out = io.BytesIO()
    start = time.perf_counter()
    written, _ = write_state(out, state.arrays, state.meta)
    encode = time.perf_counter() - start
    start = time.perf_counter()
    restored = _window()
    restored.restore(decode_state(out.getbuffer()))
    restore = time.perf_counter() - start
    same = restored.state_bytes == window.state_bytes and sorted(restored.slices) == sorted(window.slices)
    return {
        "keys": keys,
        "windows": windows,
        "state_bytes": window.state_bytes,
        "snapshot_bytes": written,
        "sync_ms": round(min(sync) * 1e3, 2),
        "sync_ms_max": round(max(sync) * 1e3, 2),
        "encode_ms": round(encode * 1e3, 2),
        "restore_ms": round(restore * 1e3, 2),
        "sync_mb_per_s": round(window.state_bytes / min(sync) / 1e6, 1),
        "correct": bool(same),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slashrt.bench.snapshot_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(bench(keys=args.keys, windows=args.windows, repeat=args.repeat)))


if __name__ == "__main__":
    main()
