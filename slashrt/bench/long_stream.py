"""Long streams for the cluster benchmarks: each executor's events made chunk by chunk while the
run goes (a `PerExecutor` returning a sequence of chunks, `slashrt.ops.chunks`), so a run lasts
as long as asked in bounded memory, and their exact reference, computed without making them.

Executor i's stream of YSB events or NEXMark bids is its base block (`CHUNK` events of the
query's generator, seeded per executor: `CHUNK_MS` of event time) repeated: chunk k is a copy
of the base with every event time moved on by k * CHUNK_MS and, for NEXMark, every price
raised by an offset drawn per chunk (so each window's highest bid depends on which chunks it
got). Making a chunk is one copy of a block in cache and a column addition or two, so the run
measures the dataflow rather than a random number generator. CHUNK_MS divides both queries'
windows, so a chunk lies inside one window, and the windowed results are sums (YSB's counts)
or maxima (Q7's prices) over chunks of its base's results: `reference` computes them from the
bases and the number of chunks in each window, exactly, in a fraction of a second for 1e9
events. A record lost or counted twice changes a YSB count; a chunk lost changes a Q7 maximum
when its offset is its window's largest.
"""

from __future__ import annotations

import attrs
import numpy as np

from slashrt.bench import nexmark, ysb

__all__ = ["CHUNK", "CHUNK_MS", "TiledStream", "RandomStream", "make", "make_random", "reference"]

EVENTS_PER_MS = 100  # both generators' default
CHUNK = 50_000  # events a chunk: 3.9 MB of YSB, a few chunks alive per executor stay in cache
CHUNK_MS = CHUNK // EVENTS_PER_MS
assert ysb.WINDOW_MS % CHUNK_MS == 0 and nexmark.WINDOW_MS % CHUNK_MS == 0
TIME = {"ysb": "event_time", "nexmark": "date_time"}
WINDOW_MS = {"ysb": ysb.WINDOW_MS, "nexmark": nexmark.WINDOW_MS}


def _base(query: str, index: int, params: dict) -> np.ndarray:
    from slashrt.bench.scaling import QUERIES

    q = QUERIES[query]
    return q.generate(CHUNK, zipf=0.0, seed=q.seed + 1000 * index, **params)


def price_offset(index: int, k):
    """What chunk(s) `k` of executor `index` add to every price (a hash of both)."""
    return ((np.asarray(k, np.int64) + 1) * 2654435761 + index * 40503) % 100_000


@attrs.frozen(eq=False)
class TiledStream:
    """Executor `index`'s `events` events of `query` as a sequence of chunks (see the module doc)."""

    query: str
    base: np.ndarray
    events: int
    index: int

    def __len__(self) -> int:
        return -(-self.events // CHUNK)

    def __getitem__(self, k: int) -> np.ndarray:
        if not 0 <= k < len(self):
            raise IndexError(k)
        base = self.base[: min(CHUNK, self.events - k * CHUNK)]
        out = np.empty_like(base)
        out.view(np.uint8)[:] = base.view(np.uint8)  # as bytes: numpy copies records field by field, 10x slower
        out[TIME[self.query]] += k * CHUNK_MS
        if self.query == "nexmark":
            out["price"] += price_offset(self.index, k)
        return out


def make(query: str, events: int, params: dict, index: int, executors: int) -> TiledStream:
    """`PerExecutor(functools.partial(make, query, events, params), deterministic=True)`: each
    executor's `events` events."""
    return TiledStream(query, _base(query, index, params), events, index)


@attrs.frozen(eq=False)
class RandomStream:
    """Executor `index`'s `events` random events of `query` as a sequence of chunks: chunk k is
    `CHUNK` events drawn afresh (keys and values at random, seeded by the executor and k), its
    event times those of chunk k of the stream. Random everywhere, as one generated array, yet
    chunk k is made without the ones before it: a resume seeks to its checkpoint's chunk rather
    than making the whole input again (`slashrt.ops.chunks`). No closed-form reference: its
    users compare against a failure-free run's output."""

    query: str
    events: int
    index: int
    params: dict

    def __len__(self) -> int:
        return -(-self.events // CHUNK)

    def __getitem__(self, k: int) -> np.ndarray:
        from slashrt.bench.scaling import QUERIES

        if not 0 <= k < len(self):
            raise IndexError(k)
        q = QUERIES[self.query]
        out = q.generate(min(CHUNK, self.events - k * CHUNK), zipf=0.0, seed=[q.seed, self.index, k], **self.params)
        out[TIME[self.query]] += k * CHUNK_MS
        return out


def make_random(query: str, events: int, params: dict, index: int, executors: int) -> RandomStream:
    """`PerExecutor(functools.partial(make_random, query, events, params), deterministic=True)`:
    each executor's `events` random events, seekable chunk by chunk."""
    return RandomStream(query, events, index, params)


def reference(query: str, events: int, executors: int, params: dict) -> np.ndarray:
    """The query's sorted result rows (as its `to_result`) over `executors` streams of `events`
    events each, from their bases and chunk counts."""
    full, rest = divmod(events, CHUNK)
    window_of = np.arange(full + (rest > 0), dtype=np.int64) * CHUNK_MS // WINDOW_MS[query]
    windows = int(window_of[-1]) + 1 if len(window_of) else 0
    if query == "ysb":
        mapping = ysb.campaign_map(params["campaigns"])
        counts = np.zeros((windows, params["campaigns"]), np.int64)

        def per_campaign(block: np.ndarray) -> np.ndarray:
            rows = ysb.reference(block, mapping)  # one window: the base spans CHUNK_MS
            vector = np.zeros(params["campaigns"], np.int64)
            vector[rows["campaign_id"]] = rows["count"]
            return vector

        for index in range(executors):
            base = _base(query, index, params)
            counts += np.outer(np.bincount(window_of[:full], minlength=windows), per_campaign(base))
            if rest:
                counts[window_of[full]] += per_campaign(base[:rest])
        window, campaign = np.nonzero(counts)  # row-major: by window, then campaign
        out = np.empty(len(window), ysb.RESULT_DTYPE)
        out["window_start_ms"], out["campaign_id"], out["count"] = window * ysb.WINDOW_MS, campaign, counts[window, campaign]
        return out
    best = np.full(windows, np.iinfo(np.int64).min)
    for index in range(executors):
        base = _base(query, index, params)
        np.maximum.at(best, window_of[:full], base["price"].max() + price_offset(index, np.arange(full)))
        if rest:
            np.maximum.at(best, window_of[full:], base["price"][:rest].max() + price_offset(index, full))
    out = np.empty(windows, nexmark.RESULT_DTYPE)
    out["window_start"], out["max_price"] = np.arange(windows) * nexmark.WINDOW_MS, best
    return out
