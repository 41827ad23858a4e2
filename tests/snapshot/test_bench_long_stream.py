"""`slashrt.bench.long_stream`, the chunked input of `slashrt bench checkpoint` on clusters: its
reference, computed from the bases and chunk counts, equals the query's numpy reference over
every chunk made (a partial last chunk too), and it can fail: a chunk lost or counted twice
changes it."""

import numpy as np
import pytest

from slashrt.bench import long_stream
from slashrt.bench.scaling import QUERIES

PARAMS = {"ysb": {"campaigns": 100}, "nexmark": {}}


def made(query: str, events: int, executors: int, drop=(), twice=()) -> np.ndarray:
    streams = [long_stream.make(query, events, PARAMS[query], i, executors) for i in range(executors)]
    chunks = [s[k] for i, s in enumerate(streams) for k in range(len(s)) if (i, k) not in drop]
    chunks += [streams[i][k] for i, k in twice]
    return np.concatenate(chunks)


@pytest.mark.parametrize("query", ["ysb", "nexmark"])
def test_the_reference_is_the_querys_over_every_chunk_and_notices_a_chunk_lost_or_twice(query):
    # windows of several chunks (YSB's 20: two windows; Q7's 120: one), and a partial last chunk
    events = long_stream.CHUNK * (21 if query == "ysb" else 7) + 777
    q, params = QUERIES[query], PARAMS[query]
    want = long_stream.reference(query, events, 2, params)
    assert len(np.unique(want["window_start_ms" if query == "ysb" else "window_start"])) == (2 if query == "ysb" else 1)
    np.testing.assert_array_equal(q.reference(made(query, events, 2), **params), want)
    # executor 1's chunk whose offset is its window's largest (for Q7's maxima), lost
    k = int(np.argmax(long_stream.price_offset(1, np.arange(20 if query == "ysb" else 8))))
    assert not np.array_equal(q.reference(made(query, events, 2, drop={(1, k)}), **params), want)
    if query == "ysb":
        assert not np.array_equal(q.reference(made(query, events, 2, twice=[(0, 3)]), **params), want)


def test_chunks_are_made_on_demand_and_only_in_range():
    stream = long_stream.make("nexmark", 10**12, {}, 0, 2)  # a trillion events: nothing is made up front
    assert len(stream) == 10**12 // long_stream.CHUNK
    last = stream[len(stream) - 1]
    assert last["date_time"][0] == (len(stream) - 1) * long_stream.CHUNK_MS
    with pytest.raises(IndexError):
        stream[len(stream)]


@pytest.mark.parametrize("query", ["ysb", "nexmark"])
def test_the_chaos_bench_input_is_random_and_seeks_to_a_chunk_without_making_the_ones_before(query):
    """`bench chaos`'s input (`_query(chunked=False)`): random chunks, each made on its own, so
    a recovery seeks to its checkpoint's chunk (made whole, 10 M events took seconds of each
    recovery); a trillion events make nothing up front."""
    from slashrt.bench.checkpoint import _query

    inputs, _, _, _ = _query(query, 10**12, 2, chunked=False)
    (make,) = inputs.values()
    stream = make.make(1, 2)
    k = len(stream) - 1
    chunk = stream[k]
    time = long_stream.TIME[query]
    assert len(chunk) == long_stream.CHUNK and np.all(np.diff(chunk[time]) >= 0)
    assert chunk[time][0] == k * long_stream.CHUNK_MS  # chunk k's event times, as if the ones before were made
    assert stream[k].tobytes() == chunk.tobytes()  # made again: the same records (a resume's rewind)
    key = "ad_id" if query == "ysb" else "bidder"
    assert not np.array_equal(stream[0][key], stream[1][key])  # drawn afresh, not tiled
    assert not np.array_equal(make.make(0, 2)[0][key], stream[0][key])  # each executor its own
