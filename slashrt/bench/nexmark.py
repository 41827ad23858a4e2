"""NEXMark query 7 (highest bid): the highest bid price in every 60-second tumbling window.

A bid is (auction, bidder, price, channel, date_time) as a 40-byte record; NEXMark's `url`
and `extra` strings are left out, and the channel is a short fixed-width name. Auctions and
bidders are drawn with optional Zipf skew, prices log-normal in cents
(`slashrt.spark.generators` makes the same stream on Spark).
The query has one group per window: with repartitioning (UpPar) every bid goes to one
executor, while the SSB keeps one partial maximum per executor and ships it once per epoch.
"""

from __future__ import annotations

import numpy as np

from slashrt._dataflow import Dataflow
from slashrt._schema import Schema
from slashrt.bench._common import generate_chunked, sort_rows, zipf_choice
from slashrt.ops.window import Tumbling

__all__ = ["BID_SCHEMA", "CHANNELS", "WINDOW_MS", "generate", "dataflow", "reference", "to_result"]

BID_SCHEMA = Schema(
    [
        ("auction", "<i8"),
        ("bidder", "<i8"),
        ("price", "<i8"),
        ("channel", "S8"),
        ("date_time", "<i8"),
    ]
)
assert BID_SCHEMA.record_size == 40
CHANNELS = (b"Google", b"Facebook", b"Baidu", b"Apple")
WINDOW_MS = 60_000
RESULT_DTYPE = np.dtype([("window_start", "<i8"), ("max_price", "<i8")])


def generate(
    events: int, auctions: int = 10_000, *, zipf: float = 0.0, events_per_ms: int = 100, seed: int = 13
) -> np.ndarray:
    def fill(out, first, rng):
        n = len(out)
        out["date_time"] = np.arange(first, first + n, dtype=np.int64) // events_per_ms
        out["auction"] = zipf_choice(rng, auctions, n, zipf) + 1000
        out["bidder"] = zipf_choice(rng, 100 * auctions, n, zipf) + 1000
        out["price"] = np.round(rng.lognormal(7.0, 1.5, n)).astype(np.int64) + 1
        out["channel"] = np.array(CHANNELS, "S8")[rng.integers(0, len(CHANNELS), n)]

    return generate_chunked(BID_SCHEMA.dtype, events, fill, seed)


def dataflow(sink) -> Dataflow:
    """Q7 against the public API: one group (key 0) per window, the maximum price."""
    flow = Dataflow("nexmark_q7")
    bids = flow.source("bids", BID_SCHEMA, time="date_time")
    (
        bids.with_column("all", lambda b: np.zeros(len(b), np.int64), dtype="<i8")
        .window(Tumbling(ms=WINDOW_MS))
        .max("price", key="all", output="max_price")
        .sink(sink, name="highest_bid")
    )
    return flow


def to_result(records) -> np.ndarray:
    if records is None:
        return np.empty(0, RESULT_DTYPE)
    out = np.empty(len(records), RESULT_DTYPE)
    out["window_start"], out["max_price"] = records["window_start"], records["max_price"]
    return sort_rows(out, "window_start")


def reference(records: np.ndarray) -> np.ndarray:
    window = records["date_time"] // WINDOW_MS
    order = np.argsort(window, kind="stable")
    w = window[order]
    starts = np.flatnonzero(np.r_[True, w[1:] != w[:-1]]) if len(w) else np.empty(0, np.intp)
    out = np.empty(len(starts), RESULT_DTYPE)
    out["window_start"] = w[starts] * WINDOW_MS
    out["max_price"] = np.maximum.reduceat(records["price"][order], starts) if len(starts) else []
    return out
